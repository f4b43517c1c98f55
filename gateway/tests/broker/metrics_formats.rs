//! `/metrics` content negotiation on a real broker (docs/operations.md, "Metrics"): a
//! scraper that asks for the Prometheus text format (`Accept: text/plain; version=0.0.4`)
//! gets it, and `promtool check metrics` (Prometheus 2.42's own linter, from Debian's
//! `prometheus` package, installed by scripts/test.sh) finds nothing to say about it;
//! Prometheus' own Accept header, a bare `*/*` and no header get OpenMetrics. Both carry the
//! same series with the same values.
//!
//! A step of a test that already runs a broker with traffic (`broker::felixctl`), so the
//! families have series of every kind (counters, gauges, histograms) when it looks.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Stdio;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::common::{Broker, PATIENCE};

/// What Prometheus 2.42 sends when it scrapes.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,\
     application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// `GET /metrics` with an optional Accept header: the lowercased head and the body.
async fn scrape(addr: SocketAddr, accept: Option<&str>) -> (String, String) {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the admin API");
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    let req = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("send");
    let mut buf = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut buf))
        .await
        .expect("the admin API answers")
        .expect("read");
    let text = String::from_utf8(buf).expect("UTF-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    (head.to_ascii_lowercase(), body.to_owned())
}

/// Every sample line as `series -> value`, leaving out what only OpenMetrics has.
fn samples(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("a sample has a value");
            (series.to_owned(), value.to_owned())
        })
        .filter(|(series, _)| {
            !series
                .split('{')
                .next()
                .is_some_and(|n| n.ends_with("_created"))
        })
        .collect()
}

/// Runs `promtool check metrics` on `text`: its exit code and what it printed.
async fn promtool_check(text: &str) -> (Option<i32>, String) {
    let mut child = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}); scripts/test.sh installs Debian's prometheus")
        });
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(text.as_bytes())
        .await
        .expect("feed promtool");
    drop(stdin);
    let out = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("promtool finishes")
        .expect("promtool output");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), said)
}

/// The step: both formats on request, the same series in each, promtool clean.
pub(super) async fn metrics_negotiate_the_format_and_promtool_finds_nothing(broker: &Broker) {
    let addr = broker.admin_addr;
    let (head, text) = scrape(addr, Some("text/plain; version=0.0.4")).await;
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "asked for the text format: {head}"
    );
    assert!(
        !text.contains("# EOF"),
        "no OpenMetrics framing in the text format"
    );
    let (code, said) = promtool_check(&text).await;
    assert_eq!(
        (code, said.trim()),
        (Some(0), ""),
        "promtool check metrics on the text format"
    );

    for accept in [Some(PROMETHEUS_ACCEPT), Some("*/*"), None] {
        let (head, om) = scrape(addr, accept).await;
        assert!(
            head.contains("content-type: application/openmetrics-text; version=1.0.0"),
            "Accept {accept:?}: {head}"
        );
        assert!(
            om.ends_with("# EOF\n"),
            "Accept {accept:?}: OpenMetrics ends with EOF"
        );
    }
    // The same series either way. A series can appear between two scrapes (a background
    // task's first sample), so the pair is taken again until both saw the same set.
    let mut pair = None;
    for _ in 0..5 {
        let (_, om) = scrape(addr, None).await;
        let (_, text) = scrape(addr, Some("text/plain")).await;
        let (om, text) = (samples(&om), samples(&text));
        if om.keys().eq(text.keys()) {
            pair = Some((om, text));
            break;
        }
        pair = Some((om, text));
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (om, text) = pair.expect("scraped");
    assert_eq!(
        om.keys().collect::<Vec<_>>(),
        text.keys().collect::<Vec<_>>(),
        "the same series in both formats"
    );
    // Values of a family that moves only with what this test does are equal.
    let quiet: Vec<_> = om
        .iter()
        .filter(|(s, _)| s.starts_with("felix_tenant_publish_queue_full_total{"))
        .collect();
    assert!(!quiet.is_empty(), "seeded tenant series are there");
    for (series, value) in quiet {
        assert_eq!(text.get(series), Some(value), "{series}");
    }
}
