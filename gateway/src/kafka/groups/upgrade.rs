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
//!
//! A move and a DeleteGroups of the same group never interleave: both run under the
//! group's lock in [`GroupSerial`], and a move takes only the old offsets the old log still
//! holds once it has the lock. Otherwise a move that read an old offset, then waited while
//! DeleteGroups emptied the journals and the old log, would adopt it into the emptied
//! journal: the deleted group's offset back. (The lock is this broker's: the old log is
//! too, and DeleteGroups runs on the group's coordinator, which moves its own old log.)

use std::collections::BTreeMap;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Weak;
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use tracing::{debug, info};

use crate::groups::kafka_offsets::{KafkaOffset, OffsetsOp};
use crate::kafka::Kafka;
use crate::kafka::offsets::{CommittedOffsets, OffsetKey};
use crate::kafka::scope::Scope;

/// The first pause between start-up passes that left offsets behind; it doubles up to
/// [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(500);
const MAX_PAUSE: Duration = Duration::from_secs(30);

/// How many locks groups are spread over: moves and deletes are rare, so two groups
/// sharing one only wait for each other now and then.
const STRIPES: usize = 64;

/// Serialises, per group, moving old offsets into the journals and deleting the group's
/// offsets (see the module's comment).
pub struct GroupSerial {
    stripes: Vec<tokio::sync::Mutex<()>>,
}

impl Default for GroupSerial {
    fn default() -> GroupSerial {
        GroupSerial {
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }
}

impl GroupSerial {
    /// The lock of the group `key` (`tenant/namespace/group`), held until dropped.
    pub(super) async fn lock(&self, key: &str) -> tokio::sync::MutexGuard<'_, ()> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        self.stripes[h.finish() as usize % STRIPES].lock().await
    }
}

/// Moves old offsets of one group into their journals, under the group's lock: only those
/// the old log still holds then are handed to `adopt` (which answers, for each, the
/// journal's offset after, or none where it did not move), and those moved are forgotten
/// in the old log. Answers each offset after: the journal's where it moved, the old one
/// where it did not; an offset deleted meanwhile is not answered.
pub(super) async fn move_serialised<A, F>(
    serial: &GroupSerial,
    offsets: &CommittedOffsets,
    group_key: &str,
    old: Vec<(OffsetKey, KafkaOffset)>,
    adopt: A,
) -> BTreeMap<OffsetKey, KafkaOffset>
where
    A: FnOnce(Vec<(OffsetKey, KafkaOffset)>) -> F,
    F: Future<Output = Vec<(OffsetKey, Option<KafkaOffset>)>>,
{
    let _serial = serial.lock(group_key).await;
    let mut still = Vec::with_capacity(old.len());
    for (k, o) in old {
        if offsets.get(&k).await.as_ref() == Some(&o) {
            still.push((k, o));
        }
    }
    let mut now: BTreeMap<OffsetKey, KafkaOffset> = still.iter().cloned().collect();
    if still.is_empty() {
        return now;
    }
    let mut moved = Vec::new();
    for (k, journal) in adopt(still).await {
        if let Some(journal) = journal
            && let Some(o) = now.insert(k.clone(), journal)
        {
            moved.push((k, o));
        }
    }
    if let Err(e) = offsets.forget(&moved).await {
        // The journals hold them: the old log answers nothing a journal does not override,
        // and the next pass forgets them.
        debug!(error = %e, "could not forget moved offsets in the old log");
    }
    now
}

/// Deletes a group's offsets under its lock: `delete_journals` (how many the journals had),
/// then the old log's. How many there were in all.
pub(super) async fn delete_serialised<D, F>(
    serial: &GroupSerial,
    offsets: &CommittedOffsets,
    (tenant, namespace, group): (&str, &str, &str),
    delete_journals: D,
) -> Result<usize, ResponseError>
where
    D: FnOnce() -> F,
    F: Future<Output = Result<usize, ResponseError>>,
{
    let _serial = serial.lock(&format!("{tenant}/{namespace}/{group}")).await;
    let mut deleted = delete_journals().await?;
    deleted += offsets
        .delete_group(tenant, namespace, group)
        .await
        .map_err(|e| {
            tracing::warn!(group, error = %e, "could not delete a Kafka group's offsets");
            ResponseError::KafkaStorageError
        })?;
    Ok(deleted)
}

/// Moves the old log's offsets of `group` on partitions of `topic` (`old`: partition →
/// offset, as read before) into their journals. Answers each partition's offset after: the
/// journal's where the move succeeded (a commit made since the upgrade wins), the old one
/// where it did not (it is still answered from the old log, and moved later); a partition
/// whose old offset was deleted meanwhile (DeleteGroups) is left out.
pub(super) async fn move_partitions(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
    topic: &str,
    old: &BTreeMap<i32, KafkaOffset>,
) -> BTreeMap<i32, KafkaOffset> {
    let keyed = old
        .iter()
        .map(|(p, o)| (key(scope, group, topic, *p), o.clone()))
        .collect();
    let adopt = |still: Vec<(OffsetKey, KafkaOffset)>| async move {
        let offsets: Vec<(u32, KafkaOffset)> = still
            .iter()
            .filter_map(|(k, o)| Some((u32::try_from(k.partition).ok()?, o.clone())))
            .collect();
        if offsets.is_empty() {
            return Vec::new();
        }
        let op = OffsetsOp::Adopt { offsets };
        let answers = super::route::on_topic(kafka, scope, group, topic, op).await;
        answers
            .into_iter()
            .map(|(shard, outcome)| {
                let p = shard as i32;
                let journal = match outcome {
                    Ok(o) => o,
                    Err(e) => {
                        debug!(group, topic, partition = p, error = %e.message,
                            "an offset from before the group journals did not move yet");
                        None
                    }
                };
                (key(scope, group, topic, p), journal)
            })
            .collect()
    };
    let now = move_serialised(
        &kafka.groups.serial,
        &kafka.groups.offsets,
        &scope.group_key(group),
        keyed,
        adopt,
    )
    .await;
    now.into_iter().map(|(k, o)| (k.partition, o)).collect()
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use felix_hot::FsyncPolicy;
    use parking_lot::Mutex;

    use super::*;

    type Journal = Arc<Mutex<HashMap<OffsetKey, KafkaOffset>>>;

    fn old_key() -> OffsetKey {
        OffsetKey {
            tenant: "t".into(),
            namespace: "n".into(),
            group: "g".into(),
            topic: "orders".into(),
            partition: 0,
        }
    }

    fn at(offset: i64) -> KafkaOffset {
        KafkaOffset {
            offset,
            leader_epoch: -1,
            metadata: None,
            commit_ms: 1,
        }
    }

    /// A journal's `Adopt`: takes the offset where it holds none.
    async fn adopt(
        journal: Journal,
        still: Vec<(OffsetKey, KafkaOffset)>,
    ) -> Vec<(OffsetKey, Option<KafkaOffset>)> {
        let mut j = journal.lock();
        still
            .into_iter()
            .map(|(k, o)| {
                let held = j.entry(k.clone()).or_insert(o).clone();
                (k, Some(held))
            })
            .collect()
    }

    async fn delete(serial: &GroupSerial, offsets: &CommittedOffsets, journal: Journal) -> usize {
        delete_serialised(serial, offsets, ("t", "n", "g"), || async move {
            let mut j = journal.lock();
            let before = j.len();
            j.retain(|k, _| k.group != "g");
            Ok(before - j.len())
        })
        .await
        .expect("deleted")
    }

    async fn old_log(dir: &std::path::Path) -> CommittedOffsets {
        let offsets = CommittedOffsets::open(dir, FsyncPolicy::OnCommit).expect("open");
        offsets
            .commit(vec![(old_key(), at(5))])
            .await
            .expect("commit");
        offsets
    }

    /// The race seen in review: a move read the old offset, then DeleteGroups emptied the
    /// journals and the old log, then the move went on. It adopts nothing.
    #[tokio::test]
    async fn a_move_that_read_an_offset_before_delete_groups_writes_nothing_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let offsets = old_log(dir.path()).await;
        let serial = GroupSerial::default();
        let journal = Journal::default();
        let read_before = offsets.entries().await;
        assert_eq!(delete(&serial, &offsets, journal.clone()).await, 1);
        let now = move_serialised(&serial, &offsets, "t/n/g", read_before, |still| {
            adopt(journal.clone(), still)
        })
        .await;
        assert!(now.is_empty(), "nothing answered: {now:?}");
        assert!(journal.lock().is_empty(), "the deleted offset came back");
        assert!(offsets.entries().await.is_empty());
    }

    /// DeleteGroups arriving while a move is adopting waits for it, then deletes what it
    /// moved: nothing of the group is left anywhere.
    #[tokio::test]
    async fn delete_groups_during_a_move_deletes_what_the_move_wrote() {
        let dir = tempfile::tempdir().expect("tempdir");
        let offsets = Arc::new(old_log(dir.path()).await);
        let serial = Arc::new(GroupSerial::default());
        let journal = Journal::default();
        let mut deleting = None;
        let read = offsets.entries().await;
        let now = move_serialised(&serial, &offsets, "t/n/g", read, |still| {
            // DeleteGroups comes in now and runs as far as it can before the adopt.
            let (serial, offsets, j) = (serial.clone(), offsets.clone(), journal.clone());
            deleting = Some(tokio::spawn(
                async move { delete(&serial, &offsets, j).await },
            ));
            let journal = journal.clone();
            async move {
                for _ in 0..10 {
                    tokio::task::yield_now().await;
                }
                adopt(journal, still).await
            }
        })
        .await;
        assert_eq!(now.get(&old_key()), Some(&at(5)), "moved: {now:?}");
        let deleted = deleting.expect("spawned").await.expect("delete task");
        assert_eq!(deleted, 1, "the moved offset, deleted from the journal");
        assert!(
            journal.lock().is_empty(),
            "the group's offset outlived its deletion"
        );
        assert!(offsets.entries().await.is_empty());
    }
}
