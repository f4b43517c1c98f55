//! The log format of a log-backed cache: each change is one record in the cache shard's log
//! (a durable stream shard of its own, replicated like any other), so replaying the log in
//! order gives every key's latest value.
//!
//! Decides how a change is spelled on disk. A record's key is the cache key; its value is
//! the cache value (absent for a delete); headers carry the operation (`felix.cache`: `p`
//! put, `d` delete, `e` expiry delete, `f` version floor), the version (`v`, u64 big
//! endian) and a put's absolute expiry (`x`, ms since the Unix epoch, u64 big endian).
//! A version floor record (written first by compaction) carries the next version to hand
//! out, so compacting deletes away never lets a version be handed out twice. A compaction's
//! copy of a live entry is a put marked `s` (snapshot): it is written while other changes
//! go on, so it stands for its key only if no change to the key came after its floor
//! record (`replay.rs`); a broker that does not know the mark reads it as the put it was
//! before compactions ran beside other writes.
//!
//! The invariant: a record this module cannot read is skipped with a warning by the
//! replay, never taken for a delete or a put of something else.

use bytes::Bytes;
use felix_wire::{BatchBuilder, Compression, Header, Record, WireError};

const OP: &str = "felix.cache";
const VERSION: &str = "v";
const EXPIRES: &str = "x";
const SNAPSHOT: &str = "s";

/// One change of a cache shard, as the log holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LogOp {
    Put {
        key: String,
        value: Bytes,
        version: u64,
        /// Absolute expiry, ms since the Unix epoch.
        expires_at: Option<u64>,
    },
    Delete {
        key: String,
        version: u64,
        /// Written by the owner's expiry pass, not asked for by a client.
        expired: bool,
    },
    /// Versions below `next_version` were handed out (compaction writes it first).
    Floor { next_version: u64 },
    /// A compaction's copy of a live entry as it was at the floor record before it: the
    /// key's value only if nothing changed the key since that floor record.
    Snapshot {
        key: String,
        value: Bytes,
        version: u64,
        expires_at: Option<u64>,
    },
}

impl LogOp {
    /// The version the change gave its key (a floor record gives none, and a snapshot's
    /// copy is no change: a watch never hears one, so never resumes after one).
    pub(crate) fn version(&self) -> Option<u64> {
        match self {
            LogOp::Put { version, .. } | LogOp::Delete { version, .. } => Some(*version),
            LogOp::Floor { .. } | LogOp::Snapshot { .. } => None,
        }
    }

    fn to_record(&self, now_ms: i64) -> Record {
        let u64h = |k: &str, v: u64| Header {
            key: k.to_owned(),
            value: Some(Bytes::copy_from_slice(&v.to_be_bytes())),
        };
        let op = |c: &'static [u8]| Header {
            key: OP.to_owned(),
            value: Some(Bytes::from_static(c)),
        };
        // A snapshot copy is written as a put with a mark (`SNAPSHOT`), so a reader that
        // does not know the mark replays it as the put it is.
        let snapshot = matches!(self, LogOp::Snapshot { .. });
        let (key, value, headers) = match self {
            LogOp::Put {
                key,
                value,
                version,
                expires_at,
            }
            | LogOp::Snapshot {
                key,
                value,
                version,
                expires_at,
            } => {
                let mut h = Vec::with_capacity(4);
                h.extend([op(b"p"), u64h(VERSION, *version)]);
                if let Some(x) = expires_at {
                    h.push(u64h(EXPIRES, *x));
                }
                if snapshot {
                    h.push(Header {
                        key: SNAPSHOT.to_owned(),
                        value: Some(Bytes::from_static(b"1")),
                    });
                }
                (Some(key), Some(value.clone()), h)
            }
            LogOp::Delete {
                key,
                version,
                expired,
            } => (
                Some(key),
                None,
                vec![
                    op(if *expired { b"e" } else { b"d" }),
                    u64h(VERSION, *version),
                ],
            ),
            LogOp::Floor { next_version } => {
                (None, None, vec![op(b"f"), u64h(VERSION, *next_version)])
            }
        };
        Record {
            offset: 0,
            timestamp: now_ms,
            key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
            value,
            headers,
        }
    }

    /// Reads a change back; `None` for a record that is not one.
    pub(crate) fn of(r: &Record) -> Option<LogOp> {
        let header = |k: &str| {
            r.headers
                .iter()
                .find(|h| h.key == k)
                .and_then(|h| h.value.as_ref())
        };
        let u64_of = |k: &str| {
            header(k).and_then(|v| <[u8; 8]>::try_from(&v[..]).ok().map(u64::from_be_bytes))
        };
        let version = u64_of(VERSION)?;
        let key = || {
            r.key
                .as_ref()
                .and_then(|k| std::str::from_utf8(k).ok())
                .map(str::to_owned)
        };
        match &header(OP)?[..] {
            b"p" if header(SNAPSHOT).is_some() => Some(LogOp::Snapshot {
                key: key()?,
                value: r.value.clone().unwrap_or_default(),
                version,
                expires_at: u64_of(EXPIRES),
            }),
            b"p" => Some(LogOp::Put {
                key: key()?,
                value: r.value.clone().unwrap_or_default(),
                version,
                expires_at: u64_of(EXPIRES),
            }),
            b"d" | b"e" => Some(LogOp::Delete {
                key: key()?,
                version,
                expired: &header(OP)?[..] == b"e",
            }),
            b"f" => Some(LogOp::Floor {
                next_version: version,
            }),
            _ => None,
        }
    }
}

/// One record batch holding `ops` in order.
pub(crate) fn encode(ops: &[LogOp], now_ms: i64) -> Result<Vec<u8>, WireError> {
    let mut b = BatchBuilder::new(Compression::None);
    for op in ops {
        b.push(op.to_record(now_ms));
    }
    b.build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_wire::DecodedBatch;

    #[test]
    fn every_change_reads_back_as_written() {
        let ops = vec![
            LogOp::Floor { next_version: 9 },
            LogOp::Put {
                key: "k".into(),
                value: Bytes::from_static(b"v"),
                version: 9,
                expires_at: Some(1_000),
            },
            LogOp::Put {
                key: "n".into(),
                value: Bytes::new(),
                version: 10,
                expires_at: None,
            },
            LogOp::Delete {
                key: "k".into(),
                version: 11,
                expired: true,
            },
            LogOp::Snapshot {
                key: "n".into(),
                value: Bytes::from_static(b"w"),
                version: 10,
                expires_at: Some(2_000),
            },
        ];
        let batch = encode(&ops, 5).expect("encodes");
        let decoded = DecodedBatch::decode(&batch, 1 << 20).expect("decodes");
        let back: Vec<LogOp> = decoded.records.iter().filter_map(LogOp::of).collect();
        assert_eq!(back, ops);
        // A plain record (no cache headers) is not a change.
        assert_eq!(LogOp::of(&Record::value(0, "x")), None);
    }
}
