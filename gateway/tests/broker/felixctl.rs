//! `felixctl` against a real broker: create a tenant, a namespace and a durable stream,
//! publish stdin lines with `--output jsonl` (one acknowledgement line per input line, in
//! input order, naming its shard and offset), and read them back with `subscribe --from earliest`.
//!
//! felixctl belongs to felix-client, so Cargo does not hand this binary its path: it is
//! looked for beside the test's own target directory and built there when missing or older
//! than its sources.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::SystemTime;

use tokio::io::AsyncWriteExt;

use super::common::{Broker, BrokerOptions, PATIENCE};

/// The newest modification time of the files under `dir`.
fn newest_under(dir: &Path) -> SystemTime {
    let mut newest = SystemTime::UNIX_EPOCH;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return newest;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let t = if path.is_dir() {
            newest_under(&path)
        } else {
            entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH)
        };
        newest = newest.max(t);
    }
    newest
}

/// The path of a current `felixctl`, building it once if needed.
pub(super) fn felixctl() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        // The test runs as <target>/<profile>/deps/broker-<hash>; binaries sit in <profile>.
        let exe = std::env::current_exe().expect("the test binary's path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("the target profile directory");
        let path = profile_dir.join(format!("felixctl{}", std::env::consts::EXE_SUFFIX));
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the workspace root");
        let sources = ["client", "wire"]
            .iter()
            .map(|c| newest_under(&workspace.join(c)))
            .max()
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let built = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        if built.is_none_or(|b| b < sources) {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let mut cmd = std::process::Command::new(cargo);
            cmd.args(["build", "-p", "felix-client", "--bin", "felixctl"])
                .current_dir(workspace);
            if profile_dir.file_name().is_some_and(|n| n == "release") {
                cmd.arg("--release");
            }
            eprintln!("building felixctl: {cmd:?}");
            let status = cmd.status().expect("run cargo to build felixctl");
            assert!(status.success(), "cargo build of felixctl failed: {status}");
        }
        assert!(path.exists(), "felixctl not found at {}", path.display());
        path
    })
}

pub(super) struct Output {
    pub(super) stdout: String,
    pub(super) stderr: String,
}

/// Runs `felixctl --broker ADDR ARGS...` with `stdin`, requiring success.
pub(super) async fn run(broker: &Broker, args: &[&str], stdin: &[u8]) -> Output {
    succeeded(spawn(broker, None, args, stdin).await, args)
}

/// [`run`] in the working directory `cwd`.
pub(super) async fn run_in(broker: &Broker, cwd: &Path, args: &[&str], stdin: &[u8]) -> Output {
    succeeded(spawn(broker, Some(cwd), args, stdin).await, args)
}

/// Runs felixctl in `cwd` without requiring success: whether it succeeded, and its stderr.
pub(super) async fn run_status_in(
    broker: &Broker,
    cwd: &Path,
    args: &[&str],
    stdin: &[u8],
) -> (bool, String) {
    let (status, out) = spawn(broker, Some(cwd), args, stdin).await;
    (status.success(), out.stderr)
}

fn succeeded((status, output): (std::process::ExitStatus, Output), args: &[&str]) -> Output {
    assert!(
        status.success(),
        "felixctl {args:?} exited with {}\nstdout:\n{}\nstderr:\n{}",
        status,
        output.stdout,
        output.stderr
    );
    output
}

async fn spawn(
    broker: &Broker,
    cwd: Option<&Path>,
    args: &[&str],
    stdin: &[u8],
) -> (std::process::ExitStatus, Output) {
    let mut cmd = tokio::process::Command::new(felixctl());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("FELIX_") {
            cmd.env_remove(k);
        }
    }
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let mut child = cmd
        .arg("--broker")
        .arg(broker.quic_addr.to_string())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn felixctl");
    let mut input = child.stdin.take().expect("felixctl stdin");
    input
        .write_all(stdin)
        .await
        .expect("write felixctl's stdin");
    drop(input);
    let out = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("felixctl {args:?} did not finish within {PATIENCE:?}"))
        .expect("felixctl output");
    let output = Output {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    (out.status, output)
}

fn json_lines(out: &Output, what: &str) -> Vec<serde_json::Value> {
    out.stdout
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| {
                panic!(
                    "{what}: not a JSON line ({e}): {l:?}\nstderr:\n{}",
                    out.stderr
                )
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn felixctl_creates_publishes_stdin_lines_and_subscribes_them_back() {
    let broker = Broker::start(BrokerOptions::new()).await;
    run(&broker, &["tenant", "create", "smoke"], b"").await;
    run(&broker, &["namespace", "create", "smoke/ns"], b"").await;
    // A new tenant's series exist at 0 before anything happens to it, so the first
    // refusal of a kind shows in Prometheus' increase().
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let seeded = "felix_tenant_publish_queue_full_total{tenant=\"smoke\",action=\"shed\"} 0";
    while !broker.metrics().await.contains(seeded) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no zero series for the new tenant: {seeded}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let metrics = broker.metrics().await;
    for line in [
        "felix_publish_errors_total{tenant=\"smoke\",reason=\"publish_queue_full\"} 0",
        "felix_sub_queue_dropped_total{tenant=\"smoke\"} 0",
        "felix_connections_refused_total{listener=\"kafka\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} missing");
    }
    // Three shards: key-less batches go to the shards in turn, so the acknowledgements
    // must name their shard for a script to pair each with its record.
    let created = run(
        &broker,
        &[
            "stream",
            "create",
            "smoke/ns/lines",
            "--durable",
            "--shards",
            "3",
        ],
        b"",
    )
    .await;
    let info: serde_json::Value = serde_json::from_str(created.stdout.trim())
        .unwrap_or_else(|e| panic!("stream create prints JSON ({e}): {}", created.stdout));
    assert_eq!(info["name"], "lines", "{info}");
    assert_eq!(info["config"]["durable"], true, "{info}");

    let lines: Vec<String> = (1..=25)
        .map(|i| format!("line {i}: {}", "é-\"quoted\"-".repeat(i % 4)))
        .collect();
    let input = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
    // Small batches, so several publishes carry the lines.
    let published = run(
        &broker,
        &[
            "publish",
            "smoke/ns/lines",
            "--output",
            "jsonl",
            "--batch-size",
            "4",
            "--header",
            "trace=t-1",
            "--header",
            "env=a=b",
        ],
        input.as_bytes(),
    )
    .await;
    let acks = json_lines(&published, "publish --output jsonl");
    assert_eq!(
        acks.len(),
        lines.len(),
        "one line per input line:\n{}",
        published.stdout
    );
    let mut last_offset: std::collections::HashMap<u64, u64> = Default::default();
    for (i, ack) in acks.iter().enumerate() {
        assert_eq!(
            ack["line"],
            i as u64 + 1,
            "acknowledgements in input order: {ack}"
        );
        let shard = ack["shard"]
            .as_u64()
            .unwrap_or_else(|| panic!("a shard: {ack}"));
        let offset = ack["offset"]
            .as_u64()
            .unwrap_or_else(|| panic!("an offset: {ack}"));
        let last = last_offset.insert(shard, offset);
        assert!(
            last.is_none_or(|l| offset > l),
            "offsets increase within shard {shard}: {offset} after {last:?}"
        );
    }
    assert!(
        last_offset.len() > 1,
        "key-less batches spread over the shards: {last_offset:?}"
    );

    let count = lines.len().to_string();
    let read = run(
        &broker,
        &[
            "subscribe",
            "smoke/ns/lines",
            "--from",
            "earliest",
            "--count",
            &count,
            "--output",
            "jsonl",
        ],
        b"",
    )
    .await;
    let events = json_lines(&read, "subscribe --output jsonl");
    assert_eq!(
        events.len(),
        lines.len(),
        "--count {count} prints {count} records"
    );
    // Every acknowledgement's (shard, offset) holds the line it names.
    let stored: std::collections::HashMap<(u64, u64), String> = events
        .iter()
        .map(|e| {
            let at = (e["shard"].as_u64().unwrap(), e["offset"].as_u64().unwrap());
            (at, e["payload"].as_str().unwrap().to_owned())
        })
        .collect();
    // Every record carries the --header pairs, in order, as subscribe prints them.
    for e in &events {
        assert_eq!(
            e["headers"],
            serde_json::json!([{"key": "trace", "value": "t-1"}, {"key": "env", "value": "a=b"}]),
            "{e}"
        );
    }
    for ack in &acks {
        let at = (
            ack["shard"].as_u64().unwrap(),
            ack["offset"].as_u64().unwrap(),
        );
        let line = ack["line"].as_u64().unwrap() as usize;
        assert_eq!(
            stored.get(&at),
            Some(&lines[line - 1]),
            "the record at shard {} offset {} is line {line}",
            at.0,
            at.1
        );
    }
    no_limit_reads_as_null(&broker).await;
    the_admin_api_describes_itself(&broker).await;
    super::felixctl_output::segments_table_and_publish_progress(&broker, "smoke/ns/lines").await;
    super::metrics_formats::metrics_negotiate_the_format_and_promtool_finds_nothing(&broker).await;
}

/// "No hot-retention limit" is u64::MAX on the wire; printed as 18446744073709551615 it is
/// rounded by jq and JavaScript (to 18446744073709552000, a limit). felixctl's stream JSON
/// and the admin HTTP API print `null` instead, and the HTTP API takes `null` to mean it.
async fn no_limit_reads_as_null(broker: &Broker) {
    // The default hot retention is "no limit" on both settings.
    let created = run(broker, &["stream", "create", "smoke/ns/unbounded"], b"").await;
    let described = run(broker, &["stream", "describe", "smoke/ns/unbounded"], b"").await;
    let listed = run(broker, &["stream", "list", "smoke/ns"], b"").await;
    let listed: serde_json::Value = serde_json::from_str(&listed.stdout).expect("list JSON");
    let listed = listed
        .as_array()
        .and_then(|l| l.iter().find(|s| s["name"] == "unbounded"))
        .cloned()
        .expect("the stream is listed");
    for (what, out) in [
        ("create", created.stdout),
        ("describe", described.stdout),
        ("list", listed.to_string()),
    ] {
        assert!(
            !out.contains("18446744073709551615"),
            "stream {what} prints u64::MAX: {out}"
        );
        let info: serde_json::Value = serde_json::from_str(&out).expect("stream JSON");
        for key in ["hot_retention_ms", "hot_retention_bytes"] {
            let v = info["config"].get(key);
            assert_eq!(
                v,
                Some(&serde_json::Value::Null),
                "stream {what}: {key}: {out}"
            );
        }
    }

    let path = "/v1/streams/smoke/ns/unbounded";
    let (status, body) = http_json(broker, "GET", path, "").await;
    assert_eq!(status, 200, "{body}");
    let info: serde_json::Value = serde_json::from_str(&body).expect("HTTP stream JSON");
    assert_eq!(
        info["config"]["hot_retention_ms"],
        serde_json::Value::Null,
        "{body}"
    );
    assert!(!body.contains("18446744073709551615"), "{body}");

    // A limit reads back as itself; a written `null` puts "no limit" back.
    let (status, body) = http_json(broker, "PATCH", path, r#"{"hot_retention_bytes": 4096}"#).await;
    assert_eq!(status, 200, "{body}");
    let info: serde_json::Value = serde_json::from_str(&body).expect("PATCH answer");
    assert_eq!(info["config"]["hot_retention_bytes"], 4096, "{body}");
    assert_eq!(
        info["config"]["hot_retention_ms"],
        serde_json::Value::Null,
        "{body}"
    );
    let (status, body) = http_json(broker, "PATCH", path, r#"{"hot_retention_bytes": null}"#).await;
    assert_eq!(status, 200, "{body}");
    let described = run(broker, &["stream", "describe", "smoke/ns/unbounded"], b"").await;
    let info: serde_json::Value = serde_json::from_str(&described.stdout).expect("describe");
    assert_eq!(
        info["config"]["hot_retention_bytes"],
        serde_json::Value::Null,
        "null on input means no limit again: {}",
        described.stdout
    );
    // Bad input is refused and changes nothing.
    let (status, body) = http_json(broker, "PATCH", path, r#"{"hot_retention_ms": "soon"}"#).await;
    assert_eq!(status, 400, "{body}");
    let (_, body) = http_json(broker, "GET", path, "").await;
    let info: serde_json::Value = serde_json::from_str(&body).expect("HTTP stream JSON");
    assert_eq!(
        info["config"]["hot_retention_ms"],
        serde_json::Value::Null,
        "{body}"
    );
}

/// The admin HTTP API of a real broker process describes itself: `GET /v1` lists its
/// routes, an unknown path is 404 `not_found`, a known path with another method is 405
/// `method_not_allowed` naming the methods it takes (gateway::admin's unit test requests
/// every listed route and checks the `Allow` header).
async fn the_admin_api_describes_itself(broker: &Broker) {
    let (status, body) = http_json(broker, "GET", "/v1", "").await;
    assert_eq!(status, 200, "{body}");
    let listed: serde_json::Value = serde_json::from_str(&body).expect("GET /v1 is JSON");
    let paths: Vec<&str> = listed["routes"]
        .as_array()
        .expect("routes")
        .iter()
        .filter_map(|r| r["path"].as_str())
        .collect();
    for path in [
        "/metrics",
        "/healthz",
        "/v1/tenants",
        "/v1/streams/{tenant}/{namespace}",
    ] {
        assert!(paths.contains(&path), "{path} listed: {body}");
    }
    let (status, body) = http_json(broker, "GET", "/v1/no/such/route", "").await;
    assert_eq!(status, 404, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).expect("a JSON refusal");
    assert_eq!(error["reason"], "not_found", "{body}");
    let (status, body) = http_json(broker, "PUT", "/v1/tenants", "{}").await;
    assert_eq!(status, 405, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).expect("a JSON refusal");
    assert_eq!(error["reason"], "method_not_allowed", "{body}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("GET") && message.contains("POST"),
        "the allowed methods named: {body}"
    );
}

/// One HTTP/1.1 request to the admin API with a JSON body: the status and body.
async fn http_json(broker: &Broker, method: &str, path: &str, body: &str) -> (u16, String) {
    use tokio::io::AsyncReadExt;
    let addr = broker.admin_addr;
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the admin API");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("send");
    let mut buf = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut buf))
        .await
        .expect("the admin API answers")
        .expect("read");
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned());
    (status, body.unwrap_or_default())
}
