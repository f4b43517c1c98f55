//! The `failover` scenario: how long a Quorum shard takes to acknowledge publishes again
//! after its leader is SIGKILLed, as a client sees it.
//!
//! Setup: a running cluster (`--cluster` seeds) whose brokers' process ids are given
//! (`--pids 1=PID,2=PID,3=PID`, broker id = node id). A fresh durable 1-shard stream with
//! `--replicas` replicas and `consistency: quorum` in tenant `bench`, namespace `cluster`
//! (a Leader stream promotes nobody when its leader dies, so it has no failover to time).
//!
//! Load: one idempotent producer of a `ClusterClient` publishes one `--size`-byte record per
//! call, one call every `--interval-ms` (a call in progress delays the next; missed ticks
//! are not made up). After `--warmup-secs`, right after an acknowledgement arrives, the
//! benchmark sends SIGKILL to the process of the shard's leader (from a fresh topology) and
//! notes the instant; nothing is in flight then, so every acknowledgement after it comes
//! from another broker. Publishing goes on until `--after-secs` past the first
//! acknowledgement after the kill.
//!
//! Figures: `recovery_ms`, the kill to the first acknowledgement after it (what a
//! publisher waits: lease expiry, a controller tick, a control-plane election when the
//! victim also led the control plane, and the client noticing and re-routing);
//! `leader_visible_ms`, the kill to the first topology (polled every 50 ms on its own
//! client) naming a live leader other than the victim; the largest gap between consecutive
//! acknowledgements; ack latency before the kill and after recovery. With `--internal`
//! (`1=HOST:PORT,...`, the brokers' internal addresses) it also reports which broker led the
//! control plane before and after (`GET /meta/status`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use felix_client::{ClientError, ClusterClient, IdempotentClusterProducer, Message};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cluster::{cluster_client, create_cluster_stream, first_publish};
use crate::common::{TENANT, histogram, payload_template, print_line, runtime};

const NAMESPACE: &str = "cluster";

#[derive(Args, Debug, Clone)]
pub struct FailoverArgs {
    /// The brokers' QUIC addresses, comma-separated (a loopback cluster needs no CA).
    #[arg(long, value_name = "SEEDS", value_delimiter = ',', required = true)]
    cluster: Vec<String>,
    /// Each broker's process id, `ID=PID` comma-separated: the shard leader's is killed.
    #[arg(
        long,
        value_name = "ID=PID,...",
        value_delimiter = ',',
        required = true
    )]
    pids: Vec<String>,
    /// Each broker's internal (control-plane) address, `ID=HOST:PORT` comma-separated, to
    /// report which broker led the control plane before and after.
    #[arg(long, value_name = "ID=ADDR,...", value_delimiter = ',')]
    internal: Vec<String>,
    /// PEM CA file to verify non-loopback brokers with.
    #[arg(long)]
    ca: Option<std::path::PathBuf>,
    /// The stream's replicas.
    #[arg(long, default_value_t = 3)]
    replicas: u32,
    /// Milliseconds between publish calls.
    #[arg(long, default_value_t = 5)]
    interval_ms: u64,
    /// Payload bytes per record.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Seconds of steady publishing before the kill.
    #[arg(long, default_value_t = 3.0)]
    warmup_secs: f64,
    /// Seconds of publishing after the first acknowledgement after the kill.
    #[arg(long, default_value_t = 2.0)]
    after_secs: f64,
    /// Seconds to wait for an acknowledgement after the kill before giving up.
    #[arg(long, default_value_t = 120)]
    timeout_secs: u64,
    /// The client's request timeout, in seconds (an idempotent publish is re-sent until
    /// then).
    #[arg(long, default_value_t = 60)]
    request_timeout_secs: u64,
    /// Keep the benchmark stream afterwards instead of deleting it.
    #[arg(long)]
    keep: bool,
}

#[derive(Serialize)]
struct FailoverReport {
    scenario: &'static str,
    stream: String,
    brokers: usize,
    replicas: u32,
    consistency: &'static str,
    interval_ms: u64,
    record_bytes: usize,
    placed_replicas: Vec<u64>,
    killed_broker: u64,
    killed_pid: i32,
    /// Control-plane leader before the kill and after recovery (with `--internal`).
    controller_before: Option<u64>,
    controller_after: Option<u64>,
    killed_controller: Option<bool>,
    /// The shard's leader after recovery.
    new_leader: Option<u64>,
    /// Kill to the first acknowledgement after it.
    recovery_ms: f64,
    /// Kill to the first topology naming a live leader other than the victim.
    leader_visible_ms: Option<f64>,
    /// The largest gap between consecutive acknowledgements.
    max_ack_gap_ms: f64,
    /// Publish calls that returned an error after the kill (each re-sent within the
    /// request timeout first; the producer is replaced after one).
    publish_errors: u64,
    acked_before_kill: u64,
    ack_before_p50_us: u64,
    ack_before_p99_us: u64,
    /// The publish call in progress across the failover, from its start to its ack.
    stalled_call_ms: f64,
    acked_after_recovery: u64,
    ack_after_p50_us: u64,
    ack_after_p99_us: u64,
}

/// `ID=VALUE,...` into a map.
fn id_map(items: &[String], what: &str) -> anyhow::Result<BTreeMap<u64, String>> {
    items
        .iter()
        .map(|item| {
            let (id, value) = item
                .split_once('=')
                .with_context(|| format!("{what}: `{item}` is not ID=VALUE"))?;
            let id = id
                .trim()
                .parse()
                .with_context(|| format!("{what}: bad broker id in `{item}`"))?;
            Ok((id, value.trim().to_owned()))
        })
        .collect()
}

/// The control plane's leader as `addr` sees it (`GET /meta/status`); `None` on any failure.
async fn controller_leader(addr: &str) -> Option<u64> {
    let fetch = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request =
            format!("GET /meta/status HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        conn.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        conn.read_to_end(&mut response).await.ok()?;
        let text = String::from_utf8_lossy(&response);
        let (head, body) = text.split_once("\r\n\r\n")?;
        if !head.starts_with("HTTP/1.1 200") {
            return None;
        }
        let status: serde_json::Value = serde_json::from_str(body).ok()?;
        status.get("leader")?.as_u64()
    };
    tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .ok()
        .flatten()
}

/// The control-plane leader according to the first of `internal` (skipping `skip`) that
/// answers.
async fn any_controller_leader(internal: &BTreeMap<u64, String>, skip: Option<u64>) -> Option<u64> {
    for (id, addr) in internal {
        if Some(*id) == skip {
            continue;
        }
        if let Some(leader) = controller_leader(addr).await {
            return Some(leader);
        }
    }
    None
}

/// One publish call's outcome.
struct Call {
    started: Instant,
    ended: Instant,
    ok: bool,
}

async fn publish_one(
    producer: &IdempotentClusterProducer,
    stream: &str,
    payload: &Message,
) -> Result<(), ClientError> {
    producer
        .publish_to_shard(TENANT, NAMESPACE, stream, 0, std::slice::from_ref(payload))
        .await
        .map(|_| ())
}

/// Polls the topology every 50 ms from `since` until it names a live leader other than
/// `victim`; the instant it did and the leader.
async fn watch_leader(
    client: ClusterClient,
    stream: String,
    victim: u64,
    until: Instant,
) -> Option<(Instant, u64)> {
    while Instant::now() < until {
        if let Ok(Ok(t)) = tokio::time::timeout(
            Duration::from_secs(2),
            client.topology(TENANT, NAMESPACE, &stream),
        )
        .await
            && let Some((leader, _)) = t.leader(0)
            && leader != victim
        {
            return Some((Instant::now(), leader));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

pub fn run(args: FailoverArgs) -> anyhow::Result<()> {
    if args.interval_ms == 0 || args.size == 0 {
        bail!("--interval-ms and --size must be at least 1");
    }
    let pids = id_map(&args.pids, "--pids")?;
    let pids: BTreeMap<u64, i32> = pids
        .into_iter()
        .map(|(id, pid)| {
            Ok((
                id,
                pid.parse()
                    .with_context(|| format!("--pids: bad pid {pid}"))?,
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let internal = id_map(&args.internal, "--internal")?;
    print_line(&runtime()?.block_on(run_async(&args, &pids, &internal))?)
}

async fn run_async(
    args: &FailoverArgs,
    pids: &BTreeMap<u64, i32>,
    internal: &BTreeMap<u64, String>,
) -> anyhow::Result<FailoverReport> {
    let timeout = Duration::from_secs(args.request_timeout_secs);
    let admin = cluster_client(&args.cluster, args.ca.clone(), timeout).await?;
    let (stream, placed, _) = create_cluster_stream(
        &admin,
        NAMESPACE,
        "failover",
        "quorum",
        args.replicas,
        Duration::from_secs(90),
        None,
    )
    .await?;

    let client = cluster_client(&args.cluster, args.ca.clone(), timeout).await?;
    let mut producer = client
        .idempotent_producer()
        .await
        .context("idempotent producer")?;
    let payload = Message::new(payload_template(args.size));
    // The connection to the leader opens outside the measurement.
    first_publish(|| publish_one(&producer, &stream, &payload)).await?;

    let interval = Duration::from_millis(args.interval_ms);
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = Instant::now();
    let warmup = Duration::from_secs_f64(args.warmup_secs);
    let mut calls: Vec<Call> = Vec::new();
    // (victim id, pid, kill instant, controller leader before)
    let mut killed: Option<(u64, i32, Instant, Option<u64>)> = None;
    let mut watcher = None;
    let mut recovered: Option<Instant> = None;
    let mut publish_errors = 0u64;
    loop {
        ticks.tick().await;
        let t0 = Instant::now();
        let result = publish_one(&producer, &stream, &payload).await;
        let t1 = Instant::now();
        calls.push(Call {
            started: t0,
            ended: t1,
            ok: result.is_ok(),
        });
        if let Err(e) = &result {
            eprintln!("failover: publish failed: {e}");
            publish_errors += 1;
            // A batch whose outcome stayed unknown may leave the sequence behind: start
            // afresh (a later sequence would be refused as out of order).
            producer = client
                .idempotent_producer()
                .await
                .context("idempotent producer after an error")?;
        }
        match (killed, recovered) {
            (None, _) if result.is_ok() && t1 - started >= warmup => {
                let topology = admin
                    .topology(TENANT, NAMESPACE, &stream)
                    .await
                    .context("topology before the kill")?;
                let Some((victim, _)) = topology.leader(0) else {
                    bail!("the shard has no leader before the kill");
                };
                let &pid = pids
                    .get(&victim)
                    .with_context(|| format!("no --pids entry for broker {victim}"))?;
                let controller = any_controller_leader(internal, None).await;
                let watch_client =
                    cluster_client(&args.cluster, args.ca.clone(), Duration::from_secs(2)).await?;
                // SAFETY: kill(2) on a process id the caller named; no memory is touched.
                let at = Instant::now();
                if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
                    bail!(
                        "kill -9 {pid} (broker {victim}): {}",
                        std::io::Error::last_os_error()
                    );
                }
                eprintln!("failover: killed broker {victim} (pid {pid}) on {stream}");
                killed = Some((victim, pid, at, controller));
                let until = at + Duration::from_secs(args.timeout_secs);
                watcher = Some(tokio::spawn(watch_leader(
                    watch_client,
                    stream.clone(),
                    victim,
                    until,
                )));
            }
            (Some((_, _, at, _)), None) => {
                if result.is_ok() {
                    recovered = Some(t1);
                } else if t1 - at > Duration::from_secs(args.timeout_secs) {
                    bail!("no acknowledgement {}s after the kill", args.timeout_secs);
                }
            }
            (Some(_), Some(r)) if t1 - r >= Duration::from_secs_f64(args.after_secs) => break,
            _ => {}
        }
    }
    let (victim, pid, at, controller_before) = killed.expect("killed before recovery");
    let recovered = recovered.expect("recovered before the end");
    let visible = match watcher {
        Some(w) => w.await.context("leader watcher")?,
        None => None,
    };
    let new_leader = match admin.topology(TENANT, NAMESPACE, &stream).await {
        Ok(t) => t.leader(0).map(|l| l.0),
        Err(_) => visible.map(|v| v.1),
    };
    let controller_after = any_controller_leader(internal, Some(victim)).await;

    let mut before = histogram();
    let mut after = histogram();
    let mut stalled = Duration::ZERO;
    let mut last_ack: Option<Instant> = None;
    let mut max_gap = Duration::ZERO;
    for c in calls.iter().filter(|c| c.ok) {
        let us = (c.ended - c.started).as_micros().max(1) as u64;
        if c.ended <= at {
            before.saturating_record(us);
        } else if c.ended == recovered {
            stalled = c.ended - c.started;
        } else {
            after.saturating_record(us);
        }
        if let Some(prev) = last_ack {
            max_gap = max_gap.max(c.ended - prev);
        }
        last_ack = Some(c.ended);
    }
    if !args.keep {
        // Best effort: the stream is small, and a delete right after a failover may meet a
        // control plane still settling.
        if let Err(e) = admin.delete_stream(TENANT, NAMESPACE, &stream).await {
            eprintln!("failover: delete stream {stream}: {e}");
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(FailoverReport {
        scenario: "failover",
        stream,
        brokers: args.cluster.len(),
        replicas: args.replicas,
        consistency: "quorum",
        interval_ms: args.interval_ms,
        record_bytes: args.size,
        placed_replicas: placed,
        killed_broker: victim,
        killed_pid: pid,
        controller_before,
        controller_after,
        killed_controller: controller_before.map(|c| c == victim),
        new_leader,
        recovery_ms: ms(recovered - at),
        leader_visible_ms: visible.map(|(t, _)| ms(t.saturating_duration_since(at))),
        max_ack_gap_ms: ms(max_gap),
        publish_errors,
        acked_before_kill: before.len(),
        ack_before_p50_us: before.value_at_quantile(0.5),
        ack_before_p99_us: before.value_at_quantile(0.99),
        stalled_call_ms: ms(stalled),
        acked_after_recovery: after.len(),
        ack_after_p50_us: after.value_at_quantile(0.5),
        ack_after_p99_us: after.value_at_quantile(0.99),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_maps_parse_and_reject_garbage() {
        let m = id_map(&["1=10".into(), " 2 = 20".into()], "--pids").unwrap();
        assert_eq!(m.get(&1).map(String::as_str), Some("10"));
        assert_eq!(m.get(&2).map(String::as_str), Some("20"));
        assert!(id_map(&["1:10".into()], "--pids").is_err());
        assert!(id_map(&["x=10".into()], "--pids").is_err());
    }
}
