//! `ShardLog::read_shared`: history read in blocks that readers share through a
//! `ReadCache`, returning exactly what plain reads return.

use felix_hot::{LogError, READ_BLOCK_BYTES, ReadCache, ShardLog};

use super::common::*;

/// A budget large enough for block reads (below two blocks `read_shared` reads plainly).
const BUDGET: usize = 2 * READ_BLOCK_BYTES as usize;

/// Batches of 1–40 records of 700 bytes: sizes that never line up with the block grid.
fn uneven(i: usize) -> Vec<u8> {
    batch(i as u64, 1 + (i * 7) % 40, 700)
}

/// Reads from `from` to the committed end through `read_shared`, checking every read is
/// dense, within the budget (a single batch may exceed it) and below the committed end.
fn read_all_shared(log: &ShardLog, cache: &ReadCache, from: u64, bound: Option<u64>) -> Vec<u8> {
    let end = bound.map_or(log.committed_offset(), |b| b.min(log.committed_offset()));
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let read = log
            .read_shared(cache, next, BUDGET, bound)
            .unwrap_or_else(|e| panic!("shared read at {next}: {e}"));
        if read.batches.is_empty() {
            break;
        }
        let batches = split_batches(&read.batches);
        assert!(
            read.batches.len() <= BUDGET || batches.len() == 1,
            "a read of {} bytes over a budget of {BUDGET}",
            read.batches.len()
        );
        let first = batches[0].0;
        assert!(first.base_offset as u64 <= next && first.last_offset() as u64 >= next);
        for pair in batches.windows(2) {
            assert_eq!(pair[1].0.base_offset, pair[0].0.last_offset() + 1, "dense");
        }
        let last = batches.last().unwrap().0.last_offset() as u64;
        assert!(last < end, "read past the bound: {last} >= {end}");
        assert_eq!(read.next_offset, last + 1);
        next = read.next_offset;
        out.extend_from_slice(&read.batches);
    }
    out
}

/// What plain reads return from `from` up to `bound`, concatenated.
fn read_all_plain(log: &ShardLog, from: u64, bound: Option<u64>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let read = log.read(next, BUDGET, bound).unwrap();
        if read.batches.is_empty() {
            return out;
        }
        next = read.next_offset;
        out.extend_from_slice(&read.batches);
    }
}

/// A log of `segment_bytes` segments holding `count` uneven batches (kept in `dir`), and
/// what was appended.
async fn filled_log(
    dir: &tempfile::TempDir,
    segment_bytes: u64,
    count: usize,
) -> (ShardLog, Vec<Sent>) {
    let log = ShardLog::open(dir.path(), small_segments(segment_bytes)).unwrap();
    let mut sent = Vec::with_capacity(count);
    for i in 0..count {
        sent.push(append_committed(&log, uneven(i)).await);
    }
    (log, sent)
}

#[tokio::test]
async fn shared_reads_return_what_plain_reads_return_and_readers_share_blocks() {
    let dir = tempfile::tempdir().unwrap();
    // Segments of 1.5 blocks: blocks end at segment ends as well as on the grid.
    let (log, sent) = filled_log(&dir, 3 * READ_BLOCK_BYTES / 2, 120).await;
    assert!(log.sealed_segments().len() >= 4);
    let cache = ReadCache::new(64 << 20);

    // The first reader starts mid-way through a batch, the second elsewhere: after their
    // first read both follow the same grid, so the second is served from the first's blocks.
    let a_from = sent[3].base + 1;
    let a = read_all_shared(&log, &cache, a_from, None);
    assert_eq!(a, read_all_plain(&log, a_from, None));
    let (hits_after_a, misses_after_a) = (cache.hits(), cache.misses());
    assert_eq!(hits_after_a, 0, "a lone reader has nobody to share with");

    let b_from = sent[17].base;
    let b = read_all_shared(&log, &cache, b_from, None);
    assert_eq!(b, read_all_plain(&log, b_from, None));
    let shared = cache.hits() - hits_after_a;
    let own = cache.misses() - misses_after_a;
    assert!(
        shared > 0 && own <= 2,
        "the second reader read {own} blocks itself and shared {shared}"
    );

    // Without a cache (capacity 0) the same bytes come back, read by each reader.
    let off = ReadCache::new(0);
    assert_eq!(read_all_shared(&log, &off, a_from, None), a);
    assert_eq!((off.hits(), off.misses()), (0, 0));
}

#[tokio::test]
async fn a_cached_block_never_reaches_past_a_lower_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = filled_log(&dir, 4 * READ_BLOCK_BYTES, 80).await;
    let cache = ReadCache::new(64 << 20);
    let all = read_all_shared(&log, &cache, 0, None);
    assert_eq!(all, read_all_plain(&log, 0, None));
    // Every block is cached now; a reader bounded below the end (a quorum mark) still gets
    // nothing at or past its bound.
    let bound = log.committed_offset() / 2;
    let bounded = read_all_shared(&log, &cache, 0, Some(bound));
    assert_eq!(bounded, read_all_plain(&log, 0, Some(bound)));
    assert!(!bounded.is_empty());
}

#[tokio::test]
async fn a_cut_log_is_never_served_from_blocks_of_its_old_content() {
    let dir = tempfile::tempdir().unwrap();
    let (log, sent) = filled_log(&dir, 4 * READ_BLOCK_BYTES, 80).await;
    let cache = ReadCache::new(64 << 20);
    let before = read_all_shared(&log, &cache, 0, None);
    assert!(cache.bytes() > 0, "blocks cached");

    // Cut in the middle and write other records at the same offsets.
    let keep = sent[40].last;
    log.truncate_after(keep).await.unwrap();
    for i in 0..40 {
        append_committed(&log, batch(10_000 + i as u64, 1 + (i * 7) % 40, 700)).await;
    }
    let after = read_all_shared(&log, &cache, 0, None);
    assert_eq!(after, read_all_plain(&log, 0, None));
    assert_ne!(after, before, "the cut changed what the log holds");
}

#[tokio::test]
async fn shared_reads_refuse_offsets_outside_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = filled_log(&dir, 4 * READ_BLOCK_BYTES, 10).await;
    let cache = ReadCache::new(64 << 20);
    let end = log.committed_offset();
    let at_end = log.read_shared(&cache, end, BUDGET, None).unwrap();
    assert!(at_end.batches.is_empty());
    assert_eq!(at_end.next_offset, end);
    assert!(matches!(
        log.read_shared(&cache, end + 1, BUDGET, None),
        Err(LogError::OffsetOutOfRange { .. })
    ));
}

#[tokio::test]
async fn a_large_budget_is_filled_with_several_blocks_as_a_plain_read_would_be() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = filled_log(&dir, 8 * READ_BLOCK_BYTES, 200).await;
    let cache = ReadCache::new(64 << 20);
    let budget = 1 << 20;
    // Twice: first every block comes from the file, then from the cache.
    for pass in 0..2 {
        let mut next = 0;
        let mut joined = Vec::new();
        let mut sizes = Vec::new();
        while next < log.committed_offset() {
            let read = log.read_shared(&cache, next, budget, None).unwrap();
            assert!(!read.batches.is_empty());
            assert!(
                read.batches.len() <= budget,
                "pass {pass}: {} bytes",
                read.batches.len()
            );
            sizes.push(read.batches.len());
            next = read.next_offset;
            joined.extend_from_slice(&read.batches);
        }
        assert_eq!(joined, read_all_plain(&log, 0, None), "pass {pass}");
        assert!(
            sizes.iter().any(|s| *s as u64 > 2 * READ_BLOCK_BYTES),
            "pass {pass}: reads of {sizes:?} never took more than one block"
        );
    }
    assert!(cache.hits() > 0);
}
