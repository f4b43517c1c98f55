//! How big the segments of a cache shard's log are, on its owner and on its followers.
//!
//! Decides when a cache's log rolls. Every roll costs the log a flush, new files (segment,
//! index, producer snapshot) and an upload, which a busy cache with 256 KiB segments paid
//! dozens of times a second on every put's path; but compaction drops only whole segments
//! before its floor, so a small cache wants small ones. The owner sizes them to its live
//! data ([`fit_segment`]); a follower cannot see the live data and rolls at the size its
//! leader's fetch answers name ([`follower_segment_bytes`]).

use felix_hot::ShardLog;

use super::names::is_cache_stream;

/// Segments of a cache's log: small, so compaction can drop them soon. The owner grows a
/// busy shard's segments with its live data ([`fit_segment`]).
pub const CACHE_SEGMENT_BYTES: u64 = 256 * 1024;
/// The largest segment [`fit_segment`] gives a cache shard's log.
pub const MAX_CACHE_SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// Sets the segment size of an owned shard's log to its live data, between
/// [`CACHE_SEGMENT_BYTES`] and [`MAX_CACHE_SEGMENT_BYTES`]; returns it. Segments as large as
/// the live data keep what compaction lets the log grow to within a small multiple of it
/// (`COMPACT_FACTOR` times, plus a segment: five times), and a small cache keeps small
/// segments, so compaction can drop them soon. Not smaller: a roll holds the log's writer
/// for its flushes (milliseconds), and no put of the shard is acknowledged meanwhile; at a
/// quarter of the live data a busy shard under `felix-bench cache` rolled every ~120 ms and
/// its writer spent 14% of the time in rolls (bench/results/cache-24d.md).
pub(crate) fn fit_segment(log: &ShardLog, live: u64) -> u64 {
    let want = live.clamp(CACHE_SEGMENT_BYTES, MAX_CACHE_SEGMENT_BYTES);
    if log.config().segment_bytes != want {
        log.alter(|c| c.segment_bytes = want);
    }
    want
}

/// The size a follower of `stream`'s shard rolls its log's segments at, given the size its
/// leader's fetch answer named (`None`: an older leader, which names none): the leader's,
/// for a cache's log, when within the bounds an owner keeps; `None` (keep the log's own)
/// otherwise.
pub(crate) fn follower_segment_bytes(stream: &str, leaders: Option<u64>) -> Option<u64> {
    leaders.filter(|n| {
        is_cache_stream(stream) && (CACHE_SEGMENT_BYTES..=MAX_CACHE_SEGMENT_BYTES).contains(n)
    })
}

#[cfg(test)]
mod tests {
    use felix_hot::LogConfig;

    use super::*;

    #[test]
    fn a_shards_segments_are_as_large_as_its_live_data_within_bounds() {
        let dir = tempfile::tempdir().expect("dir");
        let config = LogConfig {
            segment_bytes: CACHE_SEGMENT_BYTES,
            ..LogConfig::default()
        };
        let log = ShardLog::open(dir.path(), config).expect("log");
        assert_eq!(fit_segment(&log, 100 * 1024), CACHE_SEGMENT_BYTES);
        assert_eq!(fit_segment(&log, 40 << 20), 40 << 20);
        assert_eq!(log.config().segment_bytes, 40 << 20, "the log rolls at it");
        assert_eq!(fit_segment(&log, 1 << 40), MAX_CACHE_SEGMENT_BYTES);
        // Back down when the live data shrinks, so compaction can drop segments soon.
        assert_eq!(fit_segment(&log, 0), CACHE_SEGMENT_BYTES);
        assert_eq!(log.config().segment_bytes, CACHE_SEGMENT_BYTES);
    }

    #[test]
    fn a_cache_follower_rolls_at_its_leaders_size_within_the_owners_bounds() {
        assert_eq!(
            follower_segment_bytes("__cache.c", Some(10 << 20)),
            Some(10 << 20)
        );
        // Another stream keeps its own setting; an older leader names none.
        assert_eq!(follower_segment_bytes("orders", Some(10 << 20)), None);
        assert_eq!(follower_segment_bytes("__cache.c", None), None);
        // Out of bounds: not a size an owner gives, so not taken.
        assert_eq!(follower_segment_bytes("__cache.c", Some(1)), None);
        assert_eq!(follower_segment_bytes("__cache.c", Some(1 << 40)), None);
    }
}
