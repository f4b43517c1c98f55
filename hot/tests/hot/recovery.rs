//! Reopening a log: torn or garbage tails of the active segment are cut, sealed segments are
//! trusted through their index (rebuilt when missing or damaged), damage inside a sealed
//! segment is reported with its shard, file and byte position.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use felix_hot::{LogConfig, LogError, ShardLog};
use felix_wire::batch::{stamp_base_offset, stamp_partition_leader_epoch};
use felix_wire::{BatchHeader, BatchIter, WireError};

use super::common::*;

/// One batch as it lies in a segment file.
#[derive(Debug, Clone, Copy)]
struct Stored {
    position: u64,
    len: u64,
    header: BatchHeader,
}

/// The batches of a segment file, which must be whole and valid.
fn stored_batches(path: &Path) -> Vec<Stored> {
    let bytes = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut iter = BatchIter::new(&bytes, usize::MAX);
    loop {
        let position = iter.position() as u64;
        match iter.next() {
            None => break,
            Some(Ok((header, b))) => out.push(Stored {
                position,
                len: b.len() as u64,
                header,
            }),
            Some(Err((at, e))) => panic!("{} at {at}: {e}", path.display()),
        }
    }
    out
}

/// Opens a log in `dir`, appends `count` batches made by `make(i)` and closes it.
async fn write_log(
    dir: &Path,
    config: LogConfig,
    count: usize,
    make: impl Fn(usize) -> Vec<u8>,
) -> Vec<Sent> {
    let log = ShardLog::open(dir, config).unwrap();
    let mut sent = Vec::new();
    for i in 0..count {
        sent.push(append_committed(&log, make(i)).await);
    }
    sent
}

fn set_len(path: &Path, len: u64) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn append_bytes(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
}

fn flip_byte(path: &Path, position: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[position as usize] ^= 0x5a;
    std::fs::write(path, bytes).unwrap();
}

fn index_path(segment: &Path) -> PathBuf {
    segment.with_extension("index")
}

/// Writes a log whose active segment holds several batches, lets `damage` change the active
/// segment file (given its batches) and say how many of them stay whole, reopens and checks
/// the log holds exactly the batches before the damage, and that appends continue there and
/// survive another reopen.
async fn recover_active_after(
    config: LogConfig,
    count: usize,
    make: impl Fn(usize) -> Vec<u8>,
    damage: impl FnOnce(&Path, &[Stored]) -> usize,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut sent = write_log(dir.path(), config.clone(), count, make).await;
    let files = segment_files(dir.path());
    let active = files.last().unwrap().clone();
    let stored = stored_batches(&active);
    assert!(
        stored.len() >= 2,
        "the active segment holds several batches"
    );
    let keep = damage(&active, &stored).min(stored.len());
    let valid_len = stored[..keep].last().map_or(0, |s| s.position + s.len);
    let first_cut = match stored.get(keep) {
        Some(cut) => cut.header.base_offset as u64,
        None => stored[keep - 1].header.last_offset() as u64 + 1,
    };
    sent.retain(|s| s.base < first_cut);
    {
        let log = ShardLog::open(dir.path(), config.clone()).unwrap();
        assert_eq!(
            log.next_offset(),
            first_cut,
            "the log ends after its last whole batch"
        );
        assert_eq!(log.committed_offset(), first_cut);
        assert_eq!(
            std::fs::metadata(&active).unwrap().len(),
            valid_len,
            "the damaged tail is cut off"
        );
        assert_log_holds(&log, &sent, 1 << 20, -1);
        assert_log_holds(&log, &sent, 1, -1);
        assert_eq!(log.verify().unwrap(), sent.len() as u64);
        for i in 0..3 {
            let s = append_committed(&log, batch(10_000 + i, 2, 30)).await;
            assert_eq!(
                s.base,
                sent.last().map_or(0, |p| p.last + 1),
                "appends continue at the cut"
            );
            sent.push(s);
        }
    }
    let log = ShardLog::open(dir.path(), config).unwrap();
    assert_eq!(log.next_offset(), sent.last().unwrap().last + 1);
    assert_log_holds(&log, &sent, 4096, -1);
}

#[tokio::test]
async fn truncated_active_segment_is_recovered_to_its_last_whole_batch() {
    // Cut in the middle of the last batch, inside its 12-byte length prefix, and right
    // after its header.
    for cut in [0.5f64, 0.01, 0.3] {
        recover_active_after(
            small_segments(4096),
            40,
            |i| batch(i as u64, 3, 60),
            |path, stored| {
                let last = stored.last().unwrap();
                let at = last.position + ((last.len as f64 * cut) as u64).max(1);
                set_len(path, at);
                stored.len() - 1
            },
        )
        .await;
    }
    // Cut in the middle of an earlier batch: everything from that batch on is gone.
    recover_active_after(
        small_segments(4096),
        40,
        |i| batch(i as u64, 3, 60),
        |path, stored| {
            let victim = stored[stored.len() / 2];
            set_len(path, victim.position + victim.len / 2);
            stored.len() / 2
        },
    )
    .await;
}

#[tokio::test]
async fn garbage_after_the_last_whole_batch_is_cut_off_on_reopen() {
    /// Bytes to append to the active segment, given its file and batches.
    type Garbage = Box<dyn Fn(&Path, &[Stored]) -> Vec<u8>>;
    let cases: Vec<(&str, Garbage)> = vec![
        ("random bytes", Box::new(|_, _| noise(42, 3000))),
        ("zeros", Box::new(|_, _| vec![0u8; 4096])),
        ("a few bytes", Box::new(|_, _| noise(9, 5))),
        (
            "a batch whose offsets go backwards",
            Box::new(|path, stored| {
                let bytes = std::fs::read(path).unwrap();
                bytes[stored[0].position as usize..(stored[0].position + stored[0].len) as usize]
                    .to_vec()
            }),
        ),
        (
            "a header announcing more bytes than follow",
            Box::new(|_, stored| {
                let mut b = batch(77, 3, 500);
                stamp_base_offset(&mut b, stored.last().unwrap().header.last_offset() + 1);
                b.truncate(b.len() - 100);
                b
            }),
        ),
        (
            "a whole batch with a bad crc",
            Box::new(|_, stored| {
                let mut b = batch(78, 3, 50);
                stamp_base_offset(&mut b, stored.last().unwrap().header.last_offset() + 1);
                let n = b.len();
                b[n - 3] ^= 0xff;
                b
            }),
        ),
    ];
    for (name, garbage) in cases {
        eprintln!("case: {name}");
        recover_active_after(
            small_segments(4096),
            40,
            |i| batch(i as u64, 3, 60),
            |path, stored| {
                let bytes = garbage(path, stored);
                append_bytes(path, &bytes);
                stored.len()
            },
        )
        .await;
    }
}

#[tokio::test]
async fn a_torn_tail_after_more_than_a_scan_chunk_is_cut_at_the_last_whole_batch() {
    // About 1.9 MB in the active segment: recovery reads it in several chunks.
    let config = small_segments(64 << 20);
    let make = |i: usize| batch(i as u64, 4, 15_000 + i * 7);
    recover_active_after(config.clone(), 32, make, |path, stored| {
        let last = stored.last().unwrap();
        set_len(path, last.position + last.len - 10);
        stored.len() - 1
    })
    .await;
    recover_active_after(config, 32, make, |path, _| {
        append_bytes(path, &noise(3, 70_000));
        usize::MAX // every batch stays
    })
    .await;
}

#[tokio::test]
async fn flipped_byte_in_sealed_segment_is_reported_with_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments(2048);
    let sent = write_log(dir.path(), config.clone(), 40, |i| batch(i as u64, 3, 60)).await;
    let files = segment_files(dir.path());
    assert!(
        files.len() >= 4,
        "several sealed segments and an active one"
    );
    let damaged_file = files[1].clone();
    let stored = stored_batches(&damaged_file);
    assert!(stored.len() >= 3);
    let victim = stored[stored.len() / 2];
    // A byte among the records, which the CRC covers.
    flip_byte(&damaged_file, victim.position + 61 + (victim.len - 61) / 2);
    let victim_base = victim.header.base_offset as u64;

    // Sealed segments are trusted by their index: the open does not scan them.
    let log = ShardLog::open(dir.path(), config).unwrap();
    assert_eq!(log.next_offset(), sent.last().unwrap().last + 1);

    let check = |e: LogError, what: &str| match e {
        LogError::Corrupt {
            shard,
            segment,
            position,
            source,
        } => {
            assert_eq!(shard, SHARD, "{what}: the shard is named");
            assert_eq!(segment, damaged_file, "{what}: the file is named");
            assert_eq!(
                position, victim.position,
                "{what}: the damaged batch's start"
            );
            assert!(
                matches!(source, WireError::CrcMismatch { .. }),
                "{what}: {source:?}"
            );
        }
        other => panic!("{what}: expected Corrupt, got {other:?}"),
    };

    // Reading over the damage: everything before it is returned intact, then the damaged
    // batch is reported.
    for max_bytes in [1, 700, 1 << 20] {
        let mut next = 0;
        let mut got = Vec::new();
        let err = loop {
            match log.read(next, max_bytes, None) {
                Ok(read) => {
                    assert!(
                        !read.batches.is_empty(),
                        "the read stops at the damage, not before"
                    );
                    got.extend(split_batches(&read.batches));
                    next = read.next_offset;
                }
                Err(e) => break e,
            }
        };
        check(err, &format!("read with max_bytes {max_bytes}"));
        assert_eq!(
            next, victim_base,
            "max_bytes {max_bytes}: everything before the damage reads"
        );
        let before: Vec<&Sent> = sent.iter().filter(|s| s.base < victim_base).collect();
        assert_eq!(got.len(), before.len());
        for ((_, bytes), s) in got.iter().zip(before) {
            assert_stored_as_sent(bytes, s, -1);
        }
    }
    check(
        log.read(victim_base, 1 << 20, None).unwrap_err(),
        "read at the damaged batch",
    );
    check(
        log.read(victim.header.last_offset() as u64, 1, None)
            .unwrap_err(),
        "read inside the damaged batch",
    );
    check(log.verify().unwrap_err(), "verify");

    // Later segments are not affected.
    let later_base = stored_batches(&files[2])[0].header.base_offset as u64;
    let after: Vec<Sent> = sent
        .iter()
        .filter(|s| s.base >= later_base)
        .cloned()
        .collect();
    assert_log_holds(&log, &after, 4096, -1);
}

/// Writes 40 batches stamped one second apart over 1 KiB segments, closes the log and
/// returns what was sent and the sealed segments.
async fn timed_log(dir: &Path) -> (Vec<Sent>, Vec<felix_hot::SealedSegment>) {
    let sent = write_log(dir, small_segments(1024), 40, |i| {
        batch_at(T0 + i as i64 * 1000, 3)
    })
    .await;
    let log = ShardLog::open(dir, small_segments(1024)).unwrap();
    let sealed = log.sealed_segments();
    assert!(sealed.len() >= 4);
    (sent, sealed)
}

const T0: i64 = 1_700_000_000_000;

fn check_reads_and_times(log: &ShardLog, sent: &[Sent]) {
    assert_log_holds(log, sent, 1, -1);
    assert_log_holds(log, sent, 1 << 20, -1);
    for (i, s) in sent.iter().enumerate() {
        let ts = T0 + i as i64 * 1000;
        assert_eq!(
            log.offset_for_time(ts).unwrap(),
            Some(s.base),
            "time of batch {i}"
        );
        assert_eq!(
            log.offset_for_time(ts - 1).unwrap(),
            Some(s.base),
            "just before batch {i}"
        );
        let read = log.read_from_time(ts, 1, None).unwrap();
        assert_eq!(split_batches(&read.batches)[0].0.base_offset as u64, s.base);
    }
}

#[tokio::test]
async fn missing_index_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let (sent, sealed) = timed_log(dir.path()).await;
    let index = index_path(&sealed[1].path);
    let original = std::fs::read(&index).unwrap();
    std::fs::remove_file(&index).unwrap();

    let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
    assert_eq!(
        log.sealed_segments(),
        sealed,
        "the segment is sealed as before"
    );
    assert_eq!(
        std::fs::read(&index).unwrap(),
        original,
        "the index file is written again, as it was"
    );
    check_reads_and_times(&log, &sent);
    drop(log);
    let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
    check_reads_and_times(&log, &sent);
}

#[tokio::test]
async fn damaged_index_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let (sent, sealed) = timed_log(dir.path()).await;
    let originals: Vec<Vec<u8>> = sealed
        .iter()
        .map(|s| std::fs::read(index_path(&s.path)).unwrap())
        .collect();
    // A flipped byte in the entries, one in the header, a cut file, an empty one, and the
    // index of another segment.
    let idx = |i: usize| index_path(&sealed[i].path);
    flip_byte(&idx(0), (originals[0].len() - 10) as u64);
    flip_byte(&idx(1), 9);
    set_len(&idx(2), (originals[2].len() / 2) as u64);
    std::fs::write(idx(3), b"").unwrap();
    if sealed.len() > 4 {
        std::fs::write(idx(4), &originals[0]).unwrap();
    }

    let log = ShardLog::open(dir.path(), small_segments(1024)).unwrap();
    assert_eq!(log.sealed_segments(), sealed);
    for (i, original) in originals.iter().enumerate() {
        assert_eq!(
            &std::fs::read(idx(i)).unwrap(),
            original,
            "index {i} rebuilt"
        );
    }
    check_reads_and_times(&log, &sent);
}

#[tokio::test]
async fn sealed_segment_without_index_and_with_corrupt_data_fails_to_open_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments(2048);
    write_log(dir.path(), config.clone(), 40, |i| batch(i as u64, 3, 60)).await;
    let files = segment_files(dir.path());
    assert!(files.len() >= 4);
    let damaged = files[1].clone();
    let stored = stored_batches(&damaged);
    let victim = stored[1];
    flip_byte(&damaged, victim.position + victim.len - 2);
    std::fs::remove_file(index_path(&damaged)).unwrap();

    match ShardLog::open(dir.path(), config.clone()) {
        Err(LogError::Corrupt {
            shard,
            segment,
            position,
            source,
        }) => {
            assert_eq!(shard, SHARD);
            assert_eq!(segment, damaged);
            assert_eq!(position, victim.position);
            assert!(
                matches!(source, WireError::CrcMismatch { .. }),
                "{source:?}"
            );
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // The open changed nothing on disk: it fails the same way again.
    assert!(matches!(
        ShardLog::open(dir.path(), config),
        Err(LogError::Corrupt { .. })
    ));
    assert_eq!(segment_files(dir.path()), files);
}

#[tokio::test]
async fn sealed_segment_shorter_than_its_index_fails_to_open_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments(2048);
    write_log(dir.path(), config.clone(), 40, |i| batch(i as u64, 3, 60)).await;
    let files = segment_files(dir.path());
    let damaged = files[1].clone();
    let stored = stored_batches(&damaged);
    let victim = stored[stored.len() - 1];
    set_len(&damaged, victim.position + victim.len / 2);

    match ShardLog::open(dir.path(), config) {
        Err(LogError::Corrupt {
            shard,
            segment,
            position,
            ..
        }) => {
            assert_eq!(shard, SHARD);
            assert_eq!(segment, damaged);
            assert_eq!(position, victim.position);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[tokio::test]
async fn reopen_after_a_clean_close_keeps_the_generation_of_the_last_batch() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments(1024);
    {
        let log = ShardLog::open(dir.path(), config.clone()).unwrap();
        assert_eq!(log.generation(), -1);
        log.set_generation(4).unwrap();
        append_committed(&log, batch(1, 2, 10)).await;
        log.set_generation(9).unwrap();
        append_committed(&log, batch(2, 2, 10)).await;
    }
    {
        let log = ShardLog::open(dir.path(), config.clone()).unwrap();
        assert_eq!(log.generation(), 9, "the last batch's generation");
        assert!(matches!(
            log.set_generation(8),
            Err(LogError::StaleGeneration {
                batch: 8,
                current: 9
            })
        ));
        let s = append_committed(&log, batch(3, 1, 10)).await;
        let read = split_batches(&log.read(s.base, 4096, None).unwrap().batches);
        assert_eq!(
            read[0].0.partition_leader_epoch, 9,
            "leader appends keep being stamped with it"
        );
        // A follower append with a newer generation, then enough appends to roll segments.
        let mut b = batch(4, 1, 10);
        stamp_base_offset(&mut b, (s.last + 1) as i64);
        stamp_partition_leader_epoch(&mut b, 12);
        log.append_at(b).await.unwrap().committed().await.unwrap();
        for i in 0..20 {
            append_committed(&log, batch(100 + i, 3, 60)).await;
        }
        assert!(!log.sealed_segments().is_empty());
    }
    let last_sealed_end;
    {
        let log = ShardLog::open(dir.path(), config.clone()).unwrap();
        assert_eq!(log.generation(), 12);
        // Leave the log with an empty active segment: its generation comes from the newest
        // sealed segment.
        let sealed = log.sealed_segments();
        last_sealed_end = sealed.last().unwrap().last_offset;
        log.truncate_after(last_sealed_end).await.unwrap();
        assert_eq!(log.next_offset(), last_sealed_end + 1);
    }
    let log = ShardLog::open(dir.path(), config).unwrap();
    assert_eq!(log.next_offset(), last_sealed_end + 1);
    assert_eq!(log.generation(), 12);
}

#[tokio::test]
async fn a_last_segment_that_was_sealed_reopens_behind_a_new_active_segment() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments(1024);
    let mut sent;
    let sealed;
    {
        let log = ShardLog::open(dir.path(), config.clone()).unwrap();
        sent = Vec::new();
        for i in 0..30 {
            sent.push(append_committed(&log, batch(i, 3, 40)).await);
        }
        // Cut back to the end of the newest sealed segment: the active segment is empty.
        let end = log.sealed_segments().last().unwrap().last_offset;
        log.truncate_after(end).await.unwrap();
        sent.retain(|s| s.last <= end);
        sealed = log.sealed_segments();
    }
    // As after a crash between sealing a segment and creating the next one.
    let files = segment_files(dir.path());
    let empty_active = files.last().unwrap();
    assert_eq!(std::fs::metadata(empty_active).unwrap().len(), 0);
    std::fs::remove_file(empty_active).unwrap();

    let log = ShardLog::open(dir.path(), config).unwrap();
    let next = sent.last().unwrap().last + 1;
    assert_eq!(log.next_offset(), next);
    assert_eq!(
        log.sealed_segments(),
        sealed,
        "the last segment is trusted as sealed"
    );
    assert_log_holds(&log, &sent, 1, -1);
    let s = append_committed(&log, batch(99, 1, 1)).await;
    assert_eq!(s.base, next);
    assert!(dir.path().join(format!("{next:020}.log")).exists());
}

/// Reads `[from, end)` through `read` until it fails, returning every (first, last) offset
/// of the batches it served and the error that stopped it, if any.
fn read_until_error(
    mut read: impl FnMut(u64) -> Result<(Vec<u8>, u64), LogError>,
    from: u64,
    end: u64,
) -> (Vec<(u64, u64)>, Option<LogError>) {
    let mut served = Vec::new();
    let mut next = from;
    while next < end {
        match read(next) {
            Ok((bytes, after)) => {
                for (h, _) in BatchIter::new(&bytes, usize::MAX).map(|r| r.unwrap()) {
                    served.push((h.base_offset as u64, h.last_offset() as u64));
                }
                assert!(after > next, "a read at {next} made progress");
                next = after;
            }
            Err(e) => return (served, Some(e)),
        }
    }
    (served, None)
}

/// The batches served must be exactly the ones written, in order, with nothing skipped or
/// repeated: offsets continue from `from`.
fn assert_dense(served: &[(u64, u64)], from: u64) {
    let mut expect = from;
    for &(first, last) in served {
        assert!(
            first <= expect && last >= expect,
            "served [{first}, {last}] where offset {expect} was due: {served:?}"
        );
        expect = last + 1;
    }
}

#[tokio::test]
async fn a_changed_base_offset_in_a_sealed_segment_is_corruption_never_misplaced_records() {
    // The base offset lies outside the batch CRC (as in Kafka's format), so only the
    // continuity of offsets shows that it changed. Every read path must refuse the batch.
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments(4096);
    let sent = write_log(dir.path(), config.clone(), 60, |i| batch(i as u64, 3, 60)).await;
    let end = sent.last().unwrap().last + 1;
    let files = segment_files(dir.path());
    assert!(files.len() >= 3, "several sealed segments");
    let damaged = files[1].clone();
    let stored = stored_batches(&damaged);
    let victim = stored[stored.len() / 2];
    let mut bytes = std::fs::read(&damaged).unwrap();
    let at = victim.position as usize;
    stamp_base_offset(
        &mut bytes[at..at + victim.len as usize],
        victim.header.base_offset + 1,
    );
    std::fs::write(&damaged, bytes).unwrap();

    // The sealed segment is trusted through its index at open; the reads catch it.
    let log = ShardLog::open(dir.path(), config).unwrap();
    let check = |served: Vec<(u64, u64)>, e: Option<LogError>, path: &str| {
        assert_dense(&served, 0);
        assert!(
            served
                .iter()
                .all(|&(_, last)| last < victim.header.base_offset as u64),
            "{path}: nothing at or after the damaged batch is served: {served:?}"
        );
        match e {
            Some(LogError::Corrupt {
                segment, position, ..
            }) => {
                assert_eq!(segment, damaged, "{path}");
                assert_eq!(position, victim.position, "{path}");
            }
            other => panic!("{path}: expected Corrupt, got {other:?}"),
        }
    };
    for max_bytes in [1, 300, 1 << 20] {
        let (served, e) = read_until_error(
            |next| {
                log.read(next, max_bytes, None)
                    .map(|r| (r.batches, r.next_offset))
            },
            0,
            end,
        );
        check(served, e, &format!("read, max_bytes {max_bytes}"));
    }
    let cache = felix_hot::ReadCache::new(1 << 20);
    let (served, e) = read_until_error(
        |next| {
            log.read_shared(&cache, next, 1 << 20, None)
                .map(|r| (r.batches.to_vec(), r.next_offset))
        },
        0,
        end,
    );
    check(served, e, "read_shared");
    // A read that starts inside the damaged batch is refused too: locating its batch starts
    // from an indexed batch at or before it, whose base offset the index records.
    let inside = victim.header.base_offset as u64 + 1;
    assert!(matches!(
        log.read(inside, 1 << 20, None),
        Err(LogError::Corrupt { .. })
    ));
    assert!(matches!(log.verify(), Err(LogError::Corrupt { .. })));
}

#[tokio::test]
async fn a_sealed_segment_cut_on_a_batch_boundary_is_corruption_not_a_shorter_log() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments(2048);
    write_log(dir.path(), config.clone(), 40, |i| batch(i as u64, 3, 60)).await;
    let files = segment_files(dir.path());
    let damaged = files[1].clone();
    let stored = stored_batches(&damaged);
    let cut = stored[stored.len() / 2].position;
    set_len(&damaged, cut);

    // With its index: the index records the sealed size.
    match ShardLog::open(dir.path(), config.clone()) {
        Err(LogError::Corrupt {
            segment, position, ..
        }) => {
            assert_eq!(segment, damaged);
            assert_eq!(position, cut);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // Without it: the next segment does not start where this one now ends.
    std::fs::remove_file(index_path(&damaged)).unwrap();
    match ShardLog::open(dir.path(), config) {
        Err(LogError::Corrupt { segment, .. }) => assert_eq!(segment, files[2]),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}
