//! What felixctl prints for a person (docs/client.md, "felixctl"), on a real broker:
//! `felixctl segments`' text table shows each segment's first and last record time, the
//! times `--output jsonl` gives as milliseconds; `felixctl publish --count` on a terminal
//! (a pseudo-terminal from `script`) rewrites one progress line in place with done/total,
//! the rate and the time left, and prints no progress at all when stderr is not a terminal.
//!
//! A step of `broker::felixctl::felixctl_creates_publishes_stdin_lines_and_subscribes_them_back`,
//! which already has a broker and a durable stream with records.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::AsyncReadExt;

use super::common::{Broker, PATIENCE};
use super::felixctl::{felixctl, run};

/// Records asked of a publish that is stopped long before it ends.
const MANY: &str = "1000000";

/// Milliseconds since the epoch as RFC 3339 UTC with milliseconds (what felixctl prints),
/// computed here independently (civil-from-days, H. Hinnant).
fn utc_millis(ms: i64) -> String {
    let (days, rem) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000
    )
}

/// The step's two checks.
pub(super) async fn segments_table_and_publish_progress(broker: &Broker, stream: &str) {
    segments_table_shows_record_times(broker, stream).await;
    progress_only_on_a_terminal(broker, stream).await;
}

async fn segments_table_shows_record_times(broker: &Broker, stream: &str) {
    assert_eq!(utc_millis(1_714_564_800_123), "2024-05-01T12:00:00.123Z");
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let jsonl = run(broker, &["segments", stream, "--output", "jsonl"], b"").await;
    let mut times: HashMap<(u64, u64), (i64, i64)> = HashMap::new();
    for line in jsonl.stdout.lines() {
        let s: serde_json::Value = serde_json::from_str(line).expect("a segment as JSON");
        let (min, max) = (
            s["min_timestamp"].as_i64().expect("min_timestamp"),
            s["max_timestamp"].as_i64().expect("max_timestamp"),
        );
        // Records published by this test, stamped by the broker's clock.
        assert!(
            min <= max && now_ms - min < 3_600_000 && max <= now_ms + 60_000,
            "{s}"
        );
        let at = (
            s["shard"].as_u64().unwrap(),
            s["base_offset"].as_u64().unwrap(),
        );
        times.insert(at, (min, max));
    }
    assert!(!times.is_empty(), "segments listed: {}", jsonl.stdout);

    let text = run(broker, &["segments", stream], b"").await;
    let mut lines = text.stdout.lines();
    let header = lines.next().expect("a header");
    assert!(
        header.contains("FIRST TIME") && header.contains("LAST TIME"),
        "{header}"
    );
    let mut rows = 0;
    for row in lines {
        let cols: Vec<&str> = row.split_whitespace().collect();
        let at = (cols[0].parse().unwrap(), cols[1].parse().unwrap());
        let (min, max) = times
            .get(&at)
            .unwrap_or_else(|| panic!("row {row} is not in the JSON listing"));
        assert_eq!(
            (cols[3], cols[4]),
            (utc_millis(*min).as_str(), utc_millis(*max).as_str()),
            "{row}"
        );
        rows += 1;
    }
    assert_eq!(rows, times.len(), "{}", text.stdout);
}

/// Runs `publish STREAM --count MANY --acks message` (one acknowledged request per record:
/// slow enough to outlast a progress tick), optionally under `script` so its stderr is a
/// terminal; stops it after `for_` and returns everything it wrote to stderr (with
/// `script`: to the terminal).
async fn publish_for(broker: &Broker, stream: &str, terminal: bool, for_: Duration) -> String {
    let args = [
        "--broker",
        &broker.quic_addr.to_string(),
        "publish",
        stream,
        "--count",
        MANY,
        "--size",
        "10",
        "--acks",
        "message",
    ]
    .map(str::to_owned);
    let felixctl = felixctl().to_string_lossy().into_owned();
    let mut cmd = if terminal {
        // util-linux `script`: runs the command on a new pseudo-terminal and copies what it
        // writes there to our stdout.
        let line = std::iter::once(felixctl)
            .chain(args)
            .collect::<Vec<_>>()
            .join(" ");
        let mut c = tokio::process::Command::new("script");
        c.args(["-qfec", &line, "/dev/null"]);
        c
    } else {
        let mut c = tokio::process::Command::new(felixctl);
        c.args(args);
        c
    };
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("FELIX_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn felixctl");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let (mut o, mut e) = (Vec::new(), Vec::new());
    let read = async {
        let _ = tokio::join!(out.read_to_end(&mut o), err.read_to_end(&mut e));
    };
    // The publish of a million records runs far longer than `for_`: stop it then.
    let _ = tokio::time::timeout(for_, read).await;
    let _ = child.start_kill();
    let _ = tokio::time::timeout(PATIENCE, child.wait()).await;
    let (o, e) = (String::from_utf8_lossy(&o), String::from_utf8_lossy(&e));
    if terminal {
        o.into_owned()
    } else {
        e.into_owned()
    }
}

async fn progress_only_on_a_terminal(broker: &Broker, stream: &str) {
    let tty = publish_for(broker, stream, true, Duration::from_millis(3500)).await;
    assert!(
        tty.contains("\r\x1b[2Kfelixctl: "),
        "the progress line is rewritten in place: {tty:?}"
    );
    let line = tty
        .split("\r\x1b[2K")
        .filter(|l| l.starts_with("felixctl: "))
        .last()
        .expect("a progress line");
    assert!(
        line.contains(&format!("/{MANY} records published (")) && line.contains(" records/s, "),
        "done/total and the rate: {line:?}"
    );
    assert!(line.contains("ETA "), "the time left: {line:?}");
    assert!(!line.contains('\n'), "one line, not one per tick: {line:?}");

    let piped = publish_for(broker, stream, false, Duration::from_millis(2500)).await;
    assert!(
        !piped.contains("records published") && !piped.contains('\r'),
        "no progress when stderr is not a terminal: {piped:?}"
    );
}
