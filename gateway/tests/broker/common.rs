//! The harness: a real `felix` process on free loopback ports with its own temp data dir,
//! its stderr in `broker.log` beside the data. It is killed with SIGKILL (never asked to
//! stop) and restarted on the same data dir and ports. When a test fails the temp dir is
//! kept and the log's path and tail are printed.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use felix_client::{ClientConfig, ClusterClient, Connection, Event, StreamConfig, Subscription};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_felix");

/// How long a broker may take to become ready (a debug build, a cold Raft start, 2 cores).
const READY_WITHIN: Duration = Duration::from_secs(90);
/// Generous bound on anything a test waits for; reaching it is a failure, not a timing check.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A free TCP port on loopback (the listener is dropped, so a race is possible but rare).
fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral TCP port")
        .port()
}

/// A free TCP port on loopback that is none of `taken`: a cluster member's internal port is
/// chosen before anything binds it, so the OS may hand the same port out again.
fn free_tcp_port_except(taken: &[u16]) -> u16 {
    loop {
        let port = free_tcp_port();
        if !taken.contains(&port) {
            return port;
        }
    }
}

/// The ports a broker's options reserve for the internal network: its own internal address
/// and every member's in `--cluster` (members not started yet have not bound theirs).
fn reserved_ports(options: &BrokerOptions) -> Vec<u16> {
    let mut ports: Vec<u16> = options.internal.iter().map(SocketAddr::port).collect();
    let mut args = options.args.iter();
    while let Some(arg) = args.next() {
        if arg == "--cluster"
            && let Some(spec) = args.next()
        {
            ports.extend(
                spec.split(',')
                    .filter_map(|member| member.rsplit(':').next()?.parse::<u16>().ok()),
            );
        }
    }
    ports
}

/// A free UDP port on loopback, for QUIC.
fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("bind an ephemeral UDP port")
        .port()
}

/// How a broker is started: flags and environment beyond the addresses and data dir.
#[derive(Default, Clone)]
pub struct BrokerOptions {
    fsync: Option<String>,
    env: Vec<(String, String)>,
    /// A fixed internal address (a cluster member's, named in `--cluster`).
    internal: Option<SocketAddr>,
    args: Vec<String>,
}

impl BrokerOptions {
    pub fn new() -> BrokerOptions {
        BrokerOptions::default()
    }
    /// `--fsync on_commit|periodic`.
    pub fn fsync(mut self, policy: &str) -> BrokerOptions {
        self.fsync = Some(policy.to_owned());
        self
    }
    /// A `FELIX_*` variable.
    pub fn env(mut self, key: &str, value: impl ToString) -> BrokerOptions {
        self.env.push((key.to_owned(), value.to_string()));
        self
    }
    /// A cluster member: `--node-id ID --cluster SPEC`, listening on `internal`.
    pub fn member(mut self, id: u64, cluster: &str, internal: SocketAddr) -> BrokerOptions {
        self.internal = Some(internal);
        self.args.extend([
            "--node-id".into(),
            id.to_string(),
            "--cluster".into(),
            cluster.into(),
        ]);
        self
    }
}

/// Copies the directory tree `from` into `to` (created), as a backup restored later.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Runs `felix` with `args` and `env` (nothing else from the environment) on a fresh data dir
/// until it exits, for a start that must be refused: its exit code and stderr. It is killed
/// if it has not exited within [`PATIENCE`] (then the code is `None`).
pub fn run_to_exit(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(BIN);
    cmd.arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("FELIX_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the felix binary");
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
    }
    (status, stderr)
}

/// A free loopback TCP address.
pub fn free_tcp_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_tcp_port()))
}

/// A `felix` broker process.
pub struct Broker {
    /// `None` once kept for a post-mortem.
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    pub quic_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    internal_addr: SocketAddr,
    /// The Kafka listener (TCP).
    pub kafka_addr: SocketAddr,
    options: BrokerOptions,
    child: Option<Child>,
    starts: u32,
}

impl Broker {
    /// Starts a broker and waits until `/healthz` answers 200. Ports are picked free, but
    /// another test can take one before the broker binds it: that start is retried on others.
    pub async fn start(options: BrokerOptions) -> Broker {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_owned();
        let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
        let mut reserved = reserved_ports(&options);
        let internal_addr = options.internal.unwrap_or_else(|| {
            let addr = loopback(free_tcp_port_except(&reserved));
            reserved.push(addr.port());
            addr
        });
        let admin_addr = loopback(free_tcp_port_except(&reserved));
        reserved.push(admin_addr.port());
        let kafka_addr = loopback(free_tcp_port_except(&reserved));
        let mut broker = Broker {
            dir: Some(dir),
            root,
            quic_addr: loopback(free_udp_port()),
            admin_addr,
            internal_addr,
            kafka_addr,
            options,
            child: None,
            starts: 0,
        };
        for attempt in 1.. {
            match broker.spawn_and_wait().await {
                Ok(()) => break,
                Err(e) if attempt < 3 && e.contains("in use") => {
                    eprintln!("felix could not bind its ports, retrying on others: {e}");
                    let _ = std::fs::remove_dir_all(broker.data_dir());
                    let mut reserved = reserved_ports(&broker.options);
                    broker.quic_addr = loopback(free_udp_port());
                    if broker.options.internal.is_none() {
                        broker.internal_addr = loopback(free_tcp_port_except(&reserved));
                    }
                    reserved.push(broker.internal_addr.port());
                    broker.admin_addr = loopback(free_tcp_port_except(&reserved));
                    reserved.push(broker.admin_addr.port());
                    broker.kafka_addr = loopback(free_tcp_port_except(&reserved));
                }
                Err(e) => panic!("{e}"),
            }
        }
        broker
    }

    pub fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    /// The internal (broker-to-broker) HTTP address.
    pub fn internal_addr(&self) -> SocketAddr {
        self.internal_addr
    }

    /// The broker process's resident memory, from /proc.
    pub fn rss_bytes(&self) -> u64 {
        let pid = self.child.as_ref().map(Child::id).expect("broker running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("VmRSS")
            * 1024
    }

    pub fn log_path(&self) -> PathBuf {
        self.root.join("broker.log")
    }

    async fn spawn_and_wait(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "broker already running");
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("broker log file");
        {
            use std::io::Write;
            let mut l = &log;
            let _ = writeln!(l, "===== test harness: start #{} =====", self.starts);
        }
        let mut cmd = Command::new(BIN);
        cmd.arg("--data-dir")
            .arg(self.data_dir())
            .args(["--quic-addr", &self.quic_addr.to_string()])
            .args(["--admin-addr", &self.admin_addr.to_string()])
            .args(["--internal-addr", &self.internal_addr.to_string()])
            .args(["--kafka-addr", &self.kafka_addr.to_string()]);
        if let Some(f) = &self.options.fsync {
            cmd.args(["--fsync", f]);
        }
        cmd.args(&self.options.args);
        // Only this test's settings: nothing inherited from the environment running the tests.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("FELIX_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("FELIX_LOG", "info,openraft=warn")
            .envs(self.options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let child = cmd.spawn().expect("spawn the felix binary");
        self.child = Some(child);
        self.wait_ready().await
    }

    /// Waits for `/healthz`; an early exit is an error carrying the log's tail.
    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!(
                    "felix exited with {status} before it was ready; log at {}:\n{}",
                    self.log_path().display(),
                    tail(&self.log_path(), 20)
                ));
            }
            // Ready: our own process said so (its ready line, in this start's part of the log;
            // a port race could put someone else on the admin address) and `/healthz` agrees.
            if self.logged_ready()
                && let Ok((200, _)) = http_get(self.admin_addr, "/healthz").await
            {
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "felix not ready within {READY_WITHIN:?}; log at {}",
                self.log_path().display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether the log has a `felix node N ready` line since the last start marker.
    fn logged_ready(&self) -> bool {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let marker = format!("===== test harness: start #{} =====", self.starts);
        log.split_once(&marker).is_some_and(|(_, since)| {
            since
                .lines()
                .any(|l| l.starts_with("felix node ") && l.contains(" ready"))
        })
    }

    /// Whether the broker process was started and not killed since.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILLs the broker and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL on unix
            let _ = c.wait();
        }
    }

    /// SIGSTOPs (`true`) or SIGCONTs (`false`) the process.
    pub fn pause(&self, stop: bool) {
        let pid = self.child.as_ref().expect("broker running").id();
        let status = Command::new("kill")
            .arg(if stop { "-STOP" } else { "-CONT" })
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -STOP/-CONT {pid} failed");
    }

    /// Starts the broker again on the same data dir and ports.
    ///
    /// Another test may have taken one of its client-facing ports meanwhile (ports are
    /// picked free, then released): then it starts on other ones, as a replaced machine
    /// would. The internal address, a cluster member's identity, never changes.
    pub async fn restart(&mut self) {
        self.kill();
        for attempt in 1.. {
            match self.spawn_and_wait().await {
                Ok(()) => return,
                Err(e) if attempt < 3 && e.contains("in use") => {
                    eprintln!("felix could not bind its ports again, restarting on others: {e}");
                    let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
                    self.quic_addr = loopback(free_udp_port());
                    self.admin_addr = loopback(free_tcp_port());
                    self.kafka_addr = loopback(free_tcp_port());
                }
                Err(e) => panic!("restart: {e}"),
            }
        }
    }

    /// A client with the default configuration (loopback needs no CA).
    /// A connection to this broker, as its operator: with the bootstrap admin token when
    /// auth is on (the broker wrote it to its data directory), with none otherwise.
    pub async fn client(&self) -> Connection {
        let config = ClientConfig {
            token: self.admin_token(),
            ..ClientConfig::default()
        };
        Connection::connect(&self.quic_addr.to_string(), config)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.quic_addr))
    }

    /// The bootstrap admin token in the data directory, if auth is on.
    pub fn admin_token(&self) -> Option<String> {
        let text = std::fs::read_to_string(self.data_dir().join("admin.token")).ok()?;
        Some(text.trim().to_owned())
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        let (status, body) = http_get(self.admin_addr, "/metrics")
            .await
            .expect("GET /metrics");
        assert_eq!(status, 200, "GET /metrics answered {status}: {body}");
        body
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking()
            && let Some(dir) = self.dir.take()
        {
            let kept = dir.keep();
            let log = kept.join("broker.log");
            eprintln!(
                "---- broker log kept at {} (tail follows) ----",
                log.display()
            );
            eprintln!("{}", tail(&log, 60));
        }
    }
}

/// The last `n` lines of a file.
fn tail(path: &Path, n: usize) -> String {
    let Ok(f) = std::fs::File::open(path) else {
        return String::from("(no log)");
    };
    let lines: Vec<String> = BufReader::new(f).lines().map_while(Result::ok).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A plain HTTP/1.1 GET: the status and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http_request(addr, "GET", path).await
}

/// A plain HTTP/1.1 request without a body: the status and body.
pub async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
) -> std::io::Result<(u16, String)> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {text:?}")))?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("HTTP GET timed out")))
}

/// The lines of a metrics text for `name` (with or without labels), e.g.
/// `felix_tenant_publish_queue_full_total{tenant="a",action="waited"} 3`.
pub fn metric_lines<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .collect()
}

/// The value at the end of a metric line.
pub fn metric_value(line: &str) -> f64 {
    line.rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric line without a value: {line}"))
}

/// Creates tenant, namespace and a durable stream of `shards` shards.
pub async fn durable_stream(
    client: &Connection,
    tenant: &str,
    ns: &str,
    stream: &str,
    shards: u32,
) {
    client.create_tenant(tenant).await.expect("create tenant");
    client
        .create_namespace(tenant, ns)
        .await
        .expect("create namespace");
    client
        .create_stream(
            tenant,
            ns,
            stream,
            StreamConfig {
                durable: Some(true),
                shards: Some(shards),
                ..Default::default()
            },
        )
        .await
        .expect("create stream");
}

/// Reads events until one at or past `end_offset - 1` (i.e. all offsets below `end_offset`
/// were offered), failing after [`PATIENCE`] or on any error.
pub async fn read_until(sub: &mut Subscription, end_offset: u64, what: &str) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    if end_offset == 0 {
        return out;
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let ev = tokio::time::timeout_at(deadline, sub.next_event())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{what}: only {} events (last offset {:?}) after {PATIENCE:?}, waiting for offset {}",
                    out.len(),
                    out.last().map(|e| e.offset),
                    end_offset - 1
                )
            });
        match ev {
            Ok(Some(e)) => {
                let done = e.offset + 1 >= end_offset;
                out.push(e);
                if done {
                    return out;
                }
            }
            Ok(None) => panic!(
                "{what}: subscription ended after {} events (last offset {:?}) before offset {}",
                out.len(),
                out.last().map(|e| e.offset),
                end_offset - 1
            ),
            Err(e) => panic!(
                "{what}: subscription failed after {} events (last offset {:?}): {e:?}",
                out.len(),
                out.last().map(|e| e.offset)
            ),
        }
    }
}

/// Asserts offsets run `from, from+1, ...` with nothing skipped or repeated.
pub fn assert_contiguous(events: &[Event], from: u64, what: &str) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e.offset,
            from + i as u64,
            "{what}: event #{i} has offset {} (expected {}): a gap or a duplicate",
            e.offset,
            from + i as u64
        );
    }
}

/// The leader of shard 0 of `tenant/namespace/stream` as the cluster's topology names it,
/// once there is one other than `not` (a failover's new leader).
pub async fn shard_leader(
    client: &ClusterClient,
    (tenant, namespace, stream): (&str, &str, &str),
    not: Option<u64>,
) -> u64 {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Ok(t) = client.topology(tenant, namespace, stream).await
            && let Some((id, _)) = t.leader(0)
            && Some(id) != not
        {
            return id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no leader (other than {not:?}) for {stream} within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
