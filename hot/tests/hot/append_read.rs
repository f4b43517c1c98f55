//! Appends, reads, conditional and follower appends, truncation, retention, sealing and
//! commit: what a running log promises its callers.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use felix_hot::{FsyncPolicy, LogConfig, LogError, RetentionPolicy, ShardLog};
use felix_wire::batch::{stamp_base_offset, stamp_partition_leader_epoch};
use felix_wire::{BatchHeader, DecodedBatch, WireError};
use proptest::prelude::*;

use super::common::*;

/// Appends `count` batches built by `make(i)` and waits for each commit.
async fn append_many(log: &ShardLog, count: usize, make: impl Fn(usize) -> Vec<u8>) -> Vec<Sent> {
    let mut sent = Vec::with_capacity(count);
    for i in 0..count {
        sent.push(append_committed(log, make(i)).await);
    }
    sent
}

/// A batch already stamped for a follower append: `base` offset, `epoch` generation.
fn follower_batch(seed: u64, records: usize, base: u64, epoch: i32) -> Vec<u8> {
    let mut b = batch(seed, records, 16);
    stamp_base_offset(&mut b, base as i64);
    stamp_partition_leader_epoch(&mut b, epoch);
    b
}

/// The offsets a refused operation must leave alone (the durable end moves on its own under
/// the periodic policy, so it is left out).
fn marks(log: &ShardLog) -> (u64, u64, u64) {
    let o = log.offsets();
    (o.first, o.next, o.committed)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Polls `check` every 20 ms until it holds or `limit` passes; returns whether it held.
async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---- offsets and reads ----------------------------------------------------------------------

#[tokio::test]
async fn offsets_are_dense_and_monotonic_across_segment_rolls_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut sent: Vec<Sent> = Vec::new();
    for round in 0..4u64 {
        let log = ShardLog::open(dir.path(), small_segments(4096)).unwrap();
        let end = sent.last().map_or(0, |s| s.last + 1);
        assert_eq!(
            log.next_offset(),
            end,
            "round {round}: reopen continues at the old end"
        );
        assert_eq!(
            log.committed_offset(),
            end,
            "round {round}: everything recovered is committed"
        );
        assert_eq!(log.first_offset(), 0);
        let clone = log.clone();
        for i in 0..40u64 {
            let records = ((i * 7 + round * 3) % 13 + 1) as usize;
            let bytes = batch(round * 1000 + i, records, 20 + (i as usize % 5) * 30);
            let expected_base = sent.last().map_or(0, |s| s.last + 1);
            // Alternate between the two handles: clones are one log.
            let handle = if i % 2 == 0 { &log } else { &clone };
            let s = append_committed(handle, bytes).await;
            assert_eq!(
                s.base, expected_base,
                "round {round} batch {i}: base offset is dense"
            );
            assert_eq!(s.last, s.base + records as u64 - 1, "one offset per record");
            sent.push(s);
        }
        assert_eq!(log.next_offset(), sent.last().unwrap().last + 1);
        assert!(
            log.sealed_segments().len() as u64 > round,
            "4 KiB segments roll as the log grows"
        );
        drop(clone);
        drop(log);
    }

    let log = ShardLog::open(dir.path(), small_segments(4096)).unwrap();
    let sealed = log.sealed_segments();
    assert!(
        sealed.len() >= 10,
        "many rolls: {} sealed segments",
        sealed.len()
    );
    for max_bytes in [1, 100, 700, 4096, 10_000, 1 << 20] {
        assert_log_holds(&log, &sent, max_bytes, -1);
    }
    // The records inside decode with their absolute offsets and the values that were sent.
    let all = read_all(&log, 0, 1 << 20);
    for ((_, stored), s) in all.iter().zip(&sent) {
        let got = DecodedBatch::decode(stored, usize::MAX).unwrap();
        let want = DecodedBatch::decode(&s.bytes, usize::MAX).unwrap();
        assert_eq!(got.records.len(), want.records.len());
        for (i, (g, w)) in got.records.iter().zip(&want.records).enumerate() {
            assert_eq!(g.offset, (s.base + i as u64) as i64);
            assert_eq!(g.value, w.value);
            assert_eq!(g.timestamp, w.timestamp);
        }
    }
    assert_eq!(
        log.verify().unwrap(),
        sent.len() as u64,
        "verify checks every batch"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn a_read_from_any_offset_starts_with_its_batch_and_following_reads_skip_and_repeat_nothing(
        shapes in prop::collection::vec((1usize..12, 0usize..200), 1..50),
        segment_bytes in 512u64..8192,
        index_interval in 64u64..2048,
        max_bytes in 1usize..12_000,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let config = LogConfig {
                index_interval_bytes: index_interval,
                ..small_segments(segment_bytes)
            };
            let log = ShardLog::open(dir.path(), config).unwrap();
            let mut sent = Vec::new();
            for (i, &(records, value_len)) in shapes.iter().enumerate() {
                sent.push(append_committed(&log, batch(i as u64, records, value_len)).await);
            }
            let end = sent.last().unwrap().last + 1;
            let containing: Vec<usize> = sent
                .iter()
                .enumerate()
                .flat_map(|(i, s)| (s.base..=s.last).map(move |_| i))
                .collect();
            assert_eq!(containing.len() as u64, end, "offsets are dense");

            for offset in 0..end {
                let read = log.read(offset, max_bytes, None).unwrap();
                let batches = split_batches(&read.batches);
                assert!(!batches.is_empty(), "read at {offset} returns something");
                let want = &sent[containing[offset as usize]];
                let (first, bytes) = &batches[0];
                assert_eq!(first.base_offset as u64, want.base, "read at {offset} starts with its batch");
                assert_stored_as_sent(bytes, want, -1);
                for pair in batches.windows(2) {
                    assert_eq!(pair[1].0.base_offset, pair[0].0.last_offset() + 1);
                }
                if batches.len() > 1 {
                    assert!(read.batches.len() <= max_bytes);
                }
                assert_eq!(read.next_offset, batches.last().unwrap().0.last_offset() as u64 + 1);
            }
            assert_log_holds(&log, &sent, max_bytes, -1);
            let at_end = log.read(end, max_bytes, None).unwrap();
            assert!(at_end.batches.is_empty());
            assert_eq!(at_end.next_offset, end);
        });
    }
}

#[tokio::test]
async fn read_stops_before_the_upper_bound_and_returns_whole_batches_only() {
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
    // Batches of 5 records: [0,4] [5,9] [10,14] ... [45,49], across several segments.
    let sent = append_many(&log, 10, |i| batch(i as u64, 5, 40)).await;
    assert!(!log.sealed_segments().is_empty());

    let read = log.read(0, 1 << 20, Some(12)).unwrap();
    let batches = split_batches(&read.batches);
    let bases: Vec<i64> = batches.iter().map(|(h, _)| h.base_offset).collect();
    assert_eq!(
        bases,
        vec![0, 5],
        "the batch [10,14] holds offset 12: not returned"
    );
    assert_eq!(read.next_offset, 10);
    assert_eq!(read.visible_end, 12);

    let read = log.read(10, 1 << 20, Some(12)).unwrap();
    assert!(
        read.batches.is_empty(),
        "a batch straddling the bound is never cut"
    );
    assert_eq!(read.next_offset, 10);

    for bound in [15, 16, 19] {
        let read = log.read(7, 1 << 20, Some(bound)).unwrap();
        let batches = split_batches(&read.batches);
        assert_eq!(batches.len(), 2, "bound {bound}");
        assert_eq!(batches[0].0.base_offset, 5);
        assert_eq!(batches[1].0.last_offset(), 14);
        assert!(
            batches
                .iter()
                .all(|(h, _)| (h.last_offset() as u64) < bound)
        );
    }

    let read = log.read(0, 1 << 20, Some(0)).unwrap();
    assert!(read.batches.is_empty());
    assert_eq!(read.visible_end, 0);

    // A bound past the committed end is the committed end.
    let read = log.read(0, 1 << 20, Some(1_000)).unwrap();
    assert_eq!(read.visible_end, 50);
    assert_eq!(split_batches(&read.batches).len(), sent.len());
    assert_eq!(read.next_offset, 50);

    // Reading across segments with a bound inside a later segment.
    let read = log.read(0, 1 << 20, Some(33)).unwrap();
    let batches = split_batches(&read.batches);
    assert_eq!(batches.last().unwrap().0.last_offset(), 29);
    assert_eq!(read.next_offset, 30);
}

#[tokio::test]
async fn read_at_the_committed_end_is_empty_and_past_it_or_below_the_first_offset_is_out_of_range()
{
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();

    // An empty log: offset 0 is the end.
    let read = log.read(0, 4096, None).unwrap();
    assert!(read.batches.is_empty());
    assert_eq!((read.next_offset, read.visible_end), (0, 0));
    match log.read(1, 4096, None) {
        Err(LogError::OffsetOutOfRange {
            requested: 1,
            first: 0,
            next: 0,
        }) => {}
        other => panic!("expected OffsetOutOfRange, got {other:?}"),
    }

    let sent = append_many(&log, 30, |i| batch(i as u64, 3, 60)).await;
    let end = sent.last().unwrap().last + 1;
    let read = log.read(end, 4096, None).unwrap();
    assert!(read.batches.is_empty());
    assert_eq!(read.next_offset, end);
    for past in [end + 1, end + 1000, u64::MAX] {
        match log.read(past, 4096, None) {
            Err(LogError::OffsetOutOfRange {
                requested,
                first,
                next,
            }) => {
                assert_eq!((requested, first, next), (past, 0, end));
            }
            other => panic!("read at {past}: expected OffsetOutOfRange, got {other:?}"),
        }
    }

    // Retention moves the first offset: below it is out of range, at it reads.
    log.alter(|c| c.retention.max_bytes = Some(0));
    let sealed = log.sealed_segments();
    assert!(sealed.len() >= 3);
    let floor = sealed[2].last_offset + 1;
    let outcome = log.enforce_retention(floor).unwrap();
    assert_eq!(outcome.deleted_segments, 3);
    assert_eq!(outcome.first_offset, floor);
    assert_eq!(log.first_offset(), floor);
    for below in [0, 1, floor - 1] {
        match log.read(below, 4096, None) {
            Err(LogError::OffsetOutOfRange {
                requested,
                first,
                next,
            }) => {
                assert_eq!((requested, first, next), (below, floor, end));
            }
            other => panic!("read at {below}: expected OffsetOutOfRange, got {other:?}"),
        }
    }
    let read = log.read(floor, 4096, None).unwrap();
    assert_eq!(split_batches(&read.batches)[0].0.base_offset as u64, floor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_never_return_uncommitted_or_partial_data_while_appends_are_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(16 * 1024)).unwrap();
    let writer = {
        let log = log.clone();
        tokio::spawn(async move {
            let mut tickets = Vec::new();
            let mut sent = Vec::new();
            for i in 0..400u64 {
                let bytes = batch(i, (i % 7 + 1) as usize, 100);
                let t = log.append(bytes.clone()).await.unwrap();
                sent.push(Sent {
                    base: t.base_offset,
                    last: t.last_offset,
                    bytes,
                });
                tickets.push(t);
                if i % 50 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            for t in tickets {
                t.committed().await.unwrap();
            }
            sent
        })
    };
    let mut next = 0u64;
    let mut seen: Vec<(BatchHeader, Vec<u8>)> = Vec::new();
    loop {
        let finished = writer.is_finished();
        let read = log.read(next, 8 * 1024, None).unwrap();
        let committed_after = log.committed_offset();
        assert!(
            read.visible_end <= committed_after,
            "a read sees only committed offsets"
        );
        for (h, bytes) in split_batches(&read.batches) {
            assert_eq!(
                h.base_offset as u64, next,
                "reads follow each other densely"
            );
            assert!(
                (h.last_offset() as u64) < read.visible_end,
                "nothing at or past the visible end"
            );
            next = h.last_offset() as u64 + 1;
            seen.push((h, bytes));
        }
        assert_eq!(read.next_offset, next);
        if finished && next == log.committed_offset() {
            break;
        }
        tokio::task::yield_now().await;
    }
    let sent = writer.await.unwrap();
    assert_eq!(seen.len(), sent.len());
    for ((_, bytes), s) in seen.iter().zip(&sent) {
        assert_stored_as_sent(bytes, s, -1);
    }
}

const T0: i64 = 1_700_000_000_000;

/// The timestamp of the `i`-th batch of the time tests (one second apart).
fn ts(i: usize) -> i64 {
    T0 + i as i64 * 1000
}

/// Checks time lookups against 40 batches, batch `i` stamped `ts(i)`.
fn check_time_lookups(log: &ShardLog, sent: &[Sent], when: &str) {
    assert_eq!(log.offset_for_time(i64::MIN).unwrap(), Some(0), "{when}");
    assert_eq!(log.offset_for_time(T0 - 1).unwrap(), Some(0), "{when}");
    for (i, s) in sent.iter().enumerate() {
        assert_eq!(
            log.offset_for_time(ts(i)).unwrap(),
            Some(s.base),
            "{when}: equal to batch {i}"
        );
        assert_eq!(
            log.offset_for_time(ts(i) - 500).unwrap(),
            Some(s.base),
            "{when}: between batch {} and {i}",
            i as i64 - 1
        );
        let read = log.read_from_time(ts(i) - 1, 1, None).unwrap();
        let batches = split_batches(&read.batches);
        assert_eq!(batches.len(), 1, "{when}");
        assert_eq!(batches[0].0.base_offset as u64, s.base, "{when}");
        assert_eq!(batches[0].0.max_timestamp, ts(i), "{when}");
        assert_eq!(read.next_offset, s.last + 1, "{when}");
    }
    let n = sent.len();
    let end = sent[n - 1].last + 1;
    assert_eq!(
        log.offset_for_time(ts(n - 1) + 1).unwrap(),
        None,
        "{when}: after the newest record"
    );
    let read = log.read_from_time(ts(n - 1) + 1, 4096, None).unwrap();
    assert!(read.batches.is_empty(), "{when}");
    assert_eq!((read.next_offset, read.visible_end), (end, end), "{when}");

    // An upper bound applies to time reads too.
    let read = log
        .read_from_time(ts(10), 1 << 20, Some(sent[12].base))
        .unwrap();
    let batches = split_batches(&read.batches);
    assert_eq!(
        batches.first().unwrap().0.base_offset as u64,
        sent[10].base,
        "{when}"
    );
    assert_eq!(
        batches.last().unwrap().0.last_offset() as u64,
        sent[11].last,
        "{when}"
    );
}

#[tokio::test]
async fn offset_for_time_and_read_from_time_find_the_first_batch_at_or_after_a_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let mut sent = Vec::new();
    {
        let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
        assert_eq!(
            log.offset_for_time(0).unwrap(),
            None,
            "an empty log has no offset for any time"
        );
        for i in 0..40 {
            sent.push(append_committed(&log, batch_at(ts(i), 3)).await);
        }
        assert!(
            log.sealed_segments().len() >= 3,
            "the batches span several segments"
        );
        check_time_lookups(&log, &sent, "live");
    }
    // After a reopen the sealed segments answer from their index files.
    let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
    check_time_lookups(&log, &sent, "reopened");
    for i in 40..45 {
        sent.push(append_committed(&log, batch_at(ts(i), 2)).await);
    }
    check_time_lookups(&log, &sent, "appended after reopen");
}

// ---- conditional and follower appends -------------------------------------------------------

/// The write gate is asked when a group is about to be written, not when it is accepted:
/// appends accepted while it was open but written after it closed are refused, with nothing
/// written and their offsets given back; follower appends pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_gate_closed_before_the_write_refuses_accepted_appends_and_gives_their_offsets_back()
 {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(1 << 20)).unwrap();
    let sent = append_many(&log, 2, |i| batch(i as u64, 4, 10)).await;
    // A gate that holds the writer until the test says whether it is open.
    let open = Arc::new(AtomicBool::new(true));
    let release = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let gate = {
        let (open, release) = (open.clone(), release.clone());
        Arc::new(move || {
            let (held, cv) = &*release;
            let _g = cv.wait_while(held.lock().unwrap(), |h| *h).unwrap();
            open.load(Ordering::Acquire)
        })
    };
    log.set_write_gate(gate);
    *release.0.lock().unwrap() = true;
    let a = log.append(batch(10, 2, 10)).await.unwrap();
    let b = log.append(batch(11, 3, 10)).await.unwrap();
    assert_eq!((a.base_offset, b.base_offset), (8, 10), "accepted at once");
    open.store(false, Ordering::Release);
    *release.0.lock().unwrap() = false;
    release.1.notify_all();
    for t in [a, b] {
        match t.committed().await {
            Err(LogError::WriteRefused { .. }) => {}
            other => panic!("an append written after the gate closed: {other:?}"),
        }
    }
    assert_eq!(log.next_offset(), 8, "the refused offsets are given back");
    assert_log_holds(&log, &sent, 1 << 20, -1);
    // A follower append is not the owner's write: it passes a closed gate.
    let t = log.append_at(follower_batch(12, 2, 8, 0)).await.unwrap();
    assert_eq!(t.committed().await.unwrap(), (8, 9));
    open.store(true, Ordering::Release);
    let t = log.append(batch(13, 1, 10)).await.unwrap();
    assert_eq!(t.committed().await.unwrap(), (10, 10));
}

#[tokio::test]
async fn append_if_succeeds_at_the_next_offset_and_is_refused_elsewhere_with_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(1 << 20)).unwrap();
    let mut sent = append_many(&log, 2, |i| batch(i as u64, 4, 10)).await;
    assert_eq!(log.next_offset(), 8);

    let b = batch(100, 2, 10);
    let t = log.append_if(b.clone(), 8).await.unwrap();
    assert_eq!((t.base_offset, t.last_offset), (8, 9));
    assert_eq!(t.committed().await.unwrap(), (8, 9));
    sent.push(Sent {
        base: 8,
        last: 9,
        bytes: b,
    });

    let before = marks(&log);
    for expected in [0, 7, 9, 11, 1000] {
        match log.append_if(batch(200, 1, 10), expected).await {
            Err(LogError::OffsetMismatch { given, next }) => {
                assert_eq!((given, next), (expected, 10))
            }
            other => panic!("append_if at {expected}: expected OffsetMismatch, got {other:?}"),
        }
    }
    assert_eq!(marks(&log), before, "a refused append_if changes no offset");
    assert_log_holds(&log, &sent, 1 << 20, -1);

    let t = log.append_if(batch(300, 1, 10), 10).await.unwrap();
    assert_eq!(t.committed().await.unwrap(), (10, 10));
}

#[tokio::test]
async fn append_at_accepts_only_the_next_offset_and_refuses_an_older_generation() {
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(1 << 20)).unwrap();
    assert_eq!(log.generation(), -1);

    let t = log.append_at(follower_batch(1, 3, 0, 3)).await.unwrap();
    assert_eq!(t.committed().await.unwrap(), (0, 2));
    assert_eq!(
        log.generation(),
        3,
        "a follower adopts the batch's generation"
    );

    // A gap and an overlap are refused.
    for base in [4, 100, 2, 0] {
        match log.append_at(follower_batch(2, 2, base, 3)).await {
            Err(LogError::OffsetMismatch { given, next }) => assert_eq!((given, next), (base, 3)),
            other => panic!("append_at {base}: expected OffsetMismatch, got {other:?}"),
        }
    }
    let t = log.append_at(follower_batch(3, 2, 3, 3)).await.unwrap();
    assert_eq!(t.committed().await.unwrap(), (3, 4));

    // A newer generation is adopted; an older one is then stale.
    let t = log.append_at(follower_batch(4, 1, 5, 5)).await.unwrap();
    assert_eq!(t.committed().await.unwrap(), (5, 5));
    assert_eq!(log.generation(), 5);
    let before = marks(&log);
    match log.append_at(follower_batch(5, 1, 6, 4)).await {
        Err(LogError::StaleGeneration { batch, current }) => assert_eq!((batch, current), (4, 5)),
        other => panic!("expected StaleGeneration, got {other:?}"),
    }
    assert_eq!(
        marks(&log),
        before,
        "a refused follower append writes nothing"
    );
    assert_eq!(log.generation(), 5);

    // The stored batches keep their given offsets and generations.
    let read = split_batches(&log.read(0, 1 << 20, None).unwrap().batches);
    let stamps: Vec<(i64, i32)> = read
        .iter()
        .map(|(h, _)| (h.base_offset, h.partition_leader_epoch))
        .collect();
    assert_eq!(stamps, vec![(0, 3), (3, 3), (5, 5)]);
    assert_eq!(read.last().unwrap().0.last_offset(), 5);
}

#[tokio::test]
async fn set_generation_stamps_leader_appends_and_never_goes_back() {
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(1 << 20)).unwrap();
    let first = append_committed(&log, batch(1, 2, 10)).await;
    log.set_generation(7).unwrap();
    assert_eq!(log.generation(), 7);
    let second = append_committed(&log, batch(2, 2, 10)).await;
    match log.set_generation(6) {
        Err(LogError::StaleGeneration { batch, current }) => assert_eq!((batch, current), (6, 7)),
        other => panic!("expected StaleGeneration, got {other:?}"),
    }
    log.set_generation(7).unwrap();
    assert_eq!(log.generation(), 7);
    match log.append_at(follower_batch(3, 1, 4, 6)).await {
        Err(LogError::StaleGeneration {
            batch: 6,
            current: 7,
        }) => {}
        other => panic!("expected StaleGeneration, got {other:?}"),
    }
    let read = split_batches(&log.read(0, 1 << 20, None).unwrap().batches);
    assert_eq!(read.len(), 2);
    assert_eq!(read[0].0.partition_leader_epoch, -1);
    assert_eq!(read[1].0.partition_leader_epoch, 7);
    assert_eq!(&read[1].1[12..16], &7i32.to_be_bytes());
    assert_stored_as_sent(&read[0].1, &first, -1);
    assert_stored_as_sent(&read[1].1, &second, 7);
}

// ---- bad input ------------------------------------------------------------------------------

#[tokio::test]
async fn bad_input_is_refused_with_a_typed_error_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        max_batch_bytes: 2048,
        ..small_segments(1 << 20)
    };
    let log = ShardLog::open(dir.path(), config).unwrap();
    let sent = append_many(&log, 3, |i| batch(i as u64, 2, 50)).await;
    let before = log.offsets();
    let content = log.read(0, 1 << 20, None).unwrap();
    let before_marks = marks(&log);

    let good = batch(10, 2, 50);
    let mut flipped_crc = good.clone();
    flipped_crc[18] ^= 0x01;
    let mut flipped_body = good.clone();
    let mid = flipped_body.len() - 5;
    flipped_body[mid] ^= 0x80;
    let mut two = good.clone();
    let second = batch(11, 1, 5);
    two.extend_from_slice(&second);
    let torn = good[..good.len() - 1].to_vec();
    let oversized = batch(12, 4, 600);
    assert!(oversized.len() > 2048);
    let mut bad_magic = good.clone();
    bad_magic[16] = 1;

    type Check = fn(&LogError) -> bool;
    let cases: Vec<(&str, Vec<u8>, Check)> = vec![
        ("garbage", noise(7, 300), |e| {
            matches!(e, LogError::InvalidBatch(_))
        }),
        ("empty", Vec::new(), |e| {
            matches!(e, LogError::InvalidBatch(WireError::Truncated { .. }))
        }),
        ("flipped crc byte", flipped_crc, |e| {
            matches!(e, LogError::InvalidBatch(WireError::CrcMismatch { .. }))
        }),
        ("flipped record byte", flipped_body, |e| {
            matches!(e, LogError::InvalidBatch(WireError::CrcMismatch { .. }))
        }),
        ("torn batch", torn, |e| {
            matches!(e, LogError::InvalidBatch(WireError::Truncated { .. }))
        }),
        ("magic 1", bad_magic, |e| {
            matches!(e, LogError::InvalidBatch(WireError::UnsupportedMagic(1)))
        }),
        ("two batches", two.clone(), |e| {
            matches!(e, LogError::TrailingBytes { .. })
        }),
        ("oversized", oversized.clone(), |e| {
            matches!(e, LogError::BatchTooLarge { .. })
        }),
    ];
    for (name, bytes, check) in cases {
        for mode in ["append", "append_if", "append_at"] {
            let result = match mode {
                "append" => log.append(bytes.clone()).await,
                "append_if" => log.append_if(bytes.clone(), before.next).await,
                _ => {
                    let mut b = bytes.clone();
                    if b.len() >= 16 {
                        stamp_base_offset(&mut b, before.next as i64);
                    }
                    log.append_at(b).await
                }
            };
            match result {
                Err(e) => {
                    assert!(check(&e), "{name} via {mode}: unexpected error {e:?}");
                    assert!(!e.is_fatal(), "{name}: bad input does not fail the log");
                }
                Ok(t) => panic!("{name} via {mode} was accepted at {}", t.base_offset),
            }
            assert_eq!(
                marks(&log),
                before_marks,
                "{name} via {mode} changed the offsets"
            );
        }
    }
    match log.append(two).await {
        Err(LogError::TrailingBytes { extra }) => assert_eq!(extra, second.len()),
        other => panic!("expected TrailingBytes, got {other:?}"),
    }
    match log.append(oversized.clone()).await {
        Err(LogError::BatchTooLarge { size, max }) => {
            assert_eq!((size, max), (oversized.len(), 2048))
        }
        other => panic!("expected BatchTooLarge, got {other:?}"),
    }
    assert_eq!(
        log.read(0, 1 << 20, None).unwrap(),
        content,
        "readable content unchanged"
    );
    // The log still works and continues where it was.
    let s = append_committed(&log, good).await;
    assert_eq!(s.base, before.next);
    let mut all = sent;
    all.push(s);
    assert_log_holds(&log, &all, 1 << 20, -1);
}

// ---- truncation -----------------------------------------------------------------------------

#[tokio::test]
async fn truncate_after_inside_the_active_segment_cuts_there_and_appends_continue() {
    let dir = tempfile::tempdir().unwrap();
    let mut sent;
    {
        let log = ShardLog::open(dir.path(), small_segments(1 << 20)).unwrap();
        sent = append_many(&log, 10, |i| batch(i as u64, 3, 30)).await; // [0,2] .. [27,29]
        assert_eq!(log.truncate_after(14).await.unwrap(), 15);
        sent.truncate(5);
        assert_eq!(log.next_offset(), 15);
        assert_eq!(log.committed_offset(), 15);
        assert_log_holds(&log, &sent, 1 << 20, -1);
        match log.read(16, 4096, None) {
            Err(LogError::OffsetOutOfRange { next: 15, .. }) => {}
            other => panic!("expected OffsetOutOfRange past the cut, got {other:?}"),
        }
        // Truncating at or past the end changes nothing.
        assert_eq!(log.truncate_after(14).await.unwrap(), 15);
        assert_eq!(log.truncate_after(500).await.unwrap(), 15);
        let s = append_committed(&log, batch(100, 4, 30)).await;
        assert_eq!((s.base, s.last), (15, 18));
        sent.push(s);
        assert_log_holds(&log, &sent, 1 << 20, -1);
    }
    let log = ShardLog::open(dir.path(), small_segments(1 << 20)).unwrap();
    assert_eq!(log.next_offset(), 19);
    assert_log_holds(&log, &sent, 100, -1);
    assert_eq!(log.verify().unwrap(), 6);
}

/// Appends 40 batches of 3 records to 1 KiB segments; returns what was sent.
async fn sealed_log(log: &ShardLog) -> Vec<Sent> {
    let sent = append_many(log, 40, |i| batch(i as u64, 3, 40)).await;
    assert!(
        log.sealed_segments().len() >= 5,
        "the log spans several sealed segments"
    );
    sent
}

#[tokio::test]
async fn truncate_after_into_an_earlier_sealed_segment_deletes_the_later_ones_and_survives_reopen()
{
    let dir = tempfile::tempdir().unwrap();
    let mut sent;
    let cut_segment;
    {
        let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
        sent = sealed_log(&log).await;
        let sealed = log.sealed_segments();
        cut_segment = sealed[2].clone();
        // A batch boundary strictly inside sealed segment 2.
        let keep: Vec<&Sent> = sent
            .iter()
            .filter(|s| s.base >= cut_segment.base_offset && s.last < cut_segment.last_offset)
            .collect();
        assert!(!keep.is_empty(), "segment 2 holds more than one batch");
        let after = keep[0].last;
        assert_eq!(log.truncate_after(after).await.unwrap(), after + 1);
        sent.retain(|s| s.last <= after);
        assert_eq!(log.next_offset(), after + 1);
        assert_eq!(log.committed_offset(), after + 1);

        let now_sealed = log.sealed_segments();
        assert_eq!(
            now_sealed,
            sealed[..2].to_vec(),
            "the cut segment is active again, later ones are gone"
        );
        let files = segment_files(dir.path());
        assert_eq!(files.len(), 3);
        assert_eq!(files[2], cut_segment.path);
        assert!(std::fs::metadata(&cut_segment.path).unwrap().len() < cut_segment.size_bytes);
        assert_eq!(
            index_files(dir.path()).len(),
            2,
            "the cut segment's index is gone"
        );
        assert_log_holds(&log, &sent, 300, -1);
        match log.read(after + 1, 4096, None) {
            Ok(r) => assert!(r.batches.is_empty()),
            Err(e) => panic!("read at the new end: {e}"),
        }

        // Appends continue at the cut and roll new segments again.
        for i in 0..20 {
            let s = append_committed(&log, batch(500 + i, 2, 40)).await;
            assert_eq!(s.base, sent.last().unwrap().last + 1);
            sent.push(s);
        }
        assert!(log.sealed_segments().len() > 3);
        assert_log_holds(&log, &sent, 4096, -1);
    }
    let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
    assert_eq!(log.next_offset(), sent.last().unwrap().last + 1);
    assert_log_holds(&log, &sent, 1, -1);
    assert_eq!(log.verify().unwrap(), sent.len() as u64);
}

#[tokio::test]
async fn truncate_after_the_end_of_a_sealed_segment_leaves_an_empty_active_segment_that_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let mut sent;
    {
        let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
        sent = sealed_log(&log).await;
        let sealed = log.sealed_segments();
        let after = sealed[1].last_offset; // cut exactly at the start of segment 2
        assert_eq!(log.truncate_after(after).await.unwrap(), after + 1);
        sent.retain(|s| s.last <= after);
        assert_eq!(log.sealed_segments(), sealed[..2].to_vec());
        assert_log_holds(&log, &sent, 4096, -1);
        let s = append_committed(&log, batch(900, 5, 10)).await;
        assert_eq!(s.base, after + 1);
        sent.push(s);
        assert_log_holds(&log, &sent, 4096, -1);
    }
    let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
    assert_eq!(log.next_offset(), sent.last().unwrap().last + 1);
    assert_log_holds(&log, &sent, 4096, -1);
}

#[tokio::test]
async fn truncate_after_is_refused_inside_a_batch_and_below_the_uploaded_floor() {
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
    let sent = sealed_log(&log).await; // batches [0,2] [3,5] ...
    let before = marks(&log);
    let sealed_before = log.sealed_segments();

    for (after, base, last) in [
        (13, 12, 14),
        (12, 12, 14),
        (0, 0, 2),
        (1, 0, 2),
        (100, 99, 101),
    ] {
        match log.truncate_after(after).await {
            Err(LogError::TruncateInsideBatch {
                offset,
                batch_base,
                batch_last,
            }) => {
                assert_eq!((offset, batch_base, batch_last), (after, base, last));
            }
            other => panic!("truncate_after({after}): expected TruncateInsideBatch, got {other:?}"),
        }
    }
    assert_eq!(marks(&log), before);
    assert_eq!(log.sealed_segments(), sealed_before);

    log.mark_uploaded_below(30);
    log.mark_uploaded_below(12); // the floor only grows
    for after in [2, 26, 28] {
        match log.truncate_after(after).await {
            Err(LogError::TruncateBelowFloor { offset, floor }) => {
                assert_eq!((offset, floor), (after, 30))
            }
            other => panic!("truncate_after({after}): expected TruncateBelowFloor, got {other:?}"),
        }
    }
    assert_eq!(marks(&log), before, "a refused truncation changes nothing");
    assert_eq!(log.sealed_segments(), sealed_before);
    assert_log_holds(&log, &sent, 1 << 20, -1);
    let s = append_committed(&log, batch(77, 1, 1)).await;
    assert_eq!(
        s.base, before.1,
        "appends after a refused truncation continue at the end"
    );

    // Cutting right at the floor is allowed: records from 30 on were not uploaded.
    assert_eq!(log.truncate_after(29).await.unwrap(), 30);
    assert_log_holds(&log, &sent[..10], 1 << 20, -1);
}

// ---- retention ------------------------------------------------------------------------------

#[tokio::test]
async fn retention_by_size_deletes_only_sealed_segments_below_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
    let sent = sealed_log(&log).await;
    let end = sent.last().unwrap().last + 1;
    let total = log.size_bytes();
    let sealed = log.sealed_segments();
    assert_eq!(
        total,
        segment_files(dir.path())
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum::<u64>()
    );

    // No policy: nothing is deleted, whatever the floor.
    assert_eq!(log.enforce_retention(u64::MAX).unwrap().deleted_segments, 0);

    log.alter(|c| {
        c.retention = RetentionPolicy {
            max_bytes: Some(total / 2),
            max_age: None,
        }
    });
    // Floor 0 (nothing uploaded) and a floor inside the first segment: nothing can go.
    assert_eq!(log.enforce_retention(0).unwrap().deleted_segments, 0);
    assert_eq!(
        log.enforce_retention(sealed[0].last_offset)
            .unwrap()
            .deleted_segments,
        0
    );
    assert_eq!(log.first_offset(), 0);

    // A floor inside segment 3: segments 0..=2 may go, segment 3 holds records at the floor.
    let floor = sealed[3].base_offset + 1;
    let outcome = log.enforce_retention(floor).unwrap();
    assert_eq!(outcome.deleted_segments, 3);
    assert_eq!(
        outcome.deleted_bytes,
        sealed[..3].iter().map(|s| s.size_bytes).sum::<u64>()
    );
    assert_eq!(outcome.first_offset, sealed[3].base_offset);
    assert_eq!(log.first_offset(), sealed[3].base_offset);
    for s in &sealed[..3] {
        assert!(!s.path.exists(), "{} deleted", s.path.display());
    }
    assert_eq!(index_files(dir.path()).len(), sealed.len() - 3);
    assert!(matches!(
        log.read(sealed[3].base_offset - 1, 4096, None),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    let kept: Vec<Sent> = sent
        .iter()
        .filter(|s| s.base >= sealed[3].base_offset)
        .cloned()
        .collect();
    assert_log_holds(&log, &kept, 1000, -1);

    // No floor: delete oldest first while the rest still holds at least max_bytes.
    let max = total / 2;
    let outcome = log.enforce_retention(u64::MAX).unwrap();
    assert!(outcome.deleted_segments > 0);
    let remaining = log.sealed_segments();
    let size = log.size_bytes();
    assert!(
        size >= max,
        "retention keeps at least max_bytes ({size} < {max})"
    );
    assert!(
        remaining.is_empty() || size - remaining[0].size_bytes < max,
        "the oldest remaining segment was needed to keep max_bytes"
    );
    assert_eq!(
        log.first_offset(),
        remaining
            .first()
            .map_or(sealed.last().unwrap().last_offset + 1, |s| s.base_offset)
    );

    // Even max_bytes 0 never deletes the active segment.
    log.alter(|c| c.retention.max_bytes = Some(0));
    log.enforce_retention(u64::MAX).unwrap();
    assert!(log.sealed_segments().is_empty());
    let active_base = sealed.last().unwrap().last_offset + 1;
    assert_eq!(log.first_offset(), active_base);
    assert_eq!(segment_files(dir.path()).len(), 1);
    let kept: Vec<Sent> = sent
        .iter()
        .filter(|s| s.base >= active_base)
        .cloned()
        .collect();
    assert!(
        !kept.is_empty(),
        "the active segment holds the newest batches"
    );
    assert_log_holds(&log, &kept, 1 << 20, -1);
    assert_eq!(log.committed_offset(), end);

    // Retention survives a reopen: the log starts at its new first offset.
    drop(log);
    let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
    assert_eq!(log.first_offset(), active_base);
    assert_eq!(log.next_offset(), end);
    assert_log_holds(&log, &kept, 1 << 20, -1);
}

#[tokio::test]
async fn retention_by_age_deletes_segments_whose_newest_record_is_too_old() {
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
    let old = now_ms() - 48 * 3600 * 1000;
    let new = now_ms();
    let mut sent = Vec::new();
    for i in 0..20 {
        sent.push(append_committed(&log, batch_at(old + i, 3)).await);
    }
    for i in 0..20 {
        sent.push(append_committed(&log, batch_at(new + i, 3)).await);
    }
    let sealed = log.sealed_segments();
    let day = 24 * 3600 * 1000;
    let old_segments = sealed
        .iter()
        .take_while(|s| s.max_timestamp < now_ms() - day)
        .count();
    assert!(old_segments >= 2, "several segments hold only old records");
    assert!(old_segments < sealed.len());

    log.alter(|c| c.retention.max_age = Some(Duration::from_secs(24 * 3600)));
    // Below the caller's floor only.
    assert_eq!(
        log.enforce_retention(sealed[0].last_offset)
            .unwrap()
            .deleted_segments,
        0
    );
    let outcome = log.enforce_retention(sealed[1].last_offset + 1).unwrap();
    assert_eq!(outcome.deleted_segments, 2);
    let outcome = log.enforce_retention(u64::MAX).unwrap();
    assert_eq!(outcome.deleted_segments, old_segments - 2);
    assert_eq!(log.first_offset(), sealed[old_segments].base_offset);
    assert_eq!(log.sealed_segments(), sealed[old_segments..].to_vec());
    // Nothing newer goes, however often retention runs.
    assert_eq!(log.enforce_retention(u64::MAX).unwrap().deleted_segments, 0);
    let kept: Vec<Sent> = sent
        .into_iter()
        .filter(|s| s.base >= sealed[old_segments].base_offset)
        .collect();
    assert_log_holds(&log, &kept, 1 << 20, -1);
}

// ---- sealing --------------------------------------------------------------------------------

#[tokio::test]
async fn every_roll_is_announced_with_the_segments_offsets_and_listed_by_sealed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
    let mut rx = log.subscribe_sealed();
    let t0 = 1_700_000_000_000;
    let mut sent = Vec::new();
    for i in 0..60 {
        sent.push(append_committed(&log, batch_at(t0 + i * 10, 2)).await);
    }
    let mut announced = Vec::new();
    while let Ok(s) = rx.try_recv() {
        announced.push(s);
    }
    let listed = log.sealed_segments();
    assert!(listed.len() >= 5);
    assert_eq!(announced, listed, "one notification per roll, in order");
    let mut expect_base = 0;
    for s in &listed {
        assert_eq!(s.base_offset, expect_base, "segments are contiguous");
        let inside: Vec<&Sent> = sent
            .iter()
            .filter(|b| b.base >= s.base_offset && b.last <= s.last_offset)
            .collect();
        assert!(!inside.is_empty());
        assert_eq!(inside.last().unwrap().last, s.last_offset);
        assert_eq!(
            s.size_bytes,
            inside.iter().map(|b| b.bytes.len() as u64).sum::<u64>()
        );
        assert_eq!(std::fs::metadata(&s.path).unwrap().len(), s.size_bytes);
        let ts: Vec<i64> = inside
            .iter()
            .map(|b| BatchHeader::parse(&b.bytes).unwrap().max_timestamp)
            .collect();
        assert_eq!(s.min_timestamp, *ts.iter().min().unwrap());
        assert_eq!(s.max_timestamp, *ts.iter().max().unwrap());
        assert!(s.size_bytes <= 1024);
        expect_base = s.last_offset + 1;
    }
    let files = segment_files(dir.path());
    assert_eq!(files.len(), listed.len() + 1, "plus the active segment");
    assert_eq!(
        *files.last().unwrap(),
        dir.path().join(format!("{expect_base:020}.log"))
    );

    // Sealed segments stay sealed across a reopen.
    drop(log);
    let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
    assert_eq!(log.sealed_segments(), listed);
}

#[tokio::test]
async fn an_idle_segment_is_sealed_once_it_is_older_than_segment_age() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_age: Some(Duration::from_millis(300)),
        ..small_segments(1 << 20)
    };
    let log = ShardLog::open(dir.path(), config).unwrap();
    let mut rx = log.subscribe_sealed();
    let first = append_committed(&log, batch(1, 4, 10)).await;
    assert!(
        eventually(Duration::from_secs(10), || !log
            .sealed_segments()
            .is_empty())
        .await,
        "an idle segment with data is sealed by age"
    );
    let sealed = log.sealed_segments();
    assert_eq!(sealed.len(), 1);
    assert_eq!(
        (sealed[0].base_offset, sealed[0].last_offset),
        (0, first.last)
    );
    let note = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(note, sealed[0]);

    // The next append lands in a new segment that continues the offsets.
    let second = append_committed(&log, batch(2, 2, 10)).await;
    assert_eq!(second.base, first.last + 1);
    let files = segment_files(dir.path());
    assert_eq!(files.len(), 2);
    assert_eq!(
        files[1],
        dir.path().join(format!("{:020}.log", second.base))
    );
    assert_log_holds(&log, &[first, second], 1 << 20, -1);
    // An empty active segment is never sealed, however long it idles: the only roll after
    // the second append's segment ages is that one.
    assert!(
        eventually(Duration::from_secs(10), || log.sealed_segments().len() == 2).await,
        "the second segment ages too"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        log.sealed_segments().len(),
        2,
        "empty segments are not sealed"
    );
}

// ---- commit and durability ------------------------------------------------------------------

#[tokio::test]
async fn under_on_commit_a_committed_append_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        fsync: FsyncPolicy::OnCommit,
        ..small_segments(2048)
    };
    let log = ShardLog::open(dir.path(), config).unwrap();
    for i in 0..30 {
        let s = append_committed(&log, batch(i, 3, 50)).await;
        let o = log.offsets();
        assert!(
            o.durable > s.last,
            "durable end {} does not cover committed {}",
            o.durable,
            s.last
        );
        assert!(o.committed > s.last);
    }
    // Concurrent appends share flushes, and each is durable once committed.
    for (durable, last) in append_burst(&log, 20).await {
        assert!(
            durable > last,
            "durable end {durable} does not cover committed {last}"
        );
    }
}

/// Appends `n` batches without waiting, then waits for each commit and returns
/// (durable end right after the commit, last offset).
async fn append_burst(log: &ShardLog, n: u64) -> Vec<(u64, u64)> {
    let mut tickets = Vec::new();
    for i in 0..n {
        tickets.push(log.append(batch(1000 + i, 1, 10)).await.unwrap());
    }
    let mut out = Vec::new();
    for t in tickets {
        let (_, last) = t.committed().await.unwrap();
        out.push((log.offsets().durable, last));
    }
    out
}

#[tokio::test]
async fn under_periodic_fsync_the_durable_end_catches_up_without_more_appends() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        fsync: FsyncPolicy::Periodic {
            interval: Duration::from_millis(50),
        },
        ..small_segments(1 << 20)
    };
    let log = ShardLog::open(dir.path(), config).unwrap();
    for round in 0..3 {
        let mut last = 0;
        for i in 0..10 {
            last = append_committed(&log, batch(round * 100 + i, 2, 30))
                .await
                .last;
        }
        let committed = log.committed_offset();
        assert_eq!(committed, last + 1);
        assert!(
            eventually(Duration::from_secs(10), || log.offsets().durable
                >= committed)
            .await,
            "round {round}: durable end {} never reached committed {committed}",
            log.offsets().durable
        );
    }
    assert_eq!(log.sync().await.unwrap(), log.committed_offset());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_get_unique_dense_offsets_in_each_senders_order() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        fsync: FsyncPolicy::OnCommit,
        max_pending_bytes: 16 * 1024,
        ..small_segments(64 * 1024)
    };
    let log = ShardLog::open(dir.path(), config).unwrap();
    let run = async {
        let mut tasks = Vec::new();
        for task in 0..32u64 {
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                let mut tickets = Vec::new();
                let mut sent = Vec::new();
                for j in 0..50u64 {
                    let bytes = batch(task * 1000 + j, (j % 4 + 1) as usize, 40);
                    let t = log.append(bytes.clone()).await.unwrap();
                    sent.push(Sent {
                        base: t.base_offset,
                        last: t.last_offset,
                        bytes,
                    });
                    if j % 10 == 9 {
                        // Sometimes wait for the commit before sending more.
                        t.committed().await.unwrap();
                    } else {
                        tickets.push(t);
                    }
                }
                for t in tickets {
                    t.committed().await.unwrap();
                }
                sent
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.push(t.await.unwrap());
        }
        all
    };
    let per_task = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("all appends commit (no deadlock)");

    for (task, sent) in per_task.iter().enumerate() {
        for pair in sent.windows(2) {
            assert!(
                pair[1].base > pair[0].last,
                "task {task}: offsets follow its send order"
            );
        }
    }
    let mut everything: Vec<Sent> = per_task.into_iter().flatten().collect();
    everything.sort_by_key(|s| s.base);
    let mut next = 0;
    for s in &everything {
        assert_eq!(s.base, next, "offsets are unique and dense");
        next = s.last + 1;
    }
    assert_eq!(everything.len(), 32 * 50);
    assert_eq!(log.committed_offset(), next);
    assert!(log.offsets().durable >= next);
    assert_log_holds(&log, &everything, 64 * 1024, -1);
    let by_base: HashMap<u64, usize> = everything
        .iter()
        .enumerate()
        .map(|(i, s)| (s.base, i))
        .collect();
    assert_eq!(by_base.len(), everything.len());
}

/// What the deferred-append tests' tasks `run` sent, by offset, once every append is
/// committed — also those whose tickets were dropped — with offsets unique and dense; and
/// the log's end.
async fn all_committed_densely(
    log: &ShardLog,
    run: impl std::future::Future<Output = Vec<Sent>>,
) -> (Vec<Sent>, u64) {
    let mut everything = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("every awaited deferred append commits");
    everything.sort_by_key(|s| s.base);
    let mut next = 0;
    for s in &everything {
        assert_eq!(s.base, next, "offsets are unique and dense");
        next = s.last + 1;
    }
    assert!(
        eventually(Duration::from_secs(10), || log.committed_offset() == next).await,
        "the appends whose tickets were dropped are written too: committed {} of {next}",
        log.committed_offset()
    );
    (everything, next)
}

/// `log` holds `everything`, and so does the log reopened from `dir`, ending at `next`.
async fn holds_all_after_reopen(dir: &Path, log: ShardLog, everything: &[Sent], next: u64) {
    assert_log_holds(&log, everything, 64 * 1024, -1);
    drop(log);
    let log = ShardLog::open(dir, small_segments(16 * 1024)).unwrap();
    assert_eq!(log.next_offset(), next, "a reopened log holds every append");
    assert_log_holds(&log, everything, 64 * 1024, -1);
}

/// Deferred appends (`append_if_deferred`), made as a cache shard makes its changes:
/// accepted in turn under the caller's lock, waited for outside it, where the waiter
/// writes the queue itself. Every accepted append is committed, densely and in order —
/// across segment rolls (left to the writer thread) and when its ticket is dropped
/// unawaited — and the log holds them all after a reopen.
#[tokio::test]
async fn deferred_appends_are_written_by_their_waiters_densely_across_rolls_and_when_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(16 * 1024)).unwrap();
    let turn = std::sync::Arc::new(tokio::sync::Mutex::new(0u64));
    let run = async {
        let mut tasks = Vec::new();
        for task in 0..16u64 {
            let (log, turn) = (log.clone(), turn.clone());
            tasks.push(tokio::spawn(async move {
                let mut sent = Vec::new();
                for j in 0..40u64 {
                    let bytes = batch(task * 1000 + j, (j % 3 + 1) as usize, 200);
                    let ticket = {
                        let mut next = turn.lock().await;
                        let t = log
                            .append_if_deferred(bytes.clone(), *next)
                            .await
                            .expect("accepted at the next offset");
                        *next = t.last_offset + 1;
                        t
                    };
                    sent.push(Sent {
                        base: ticket.base_offset,
                        last: ticket.last_offset,
                        bytes,
                    });
                    if j % 7 == 6 {
                        // Nobody waits for this one: the writer thread must write it.
                        drop(ticket);
                    } else {
                        let (base, last) = ticket.committed().await.expect("committed");
                        assert_eq!((base, last), (sent[j as usize].base, sent[j as usize].last));
                    }
                }
                sent
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    };
    let (everything, next) = all_committed_densely(&log, run).await;
    assert!(
        log.sealed_segments().len() > 2,
        "the appends rolled segments"
    );
    holds_all_after_reopen(dir.path(), log, &everything, next).await;
}

/// Deferred leader appends (`append_deferred`), made as a consumer group's journal makes
/// its changes: concurrent tasks append without an expected offset and wait for their own
/// tickets (some dropped unawaited). Every append gets its own dense range, is committed,
/// and is in the log after a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_leader_appends_are_written_by_their_waiters_and_when_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(16 * 1024)).unwrap();
    let run = async {
        let mut tasks = Vec::new();
        for task in 0..8u64 {
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                let mut sent = Vec::new();
                for j in 0..40u64 {
                    let bytes = batch(task * 1000 + j, (j % 3 + 1) as usize, 200);
                    let ticket = log.append_deferred(bytes.clone()).await.expect("accepted");
                    sent.push(Sent {
                        base: ticket.base_offset,
                        last: ticket.last_offset,
                        bytes,
                    });
                    if j % 5 == 4 {
                        // Nobody waits for this one: the writer thread must write it.
                        drop(ticket);
                    } else {
                        let got = ticket.committed().await.expect("committed");
                        assert_eq!(got, (sent[j as usize].base, sent[j as usize].last));
                    }
                }
                sent
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    };
    let (everything, next) = all_committed_densely(&log, run).await;
    holds_all_after_reopen(dir.path(), log, &everything, next).await;
}

#[tokio::test]
async fn batches_larger_than_a_read_chunk_are_read_whole_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(4 << 20)).unwrap();
    // Small batches around ones of ~1.2 MB, larger than the chunk a read scans with (at
    // most 1 MiB, and only 4 KiB for small max_bytes).
    let sent = append_many(&log, 12, |i| {
        if i % 3 == 1 {
            batch(i as u64, 3, 400_000)
        } else {
            batch(i as u64, 3, 50)
        }
    })
    .await;
    assert!(sent.iter().all(|s| s.bytes.len() < 4 << 20));
    assert!(sent.iter().any(|s| s.bytes.len() > 1 << 20));
    for max_bytes in [1, 5_000, 300_000, 1 << 20, 3 << 20, 16 << 20] {
        assert_log_holds(&log, &sent, max_bytes, -1);
    }
    for s in &sent {
        let read = log.read(s.last, 1, None).unwrap();
        let batches = split_batches(&read.batches);
        assert_eq!(batches.len(), 1);
        assert_stored_as_sent(&batches[0].1, s, -1);
    }
    drop(log);
    let log = ShardLog::open(dir.path(), small_segments(4 << 20)).unwrap();
    assert_log_holds(&log, &sent, 1, -1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_racing_a_truncation_are_either_cut_or_land_densely_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(4096)).unwrap();
    let sent = append_many(&log, 20, |i| batch(i as u64, 2, 30)).await; // [0,39]
    let appender = {
        let log = log.clone();
        tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..200u64 {
                let bytes = batch(5000 + i, 2, 30);
                let t = log.append(bytes.clone()).await.unwrap();
                out.push((
                    Sent {
                        base: t.base_offset,
                        last: t.last_offset,
                        bytes,
                    },
                    t,
                ));
                if i % 16 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            let mut sent = Vec::new();
            for (s, t) in out {
                assert_eq!(t.committed().await.unwrap(), (s.base, s.last));
                sent.push(s);
            }
            sent
        })
    };
    tokio::task::yield_now().await;
    let cut_to = log.truncate_after(19).await.unwrap();
    assert_eq!(cut_to, 20, "the new next offset");
    let racing = appender.await.unwrap();

    // The log: the first ten batches, then appends that came after the cut, densely.
    let stored = read_all(&log, 0, 1 << 20);
    assert!(stored.len() >= 10);
    for ((_, bytes), s) in stored.iter().zip(&sent[..10]) {
        assert_stored_as_sent(bytes, s, -1);
    }
    let by_bytes: HashMap<&[u8], &Sent> = racing.iter().map(|s| (&s.bytes[16..], s)).collect();
    let mut prev_seed_index = None;
    for (h, bytes) in &stored[10..] {
        let s = by_bytes
            .get(&bytes[16..])
            .expect("every batch after the cut is one that was sent");
        assert_eq!(
            h.base_offset as u64, s.base,
            "it lies at the offsets its ticket named"
        );
        assert_stored_as_sent(bytes, s, -1);
        let index = racing.iter().position(|r| std::ptr::eq(r, *s)).unwrap();
        assert!(
            prev_seed_index.is_none_or(|p| index > p),
            "in the order they were sent"
        );
        prev_seed_index = Some(index);
    }
    // Appends accepted after the cut all survive; those cut were accepted before it.
    let survivors = stored.len() - 10;
    assert!(
        racing[racing.len() - survivors..]
            .iter()
            .all(|s| s.base >= 20)
    );
    assert_eq!(
        log.committed_offset(),
        stored.last().unwrap().0.last_offset() as u64 + 1
    );
}

/// A batch checked at ingress ([`felix_wire::CheckedBatch`]) is appended without its CRC
/// being computed again, reads back exactly as a plain append's would, and still meets the
/// log's own size limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checked_batch_appends_like_a_plain_one_and_the_size_limit_still_applies() {
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(1 << 20)).unwrap();
    let plain = append_committed(&log, batch(1, 3, 20)).await;
    let checked =
        felix_wire::CheckedBatch::check(batch(2, 4, 20).into(), usize::MAX).expect("a valid batch");
    let ticket = log.append_checked(checked).await.expect("accepted");
    assert_eq!(
        (ticket.base_offset, ticket.last_offset),
        (plain.last + 1, plain.last + 4)
    );
    ticket.committed().await.expect("committed");
    let read = read_all(&log, 0, 1 << 20);
    assert_eq!(read.len(), 2);
    let records = DecodedBatch::decode(&read[1].1, usize::MAX).expect("decodes");
    let original = DecodedBatch::decode(&batch(2, 4, 20), usize::MAX).expect("decodes");
    assert_eq!(
        records.records.iter().map(|r| &r.value).collect::<Vec<_>>(),
        original
            .records
            .iter()
            .map(|r| &r.value)
            .collect::<Vec<_>>()
    );

    log.alter(|c| c.max_batch_bytes = 64);
    let large =
        felix_wire::CheckedBatch::check(batch(3, 4, 20).into(), usize::MAX).expect("a valid batch");
    assert!(matches!(
        log.append_checked(large).await,
        Err(LogError::BatchTooLarge { .. })
    ));
}

/// `publish_if`'s path: a checked batch taken without a second CRC pass still lands only at
/// the expected offset, and a refused one changes nothing.
#[tokio::test]
async fn a_checked_batch_appended_if_lands_only_at_the_expected_offset() {
    let dir = tempfile::tempdir().unwrap();
    let log = ShardLog::open(dir.path(), small_segments(1 << 20)).unwrap();
    let sent = append_many(&log, 1, |i| batch(i as u64, 3, 10)).await;
    let checked = |seed| {
        felix_wire::CheckedBatch::check(batch(seed, 2, 10).into(), usize::MAX).expect("valid")
    };
    let before = marks(&log);
    for expected in [0, 2, 4] {
        match log.append_checked_if(checked(50), expected).await {
            Err(LogError::OffsetMismatch { given, next }) => {
                assert_eq!((given, next), (expected, 3))
            }
            other => panic!("at {expected}: expected OffsetMismatch, got {other:?}"),
        }
    }
    assert_eq!(marks(&log), before, "a refused append changes no offset");
    assert_log_holds(&log, &sent, 1 << 20, -1);
    let t = log
        .append_checked_if(checked(60), 3)
        .await
        .expect("at the next offset");
    assert_eq!(t.committed().await.unwrap(), (3, 4));
}
