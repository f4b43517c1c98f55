//! A Kafka share group's start offsets as a Felix group's positions, at each shard's
//! leader (the Kafka side is `kafka/share/offsets.rs` and `kafka/share/reset.rs`).
//!
//! Decides what Kafka's share-partition start offset is and how it is changed. The start
//! offset is the group's position on the shard (everything below it retired); a group that
//! has not started on the shard has none. Altering it to `to` retires everything below `to`
//! and forgets everything at or past it, so the group hands out the records from `to` again
//! as first deliveries; deleting it forgets the group's progress on the shard, so its next
//! poll starts where the group's start setting says (Kafka's `share.auto.offset.reset`).
//! The group itself (its settings, its dead-letter producer and counters) stays.
//!
//! The invariant: a change is made under the group's lock and journalled (on a Quorum
//! stream: held by a majority) before it is answered, as every change of a group's
//! progress; it is written with events every broker reads (`Rewind` and `Skip`, a
//! `Snapshot`), so a replica of an older Felix follows it.

use felix_wire::protocol::codes;

use super::cursor::{Event, Progress};
use super::kafka_offsets::{KafkaOffset, ShardOutcome};
use crate::broker::Broker;
use crate::errors::err;

/// A start offset as the Kafka side reads it.
fn at(offset: u64) -> KafkaOffset {
    KafkaOffset {
        offset: offset as i64,
        leader_epoch: -1,
        metadata: None,
        commit_ms: 0,
    }
}

impl Broker {
    /// The position of the Felix group `group` on shards of one stream this broker leads,
    /// as a Kafka share group's start offset; none where the group does not exist or has
    /// not started on the shard.
    pub(crate) async fn share_start_offsets(
        &self,
        stream: (&str, &str, &str),
        group: &str,
        shards: Vec<u32>,
    ) -> Vec<(u32, ShardOutcome)> {
        let (t, n, s) = stream;
        let Ok(g) = self.group(t, n, s, group) else {
            return shards.into_iter().map(|shard| (shard, Ok(None))).collect();
        };
        let mut out = Vec::with_capacity(shards.len());
        for shard in shards {
            let outcome = async {
                let gs = self.group_shard(t, n, s, shard).await?;
                // Looked at, not created: describing a group does not start it here.
                let cursor = gs.cursors.lock().get(&g.name).cloned();
                let Some(cursor) = cursor else {
                    return Ok(None);
                };
                let c = cursor.lock().await;
                if c.id != g.id || c.progress.next.is_none() {
                    return Ok(None);
                }
                Ok(Some(at(c.position())))
            };
            out.push((shard, outcome.await));
        }
        out
    }

    /// Moves the Felix group `group`'s position on shards this broker leads to each given
    /// offset, backwards or forwards (AlterShareGroupOffsets); answers each new position.
    /// An offset past the shard's readable end is refused and changes nothing.
    pub(crate) async fn share_seek(
        &self,
        stream: (&str, &str, &str),
        group: &str,
        offsets: Vec<(u32, u64)>,
    ) -> Vec<(u32, ShardOutcome)> {
        let (t, n, s) = stream;
        let mut out = Vec::with_capacity(offsets.len());
        for (shard, to) in offsets {
            let outcome = async {
                let g = self.group(t, n, s, group)?;
                let gs = self.group_shard(t, n, s, shard).await?;
                let end = gs.shard.visible_end();
                if to > end {
                    return Err(err(
                        codes::OFFSET_OUT_OF_RANGE,
                        "offset_out_of_range",
                        format!("start offset {to} is past partition {shard}'s end {end}"),
                    ));
                }
                let mut c = gs.cursor(&g).await;
                // Forget what lies at or past `to`, then retire what lies below it: the
                // position is `to` with nothing pending, whichever way it moved.
                let events = vec![Event::Rewind { to }, Event::Skip { to }];
                let ticket = gs.record(&g.name, &mut c, events).await?;
                let now = c.position();
                drop(c);
                gs.written(ticket).await?;
                Ok(Some(at(now)))
            };
            out.push((shard, outcome.await));
        }
        out
    }

    /// Forgets the Felix group `group`'s progress on shards this broker leads
    /// (DeleteShareGroupOffsets): each shard's position before, none where the group had
    /// not started there (nothing is written then).
    pub(crate) async fn share_forget(
        &self,
        stream: (&str, &str, &str),
        group: &str,
        shards: Vec<u32>,
    ) -> Vec<(u32, ShardOutcome)> {
        let (t, n, s) = stream;
        let mut out = Vec::with_capacity(shards.len());
        for shard in shards {
            let outcome = async {
                let Ok(g) = self.group(t, n, s, group) else {
                    return Ok(None);
                };
                let gs = self.group_shard(t, n, s, shard).await?;
                let mut c = gs.cursor(&g).await;
                if c.progress.next.is_none() {
                    return Ok(None);
                }
                let had = c.position();
                // The dead-letter producer and its sequences stay: a dead letter published
                // after this must not reuse a sequence the dead-letter stream has seen.
                let progress = Progress {
                    next: None,
                    pending: Default::default(),
                    ..c.progress.clone()
                };
                let ticket = gs
                    .record(&g.name, &mut c, vec![Event::Snapshot { progress }])
                    .await?;
                drop(c);
                gs.written(ticket).await?;
                Ok(Some(at(had)))
            };
            out.push((shard, outcome.await));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::cursor::{Cursor, Event};

    fn claimed(c: &mut Cursor, offsets: &[u64], next: u64) {
        c.apply(&Event::Claim {
            consumer: "m".into(),
            deadline_ms: i64::MAX,
            records: offsets.iter().map(|o| (*o, 1)).collect(),
            next,
        });
    }

    #[test]
    fn a_seek_leaves_nothing_pending_and_the_position_where_asked_either_way() {
        let mut c = Cursor::new(1);
        c.apply(&Event::Skip { to: 0 });
        claimed(&mut c, &[0, 1, 2, 3, 4, 5], 6);
        c.apply(&Event::Ack {
            offsets: vec![0, 1],
        });
        // Backwards, below pending records: they go, 1 is handed out again.
        let mut back = Cursor::new(1);
        back.progress = c.progress.clone();
        for e in [Event::Rewind { to: 1 }, Event::Skip { to: 1 }] {
            back.apply(&e);
        }
        assert_eq!(back.position(), 1);
        assert_eq!(back.progress.next, Some(1));
        assert!(back.progress.pending.is_empty());
        // Forwards, past pending and past the read position.
        for e in [Event::Rewind { to: 9 }, Event::Skip { to: 9 }] {
            c.apply(&e);
        }
        assert_eq!(c.position(), 9);
        assert_eq!(c.progress.next, Some(9));
        assert!(c.progress.pending.is_empty());
        // A group that never started gets the position too.
        let mut fresh = Cursor::new(1);
        for e in [Event::Rewind { to: 4 }, Event::Skip { to: 4 }] {
            fresh.apply(&e);
        }
        assert_eq!((fresh.progress.next, fresh.position()), (Some(4), 4));
    }
}
