//! The single writer of a shard's log, and its periodic flusher.
//!
//! Decides *when bytes reach the file and the device*. The writer thread takes every request
//! queued since its last pass as one group: all appends of a group go into one `pwrite` per
//! segment and (under `on_commit`) one `fdatasync`, and only then are they committed —
//! group commit, so concurrent appenders share the cost of a flush. Segments roll here, by
//! size before a batch that would not fit and by age on append or while idle; a rolled
//! segment is flushed and its index written before the next segment is created (sealing).
//!
//! Under the periodic policy a second thread flushes the active segment every interval, so
//! a slow flush never stalls appends; `durable_end` records what it covered.
//!
//! A leader append passes the log's write gate (if its owner set one) when its group is about
//! to be written; a refusal fails it and every append queued behind it, and gives their
//! offsets back.
//!
//! A failed write or flush takes the log offline (every later append fails) rather than
//! guess what reached the disk: reopening the log recovers a consistent prefix.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tracing::{error, warn};

use crate::config::FsyncPolicy;
use crate::error::LogError;
use crate::queue::Request;
use crate::segment::{Segment, index_file_name, sync_dir, write_index_file};
use crate::shared::Shared;

/// How often an idle writer wakes to roll aged segments.
const IDLE_TICK: Duration = Duration::from_millis(200);

/// The writer's state, shared by its thread and the appenders that write their own group
/// (`inline.rs`): whoever holds the lock is the log's one writer.
pub(crate) type WriterLock = Arc<Mutex<Writer>>;

pub(crate) fn start(
    shared: &Arc<Shared>,
) -> std::io::Result<(WriterLock, Vec<std::thread::JoinHandle<()>>)> {
    let mut threads = Vec::new();
    let writer = Arc::new(Mutex::new(Writer::new(shared.clone())));
    let (s, w) = (shared.clone(), writer.clone());
    threads.push(
        std::thread::Builder::new()
            .name(format!("felix-log-writer-{}", shared.shard))
            .spawn(move || run(&w, &s))?,
    );
    if let FsyncPolicy::Periodic { interval } = shared.config.read().fsync {
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("felix-log-flusher-{}", shared.shard))
                .spawn(move || run_flusher(s, interval))?,
        );
    }
    Ok((writer, threads))
}

pub(crate) struct Writer {
    shared: Arc<Shared>,
    active: Arc<Segment>,
    /// When the active segment got its first batch (for `segment_age`).
    active_since: Option<Instant>,
    /// Batches staged for the active segment, written with one vectored call.
    staging: Vec<Vec<u8>>,
    /// Total bytes in `staging`.
    staged_bytes: u64,
    /// Appends in the current group, answered once it is committed.
    waiting: Vec<oneshot::Sender<Result<(), LogError>>>,
    /// One past the last offset staged or written.
    end_offset: u64,
    /// A write or flush failed: the log is offline and nothing more is written.
    pub(crate) offline: bool,
}

pub(crate) type Failure = (&'static str, String);

impl Writer {
    fn new(shared: Arc<Shared>) -> Writer {
        let active = shared
            .segments
            .read()
            .last()
            .cloned()
            .expect("an open log always has an active segment");
        let end_offset = shared.committed_end.load(Ordering::Acquire);
        let active_since = (!active.is_empty()).then(Instant::now);
        Writer {
            shared,
            active,
            active_since,
            staging: Vec::with_capacity(256),
            staged_bytes: 0,
            waiting: Vec::new(),
            end_offset,
            offline: false,
        }
    }
}

/// The writer thread: waits for requests (or the idle tick), then writes whatever is queued
/// under the writer's lock — unless an appender took the lock and wrote it first.
fn run(writer: &Mutex<Writer>, shared: &Shared) {
    loop {
        {
            let mut q = shared.queue.lock();
            if q.requests.is_empty() && !q.closed {
                shared.work.wait_for(&mut q, IDLE_TICK);
            }
        }
        let mut w = writer.lock();
        if w.offline {
            return;
        }
        let (requests, closed) = {
            let mut q = shared.queue.lock();
            (std::mem::take(&mut q.requests), q.closed)
        };
        let result = if requests.is_empty() {
            w.roll_if_aged()
        } else {
            w.process(requests)
        };
        if let Err((op, reason)) = result {
            w.go_offline(op, reason);
            return;
        }
        if closed && shared.queue.lock().requests.is_empty() {
            if let Err((op, reason)) = w.flush_device() {
                error!(shard = %shared.shard, op, reason, "final flush failed on close");
            }
            return;
        }
    }
}

impl Writer {
    pub(crate) fn process(&mut self, requests: Vec<Request>) -> Result<(), Failure> {
        let mut written = 0usize;
        // The write gate is asked once per group, at its first leader append; once it refuses,
        // every append after that one is refused too, so the offsets that stay are dense.
        let mut gate_open: Option<bool> = None;
        let mut refusing = false;
        // Refusals are answered once their offsets are given back (below), so a caller told
        // "refused" never sees the log's next offset still past them.
        let mut refused = Vec::new();
        for req in requests {
            match req {
                Request::Append {
                    batch,
                    header,
                    leader,
                    reply,
                } => {
                    written += batch.len();
                    if leader && !*gate_open.get_or_insert_with(|| self.gate_open()) {
                        refusing = true;
                    }
                    if refusing {
                        refused.push(reply);
                        continue;
                    }
                    self.stage(batch, &header)?;
                    self.waiting.push(reply);
                }
                Request::Truncate { keep_end, reply } => {
                    self.commit_group()?;
                    // Odd while cutting: shared readers neither use nor keep cached blocks
                    // (see `ShardLog::read_shared`).
                    self.shared.truncations.fetch_add(1, Ordering::AcqRel);
                    let result = self.truncate_to(keep_end);
                    self.shared.truncations.fetch_add(1, Ordering::AcqRel);
                    let next = self.end_offset;
                    {
                        let mut q = self.shared.queue.lock();
                        q.truncating = false;
                        q.next_offset = next;
                    }
                    self.shared.room.notify_waiters();
                    match result {
                        Ok(()) => {
                            let _ = reply.send(Ok(next));
                        }
                        Err(Ok(e)) => {
                            let _ = reply.send(Err(e));
                        }
                        Err(Err(failure)) => {
                            let _ =
                                reply.send(Err(self.shared.failed_error(failure.0, &failure.1)));
                            return Err(failure);
                        }
                    }
                }
                Request::Sync { reply } => {
                    self.commit_group()?;
                    self.flush_device()?;
                    let _ = reply.send(Ok(self.shared.durable_end.load(Ordering::Acquire)));
                }
            }
        }
        self.commit_group()?;
        if refusing {
            written += self.refuse_queued();
            for reply in refused {
                let _ = reply.send(Err(self.refused()));
            }
        }
        if written > 0 {
            let mut q = self.shared.queue.lock();
            q.pending_bytes = q.pending_bytes.saturating_sub(written);
            drop(q);
            self.shared.room.notify_waiters();
        }
        Ok(())
    }

    /// Whether a group of `bytes` more bytes would roll the active segment (by size or by
    /// age) before it is written.
    pub(crate) fn would_roll(&self, bytes: u64) -> bool {
        let (segment_bytes, segment_age) = {
            let c = self.shared.config.read();
            (c.segment_bytes, c.segment_age)
        };
        let used = self.active.size() + self.staged_bytes;
        let aged = segment_age
            .zip(self.active_since)
            .is_some_and(|(age, since)| since.elapsed() >= age);
        used > 0 && (used + bytes > segment_bytes || aged)
    }

    fn gate_open(&self) -> bool {
        let gate = self.shared.write_gate.read().clone();
        gate.is_none_or(|open| open())
    }

    fn refused(&self) -> LogError {
        LogError::WriteRefused {
            shard: self.shared.shard.clone(),
        }
    }

    /// After a refusal: refuses the appends queued meanwhile (their offsets follow the refused
    /// ones) and gives the offsets back, so the next append continues the written log.
    /// Returns the bytes of the appends it refused.
    fn refuse_queued(&mut self) -> usize {
        let mut q = self.shared.queue.lock();
        let mut bytes = 0;
        let mut kept = Vec::new();
        for req in std::mem::take(&mut q.requests) {
            match req {
                Request::Append { batch, reply, .. } => {
                    bytes += batch.len();
                    let _ = reply.send(Err(self.refused()));
                }
                other => kept.push(other),
            }
        }
        q.requests = kept;
        q.next_offset = self.end_offset;
        bytes
    }

    /// Adds one batch to the group, rolling first if it does not fit the active segment.
    fn stage(&mut self, batch: Vec<u8>, header: &felix_wire::BatchHeader) -> Result<(), Failure> {
        if self.would_roll(batch.len() as u64) {
            self.write_staged()?;
            self.roll(header.base_offset as u64)?;
        }
        let interval = self.shared.config.read().index_interval_bytes;
        let position = self.active.size() + self.staged_bytes;
        self.active
            .note_appended(header, position, batch.len() as u64, interval);
        self.staged_bytes += batch.len() as u64;
        self.staging.push(batch);
        self.active_since.get_or_insert_with(Instant::now);
        self.end_offset = header.last_offset() as u64 + 1;
        Ok(())
    }

    /// Writes the staged bytes to the active segment file.
    fn write_staged(&mut self) -> Result<(), Failure> {
        if self.staging.is_empty() {
            return Ok(());
        }
        let position = self.active.size();
        write_all_vectored_at(&self.active.file, &self.staging, position)
            .map_err(|e| ("write", format!("{}: {e}", self.active.path.display())))?;
        self.active
            .size
            .store(position + self.staged_bytes, Ordering::Release);
        self.staging.clear();
        self.staged_bytes = 0;
        Ok(())
    }

    /// Writes the group, flushes it if the policy says so, then commits and answers it.
    fn commit_group(&mut self) -> Result<(), Failure> {
        self.write_staged()?;
        if self.shared.config.read().fsync == FsyncPolicy::OnCommit {
            self.flush_device()?;
        }
        self.publish_committed();
        for reply in self.waiting.drain(..) {
            let _ = reply.send(Ok(()));
        }
        Ok(())
    }

    fn publish_committed(&self) {
        self.shared
            .committed_end
            .store(self.end_offset, Ordering::Release);
        self.shared.committed_tx.send_replace(self.end_offset);
    }

    /// fdatasync of the active segment; earlier segments were flushed when sealed.
    fn flush_device(&mut self) -> Result<(), Failure> {
        let target = self.end_offset;
        self.active
            .file
            .sync_data()
            .map_err(|e| ("fsync", format!("{}: {e}", self.active.path.display())))?;
        self.shared.durable_end.fetch_max(target, Ordering::AcqRel);
        Ok(())
    }

    fn roll_if_aged(&mut self) -> Result<(), Failure> {
        let age = self.shared.config.read().segment_age;
        let aged = age
            .zip(self.active_since)
            .is_some_and(|(age, since)| since.elapsed() >= age);
        if aged && !self.active.is_empty() {
            self.roll(self.end_offset)?;
            self.publish_committed();
        }
        Ok(())
    }

    /// Seals the active segment (flush, index file) and starts a new one at `next_base`.
    fn roll(&mut self, next_base: u64) -> Result<(), Failure> {
        let dir = self.shared.dir.clone();
        let fail = |op: &'static str, e: std::io::Error| (op, format!("{}: {e}", dir.display()));
        self.flush_device()?;
        write_index_file(&dir, &self.active).map_err(|e| fail("write segment index", e))?;
        self.active.sealed.store(true, Ordering::Release);
        let summary = self.active.summary();
        let next = Segment::create(&dir, next_base, &self.shared.shard)
            .map_err(|e| ("create segment", e.to_string()))?;
        sync_dir(&dir).map_err(|e| fail("sync log directory", e))?;
        let next = Arc::new(next);
        self.shared.segments.write().push(next.clone());
        self.active = next;
        self.active_since = None;
        let _ = self.shared.sealed_tx.send(summary);
        Ok(())
    }

    /// Cuts every record at or after `keep_end`. `Err(Ok(e))` is a refusal that changed nothing;
    /// `Err(Err(f))` is an I/O failure that takes the log offline.
    fn truncate_to(&mut self, keep_end: u64) -> Result<(), Result<LogError, Failure>> {
        let shared = self.shared.clone();
        let _maintenance = shared.maintenance.lock();
        let shard = self.shared.shard.clone();
        // Refusals name the last kept offset, as `ShardLog::truncate_after` takes it.
        let after = keep_end.wrapping_sub(1);
        if keep_end >= self.end_offset {
            return Ok(()); // nothing at or after `keep_end`
        }
        let floor = self.shared.immutable_below.load(Ordering::Acquire);
        let first = self
            .shared
            .segments
            .read()
            .first()
            .map_or(0, |s| s.base_offset);
        if keep_end < floor.max(first) {
            return Err(Ok(LogError::TruncateBelowFloor {
                offset: after,
                floor: floor.max(first),
            }));
        }
        let max_batch = self.shared.config.read().max_batch_bytes;
        let segs: Vec<Arc<Segment>> = self.shared.segments.read().clone();
        // The segment holding the first record to cut, and where its batch starts.
        let idx = segs
            .partition_point(|s| s.base_offset <= keep_end)
            .saturating_sub(1);
        let seg = segs[idx].clone();
        let mut cut = None;
        let mut inside = None;
        let start = seg.index.read().position_for(keep_end);
        seg.walk(
            start,
            seg.size(),
            1 << 20,
            max_batch,
            &shard,
            |h, pos, _| {
                let last = h.last_offset() as u64;
                if last >= keep_end {
                    if (h.base_offset as u64) < keep_end {
                        inside = Some((h.base_offset as u64, last));
                    } else {
                        cut = Some(pos);
                    }
                    return false;
                }
                true
            },
        )
        .map_err(Ok)?;
        if let Some((batch_base, batch_last)) = inside {
            return Err(Ok(LogError::TruncateInsideBatch {
                offset: after,
                batch_base,
                batch_last,
            }));
        }
        let cut = cut.unwrap_or(seg.size());
        let io = |op: &'static str,
                  path: &std::path::Path,
                  e: std::io::Error|
         -> Result<LogError, Failure> {
            Err((op, format!("{}: {e}", path.display())))
        };

        // Remove the later segments, newest first, then cut this one and make it active.
        // Readers are kept out (write lock) until the cut segment's bookkeeping is rebuilt.
        let mut list = shared.segments.write();
        list.retain(|s| s.base_offset <= seg.base_offset);
        for later in segs[idx + 1..].iter().rev() {
            std::fs::remove_file(&later.path).map_err(|e| io("delete segment", &later.path, e))?;
            let _ = std::fs::remove_file(self.shared.dir.join(index_file_name(later.base_offset)));
        }
        let index_path = self.shared.dir.join(index_file_name(seg.base_offset));
        if index_path.exists() {
            std::fs::remove_file(&index_path)
                .map_err(|e| io("delete segment index", &index_path, e))?;
        }
        seg.file
            .set_len(cut)
            .map_err(|e| io("truncate segment", &seg.path, e))?;
        seg.file.sync_all().map_err(|e| io("fsync", &seg.path, e))?;
        sync_dir(&self.shared.dir).map_err(|e| io("sync log directory", &self.shared.dir, e))?;

        // Rebuild the segment's bookkeeping for what remains.
        let interval = self.shared.config.read().index_interval_bytes;
        *seg.index.write() = Default::default();
        seg.size.store(cut, Ordering::Release);
        seg.next_offset.store(seg.base_offset, Ordering::Release);
        seg.min_timestamp.store(i64::MAX, Ordering::Relaxed);
        seg.max_timestamp.store(i64::MIN, Ordering::Relaxed);
        seg.walk(0, cut, 1 << 20, max_batch, &shard, |h, pos, bytes| {
            seg.note_appended(h, pos, bytes.len() as u64, interval);
            true
        })
        .map_err(Ok)?;
        seg.sealed.store(false, Ordering::Release);
        drop(list);

        self.active = seg.clone();
        self.active_since = (!seg.is_empty()).then(Instant::now);
        self.end_offset = seg.next_offset().max(seg.base_offset);
        self.shared
            .committed_end
            .store(self.end_offset, Ordering::Release);
        self.shared.committed_tx.send_replace(self.end_offset);
        let durable = self
            .shared
            .durable_end
            .load(Ordering::Acquire)
            .min(self.end_offset);
        self.shared.durable_end.store(durable, Ordering::Release);
        warn!(shard = %shard, after, next = self.end_offset, "truncated the log");
        Ok(())
    }

    pub(crate) fn go_offline(&mut self, op: &'static str, reason: String) {
        self.offline = true;
        error!(shard = %self.shared.shard, op, reason, "log is offline; reopen it to recover");
        let requests = {
            let mut q = self.shared.queue.lock();
            q.failed = Some((op, reason.clone()));
            q.truncating = false;
            std::mem::take(&mut q.requests)
        };
        let err = || self.shared.failed_error(op, &reason);
        for reply in self.waiting.drain(..) {
            let _ = reply.send(Err(err()));
        }
        for req in requests {
            match req {
                Request::Append { reply, .. } => {
                    let _ = reply.send(Err(err()));
                }
                Request::Truncate { reply, .. } | Request::Sync { reply } => {
                    let _ = reply.send(Err(err()));
                }
            }
        }
        self.shared.room.notify_waiters();
    }
}

/// Writes every buffer, in order, at `position` with as few `pwritev` calls as the kernel
/// allows: the group's batches go to the file without first being copied together.
fn write_all_vectored_at(
    file: &std::fs::File,
    bufs: &[Vec<u8>],
    mut position: u64,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // Linux's IOV_MAX.
    const MAX_IOV: usize = 1024;
    let mut index = 0; // first buffer not fully written
    let mut skip = 0; // bytes of bufs[index] already written
    while index < bufs.len() {
        let iov: Vec<libc::iovec> = bufs[index..]
            .iter()
            .take(MAX_IOV)
            .enumerate()
            .map(|(i, b)| {
                let b = if i == 0 { &b[skip..] } else { &b[..] };
                libc::iovec {
                    iov_base: b.as_ptr() as *mut libc::c_void,
                    iov_len: b.len(),
                }
            })
            .collect();
        // SAFETY: every iovec points into a live buffer borrowed for the whole call, and the
        // descriptor is an open file.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                position as libc::off_t,
            )
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                "pwritev wrote nothing",
            ));
        }
        position += n as u64;
        let mut written = n as usize;
        while written > 0 && index < bufs.len() {
            let left = bufs[index].len() - skip;
            if written >= left {
                written -= left;
                index += 1;
                skip = 0;
            } else {
                skip += written;
                written = 0;
            }
        }
    }
    Ok(())
}

/// The periodic flusher: every `interval`, flush the active segment if anything committed
/// is not yet durable.
fn run_flusher(shared: Arc<Shared>, interval: Duration) {
    loop {
        {
            let mut stop = shared.syncer_stop.0.lock();
            if !*stop {
                shared.syncer_stop.1.wait_for(&mut stop, interval);
            }
            if *stop {
                return;
            }
        }
        let _maintenance = shared.maintenance.lock();
        // Read the target before picking the segment: anything committed by then is either
        // in this segment or in an earlier one that was flushed when it was sealed.
        let target = shared.committed_end.load(Ordering::Acquire);
        if shared.durable_end.load(Ordering::Acquire) >= target {
            continue;
        }
        let Some(active) = shared.segments.read().last().cloned() else {
            continue;
        };
        if let Err(e) = active.file.sync_data() {
            let reason = format!("{}: {e}", active.path.display());
            error!(shard = %shared.shard, reason, "periodic fsync failed; log is offline");
            shared.queue.lock().failed = Some(("fsync", reason));
            shared.room.notify_waiters();
            return;
        }
        shared.durable_end.fetch_max(target, Ordering::AcqRel);
    }
}
