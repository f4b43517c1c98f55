//! What the owner of a cache shard holds in memory: each key's value, version and expiry,
//! and the next version to hand out.
//!
//! Decides what a read sees and how a change applies. A read treats an entry as absent the
//! moment its absolute expiry passes; every change carries the version the owner gave it,
//! and versions only grow (a log-backed shard's replay raises the next version past every
//! version the log holds, and a compaction's floor record keeps that true once deletes are
//! compacted away). The invariant: the state is exactly the replay of the changes applied
//! to it, in order, so the log of a log-backed shard rebuilds it after a restart or on a new
//! owner.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use felix_wire::cache::Condition;
use felix_wire::protocol::{ErrorBody, codes};

use super::record::LogOp;
use crate::errors::err;

/// Bytes an entry costs beyond its key and value (map slot, version, expiry), for the
/// in-memory budget and the compaction trigger.
pub(crate) const ENTRY_OVERHEAD: u64 = 64;

/// One key's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub value: Bytes,
    pub version: u64,
    /// Absolute expiry, ms since the Unix epoch.
    pub expires_at: Option<u64>,
}

impl Entry {
    pub(crate) fn live_at(&self, now_ms: u64) -> bool {
        self.expires_at.is_none_or(|x| now_ms < x)
    }

    fn cost(key: &str, value: &Bytes) -> u64 {
        key.len() as u64 + value.len() as u64 + ENTRY_OVERHEAD
    }
}

/// A cache shard's entries at its owner.
#[derive(Debug, Default)]
pub(crate) struct KvState {
    entries: HashMap<String, Entry>,
    next_version: u64,
    /// Keys, values and overhead of the entries held (expired ones included until removed).
    bytes: u64,
    /// A log-backed shard: one past the last log offset applied.
    pub applied_end: u64,
    /// The generation this broker led the shard at when the state was built (`None`: not
    /// built yet); another generation means another owner may have written since.
    pub built_at: Option<u64>,
}

impl KvState {
    /// A fresh state whose versions start at `first_version` (a new generation's, so a
    /// version is never handed out twice across owners).
    pub(crate) fn starting_at(first_version: u64, generation: u64) -> KvState {
        KvState {
            next_version: first_version.max(1),
            built_at: Some(generation),
            ..KvState::default()
        }
    }

    /// The key's entry if it is there and unexpired at `now_ms`.
    pub(crate) fn live(&self, key: &str, now_ms: u64) -> Option<&Entry> {
        self.entries.get(key).filter(|e| e.live_at(now_ms))
    }

    /// The version the next change gets.
    pub(crate) fn next_version(&self) -> u64 {
        self.next_version
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Applies one change.
    pub(crate) fn apply(&mut self, op: &LogOp) {
        match op {
            LogOp::Put {
                key,
                value,
                version,
                expires_at,
            } => {
                self.bump(*version);
                self.bytes += Entry::cost(key, value);
                let entry = Entry {
                    value: value.clone(),
                    version: *version,
                    expires_at: *expires_at,
                };
                // An overwrite keeps the key the map holds: no copy of the key per put.
                match self.entries.get_mut(key.as_str()) {
                    Some(held) => {
                        let old = std::mem::replace(held, entry);
                        self.bytes -= Entry::cost(key, &old.value);
                    }
                    None => {
                        self.entries.insert(key.clone(), entry);
                    }
                }
            }
            LogOp::Delete { key, version, .. } => {
                self.bump(*version);
                self.remove(key);
            }
            LogOp::Floor { next_version } => {
                self.next_version = self.next_version.max(*next_version);
            }
            // The owner that wrote it holds the entry already (or a later change of the
            // key); only a replay from the log may need it ([`Replayer`]).
            LogOp::Snapshot { .. } => {}
        }
    }

    fn bump(&mut self, version: u64) {
        self.next_version = self.next_version.max(version + 1);
    }

    /// Drops a key without a change (an in-memory cache's lazy expiry and eviction).
    pub(crate) fn remove(&mut self, key: &str) -> Option<Entry> {
        let old = self.entries.remove(key)?;
        self.bytes -= Entry::cost(key, &old.value);
        Some(old)
    }

    /// Up to `limit` keys whose expiry has passed at `now_ms`, with their versions.
    pub(crate) fn expired(&self, now_ms: u64, limit: usize) -> Vec<String> {
        self.entries
            .iter()
            .filter(|(_, e)| !e.live_at(now_ms))
            .take(limit)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Every unexpired entry as a snapshot record, for a compaction (cheap: the values are
    /// shared, not copied).
    pub(crate) fn snapshot(&self, now_ms: u64) -> Vec<LogOp> {
        self.entries
            .iter()
            .filter(|(_, e)| e.live_at(now_ms))
            .map(|(k, e)| LogOp::Snapshot {
                key: k.clone(),
                value: e.value.clone(),
                version: e.version,
                expires_at: e.expires_at,
            })
            .collect()
    }

    /// Removes entries other than `keep` (expired ones first) until the state holds at most
    /// `budget` bytes; how many went.
    pub(crate) fn evict_to(&mut self, budget: u64, keep: &str, now_ms: u64) -> usize {
        if self.bytes <= budget {
            return 0;
        }
        let mut victims: Vec<(bool, String)> = self
            .entries
            .iter()
            .filter(|(k, _)| k.as_str() != keep)
            .map(|(k, e)| (e.live_at(now_ms), k.clone()))
            .collect();
        // Expired first (`false` sorts first); otherwise no order is promised.
        victims.sort_by_key(|(live, _)| *live);
        let mut n = 0;
        for (_, key) in victims {
            if self.bytes <= budget {
                break;
            }
            self.remove(&key);
            n += 1;
        }
        n
    }
}

/// Applies the log's records in order to a state, reading compaction snapshots right.
///
/// A compaction writes its floor record, then copies of the live entries as they were at
/// it, while other changes go on: a copy may follow a later change of its key in the log.
/// So a copy stands for its key only if no change to the key came between the latest floor
/// record and it. A replay that did not see that floor record (it started after it) holds
/// every key as of the floor and every change since, so copies change nothing there.
#[derive(Debug, Default)]
pub(crate) struct Replayer {
    /// Keys changed since the latest floor record this replay read.
    changed_since_floor: Option<HashSet<String>>,
}

impl Replayer {
    pub(crate) fn apply(&mut self, st: &mut KvState, op: &LogOp) {
        match op {
            LogOp::Floor { .. } => self.changed_since_floor = Some(HashSet::new()),
            LogOp::Put { key, .. } | LogOp::Delete { key, .. } => {
                if let Some(changed) = &mut self.changed_since_floor {
                    changed.insert(key.clone());
                }
            }
            LogOp::Snapshot {
                key,
                value,
                version,
                expires_at,
            } => {
                if self
                    .changed_since_floor
                    .as_ref()
                    .is_some_and(|changed| !changed.contains(key))
                {
                    st.apply(&LogOp::Put {
                        key: key.clone(),
                        value: value.clone(),
                        version: *version,
                        expires_at: *expires_at,
                    });
                }
                return;
            }
        }
        st.apply(op);
    }
}

/// Refuses a conditional write whose condition does not hold on `current` (the key's
/// unexpired entry).
pub(crate) fn check_condition(
    condition: Option<Condition>,
    current: Option<&Entry>,
    key: &str,
) -> Result<(), ErrorBody> {
    let conflict = |what: String| {
        err(
            codes::VERSION_CONFLICT,
            "version_conflict",
            format!("key {key:?}: {what}; nothing was written"),
        )
    };
    match (condition, current) {
        (None, _) | (Some(Condition::Absent), None) => Ok(()),
        (Some(Condition::Absent), Some(e)) => Err(conflict(format!(
            "it holds a value (version {}), and the write was only if absent",
            e.version
        ))),
        (Some(Condition::Version(v)), Some(e)) if e.version == v => Ok(()),
        (Some(Condition::Version(v)), Some(e)) => {
            Err(conflict(format!("it is at version {}, not {v}", e.version)))
        }
        (Some(Condition::Version(v)), None) => {
            Err(conflict(format!("it holds no value, not version {v}")))
        }
    }
}

/// A counter's value: absent counts as 0; anything but a decimal i64 is not a counter.
pub(crate) fn counter_value(current: Option<&Entry>, key: &str) -> Result<i64, ErrorBody> {
    let Some(e) = current else { return Ok(0) };
    std::str::from_utf8(&e.value)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .ok_or_else(|| {
            err(
                codes::NOT_A_COUNTER,
                "not_a_counter",
                format!("key {key:?} holds a value that is not a decimal 64-bit integer"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str, version: u64, expires_at: Option<u64>) -> LogOp {
        LogOp::Put {
            key: key.into(),
            value: Bytes::from(value.to_owned()),
            version,
            expires_at,
        }
    }

    #[test]
    fn replay_gives_the_latest_value_and_versions_only_grow() {
        let mut s = KvState::starting_at(1, 0);
        s.apply(&put("a", "1", 1, None));
        s.apply(&put("a", "2", 2, None));
        s.apply(&put("b", "x", 3, Some(100)));
        s.apply(&LogOp::Delete {
            key: "a".into(),
            version: 4,
            expired: false,
        });
        assert_eq!(s.live("a", 0), None);
        assert_eq!(s.live("b", 99).map(|e| e.version), Some(3));
        // Absent the moment the expiry passes.
        assert_eq!(s.live("b", 100), None);
        assert_eq!(s.expired(100, 10), vec!["b".to_owned()]);
        assert_eq!(s.next_version(), 5);
        s.apply(&LogOp::Floor { next_version: 9 });
        assert_eq!(s.next_version(), 9);
        assert_eq!(s.snapshot(0).len(), 1);
    }

    #[test]
    fn an_overwrite_replaces_value_version_and_expiry_and_counts_the_new_bytes_only() {
        let mut s = KvState::starting_at(1, 0);
        s.apply(&put("k", "a-long-first-value", 1, Some(50)));
        s.apply(&put("k", "v", 2, None));
        let e = s.live("k", 100).expect("the overwrite has no expiry");
        assert_eq!((&e.value[..], e.version), (&b"v"[..], 2));
        assert_eq!(s.len(), 1);
        assert_eq!(s.bytes(), Entry::cost("k", &Bytes::from_static(b"v")));
        s.apply(&put("k", "w", 3, Some(7)));
        assert_eq!(s.live("k", 7), None, "the new expiry holds");
        assert_eq!(s.bytes(), Entry::cost("k", &Bytes::from_static(b"w")));
    }

    fn copy(key: &str, value: &str, version: u64) -> LogOp {
        LogOp::Snapshot {
            key: key.into(),
            value: Bytes::from(value.to_owned()),
            version,
            expires_at: None,
        }
    }

    #[test]
    fn a_snapshot_copy_never_undoes_a_change_written_before_it_after_its_floor() {
        // The log from a compaction's floor on: the copies of a, b and c were written after
        // a put of a and a delete of b that came after the floor.
        let log = [
            LogOp::Floor { next_version: 10 },
            put("a", "new", 10, None),
            LogOp::Delete {
                key: "b".into(),
                version: 11,
                expired: false,
            },
            copy("a", "old", 3),
            copy("b", "old", 4),
            copy("c", "kept", 5),
        ];
        let mut s = KvState::starting_at(1, 0);
        let mut r = Replayer::default();
        for op in &log {
            r.apply(&mut s, op);
        }
        assert_eq!(s.live("a", 0).map(|e| &e.value[..]), Some(&b"new"[..]));
        assert_eq!(s.live("b", 0), None, "a deleted key stays deleted");
        assert_eq!(s.live("c", 0).map(|e| e.version), Some(5));
        assert_eq!(s.next_version(), 12);
        // The owner that wrote the copies applies them as nothing.
        let before = s.live("a", 0).cloned();
        s.apply(&copy("a", "old", 3));
        assert_eq!(s.live("a", 0).cloned(), before);
        // A replay that started past the floor already holds what the copies say.
        let mut r = Replayer::default();
        r.apply(&mut s, &copy("b", "old", 4));
        assert_eq!(s.live("b", 0), None);
    }

    #[test]
    fn conditions_and_counters_refuse_with_typed_errors() {
        let e = Entry {
            value: Bytes::from_static(b"41"),
            version: 7,
            expires_at: None,
        };
        assert!(check_condition(Some(Condition::Absent), None, "k").is_ok());
        assert!(check_condition(Some(Condition::Version(7)), Some(&e), "k").is_ok());
        for (c, cur) in [
            (Condition::Absent, Some(&e)),
            (Condition::Version(6), Some(&e)),
            (Condition::Version(6), None),
        ] {
            let refused = check_condition(Some(c), cur, "k").expect_err("conflict");
            assert_eq!(refused.code, codes::VERSION_CONFLICT);
        }
        assert_eq!(counter_value(Some(&e), "k").expect("number"), 41);
        assert_eq!(counter_value(None, "k").expect("absent"), 0);
        let text = Entry {
            value: Bytes::from_static(b"hello"),
            ..e
        };
        assert_eq!(
            counter_value(Some(&text), "k").expect_err("text").code,
            codes::NOT_A_COUNTER
        );
    }

    #[test]
    fn eviction_keeps_the_key_just_written_and_takes_expired_first() {
        let mut s = KvState::starting_at(1, 0);
        s.apply(&put("old", "x", 1, Some(5)));
        s.apply(&put("live", "y", 2, None));
        s.apply(&put("new", "z", 3, None));
        // One byte over: the expired entry goes, the live one stays.
        assert_eq!(s.evict_to(s.bytes() - 1, "new", 10), 1);
        assert!(s.live("live", 10).is_some());
        assert_eq!(s.entries.len(), 2);
        let one = Entry::cost("new", &Bytes::from_static(b"z"));
        assert_eq!(s.evict_to(one, "new", 10), 1);
        assert!(s.live("new", 10).is_some());
    }
}
