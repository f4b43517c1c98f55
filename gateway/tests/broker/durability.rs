//! Broker failure (spec: "Broker Failure", "Consistency: how many brokers must hold it"): a
//! durable stream's acknowledged records survive SIGKILL of the broker process. Publishers
//! write batches with `AckMode::Batch` and remember every acknowledged offset and its payload;
//! the broker is killed mid-publish, restarted on the same data dir, and a subscription from
//! the earliest offset must read every acknowledged record with its exact payload, offsets
//! dense and increasing, and no record twice.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use felix_client::{AckMode, Message, StartAt};
use parking_lot::Mutex;

use super::common::{
    Broker, BrokerOptions, PATIENCE, assert_contiguous, durable_stream, read_until,
};

const TENANT: &str = "durable";
const NS: &str = "ns";
const STREAM: &str = "events";
const SHARDS: u32 = 2;
const PUBLISHERS: usize = 4;
/// Acknowledged records a round waits for before it kills the broker.
const ACKS_BEFORE_KILL: usize = 300;

/// What the publishers of all rounds did.
#[derive(Default)]
struct Ledger {
    /// (shard, offset) → the payload acknowledged there.
    acked: BTreeMap<(u32, u64), Bytes>,
    /// Every payload ever sent, acknowledged or not (an unacknowledged one may survive too).
    sent: HashSet<Bytes>,
    /// Anything wrong the publishers saw while the broker was up.
    failures: Vec<String>,
}

/// A payload that names itself (round, publisher, batch, record) and has a varying length.
fn payload(round: u32, publisher: usize, batch: u64, record: usize) -> Bytes {
    let mut v = format!("r{round}-p{publisher}-b{batch}-i{record}:").into_bytes();
    let len = 24 + ((batch as usize * 7 + record * 131 + publisher * 17) % 900);
    let fill = b'a' + ((batch as usize + record) % 26) as u8;
    v.resize(v.len().max(len), fill);
    Bytes::from(v)
}

/// Runs `PUBLISHERS` publishing tasks until at least `ACKS_BEFORE_KILL` records of this round
/// are acknowledged, lets them run a little longer, then SIGKILLs the broker mid-publish.
async fn publish_then_kill(broker: &mut Broker, round: u32, ledger: &Arc<Mutex<Ledger>>) {
    let client = broker.client().await;
    let killed = Arc::new(AtomicBool::new(false));
    let acked_this_round = Arc::new(Mutex::new(0usize));
    let mut tasks = Vec::new();
    for p in 0..PUBLISHERS {
        let client = client.clone();
        let ledger = ledger.clone();
        let killed = killed.clone();
        let count = acked_this_round.clone();
        tasks.push(tokio::spawn(async move {
            for b in 0u64.. {
                let records = 1 + ((b as usize + p) % 8);
                let payloads: Vec<Bytes> = (0..records).map(|i| payload(round, p, b, i)).collect();
                ledger.lock().sent.extend(payloads.iter().cloned());
                let messages = payloads.iter().cloned().map(Message::new).collect();
                match client
                    .publish_batch(TENANT, NS, STREAM, messages, AckMode::Batch)
                    .await
                {
                    Ok(published) => {
                        let mut l = ledger.lock();
                        let [one] = published.as_slice() else {
                            l.failures.push(format!(
                                "a key-less batch was acknowledged as {published:?}"
                            ));
                            return;
                        };
                        if one.last_offset + 1 - one.base_offset != records as u64 {
                            l.failures.push(format!(
                                "{records} records acknowledged as offsets [{}, {}]",
                                one.base_offset, one.last_offset
                            ));
                            return;
                        }
                        for (i, pl) in payloads.into_iter().enumerate() {
                            let at = (one.shard, one.offset_of(i));
                            if let Some(old) = l.acked.insert(at, pl.clone()) {
                                l.failures.push(format!(
                                    "offset {at:?} acknowledged twice: {:?} and {:?}",
                                    String::from_utf8_lossy(&old[..old.len().min(24)]),
                                    String::from_utf8_lossy(&pl[..pl.len().min(24)])
                                ));
                            }
                        }
                        *count.lock() += records;
                    }
                    Err(e) => {
                        if !killed.load(Ordering::Acquire) {
                            ledger
                                .lock()
                                .failures
                                .push(format!("publish failed while the broker was up: {e:?}"));
                        }
                        return;
                    }
                }
            }
        }));
    }

    let deadline = tokio::time::Instant::now() + PATIENCE;
    while *acked_this_round.lock() < ACKS_BEFORE_KILL {
        {
            let l = ledger.lock();
            assert!(l.failures.is_empty(), "round {round}: {:#?}", l.failures);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "round {round}: only {} records acknowledged within {PATIENCE:?}",
            acked_this_round.lock()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Kill at a different point of the publishing each round.
    tokio::time::sleep(Duration::from_millis(10 + 37 * u64::from(round % 4))).await;
    killed.store(true, Ordering::Release);
    broker.kill();
    // Requests in flight can only fail now; what was acknowledged is in the ledger.
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    let l = ledger.lock();
    assert!(l.failures.is_empty(), "round {round}: {:#?}", l.failures);
    eprintln!(
        "round {round}: {} records acknowledged this round, {} in all, before SIGKILL",
        acked_this_round.lock(),
        l.acked.len()
    );
}

/// Reads every shard from the earliest offset up to its highest acknowledged offset and
/// checks it against the ledger.
async fn check_after_restart(broker: &Broker, round: u32, ledger: &Arc<Mutex<Ledger>>) {
    let client = broker.client().await;
    let (acked, sent) = {
        let l = ledger.lock();
        (l.acked.clone(), l.sent.clone())
    };
    let mut seen: HashSet<Bytes> = HashSet::new();
    for shard in 0..SHARDS {
        let Some(end) = acked
            .range((shard, 0)..=(shard, u64::MAX))
            .next_back()
            .map(|((_, o), _)| o + 1)
        else {
            continue;
        };
        let what = format!("round {round}, shard {shard} after restart");
        let mut sub = client
            .subscribe(TENANT, NS, STREAM, shard, StartAt::Earliest)
            .await
            .unwrap_or_else(|e| panic!("{what}: subscribe: {e:?}"));
        let events = read_until(&mut sub, end, &what).await;
        assert_eq!(
            events.first().map(|e| e.offset),
            Some(0),
            "{what}: the log starts at 0"
        );
        assert_contiguous(&events, 0, &what);
        let by_offset: BTreeMap<u64, &Bytes> =
            events.iter().map(|e| (e.offset, &e.payload)).collect();
        for e in &events {
            assert!(
                sent.contains(&e.payload),
                "{what}: offset {} holds a payload no publisher sent: {:?}",
                e.offset,
                String::from_utf8_lossy(&e.payload[..e.payload.len().min(40)])
            );
            assert!(
                seen.insert(e.payload.clone()),
                "{what}: offset {} repeats a record already read: {:?}",
                e.offset,
                String::from_utf8_lossy(&e.payload[..e.payload.len().min(40)])
            );
        }
        for ((_, offset), expected) in acked.range((shard, 0)..=(shard, u64::MAX)) {
            let got = by_offset.get(offset);
            assert_eq!(
                got.map(|b| &b[..]),
                Some(&expected[..]),
                "{what}: acknowledged record at offset {offset} did not survive SIGKILL intact"
            );
        }
        eprintln!(
            "{what}: {} records read, every acknowledged one intact",
            events.len()
        );
    }
}

async fn acked_records_survive_kill_9(options: BrokerOptions, rounds: u32) {
    let mut broker = Broker::start(options).await;
    durable_stream(&broker.client().await, TENANT, NS, STREAM, SHARDS).await;
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    for round in 0..rounds {
        publish_then_kill(&mut broker, round, &ledger).await;
        broker.restart().await;
        check_after_restart(&broker, round, &ledger).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_records_of_an_on_commit_stream_survive_kill_9_and_read_back_in_order() {
    acked_records_survive_kill_9(BrokerOptions::new().fsync("on_commit"), 3).await;
}

/// Under the default policy (periodic fsync) a process crash keeps what was written to the
/// log file, so everything acknowledged before the kill survives too (a machine crash could
/// lose the last interval; that is not what this kills).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_records_of_a_default_policy_stream_survive_kill_9_and_read_back_in_order() {
    acked_records_survive_kill_9(BrokerOptions::new(), 2).await;
}
