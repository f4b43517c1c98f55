//! Handing records out: a poll claims up to N records of one shard for one consumer.
//!
//! Decides which records a poll gets and in what order: first records due for redelivery
//! (a lapsed claim or a nack whose delay passed), lowest offset first, each with its attempt
//! number plus one; then records never handed out, from the group's read position. The
//! invariants: a poll never returns a record at or past the shard's readable end (the
//! quorum mark on a replicated shard: [`Broker::fetch`] is bounded by it); a record's claim,
//! with its attempt number, is in the journal before the poll is answered; a record already
//! claimed and within its deadline is handed to no one. A poll with a wait parks on the
//! shard's readable end and on the next redelivery time, and costs nothing meanwhile.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use felix_meta::model::{Group, GroupStart};
use felix_wire::groups::ClaimedMeta;
use felix_wire::protocol::{ErrorBody, codes};
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{BatchBuilder, BatchHeader, Compression, DecodedBatch, HeaderIter, Record};
use tokio::time::Instant;

use super::cursor::Event;
use super::{GroupShard, now_ms};
use crate::broker::Broker;
use crate::errors::err;
use crate::shard::shard_key;

/// Most records one poll hands out (each is a line of the answer's header).
pub const MAX_POLL_RECORDS: u32 = 500;
/// Longest wait of one poll.
pub const MAX_POLL_WAIT_MS: u64 = 5 * 60 * 1000;
/// Bytes a poll reads when it does not say.
const DEFAULT_POLL_BYTES: u64 = 1 << 20;
/// Most bytes read from the shard at a time for new records: a poll of a few records does
/// not read (and copy) megabytes of the log it will not hand out.
pub(super) const FETCH_CHUNK: usize = 256 << 10;
/// Reads of [`FETCH_CHUNK`] one poll makes at most.
const FETCH_ROUNDS: usize = 16;
/// Longest consumer name.
pub const MAX_CONSUMER_LEN: usize = 128;

/// One poll's arguments.
pub(crate) struct Poll<'a> {
    pub tenant: &'a str,
    pub namespace: &'a str,
    pub stream: &'a str,
    pub group: &'a str,
    pub shard: u32,
    pub consumer: &'a str,
    pub max_records: u32,
    pub max_bytes: u64,
    pub wait_ms: u64,
    /// Whole stored batches, while the poll's records stay at most this many: once a batch
    /// is started, every record of it not handed out yet is claimed, even past
    /// `max_records`, and the batch goes out as stored (never decoded and re-encoded). A
    /// Kafka share fetch asks for this: it is Kafka's default acquisition
    /// (`share.acquire.mode=batch_optimized`, `MaxRecords` a soft limit), and a Kafka
    /// client delivers only the records named in the acquired ranges; its bound is what
    /// one acknowledgement may name, so everything acquired can be answered at once.
    /// `None` (a Felix poll): at most `max_records`.
    pub whole_batches: Option<usize>,
    /// A budget of records shared with polls of other shards (a Kafka ShareFetch's
    /// `MaxRecords` over its partitions), drawn on as well as `max_records`: once it is
    /// spent no record is claimed and no batch is started, so of all the polls sharing it
    /// only one can take a whole batch past it.
    pub shared: Option<&'a Budget>,
}

/// Records that polls of several shards may still claim between them.
#[derive(Debug)]
pub(crate) struct Budget(AtomicUsize);

impl Budget {
    pub(crate) fn new(records: usize) -> Budget {
        Budget(AtomicUsize::new(records))
    }

    /// Records left.
    pub(crate) fn left(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// Starts a whole batch of `n` records if anything is left (spending all of it if the
    /// batch holds more): whether it may be taken.
    fn take_whole(&self, n: usize) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                (left > 0).then(|| left.saturating_sub(n))
            })
            .is_ok()
    }

    /// Takes up to `n` records: how many may be claimed.
    fn take_up_to(&self, n: usize) -> usize {
        match self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                Some(left - left.min(n))
            }) {
            Ok(left) | Err(left) => left.min(n),
        }
    }

    /// Gives back records taken but not claimed.
    fn give_back(&self, n: usize) {
        self.0.fetch_add(n, Ordering::AcqRel);
    }
}

/// What one poll may still claim: its own `max_records` and the shared budget, if any.
struct Allowance<'a> {
    own: usize,
    shared: Option<&'a Budget>,
}

impl Allowance<'_> {
    fn left(&self) -> usize {
        self.shared.map_or(self.own, |s| self.own.min(s.left()))
    }

    fn take_whole(&mut self, n: usize) -> bool {
        if self.own == 0 || !self.shared.is_none_or(|s| s.take_whole(n)) {
            return false;
        }
        self.own = self.own.saturating_sub(n);
        true
    }

    fn take_up_to(&mut self, n: usize) -> usize {
        let mut m = n.min(self.own);
        if let Some(s) = self.shared {
            m = s.take_up_to(m);
        }
        self.own -= m;
        m
    }

    fn give_back(&mut self, n: usize) {
        self.own += n;
        if let Some(s) = self.shared {
            s.give_back(n);
        }
    }
}

/// What a poll handed out: each record's claim, and the stored batches holding them (which
/// may hold other records too: the client keeps only those named).
#[derive(Default)]
pub(crate) struct Claimed {
    pub records: Vec<ClaimedMeta>,
    pub body: Bytes,
}

pub(crate) fn check_consumer(consumer: &str) -> Result<(), ErrorBody> {
    if consumer.is_empty() || consumer.len() > MAX_CONSUMER_LEN {
        return Err(err(
            codes::INVALID_ARGUMENT,
            "invalid_argument",
            format!("consumer must be 1-{MAX_CONSUMER_LEN} bytes"),
        ));
    }
    Ok(())
}

impl Broker {
    /// A poll: claims records of one shard, waiting up to `wait_ms` for some to arrive.
    pub(crate) async fn group_poll(&self, p: &Poll<'_>) -> Result<Claimed, ErrorBody> {
        check_consumer(p.consumer)?;
        if p.max_records == 0 || p.max_records > MAX_POLL_RECORDS {
            return Err(err(
                codes::INVALID_ARGUMENT,
                "invalid_argument",
                format!("max_records must be 1..={MAX_POLL_RECORDS}"),
            ));
        }
        if p.wait_ms > MAX_POLL_WAIT_MS {
            return Err(err(
                codes::INVALID_ARGUMENT,
                "invalid_argument",
                format!("wait_ms must be at most {MAX_POLL_WAIT_MS}"),
            ));
        }
        let until = Instant::now() + Duration::from_millis(p.wait_ms);
        loop {
            let group = self
                .group_confirmed(p.tenant, p.namespace, p.stream, p.group)
                .await?;
            let gs = self
                .group_shard(p.tenant, p.namespace, p.stream, p.shard)
                .await?;
            // Watched before claiming: a record committed after the claim found nothing
            // still wakes the wait.
            let mut end = self.watch_high_watermark(&gs.key)?;
            end.borrow_and_update();
            let (claimed, next_due) = self.claim_once(&gs, &group, p).await?;
            let now = Instant::now();
            if !claimed.records.is_empty() || now >= until {
                return Ok(claimed);
            }
            let wake = match next_due {
                Some(due_ms) => {
                    let in_ms = (due_ms - now_ms()).max(1) as u64;
                    until.min(now + Duration::from_millis(in_ms))
                }
                None => until,
            };
            tokio::select! {
                changed = end.changed() => if changed.is_err() {
                    // The shard closed: the next round answers why.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                },
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// One round of a poll: claims what is there now. Also returns when the earliest
    /// pending record falls due, for a poll that waits.
    async fn claim_once(
        &self,
        gs: &GroupShard,
        group: &Group,
        p: &Poll<'_>,
    ) -> Result<(Claimed, Option<i64>), ErrorBody> {
        let mut c = gs.cursor(group).await;
        let now = now_ms();
        c.saw(p.consumer, now);
        let mut tickets = Vec::new();
        if c.progress.next.is_none() {
            let to = self.group_start_offset(group, p.shard).await?;
            tickets.push(
                gs.record(&group.name, &mut c, vec![Event::Skip { to }])
                    .await?,
            );
        }
        // Nothing falls due before `quiet_until`: the pending records are not walked.
        let scan = now >= c.quiet_until;
        let mut allowance = Allowance {
            own: p.max_records as usize,
            shared: p.shared,
        };
        let max_bytes = if p.max_bytes == 0 {
            DEFAULT_POLL_BYTES
        } else {
            p.max_bytes
        } as usize;
        let max_attempts = group.settings.max_attempts;
        let mut out = Handout::default();
        let mut events = Vec::new();
        let due: Vec<(u64, u32)> = if scan {
            c.progress
                .pending
                .iter()
                .filter(|(_, e)| e.due(now) && !e.exhausted(max_attempts, now))
                .map(|(o, e)| (*o, e.attempts))
                .take(allowance.left())
                .collect()
        } else {
            Vec::new()
        };
        // Another shard's poll may have spent the shared budget meanwhile.
        let due = {
            let mut due = due;
            due.truncate(allowance.take_up_to(due.len()));
            due
        };
        if !due.is_empty() {
            let taken = due.len();
            let offsets: BTreeSet<u64> = due.iter().map(|(o, _)| *o).collect();
            let found = self.read_batches_at(gs, &offsets).await?;
            for (offset, attempts) in due {
                match found.get(&offset) {
                    Some((base, batch)) => {
                        if out.bytes >= max_bytes && !out.claims.is_empty() {
                            break;
                        }
                        out.add_batch(*base, batch);
                        out.claims.push((offset, attempts + 1));
                    }
                    // Removed by retention meanwhile: nothing left to hand out.
                    None => events.push(Event::Retire { offset }),
                }
            }
            allowance.give_back(taken - out.claims.len());
        }
        let redelivered = out.claims.len() as u64;
        let old_next = c.progress.next.unwrap_or(0);
        let mut next = old_next;
        if allowance.left() > 0 && out.bytes < max_bytes {
            let mut limits = Limits {
                allowance,
                bytes: max_bytes,
                whole_batches: p.whole_batches,
            };
            next = self
                .read_new(gs, next, &mut limits, &mut out, &mut events)
                .await?;
        }
        let deadline_ms = now + group.settings.visibility_timeout_ms as i64;
        if !out.claims.is_empty() || next != old_next {
            events.push(Event::Claim {
                consumer: p.consumer.to_owned(),
                deadline_ms,
                records: out.claims.clone(),
                next,
            });
        }
        if !events.is_empty() {
            tickets.push(gs.record(&group.name, &mut c, events).await?);
        }
        // After a walk, the next one is due when the earliest record is; else the claims
        // just made only lowered `quiet_until` (a bound: a wait wakes no later than it).
        let next_due = if scan {
            c.rescan(max_attempts, now)
        } else {
            (c.quiet_until != i64::MAX).then_some(c.quiet_until)
        };
        // Records to dead-letter (a last delivery lapsed): the walk leaves `quiet_until` at 0.
        let settle = scan && c.quiet_until == 0;
        drop(c);
        for t in tickets {
            gs.written(t).await?;
        }
        if settle {
            super::dead_letter::settle(self, gs, group, false).await;
        }
        self.node.metrics.group_handed_out(
            &gs.key,
            &group.name,
            out.claims.len() as u64 - redelivered,
            redelivered,
        );
        let records = out
            .claims
            .iter()
            .map(|&(offset, attempt)| ClaimedMeta {
                offset,
                attempt,
                deadline_ms,
            })
            .collect();
        Ok((
            Claimed {
                records,
                body: out.body(),
            },
            next_due,
        ))
    }

    /// Records never handed out, from `next`: claimed into `out` with their stored
    /// batches; returns the new read position (past control batches and past the last
    /// record taken).
    async fn read_new(
        &self,
        gs: &GroupShard,
        next: u64,
        limits: &mut Limits<'_>,
        out: &mut Handout,
        events: &mut Vec<Event>,
    ) -> Result<u64, ErrorBody> {
        let mut pos = next;
        for _ in 0..FETCH_ROUNDS {
            let before = (pos, out.claims.len());
            let (at, ended) = self.read_new_once(gs, pos, limits, out, events).await?;
            pos = at;
            let full = limits.allowance.left() == 0 || out.bytes >= limits.bytes;
            if ended || full || pos >= gs.shard.visible_end() || (pos, out.claims.len()) == before {
                break;
            }
        }
        Ok(pos)
    }

    /// One read of [`Broker::read_new`]: at most [`FETCH_CHUNK`] bytes. Also says whether
    /// the poll ended at a stored batch's end short of `max_records` (the next batch would
    /// not fit whole).
    async fn read_new_once(
        &self,
        gs: &GroupShard,
        next: u64,
        limits: &mut Limits<'_>,
        out: &mut Handout,
        events: &mut Vec<Event>,
    ) -> Result<(u64, bool), ErrorBody> {
        let max_bytes = limits.bytes;
        let read = match self.fetch(&gs.key, next, read_size(gs, limits, out)).await {
            Ok(read) => read,
            Err(e) if e.code == codes::OFFSET_TOO_OLD => {
                // Retention removed records the group never had: it continues at the
                // earliest one left.
                let to = e.earliest_offset.unwrap_or(next);
                events.push(Event::Skip { to });
                return Ok((to, false));
            }
            Err(e) => return Err(e),
        };
        learn_record_bytes(gs, &read.batches);
        let mut pos = next;
        for (header, batch) in stored_batches(&read.batches) {
            let base = header.base_offset as u64;
            let batch_end = base + header.last_offset_delta as u64 + 1;
            if header.is_control() {
                pos = pos.max(batch_end);
                continue;
            }
            if limits.allowance.left() == 0 || (out.bytes >= max_bytes && !out.claims.is_empty()) {
                return Ok((pos, false));
            }
            let offsets = batch_offsets(&header, batch)?;
            let left = offsets.iter().filter(|o| **o >= pos).count();
            let fits = left <= limits.allowance.left();
            if !fits && !out.claims.is_empty() && limits.whole_batches.is_none() {
                // The poll ends where the last batch taken ends rather than inside this
                // one: the batches go out as stored, never decoded and rebuilt with part
                // of their records, and the rest of this one goes whole to the next poll.
                // A poll that has nothing yet takes part of it (fewer records than a
                // batch holds were asked for).
                return Ok((pos, true));
            }
            // A batch that would take the poll past its whole-batch bound is taken up to
            // what the poll may still claim.
            let whole_batch = limits
                .whole_batches
                .is_some_and(|most| out.claims.len() + left <= most);
            let allowed = if whole_batch {
                if !limits.allowance.take_whole(left) {
                    return Ok((pos, false));
                }
                left
            } else {
                limits.allowance.take_up_to(left)
            };
            if allowed == 0 && left > 0 {
                return Ok((pos, false));
            }
            let mut took = Vec::new();
            for &offset in &offsets {
                if offset < pos {
                    continue;
                }
                if took.len() >= allowed {
                    break;
                }
                took.push(offset);
                pos = offset + 1;
            }
            let run = took.last().map_or(0, |l| l + 1 - took[0]) == took.len() as u64;
            let whole = whole_batch && !took.is_empty();
            if whole || took.len() == offsets.len() || (!took.is_empty() && !run) {
                // The whole stored batch, as a subscription sends it: no copy, no re-encoding.
                out.add_batch(header.base_offset, &read.batches.slice_ref(batch));
            } else if !took.is_empty() {
                // Part of it: only the records claimed, so a poll of fewer records than a
                // batch holds does not send (and make the client decode) the whole batch.
                out.add_partial(&read.batches.slice_ref(batch), header, &took)?;
            }
            out.claims.extend(took.iter().map(|&o| (o, 1)));
            if limits.allowance.left() == 0 {
                return Ok((pos, false));
            }
            pos = pos.max(batch_end);
        }
        if read.batches.is_empty() {
            // A gap up to the readable end (nothing but removed or control records).
            return Ok((pos.max(read.next_offset), false));
        }
        Ok((pos, false))
    }

    /// The stored batches holding each of `offsets` (those still held in either tier):
    /// offset → (the batch's base offset, the batch).
    async fn read_batches_at(
        &self,
        gs: &GroupShard,
        offsets: &BTreeSet<u64>,
    ) -> Result<HashMap<u64, (i64, Bytes)>, ErrorBody> {
        self.collect_at(gs, offsets, |found, header, batch, read| {
            let bytes = read.slice_ref(batch);
            for offset in batch_offsets(header, batch)? {
                if offsets.contains(&offset) {
                    found.insert(offset, (header.base_offset, bytes.clone()));
                }
            }
            Ok(())
        })
        .await
    }

    /// The records at `offsets` of the shard (those still held in either tier).
    pub(crate) async fn read_records_at(
        &self,
        gs: &GroupShard,
        offsets: &BTreeSet<u64>,
    ) -> Result<HashMap<u64, Record>, ErrorBody> {
        self.collect_at(gs, offsets, |found, _, batch, _| {
            let decoded = DecodedBatch::decode(batch, DEFAULT_MAX_DECOMPRESSED)
                .map_err(|e| err(codes::CORRUPT_DATA, "corrupt_segment", e.to_string()))?;
            for r in decoded.records {
                if offsets.contains(&(r.offset as u64)) {
                    found.insert(r.offset as u64, r);
                }
            }
            Ok(())
        })
        .await
    }

    /// What `take` collects from the shard's data batches around `offsets`: for each offset
    /// not collected yet, the read that starts at the batch holding it, each data batch of
    /// which `take` gets with the bytes it was read in. Offsets retention removed are left
    /// out.
    async fn collect_at<T>(
        &self,
        gs: &GroupShard,
        offsets: &BTreeSet<u64>,
        mut take: impl FnMut(&mut HashMap<u64, T>, &BatchHeader, &[u8], &Bytes) -> Result<(), ErrorBody>,
    ) -> Result<HashMap<u64, T>, ErrorBody> {
        let mut found = HashMap::new();
        for &o in offsets {
            if found.contains_key(&o) {
                continue;
            }
            let read = match self.fetch(&gs.key, o, 1).await {
                Ok(read) => read,
                Err(e) if e.code == codes::OFFSET_TOO_OLD => continue,
                Err(e) => return Err(e),
            };
            for (header, batch) in stored_batches(&read.batches) {
                if !header.is_control() {
                    take(&mut found, &header, batch, &read.batches)?;
                }
            }
        }
        Ok(found)
    }

    /// Where a group new on this shard starts.
    pub(crate) async fn group_start_offset(
        &self,
        group: &Group,
        shard: u32,
    ) -> Result<u64, ErrorBody> {
        let key = shard_key(&group.tenant, &group.namespace, &group.stream, shard);
        let b = self.shard_bounds(&key)?;
        let at_time = |ms| self.offset_for_time(&key, ms);
        Ok(match group.settings.start {
            GroupStart::Earliest => b.earliest,
            GroupStart::Latest => at_time(group.created_ms).await?.unwrap_or(b.high_watermark),
            GroupStart::Offset(o) => o.clamp(b.earliest, b.high_watermark),
            GroupStart::Timestamp(ms) => at_time(ms).await?.unwrap_or(b.high_watermark),
        })
    }
}

/// How much one poll reads of records never handed out.
struct Limits<'a> {
    allowance: Allowance<'a>,
    bytes: usize,
    whole_batches: Option<usize>,
}

/// The batches of a shard read, with their headers: whole stored batches whose CRCs the
/// read checked (as every read of either tier does), so here only their headers are
/// parsed, never their CRCs computed again. Stops at anything that is not a whole batch.
fn stored_batches(buf: &[u8]) -> impl Iterator<Item = (BatchHeader, &[u8])> {
    HeaderIter::new(buf)
        .map_while(Result::ok)
        .map_while(move |(h, at)| Some((h, buf.get(at..at.checked_add(h.total_len())?)?)))
}

/// Bytes to read for the records a poll may still take: as many as the shard's latest
/// batches stored for that many records (every batch a read returns is read from the file
/// and its CRC checked, so reading past what the poll takes is paid for twice), at most
/// [`FETCH_CHUNK`] and what `max_bytes` leaves; a read returns at least one whole batch.
fn read_size(gs: &GroupShard, limits: &Limits<'_>, out: &Handout) -> usize {
    let room = limits.bytes.saturating_sub(out.bytes).clamp(1, FETCH_CHUNK);
    let per_record = gs.record_bytes.load(Ordering::Relaxed) as usize;
    if per_record == 0 {
        return room;
    }
    let records = limits.allowance.left().max(1);
    records.saturating_mul(per_record).clamp(1, room)
}

/// Notes the stored bytes per record of a read's batches (rounded up, so a read sized by it
/// for a batch's records holds the whole batch).
fn learn_record_bytes(gs: &GroupShard, batches: &[u8]) {
    let records: u64 = stored_batches(batches)
        .map(|(h, _)| h.records_count.max(0) as u64)
        .sum();
    if records > 0 {
        let per = (batches.len() as u64).div_ceil(records);
        gs.record_bytes.store(per, Ordering::Relaxed);
    }
}

/// The offsets of a stored batch's records: dense from its base offset (as Felix writes
/// them), else read from the records.
fn batch_offsets(header: &BatchHeader, batch: &[u8]) -> Result<Vec<u64>, ErrorBody> {
    let base = header.base_offset as u64;
    if i64::from(header.records_count) == i64::from(header.last_offset_delta) + 1 {
        return Ok((base..base + header.records_count.max(0) as u64).collect());
    }
    let decoded = DecodedBatch::decode(batch, DEFAULT_MAX_DECOMPRESSED)
        .map_err(|e| err(codes::CORRUPT_DATA, "corrupt_segment", e.to_string()))?;
    Ok(decoded.records.iter().map(|r| r.offset as u64).collect())
}

/// What one poll hands out: the claims, and the stored batches that hold them (each once).
#[derive(Default)]
pub(crate) struct Handout {
    claims: Vec<(u64, u32)>,
    batches: Vec<Bytes>,
    bases: BTreeSet<i64>,
    bytes: usize,
}

impl Handout {
    fn add_batch(&mut self, base: i64, batch: &Bytes) {
        if self.bases.insert(base) {
            self.bytes += batch.len();
            self.batches.push(batch.clone());
        }
    }

    /// A batch re-encoded with only the records at `offsets`, a contiguous run.
    fn add_partial(
        &mut self,
        batch: &Bytes,
        header: BatchHeader,
        offsets: &[u64],
    ) -> Result<(), ErrorBody> {
        // Checked by the read: decoded without computing its CRC again.
        let decoded =
            DecodedBatch::decode_shared_validated(batch, header, DEFAULT_MAX_DECOMPRESSED)
                .map_err(|e| err(codes::CORRUPT_DATA, "corrupt_segment", e.to_string()))?;
        let mut b = BatchBuilder::new(Compression::None);
        for r in decoded.records {
            if offsets.contains(&(r.offset as u64)) {
                b.push(r);
            }
        }
        let mut built = b
            .build()
            .map_err(|e| err(codes::INTERNAL, "internal", e.to_string()))?;
        // The records keep their offsets (a contiguous run): the base offset is outside
        // the CRC, as the log stamps it.
        felix_wire::batch::stamp_base_offset(&mut built, offsets[0] as i64);
        let bytes = Bytes::from(built);
        self.bytes += bytes.len();
        self.batches.push(bytes);
        Ok(())
    }

    /// The batches, in the order added, as one body.
    fn body(&self) -> Bytes {
        match &self.batches[..] {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => Bytes::from(many.concat()),
        }
    }
}
