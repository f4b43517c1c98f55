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
