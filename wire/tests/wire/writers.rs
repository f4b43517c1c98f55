//! The writers other crates build batches with (the header writer, the record writer), the
//! header-only walk and the checked batch: each agrees with the validating decoder.

use bytes::Bytes;
use felix_wire::batch::{BatchHeader, BatchIter, seal_batch};
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{
    BATCH_HEADER_LEN, CheckedBatch, Compression, DecodedBatch, HeaderIter, WireError,
};
use proptest::prelude::*;

use crate::common::{batch_spec, batch_spec_with, config, noise};

proptest! {
    #![proptest_config(config(128))]

    /// A batch written record by record with `RecordFields` and sealed with `seal_batch`,
    /// as the cold tier rebuilds one, is the batch `BatchBuilder` writes, byte for byte.
    #[test]
    fn hand_written_batches_equal_built_ones(spec in batch_spec_with(Just(Compression::None))) {
        let built = spec.build();
        let header = BatchHeader::parse(&built).expect("parses");
        let mut out = vec![0u8; BATCH_HEADER_LEN];
        for (delta, r) in spec.records.iter().enumerate() {
            r.fields(delta as i32, header.base_timestamp).put(&mut out).expect("encodes");
        }
        seal_batch(&mut out, &BatchHeader { batch_length: -7, crc: 1, ..header }).expect("seals");
        prop_assert_eq!(&out, &built);
        let decoded = DecodedBatch::decode(&out, DEFAULT_MAX_DECOMPRESSED).expect("decodes");
        prop_assert_eq!(decoded.records.len(), spec.records.len());
    }

    /// Over valid batches the header-only walk sees the headers the validating iterator
    /// sees, at the same positions; a checked split yields the same batches.
    #[test]
    fn header_walk_and_checked_split_agree_with_the_validating_iterator(
        specs in prop::collection::vec(batch_spec(), 1..5)
    ) {
        let mut buf = Vec::new();
        for s in &specs {
            buf.extend_from_slice(&s.build());
        }
        let validated: Vec<(BatchHeader, usize)> = {
            let mut at = 0;
            BatchIter::new(&buf, usize::MAX)
                .map(|item| {
                    let (h, bytes) = item.expect("valid");
                    let pos = at;
                    at += bytes.len();
                    (h, pos)
                })
                .collect()
        };
        let walked: Vec<(BatchHeader, usize)> =
            HeaderIter::new(&buf).map(|item| item.expect("parses")).collect();
        prop_assert_eq!(&walked, &validated);
        let body = Bytes::from(buf);
        let checked: Vec<CheckedBatch> = CheckedBatch::split(&body, usize::MAX)
            .map(|item| item.expect("valid"))
            .collect();
        prop_assert_eq!(checked.len(), validated.len());
        for (c, (h, pos)) in checked.iter().zip(&validated) {
            prop_assert_eq!(c.header(), h);
            prop_assert_eq!(c.bytes(), &body.slice(*pos..*pos + h.total_len()));
        }
    }
}

#[test]
fn header_walk_stops_at_the_first_header_that_does_not_parse() {
    let mut buf = crate::common::BatchSpec {
        codec: Compression::None,
        producer: None,
        transactional: false,
        control: false,
        records: vec![felix_wire::Record::value(1, &b"x"[..])],
    }
    .build();
    let first = buf.len();
    buf.extend_from_slice(&noise(100, 7));
    let items: Vec<_> = HeaderIter::new(&buf).collect();
    assert_eq!(items.len(), 2, "{items:?}");
    assert!(matches!(items[0], Ok((_, 0))));
    assert!(matches!(items[1], Err((at, _)) if at == first));
}

#[test]
fn a_checked_batch_is_exactly_one_valid_batch() {
    let spec = crate::common::BatchSpec {
        codec: Compression::Lz4,
        producer: Some((7, 1, 0)),
        transactional: false,
        control: false,
        records: vec![felix_wire::Record::value(1, &b"payload"[..])],
    };
    let bytes = spec.build();
    let checked = CheckedBatch::check(Bytes::from(bytes.clone()), usize::MAX).expect("valid");
    assert_eq!(checked.len(), bytes.len());
    assert_eq!(checked.header().producer_id, 7);

    let mut trailing = bytes.clone();
    trailing.push(0);
    assert!(matches!(
        CheckedBatch::check(Bytes::from(trailing), usize::MAX),
        Err(WireError::Inconsistent(_))
    ));
    let mut flipped = bytes.clone();
    *flipped.last_mut().expect("non-empty") ^= 1;
    assert!(matches!(
        CheckedBatch::check(Bytes::from(flipped), usize::MAX),
        Err(WireError::CrcMismatch { .. })
    ));
    assert!(matches!(
        CheckedBatch::check(Bytes::from(bytes), 10),
        Err(WireError::InvalidLength { .. })
    ));
}
