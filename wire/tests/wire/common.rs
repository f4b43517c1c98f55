//! Strategies and helpers shared by the test modules.

use felix_wire::batch::{BatchHeader, BatchIter};
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{BATCH_HEADER_LEN, BatchBuilder, Compression, DecodedBatch, Header, Record};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// Every codec a Kafka client may send.
pub const CODECS: [Compression; 5] = [
    Compression::None,
    Compression::Gzip,
    Compression::Snappy,
    Compression::Lz4,
    Compression::Zstd,
];

/// Where the CRC-covered region starts (attributes).
pub const CRC_START: usize = 21;

/// `cases` cases; a failing case is saved next to the test module (`*.proptest-regressions`,
/// commit it) and replayed first on later runs. `PROPTEST_CASES` overrides the count.
pub fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

pub fn codec() -> impl Strategy<Value = Compression> {
    prop::sample::select(CODECS.to_vec())
}

/// Null (one time in five) or up to `max` arbitrary bytes.
pub fn nullable_bytes(max: usize) -> impl Strategy<Value = Option<Vec<u8>>> {
    prop::option::weighted(0.8, prop::collection::vec(any::<u8>(), 0..max))
}

pub fn header() -> impl Strategy<Value = Header> {
    (".{0,12}", nullable_bytes(16)).prop_map(|(key, value)| Header {
        key,
        value: value.map(Into::into),
    })
}

/// Mostly realistic epoch milliseconds (so deltas are small, often negative), sometimes
/// anything at all (so deltas wrap), sometimes around zero and Kafka's "no timestamp" -1.
pub fn timestamp() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => 1_600_000_000_000i64..1_800_000_000_000,
        1 => any::<i64>(),
        1 => -3i64..3,
    ]
}

pub fn record() -> impl Strategy<Value = Record> {
    (
        timestamp(),
        nullable_bytes(48),
        nullable_bytes(200),
        prop::collection::vec(header(), 0..4),
    )
        .prop_map(|(timestamp, key, value, headers)| Record {
            offset: 0,
            timestamp,
            key: key.map(Into::into),
            value: value.map(Into::into),
            headers,
        })
}

/// Everything a [`BatchBuilder`] takes.
#[derive(Debug, Clone)]
pub struct BatchSpec {
    pub codec: Compression,
    pub producer: Option<(i64, i16, i32)>,
    pub transactional: bool,
    pub control: bool,
    pub records: Vec<Record>,
}

impl BatchSpec {
    pub fn builder(&self) -> BatchBuilder {
        let mut b = BatchBuilder::new(self.codec)
            .transactional(self.transactional)
            .control(self.control);
        if let Some((id, epoch, seq)) = self.producer {
            b = b.producer(id, epoch, seq);
        }
        for r in &self.records {
            b.push(r.clone());
        }
        b
    }
    pub fn build(&self) -> Vec<u8> {
        self.builder().build().expect("a non-empty batch encodes")
    }
}

pub fn batch_spec_with(
    codec: impl Strategy<Value = Compression>,
) -> impl Strategy<Value = BatchSpec> {
    (
        codec,
        prop::option::of((any::<i64>(), any::<i16>(), any::<i32>())),
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(record(), 1..10),
    )
        .prop_map(
            |(codec, producer, transactional, control, records)| BatchSpec {
                codec,
                producer,
                transactional,
                control,
                records,
            },
        )
}

pub fn batch_spec() -> impl Strategy<Value = BatchSpec> {
    batch_spec_with(codec())
}

/// Recomputes the CRC of the single batch that fills `buf`.
pub fn reseal(buf: &mut [u8]) {
    if buf.len() >= BATCH_HEADER_LEN {
        let crc = crc32c::crc32c(&buf[CRC_START..]);
        buf[17..21].copy_from_slice(&crc.to_be_bytes());
    }
}

/// A batch around an arbitrary `body` with a correct length and CRC, so decoding gets past
/// the header checks and into the records (or the decompressor).
pub fn forge(attributes: i16, last_offset_delta: i32, records_count: i32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(BATCH_HEADER_LEN + body.len());
    out.extend_from_slice(&0i64.to_be_bytes());
    out.extend_from_slice(&((BATCH_HEADER_LEN - 12 + body.len()) as i32).to_be_bytes());
    out.extend_from_slice(&0i32.to_be_bytes());
    out.push(2);
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&attributes.to_be_bytes());
    out.extend_from_slice(&last_offset_delta.to_be_bytes());
    out.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
    out.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
    out.extend_from_slice(&(-1i64).to_be_bytes());
    out.extend_from_slice(&(-1i16).to_be_bytes());
    out.extend_from_slice(&(-1i32).to_be_bytes());
    out.extend_from_slice(&records_count.to_be_bytes());
    out.extend_from_slice(body);
    reseal(&mut out);
    out
}

/// Runs every decoding entry point over `buf`. Each must return (not panic), and what they
/// return must agree with each other.
pub fn exercise(buf: &[u8]) {
    for max in [usize::MAX, buf.len(), 64] {
        let _ = BatchHeader::peek_total_len(buf, max);
        if let Ok((h, len)) = BatchHeader::validate(buf, max) {
            assert!(len <= buf.len() && len <= max && len >= BATCH_HEADER_LEN);
            assert_eq!(len, h.total_len());
            assert_eq!(Ok(h), BatchHeader::parse(buf));
            assert!(h.compression().is_ok());
            assert!(h.records_count >= 0 && h.last_offset_delta >= 0);
        }
    }
    if let Ok(h) = BatchHeader::parse(buf) {
        // Accessors on an unvalidated header must not panic either.
        let _ = (h.compression(), h.is_control(), h.is_transactional());
        let _ = (
            h.is_log_append_time(),
            h.last_offset(),
            h.offset_count(),
            h.total_len(),
        );
    }
    for limit in [DEFAULT_MAX_DECOMPRESSED, 1024] {
        if let Ok(d) = DecodedBatch::decode(buf, limit) {
            assert!(BatchHeader::validate(buf, usize::MAX).is_ok());
            assert_eq!(d.records.len(), d.header.records_count as usize);
            if let Some(last) = d.records.last() {
                assert!(last.offset <= d.header.last_offset());
            }
        }
    }
    check_iter(buf, usize::MAX);
    check_iter(buf, 256);
}

/// A [`BatchIter`] yields consecutive whole batches, then at most one error, then stops.
pub fn check_iter(buf: &[u8], max: usize) {
    let mut iter = BatchIter::new(buf, max);
    let mut expect_pos = 0;
    let mut failed = false;
    for item in iter.by_ref() {
        assert!(!failed, "BatchIter yielded after an error");
        match item {
            Ok((h, bytes)) => {
                assert_eq!(bytes.as_ptr(), buf[expect_pos..].as_ptr());
                assert_eq!(bytes.len(), h.total_len());
                expect_pos += bytes.len();
            }
            Err((pos, _)) => {
                assert_eq!(pos, expect_pos);
                failed = true;
            }
        }
    }
    assert!(iter.next().is_none(), "BatchIter is fused");
    if !failed {
        assert_eq!(expect_pos, buf.len());
    }
}

/// Deterministic pseudo-random bytes (xorshift), for payloads no codec can shrink.
pub fn noise(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}
