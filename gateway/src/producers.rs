//! Idempotent producers on a shard: which sequences each producer has already
//! landed, so a batch re-sent after a lost acknowledgement is answered with its original
//! offsets instead of being appended twice.
//!
//! Decides, per batch carrying a producer id (RecordBatch v2's producer id, epoch and base
//! sequence), whether to append it, answer it as a duplicate, or refuse it:
//! * the next expected sequence (last sequence + 1) is appended;
//! * a batch matching one of the producer's last [`RECENT`] batches is a duplicate;
//! * anything else is a gap or a stale re-send (`out_of_order_sequence`); an older epoch
//!   is fenced (`invalid_producer_epoch`); a new epoch restarts at sequence 0.
//!
//! On an ephemeral shard the table lives in the leader's memory only
//! ([`ProducerTable::check_in_memory`]). On a durable shard the sequences live in the log
//! with the records, so the table is rebuilt from the log
//! when the shard opens: a re-send is answered the same way after a restart. At every
//! segment seal a snapshot of the table for exactly the log up to that segment's end is
//! written to `producer-state.json` in the shard's directory, so the state survives once
//! old segments leave local disk (tiering) and opening scans only what follows it.

use std::collections::{HashMap, VecDeque};
use std::path::Path;

use serde::{Deserialize, Serialize};

use felix_hot::{LogError, ShardLog};
use felix_wire::protocol::{ErrorBody, codes};
use felix_wire::{BatchHeader, BatchIter};

/// Batches remembered per producer for duplicate detection (Kafka keeps 5 as well).
pub const RECENT: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Landed {
    first_seq: i32,
    last_seq: i32,
    base_offset: u64,
    last_offset: u64,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Producer {
    epoch: i16,
    recent: VecDeque<Landed>,
}

/// The verdict on one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeqCheck {
    /// Not idempotent, or the next expected sequence: append it.
    Append,
    /// Already in the log at these offsets: answer without appending.
    Duplicate {
        base_offset: u64,
        last_offset: u64,
    },
    Reject(ErrorBody),
}

/// One idempotent producer of a shard, as [`ProducerTable::active`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveProducer {
    pub producer_id: i64,
    pub epoch: i16,
    /// The sequence number of its last record in the log.
    pub last_sequence: i32,
}

/// The producers of one shard.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct ProducerTable {
    producers: HashMap<i64, Producer>,
}

/// The snapshot file: the table for exactly the log's offsets below `up_to`.
#[derive(Serialize, Deserialize)]
struct Snapshot {
    up_to: u64,
    table: ProducerTable,
}

const SNAPSHOT_FILE: &str = "producer-state.json";

fn last_seq(h: &BatchHeader) -> i32 {
    h.base_sequence.wrapping_add(h.last_offset_delta)
}

impl ProducerTable {
    /// Rebuilds the table: the last snapshot, then every batch the log holds after it.
    pub fn rebuild(log: &ShardLog) -> Result<ProducerTable, LogError> {
        let (mut table, up_to) = ProducerTable::load_snapshot(log.dir()).unwrap_or_default();
        let end = log.committed_offset();
        if up_to > end {
            // The log was cut below the snapshot (it cannot describe this log): start over.
            let mut table = ProducerTable::default();
            table.scan(log, log.first_offset(), end)?;
            return Ok(table);
        }
        table.scan(log, up_to.max(log.first_offset()), end)?;
        Ok(table)
    }

    /// Records every batch of the log in `[from, to)`.
    fn scan(&mut self, log: &ShardLog, from: u64, to: u64) -> Result<(), LogError> {
        let mut offset = from;
        while offset < to {
            let read = log.read(offset, 4 << 20, Some(to))?;
            if read.batches.is_empty() {
                break;
            }
            for (h, _) in BatchIter::new(&read.batches, usize::MAX).flatten() {
                if h.producer_id >= 0 {
                    self.record(&h, h.base_offset as u64, h.last_offset() as u64);
                }
            }
            offset = read.next_offset;
        }
        Ok(())
    }

    fn load_snapshot(dir: &Path) -> Option<(ProducerTable, u64)> {
        let bytes = std::fs::read(dir.join(SNAPSHOT_FILE)).ok()?;
        let snap: Snapshot = serde_json::from_slice(&bytes).ok()?;
        Some((snap.table, snap.up_to))
    }

    /// Brings the snapshot up to `up_to` (a sealed segment's end): the previous snapshot
    /// plus the batches after it, written atomically.
    pub fn snapshot_through(log: &ShardLog, up_to: u64) -> Result<(), LogError> {
        let dir = log.dir();
        let (mut table, from) = ProducerTable::load_snapshot(dir).unwrap_or_default();
        if from >= up_to {
            return Ok(());
        }
        table.scan(log, from.max(log.first_offset()), up_to)?;
        let bytes = serde_json::to_vec(&Snapshot { up_to, table }).unwrap_or_default();
        let io = |e: std::io::Error| LogError::Io {
            shard: log.shard().to_owned(),
            op: "write producer snapshot",
            path: dir.join(SNAPSHOT_FILE),
            source: e,
        };
        let tmp = dir.join("producer-state.json.tmp");
        std::fs::write(&tmp, bytes).map_err(io)?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(io)?;
        std::fs::rename(&tmp, dir.join(SNAPSHOT_FILE)).map_err(io)?;
        std::fs::File::open(dir)
            .and_then(|f| f.sync_all())
            .map_err(io)
    }

    /// Whether to append `h`.
    pub fn check(&self, h: &BatchHeader) -> SeqCheck {
        if h.producer_id < 0 {
            return SeqCheck::Append;
        }
        let refuse = |reason: &str, msg: String| {
            SeqCheck::Reject(ErrorBody::new(codes::OUT_OF_ORDER_SEQUENCE, reason, msg))
        };
        let Some(p) = self.producers.get(&h.producer_id) else {
            return if h.base_sequence == 0 {
                SeqCheck::Append
            } else {
                refuse(
                    "out_of_order_sequence",
                    format!(
                        "producer {} is unknown on this shard; its first batch must have sequence 0, not {}",
                        h.producer_id, h.base_sequence
                    ),
                )
            };
        };
        if h.producer_epoch < p.epoch {
            return refuse(
                "invalid_producer_epoch",
                format!(
                    "producer {} epoch {} is fenced by epoch {}",
                    h.producer_id, h.producer_epoch, p.epoch
                ),
            );
        }
        if h.producer_epoch > p.epoch {
            return if h.base_sequence == 0 {
                SeqCheck::Append
            } else {
                refuse(
                    "out_of_order_sequence",
                    format!(
                        "a new producer epoch starts at sequence 0, not {}",
                        h.base_sequence
                    ),
                )
            };
        }
        if let Some(l) = p
            .recent
            .iter()
            .find(|l| l.first_seq == h.base_sequence && l.last_seq == last_seq(h))
        {
            return SeqCheck::Duplicate {
                base_offset: l.base_offset,
                last_offset: l.last_offset,
            };
        }
        let expected = p.recent.back().map_or(0, |l| l.last_seq.wrapping_add(1));
        if h.base_sequence == expected {
            SeqCheck::Append
        } else {
            refuse(
                "out_of_order_sequence",
                format!(
                    "producer {} sent sequence {}, expected {} (a gap, or a re-send older than the last {RECENT} batches)",
                    h.producer_id, h.base_sequence, expected
                ),
            )
        }
    }

    /// Whether to offer `h` on an in-memory (ephemeral) shard. As [`ProducerTable::check`],
    /// except that a producer this table does not know may start at any sequence: the
    /// table lives only as long as the shard's leader, so after a takeover a producer's
    /// next batch is the first this leader sees of it.
    pub fn check_in_memory(&self, h: &BatchHeader) -> SeqCheck {
        if h.producer_id >= 0 && !self.producers.contains_key(&h.producer_id) {
            return SeqCheck::Append;
        }
        self.check(h)
    }

    /// The producers this table knows, by id: each one's epoch and last sequence landed
    /// (what Kafka's DescribeProducers reports).
    pub fn active(&self) -> Vec<ActiveProducer> {
        let mut out: Vec<ActiveProducer> = self
            .producers
            .iter()
            .filter_map(|(&id, p)| {
                let last = p.recent.back()?;
                Some(ActiveProducer {
                    producer_id: id,
                    epoch: p.epoch,
                    last_sequence: last.last_seq,
                })
            })
            .collect();
        out.sort_by_key(|p| p.producer_id);
        out
    }

    /// Records that `h` landed at these offsets.
    pub fn record(&mut self, h: &BatchHeader, base_offset: u64, last_offset: u64) {
        if h.producer_id < 0 {
            return;
        }
        let p = self.producers.entry(h.producer_id).or_default();
        if h.producer_epoch != p.epoch {
            p.epoch = h.producer_epoch;
            p.recent.clear();
        }
        p.recent.push_back(Landed {
            first_seq: h.base_sequence,
            last_seq: last_seq(h),
            base_offset,
            last_offset,
        });
        while p.recent.len() > RECENT {
            p.recent.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_wire::{BatchBuilder, Compression, Record};

    fn header(pid: i64, epoch: i16, seq: i32, records: usize) -> BatchHeader {
        let mut b = BatchBuilder::new(Compression::None).producer(pid, epoch, seq);
        for i in 0..records {
            b.push(Record::value(0, format!("r{i}")));
        }
        BatchHeader::parse(&b.build().unwrap()).unwrap()
    }

    #[test]
    fn a_resent_batch_is_answered_with_its_original_offsets() {
        let mut t = ProducerTable::default();
        let h0 = header(7, 0, 0, 3);
        assert_eq!(t.check(&h0), SeqCheck::Append);
        t.record(&h0, 10, 12);
        let h1 = header(7, 0, 3, 2);
        assert_eq!(t.check(&h1), SeqCheck::Append);
        t.record(&h1, 13, 14);
        assert_eq!(
            t.check(&h0),
            SeqCheck::Duplicate {
                base_offset: 10,
                last_offset: 12
            }
        );
        assert_eq!(
            t.check(&h1),
            SeqCheck::Duplicate {
                base_offset: 13,
                last_offset: 14
            }
        );
    }

    #[test]
    fn active_producers_show_their_epoch_and_last_sequence() {
        let mut t = ProducerTable::default();
        t.record(&header(9, 0, 0, 3), 0, 2);
        t.record(&header(7, 0, 0, 2), 3, 4);
        t.record(&header(7, 1, 0, 4), 5, 8);
        let active = t.active();
        assert_eq!(
            active,
            vec![
                ActiveProducer {
                    producer_id: 7,
                    epoch: 1,
                    last_sequence: 3
                },
                ActiveProducer {
                    producer_id: 9,
                    epoch: 0,
                    last_sequence: 2
                },
            ]
        );
    }

    #[test]
    fn gaps_stale_epochs_and_unknown_producers_are_refused() {
        let mut t = ProducerTable::default();
        assert!(
            matches!(t.check(&header(1, 0, 5, 1)), SeqCheck::Reject(e) if e.reason == "out_of_order_sequence")
        );
        let h = header(1, 2, 0, 1);
        t.record(&h, 0, 0);
        assert!(
            matches!(t.check(&header(1, 2, 5, 1)), SeqCheck::Reject(e) if e.code == codes::OUT_OF_ORDER_SEQUENCE)
        );
        assert!(
            matches!(t.check(&header(1, 1, 1, 1)), SeqCheck::Reject(e) if e.reason == "invalid_producer_epoch")
        );
        assert_eq!(t.check(&header(1, 3, 0, 1)), SeqCheck::Append);
        assert_eq!(t.check(&header(-1, -1, -1, 1)), SeqCheck::Append);
    }

    #[test]
    fn an_in_memory_shard_takes_an_unknown_producer_at_any_sequence_then_holds_it_to_order() {
        let mut t = ProducerTable::default();
        let h = header(9, 0, 40, 2);
        assert_eq!(t.check_in_memory(&h), SeqCheck::Append);
        t.record(&h, 0, 1);
        assert_eq!(
            t.check_in_memory(&h),
            SeqCheck::Duplicate {
                base_offset: 0,
                last_offset: 1
            }
        );
        assert!(matches!(
            t.check_in_memory(&header(9, 0, 45, 1)),
            SeqCheck::Reject(e) if e.reason == "out_of_order_sequence"
        ));
        assert_eq!(t.check_in_memory(&header(9, 0, 42, 1)), SeqCheck::Append);
    }
}
