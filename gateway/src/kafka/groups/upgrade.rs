//! Offsets committed before the group journals: moving them out of a broker's old local
//! log (`<data_dir>/kafka/group-offsets`, [`crate::kafka::offsets`]) into the journals of
//! their partitions, where they survive losing that broker.
//!
//! Decides when an old offset moves: at start-up a task moves every one, retrying until
//! each partition's leader took it (leaders may not be settled yet); and an OffsetFetch
//! that finds a partition's journal without the group's offset but the old log with one
//! moves it before answering, so a group resuming right after an upgrade reads it from its
//! journal. The invariants: a move is an `Adopt` (the journal takes the old offset only
//! where it holds none for the group, so a commit made since always wins), and the old
//! offset is removed from the old log (a tombstone) only once the journal holds it under
//! its replication rule. So moving is idempotent (repeated, or cut between its two writes,
//! it changes nothing more), and once every offset moved nothing is read from the old log.
//! An offset on a topic or partition no longer there has no journal to move to: it stays
//! in the old log and is answered from it as before.

use std::collections::BTreeMap;
use std::sync::Weak;
use std::time::Duration;

use tracing::{debug, info};

use crate::groups::kafka_offsets::{KafkaOffset, OffsetsOp};
use crate::kafka::Kafka;
use crate::kafka::offsets::OffsetKey;
use crate::kafka::scope::Scope;

/// The first pause between start-up passes that left offsets behind; it doubles up to
/// [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(500);
const MAX_PAUSE: Duration = Duration::from_secs(30);

/// Moves the old log's offsets of `group` on partitions of `topic` (`old`: partition →
/// offset) into their journals. Answers each partition's offset after: the journal's where
/// the move succeeded (a commit made since the upgrade wins), the old one where it did not
/// (it is still answered from the old log, and moved later).
pub(super) async fn move_partitions(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
    topic: &str,
    old: &BTreeMap<i32, KafkaOffset>,
) -> BTreeMap<i32, KafkaOffset> {
    let offsets: Vec<(u32, KafkaOffset)> = old
        .iter()
        .filter_map(|(p, o)| Some((u32::try_from(*p).ok()?, o.clone())))
        .collect();
    let mut now = old.clone();
    if offsets.is_empty() {
        return now;
    }
    let answers =
        super::route::on_topic(kafka, scope, group, topic, OffsetsOp::Adopt { offsets }).await;
    let mut moved = Vec::new();
    for (shard, outcome) in answers {
        let p = shard as i32;
        match outcome {
            Ok(Some(journal)) => {
                if let Some(o) = old.get(&p) {
                    moved.push((key(scope, group, topic, p), o.clone()));
                }
                now.insert(p, journal);
            }
            Ok(None) => {}
            Err(e) => debug!(group, topic, partition = p, error = %e.message,
                "an offset from before the group journals did not move yet"),
        }
    }
    if let Err(e) = kafka.groups.offsets.forget(&moved).await {
        // The journals hold them: the old log answers nothing a journal does not override,
        // and the next pass forgets them.
        debug!(group, error = %e, "could not forget moved offsets in the old log");
    }
    now
}

fn key(scope: &Scope, group: &str, topic: &str, partition: i32) -> OffsetKey {
    OffsetKey {
        tenant: scope.tenant.clone(),
        namespace: scope.namespace.clone(),
        group: group.to_owned(),
        topic: topic.to_owned(),
        partition,
    }
}

/// One pass over the old log: moves what it can. How many offsets had a partition to move
/// to, and how many of them are left.
async fn move_all_once(kafka: &Kafka) -> (usize, usize) {
    type Topic = (String, String, String, String);
    let mut by_topic: BTreeMap<Topic, BTreeMap<i32, KafkaOffset>> = BTreeMap::new();
    for (k, v) in kafka.groups.offsets.entries().await {
        by_topic
            .entry((k.tenant, k.namespace, k.group, k.topic))
            .or_default()
            .insert(k.partition, v);
    }
    let (mut movable_total, mut left) = (0, 0);
    for ((tenant, namespace, group, topic), old) in by_topic {
        let partitions = kafka
            .broker
            .stream_shapes(&tenant, &namespace)
            .unwrap_or_default()
            .into_iter()
            .find(|s| s.durable && s.name == topic)
            .map_or(0, |s| s.shards);
        let movable: BTreeMap<i32, KafkaOffset> = old
            .into_iter()
            .filter(|(p, _)| u32::try_from(*p).is_ok_and(|p| p < partitions))
            .collect();
        if movable.is_empty() {
            continue;
        }
        movable_total += movable.len();
        let scope = Scope {
            tenant,
            namespace,
            credential: None,
        };
        move_partitions(kafka, &scope, &group, &topic, &movable).await;
        let still = kafka
            .groups
            .offsets
            .of_group(&scope.tenant, &scope.namespace, &group);
        left += still
            .await
            .iter()
            .filter(|(k, _)| k.topic == topic && movable.contains_key(&k.partition))
            .count();
    }
    (movable_total, left)
}

/// The start-up task: passes over the old log until every offset with a partition to move
/// to has moved.
pub(crate) async fn move_old_offsets(kafka: Weak<Kafka>) {
    let mut pause = FIRST_PAUSE;
    loop {
        let Some(k) = kafka.upgrade() else {
            return;
        };
        if k.groups.offsets.entries().await.is_empty() {
            return;
        }
        let (movable, left) = move_all_once(&k).await;
        if left == 0 {
            if movable > 0 {
                info!(
                    offsets = movable,
                    "Kafka group offsets from before the group journals moved into them"
                );
            }
            return;
        }
        debug!(
            left,
            "Kafka group offsets from before the group journals still to move"
        );
        drop(k);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}
