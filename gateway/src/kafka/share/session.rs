//! Share sessions: what one member fetches from this broker and which records it holds
//! here.
//!
//! Decides the session epoch rule of KIP-932: a request with epoch 0 opens (or re-opens) a
//! session with the partitions it names; each following request carries the next epoch
//! (1, 2, ...) and may add partitions or forget some; -1 closes it. A request with another
//! epoch is `INVALID_SHARE_SESSION_EPOCH`, one for a session never opened
//! `SHARE_SESSION_NOT_FOUND`; either way nothing of it is applied and the client opens a
//! new session. One member's requests are served one at a time (the session's lock).
//!
//! A session also keeps, per partition, the attempt and lock deadline of each record this
//! member acquired here: a Kafka acknowledgement names offsets only, a Felix answer the
//! attempt too, so an acknowledgement from a member for a record it does not hold (never
//! acquired, lock lapsed, handed to another member since) never retires another member's
//! claim. Entries go when answered or when their lock lapses; a session idle for
//! [`IDLE_FOR`] with nothing held is dropped.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use felix_wire::groups::ClaimRef;
use kafka_protocol::error::ResponseError;
use uuid::Uuid;

/// A session unused this long, holding nothing, is dropped.
const IDLE_FOR: Duration = Duration::from_secs(300);

/// A topic partition as share requests name it.
pub(super) type Partition = (Uuid, i32);

/// A record this member holds: the attempt it was handed as and its lock deadline (ms
/// since the Unix epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Held {
    pub attempt: u32,
    pub deadline_ms: i64,
}

/// The records a member holds on one partition, kept as runs of consecutive offsets
/// handed out as the same attempt with the same deadline (a stored batch acquired whole is
/// one run), so acquiring and acknowledging thousands of records costs a few runs, not an
/// entry each.
#[derive(Debug, Default)]
pub(super) struct HeldRecords {
    /// First offset → (last offset, what each record of the run is held as).
    runs: BTreeMap<u64, (u64, Held)>,
}

impl HeldRecords {
    /// Notes `offset` held as `held` (in place of anything held there before).
    pub fn insert(&mut self, offset: u64, held: Held) {
        self.remove(offset);
        self.add(offset, offset, held);
    }

    /// Notes every record of `first..=last` held as `held` (in place of anything held
    /// there before): a stored batch acquired whole is one call.
    pub fn insert_run(&mut self, first: u64, last: u64, held: Held) {
        let overlaps = self
            .runs
            .range(..=last)
            .next_back()
            .is_some_and(|(_, (l, _))| *l >= first);
        if overlaps {
            for offset in first..=last {
                self.insert(offset, held);
            }
            return;
        }
        self.add(first, last, held);
    }

    /// Adds `first..=last`, which no run holds, joined to a neighbour held the same way.
    fn add(&mut self, first: u64, last: u64, held: Held) {
        let (mut from, mut to) = (first, last);
        if let Some((&f, &(l, h))) = self.runs.range(..first).next_back()
            && l + 1 == first
            && h == held
        {
            from = f;
        }
        if let Some(&(l, h)) = self.runs.get(&(last + 1))
            && h == held
        {
            to = l;
            self.runs.remove(&(last + 1));
        }
        self.runs.insert(from, (to, held));
    }

    /// Takes the records of `first..=last` out: each one held goes to `claims`, named
    /// with the attempt it was handed as, each one not held to `not_held`.
    pub fn take_run(
        &mut self,
        first: u64,
        last: u64,
        claims: &mut Vec<ClaimRef>,
        not_held: &mut Vec<u64>,
    ) {
        let start = match self.runs.range(..=first).next_back() {
            Some((&f, &(l, _))) if l >= first => f,
            _ => first,
        };
        let overlapping: Vec<(u64, (u64, Held))> = self
            .runs
            .range(start..=last)
            .map(|(&f, &r)| (f, r))
            .collect();
        let mut next = first;
        for (f, (l, held)) in overlapping {
            self.runs.remove(&f);
            if f < first {
                self.runs.insert(f, (first - 1, held));
            }
            if l > last {
                self.runs.insert(last + 1, (l, held));
            }
            let (from, to) = (f.max(first), l.min(last));
            not_held.extend(next..from);
            claims.extend((from..=to).map(|offset| ClaimRef {
                offset,
                attempt: held.attempt,
            }));
            next = to + 1;
        }
        not_held.extend(next..=last);
    }

    /// Takes `offset` out: what it was held as, if it was.
    pub fn remove(&mut self, offset: u64) -> Option<Held> {
        let (&first, &(last, held)) = self.runs.range(..=offset).next_back()?;
        if last < offset {
            return None;
        }
        if first == offset {
            self.runs.remove(&first);
        } else if let Some(run) = self.runs.get_mut(&first) {
            run.0 = offset - 1;
        }
        if offset < last {
            self.runs.insert(offset + 1, (last, held));
        }
        Some(held)
    }

    /// Forgets records whose lock lapsed by `now_ms`.
    fn prune(&mut self, now_ms: i64) {
        self.runs.retain(|_, (_, h)| h.deadline_ms > now_ms);
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Every record held, by offset.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Held)> + '_ {
        self.runs
            .iter()
            .flat_map(|(&first, &(last, held))| (first..=last).map(move |o| (o, held)))
    }
}

/// One member's share session on this broker.
pub(super) struct Session {
    /// The epoch the next request must carry; `None` while no session is open.
    next_epoch: Option<i32>,
    pub partitions: BTreeSet<Partition>,
    pub held: HashMap<Partition, HeldRecords>,
    used: Instant,
}

impl Session {
    fn new() -> Session {
        Session {
            next_epoch: None,
            partitions: BTreeSet::new(),
            held: HashMap::new(),
            used: Instant::now(),
        }
    }

    /// Checks a request's session epoch and moves the session on; nothing is to be applied
    /// on an error.
    pub fn begin(&mut self, epoch: i32) -> Result<(), ResponseError> {
        self.used = Instant::now();
        match epoch {
            0 => {
                self.next_epoch = Some(1);
                self.partitions.clear();
            }
            // Closing: its acknowledgements are applied even if the session is gone
            // (a restarted broker), so a clean close never loses them.
            -1 => self.next_epoch = None,
            n if n < 0 => return Err(ResponseError::InvalidShareSessionEpoch),
            n => match self.next_epoch {
                None => return Err(ResponseError::ShareSessionNotFound),
                Some(want) if want != n => return Err(ResponseError::InvalidShareSessionEpoch),
                Some(_) => self.next_epoch = Some(if n == i32::MAX { 1 } else { n + 1 }),
            },
        }
        Ok(())
    }

    /// Forgets held records whose lock lapsed: they are someone else's to answer now.
    pub fn prune(&mut self, now_ms: i64) {
        for records in self.held.values_mut() {
            records.prune(now_ms);
        }
        self.held.retain(|_, r| !r.is_empty());
    }
}

/// A session, locked while one of its member's requests is served.
type Shared = Arc<tokio::sync::Mutex<Session>>;

/// The share sessions open on this broker: (group key, member id) → session.
#[derive(Default)]
pub(crate) struct ShareSessions {
    sessions: parking_lot::Mutex<HashMap<(String, String), Shared>>,
}

impl ShareSessions {
    /// The session of `member` in the group `key` (an empty one if it has none), after
    /// dropping idle sessions that hold nothing.
    pub(super) fn of(&self, key: &str, member: &str) -> Shared {
        let mut sessions = self.sessions.lock();
        let now = Instant::now();
        let now_ms = crate::groups::now_ms();
        sessions.retain(|_, s| match s.try_lock() {
            Ok(mut s) => {
                s.prune(now_ms);
                now.duration_since(s.used) < IDLE_FOR || !s.held.is_empty()
            }
            Err(_) => true,
        });
        sessions
            .entry((key.to_owned(), member.to_owned()))
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(Session::new())))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_follow_open_next_close() {
        let mut s = Session::new();
        assert_eq!(s.begin(1), Err(ResponseError::ShareSessionNotFound));
        assert_eq!(s.begin(0), Ok(()));
        assert_eq!(s.begin(2), Err(ResponseError::InvalidShareSessionEpoch));
        assert_eq!(s.begin(1), Ok(()));
        assert_eq!(s.begin(2), Ok(()));
        assert_eq!(s.begin(2), Err(ResponseError::InvalidShareSessionEpoch));
        assert_eq!(s.begin(-1), Ok(()));
        assert_eq!(s.begin(3), Err(ResponseError::ShareSessionNotFound));
    }

    #[test]
    fn held_records_are_kept_as_runs_and_answer_as_one_entry_each() {
        let held = |attempt, deadline_ms| Held {
            attempt,
            deadline_ms,
        };
        let mut h = HeldRecords::default();
        let mut each: BTreeMap<u64, Held> = BTreeMap::new();
        let mut put = |h: &mut HeldRecords, o, v| {
            h.insert(o, v);
            each.insert(o, v);
        };
        for o in 10..20 {
            put(&mut h, o, held(1, 100));
        }
        assert_eq!(h.runs.len(), 1, "a batch acquired whole is one run");
        put(&mut h, 25, held(2, 100));
        put(&mut h, 21, held(1, 100));
        put(&mut h, 20, held(1, 100));
        assert_eq!(h.runs.len(), 2, "20 joins 10..19 and 21: {:?}", h.runs);
        // A record acquired again as another attempt splits its run.
        put(&mut h, 15, held(3, 200));
        assert_eq!(h.iter().collect::<BTreeMap<_, _>>(), each);
        for o in [10, 14, 16, 21, 25, 26, 9, 15] {
            assert_eq!(h.remove(o), each.remove(&o), "offset {o}");
            assert_eq!(h.iter().collect::<BTreeMap<_, _>>(), each, "after {o}");
        }
        for o in 11..22 {
            h.remove(o);
        }
        assert!(h.is_empty(), "{:?}", h.runs);
    }

    #[test]
    fn runs_taken_out_name_each_record_held_and_each_not_held() {
        let held = |attempt| Held {
            attempt,
            deadline_ms: 100,
        };
        let mut h = HeldRecords::default();
        h.insert_run(10, 19, held(1));
        h.insert_run(20, 24, held(1));
        assert_eq!(
            h.runs.len(),
            1,
            "adjacent runs held alike join: {:?}",
            h.runs
        );
        h.insert_run(30, 31, held(2));
        // Overlapping an existing run: each record in place of what was there.
        h.insert_run(18, 21, held(3));
        let (mut claims, mut not_held) = (Vec::new(), Vec::new());
        h.take_run(8, 12, &mut claims, &mut not_held);
        h.take_run(17, 19, &mut claims, &mut not_held);
        h.take_run(24, 30, &mut claims, &mut not_held);
        let got: Vec<(u64, u32)> = claims.iter().map(|c| (c.offset, c.attempt)).collect();
        assert_eq!(
            got,
            [
                (10, 1),
                (11, 1),
                (12, 1),
                (17, 1),
                (18, 3),
                (19, 3),
                (24, 1),
                (30, 2)
            ]
        );
        assert_eq!(not_held, [8, 9, 25, 26, 27, 28, 29]);
        let left: Vec<(u64, u32)> = h.iter().map(|(o, h)| (o, h.attempt)).collect();
        assert_eq!(
            left,
            [
                (13, 1),
                (14, 1),
                (15, 1),
                (16, 1),
                (20, 3),
                (21, 3),
                (22, 1),
                (23, 1),
                (31, 2)
            ]
        );
        // Taken already: not held now.
        let (mut claims, mut not_held) = (Vec::new(), Vec::new());
        h.take_run(10, 10, &mut claims, &mut not_held);
        assert!(claims.is_empty());
        assert_eq!(not_held, [10]);
    }

    #[test]
    fn lapsed_locks_are_forgotten() {
        let mut s = Session::new();
        let p = (Uuid::from_u128(1), 0);
        let held = |deadline_ms| Held {
            attempt: 1,
            deadline_ms,
        };
        s.held.entry(p).or_default().insert(5, held(100));
        s.held.entry(p).or_default().insert(6, held(300));
        s.prune(200);
        assert_eq!(s.held[&p].iter().map(|(o, _)| o).collect::<Vec<_>>(), [6]);
        s.prune(300);
        assert!(s.held.is_empty());
    }
}
