//! Replacing a damaged sealed segment: a verified copy of exactly its records is taken and
//! survives a reopen; anything else is refused and leaves the file as it was.

use std::path::Path;

use felix_hot::{LogError, ShardLog};

use super::common::*;

/// A log of 12 batches of 4 records in segments of ~2 KiB, so several are sealed; returns
/// the log, what was sent and the stored bytes of the second segment (its good copy).
async fn log_with_sealed_segments(dir: &Path) -> (ShardLog, Vec<Sent>, u64, Vec<u8>) {
    let log = ShardLog::open(dir, small_segments(2048)).unwrap();
    let mut sent = Vec::new();
    for i in 0..12 {
        sent.push(append_committed(&log, batch(i, 4, 200)).await);
    }
    let sealed = log.sealed_segments();
    assert!(
        sealed.len() >= 3,
        "want several sealed segments: {sealed:?}"
    );
    let second = &sealed[1];
    let good = std::fs::read(&second.path).unwrap();
    (log, sent, second.base_offset, good)
}

fn flip(path: &Path, position: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[position] ^= 0x5a;
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test]
async fn a_damaged_sealed_segment_replaced_by_a_verified_copy_reads_whole_again_and_after_a_reopen()
{
    let dir = tempfile::tempdir().unwrap();
    let (log, sent, base, good) = log_with_sealed_segments(dir.path()).await;
    let (seg_base, seg_next) = log.sealed_segment_range(base + 1).expect("sealed");
    assert_eq!(seg_base, base);
    let path = log.sealed_segments()[1].path.clone();
    // A payload byte of the segment's last batch: its CRC fails on read.
    flip(&path, good.len() - 10);
    let damaged = (seg_base..seg_next).find_map(|o| log.read(o, 1 << 20, None).err());
    assert!(
        matches!(damaged, Some(LogError::Corrupt { .. })),
        "the damage is found: {damaged:?}"
    );

    let outcome = log.replace_sealed_segment(base, &good).expect("repair");
    assert_eq!(
        (outcome.base_offset, outcome.next_offset),
        (seg_base, seg_next)
    );
    assert_log_holds(&log, &sent, 1 << 20, -1);
    assert_eq!(log.verify().unwrap(), 12, "every batch passes its checks");
    drop(log);

    let reopened = ShardLog::open(dir.path(), small_segments(2048)).unwrap();
    assert_log_holds(&reopened, &sent, 1 << 20, -1);
    assert_eq!(reopened.verify().unwrap(), 12);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".repair"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary file stays behind");
}

#[tokio::test]
async fn a_replacement_that_is_not_exactly_the_segments_records_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (log, sent, base, good) = log_with_sealed_segments(dir.path()).await;
    let path = log.sealed_segments()[1].path.clone();
    let batches = split_batches(&good);
    assert!(batches.len() >= 2);
    let first_len = batches[0].1.len();

    let mut flipped = good.clone();
    let last = flipped.len() - 10;
    flipped[last] ^= 0x5a;
    let mut garbage_tail = good.clone();
    garbage_tail.extend_from_slice(&[0u8; 7]);
    let refused: Vec<(&str, u64, Vec<u8>)> = vec![
        (
            "its last batch missing",
            base,
            good[..good.len() - batches.last().unwrap().1.len()].to_vec(),
        ),
        ("its first batch missing", base, good[first_len..].to_vec()),
        ("a byte changed", base, flipped),
        ("bytes after the last batch", base, garbage_tail),
        ("empty", base, Vec::new()),
    ];
    for (what, at, bytes) in refused {
        let err = log.replace_sealed_segment(at, &bytes).expect_err(what);
        assert!(
            matches!(err, LogError::InvalidBatch(_)),
            "{what}: refused as an invalid replacement, got {err}"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            good,
            "{what}: the file is unchanged"
        );
    }
    // No sealed segment starts there (inside one, and the active segment).
    for at in [base + 1, log.next_offset()] {
        let err = log
            .replace_sealed_segment(at, &good)
            .expect_err("no segment");
        assert!(matches!(err, LogError::OffsetOutOfRange { .. }), "{err}");
    }
    assert_log_holds(&log, &sent, 1 << 20, -1);
}
