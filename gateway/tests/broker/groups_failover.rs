//! Consumer-group progress on a replicated Quorum stream survives failover (spec: "a
//! group's positions, in-flight attempt counts and dead-letter progress are replicated with
//! the shard and survive failover"; docs/groups.md "Replicated progress"): three real
//! `felix` processes, a 3-replica Quorum stream, a group consuming and acknowledging, the
//! shard's leader killed with SIGKILL mid-run. The group continues on the new leader;
//! nothing whose ack was answered ok is delivered again, nothing is lost, records that were
//! claimed and never answered before the kill come back with their attempt counted, and
//! every record a poll returned was one a publisher had been acknowledged for by a quorum.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use felix_client::{ClusterClient, GroupConfig, GroupConsumer, GroupRecord, GroupStart, Message};

use super::cluster::{Cluster, create_stream};
use super::common::PATIENCE;

const STREAM: &str = "groups-failover";

/// Publishes `{prefix}-{i}` for i in `range` to shard 0, one batch per 100, each
/// acknowledged by a quorum (the client retries refusals across the failover).
async fn publish(
    client: &ClusterClient,
    prefix: &str,
    range: std::ops::Range<usize>,
) -> BTreeSet<Bytes> {
    let mut all = BTreeSet::new();
    for chunk in range.collect::<Vec<_>>().chunks(100) {
        let messages: Vec<Message> = chunk
            .iter()
            .map(|i| {
                let p = Bytes::from(format!("{prefix}-{i}"));
                all.insert(p.clone());
                Message::new(p)
            })
            .collect();
        client
            .publish_to_shard("t", "ns", STREAM, 0, &messages)
            .await
            .expect("publish");
    }
    all
}

/// What the consumers saw.
#[derive(Default)]
struct Seen {
    /// Records whose ack was answered ok.
    acked: BTreeSet<Bytes>,
    /// The highest attempt each record was delivered with.
    attempts: BTreeMap<Bytes, u32>,
}

impl Seen {
    /// Takes a poll's records: none may be one whose ack was answered ok.
    fn delivered(&mut self, records: &[GroupRecord]) {
        for r in records {
            assert!(
                !self.acked.contains(&r.payload),
                "{:?} (offset {}, attempt {}) was delivered again after its ack was answered ok",
                r.payload,
                r.offset,
                r.attempt
            );
            let a = self.attempts.entry(r.payload.clone()).or_default();
            *a = (*a).max(r.attempt);
        }
    }
}

/// Polls and acks until `want` are all acked or `until`; poll and ack failures during the
/// failover are retried (an ack whose answer was lost leaves its record unconfirmed).
async fn consume(c: &mut GroupConsumer, seen: &mut Seen, want: &BTreeSet<Bytes>, stop_at: usize) {
    let until = tokio::time::Instant::now() + PATIENCE * 2;
    while want.difference(&seen.acked).count() > 0 && seen.acked.len() < stop_at {
        assert!(
            tokio::time::Instant::now() < until,
            "{} of {} records acked",
            seen.acked.len(),
            want.len()
        );
        let records = match c.poll(50, Duration::from_millis(500)).await {
            Ok(r) => r,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        seen.delivered(&records);
        if c.ack_all(&records).await.is_ok() {
            seen.acked.extend(records.iter().map(|r| r.payload.clone()));
        }
    }
}

/// A step of `groups::groups_in_a_cluster_follow_shard_leaders_and_survive_failover` (it
/// shares that cluster, and kills one of its brokers).
pub(super) async fn a_group_on_a_quorum_stream_survives_killing_the_leader(
    cluster: &mut Cluster,
    client: &ClusterClient,
) {
    create_stream(client, STREAM, "quorum", Default::default()).await;
    let mut published = publish(client, "before", 0..1500).await;
    client
        .create_group(
            "t",
            "ns",
            STREAM,
            "g",
            GroupConfig {
                visibility_timeout_ms: Some(3_000),
                max_attempts: Some(10),
                dead_letter: None,
                start: Some(GroupStart::Earliest),
            },
        )
        .await
        .expect("a group on a 3-replica Quorum stream");
    let mut seen = Seen::default();
    let mut c = client.group("t", "ns", STREAM, "g");
    consume(&mut c, &mut seen, &published, 600).await;
    // Claimed and never answered: their first attempt is in the journal, and must still be
    // after the failover.
    let held = c.poll(20, Duration::from_secs(2)).await.expect("poll");
    assert!(!held.is_empty());
    seen.delivered(&held);
    assert!(held.iter().all(|r| r.attempt == 1));
    let leader = cluster.leader(client, STREAM, None).await;
    cluster.node(leader).kill();
    let successor = cluster.leader(client, STREAM, Some(leader)).await;
    assert_ne!(successor, leader);
    // More records after the failover: the group reads them on the new leader too.
    published.extend(publish(client, "after", 0..300).await);
    let mut c = client.group("t", "ns", STREAM, "g");
    consume(&mut c, &mut seen, &published, usize::MAX).await;
    assert_eq!(
        seen.acked, published,
        "every record published was acknowledged through the group, none more"
    );
    for r in &held {
        assert!(
            seen.attempts[&r.payload] >= 2,
            "{:?} was claimed before the kill and lapsed: its next delivery is attempt 2 or \
             more, not {}",
            r.payload,
            seen.attempts[&r.payload]
        );
    }
    let info = client
        .describe_group("t", "ns", STREAM, "g")
        .await
        .expect("describe on the new leader");
    assert_eq!(info.shards[0].acked_up_to, 1800, "{info:?}");
}
