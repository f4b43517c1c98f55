//! Helpers shared by the log tests.

#![allow(dead_code)]

use felix_wire::{BatchBuilder, Compression, Record};

/// A batch of `records` records whose values are derived from `seed`, so a test can rebuild
/// the exact bytes it appended.
pub fn batch(seed: u64, records: usize, value_len: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(Compression::None);
    for i in 0..records {
        let mut value = vec![0u8; value_len];
        let mut x = seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(i as u64);
        for byte in value.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *byte = x as u8;
        }
        b.push(Record::value(1_700_000_000_000 + seed as i64, value));
    }
    b.build().expect("test batch encodes")
}

/// A batch with the given record timestamp.
pub fn batch_at(timestamp: i64, records: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(Compression::None);
    for i in 0..records {
        b.push(Record::value(timestamp, format!("record-{timestamp}-{i}")));
    }
    b.build().expect("test batch encodes")
}

// ---- helpers of the append/read and recovery tests ------------------------------------------

use std::path::{Path, PathBuf};

use felix_hot::{FsyncPolicy, LogConfig, ShardLog};
use felix_wire::{BatchHeader, BatchIter};

/// The shard name the tests give their logs (errors must carry it).
pub const SHARD: &str = "acme/test/orders/0";

/// A config with small segments, a small index interval, no age roll and the default
/// (periodic) fsync policy.
pub fn small_segments(segment_bytes: u64) -> LogConfig {
    LogConfig {
        shard: SHARD.to_owned(),
        segment_bytes,
        segment_age: None,
        index_interval_bytes: 256,
        fsync: FsyncPolicy::default(),
        ..LogConfig::default()
    }
}

/// One appended batch as the test remembers it: its offsets and the bytes it gave `append`.
#[derive(Debug, Clone)]
pub struct Sent {
    pub base: u64,
    pub last: u64,
    pub bytes: Vec<u8>,
}

/// Appends and waits for the commit; checks the ticket agrees with the commit.
pub async fn append_committed(log: &ShardLog, bytes: Vec<u8>) -> Sent {
    let ticket = log.append(bytes.clone()).await.expect("append accepted");
    let (base, last) = (ticket.base_offset, ticket.last_offset);
    let committed = ticket.committed().await.expect("append committed");
    assert_eq!(
        committed,
        (base, last),
        "commit reports the ticket's offsets"
    );
    Sent { base, last, bytes }
}

/// Splits a read's bytes into validated batches (header, bytes).
pub fn split_batches(buf: &[u8]) -> Vec<(BatchHeader, Vec<u8>)> {
    BatchIter::new(buf, usize::MAX)
        .map(|b| {
            let (h, bytes) = b.expect("a read returns whole, valid batches");
            (h, bytes.to_vec())
        })
        .collect()
}

/// Reads from `from` to the committed end following `next_offset`, `max_bytes` at a time;
/// checks every read makes progress, stays within its budget (one batch may exceed it) and
/// that batches follow each other densely.
pub fn read_all(log: &ShardLog, from: u64, max_bytes: usize) -> Vec<(BatchHeader, Vec<u8>)> {
    let end = log.committed_offset();
    let mut out: Vec<(BatchHeader, Vec<u8>)> = Vec::new();
    let mut next = from;
    while next < end {
        let read = log
            .read(next, max_bytes, None)
            .unwrap_or_else(|e| panic!("read at {next}: {e}"));
        let batches = split_batches(&read.batches);
        assert!(
            !batches.is_empty(),
            "read at {next} below the committed end {end} returned nothing"
        );
        if batches.len() > 1 {
            assert!(
                read.batches.len() <= max_bytes,
                "read of {} bytes from {next} exceeds max_bytes {max_bytes} with more than one batch",
                read.batches.len()
            );
        }
        let last = batches.last().unwrap().0.last_offset() as u64;
        for (h, bytes) in batches {
            if let Some((prev, _)) = out.last() {
                assert_eq!(
                    h.base_offset,
                    prev.last_offset() + 1,
                    "batch after offset {} does not follow it",
                    prev.last_offset()
                );
            }
            out.push((h, bytes));
        }
        assert_eq!(
            read.next_offset,
            last + 1,
            "next_offset is one past the last returned record"
        );
        next = read.next_offset;
    }
    out
}

/// Asserts a stored batch is the appended one, stamped with `base` and `epoch`: the log
/// rewrites only the base offset (bytes 0..8) and the partition leader epoch (12..16).
pub fn assert_stored_as_sent(stored: &[u8], sent: &Sent, epoch: i32) {
    assert_eq!(
        stored.len(),
        sent.bytes.len(),
        "batch at {} has another length",
        sent.base
    );
    assert_eq!(
        &stored[0..8],
        &(sent.base as i64).to_be_bytes(),
        "base offset stamp at {}",
        sent.base
    );
    assert_eq!(
        &stored[8..12],
        &sent.bytes[8..12],
        "batch length at {}",
        sent.base
    );
    assert_eq!(
        &stored[12..16],
        &epoch.to_be_bytes(),
        "epoch stamp at {}",
        sent.base
    );
    assert!(
        stored[16..] == sent.bytes[16..],
        "batch at {} differs from what was appended",
        sent.base
    );
}

/// Asserts the log holds exactly `sent`, in order, from its first offset, read `max_bytes`
/// at a time, each batch stamped with `epoch`.
pub fn assert_log_holds(log: &ShardLog, sent: &[Sent], max_bytes: usize, epoch: i32) {
    let from = sent.first().map_or(log.first_offset(), |s| s.base);
    let read = read_all(log, from, max_bytes);
    assert_eq!(
        read.len(),
        sent.len(),
        "number of batches read back (max_bytes {max_bytes})"
    );
    for ((h, bytes), s) in read.iter().zip(sent) {
        assert_eq!(h.base_offset as u64, s.base);
        assert_eq!(h.last_offset() as u64, s.last);
        assert_stored_as_sent(bytes, s, epoch);
    }
}

/// The segment files (`*.log`) of a log directory, oldest first.
pub fn segment_files(dir: &Path) -> Vec<PathBuf> {
    files_with_extension(dir, "log")
}

/// The index files (`*.index`) of a log directory, oldest first.
pub fn index_files(dir: &Path) -> Vec<PathBuf> {
    files_with_extension(dir, "index")
}

fn files_with_extension(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("list log directory")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    files
}

/// Deterministic pseudo-random bytes (xorshift), for garbage.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
