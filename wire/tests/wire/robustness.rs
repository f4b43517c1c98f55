//! Hostile input: every decoder returns a typed error and never panics, corruption is caught
//! by the CRC, decompression is bounded, and a buffer of batches is walked precisely.

use felix_wire::batch::{BatchHeader, BatchIter, stamp_base_offset};
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{
    BATCH_HEADER_LEN, BatchBuilder, Compression, DecodedBatch, Header, Record, WireError,
};
use proptest::prelude::*;
use proptest::sample::Index;

use crate::common::{CODECS, CRC_START, batch_spec, codec, config, exercise, forge, noise, reseal};

/// A small batch of every shape of record, for the exhaustive tests.
fn sample_batch(codec: Compression) -> Vec<u8> {
    BatchBuilder::new(codec)
        .producer(12, 3, 40)
        .with(Record {
            offset: 0,
            timestamp: 1_700_000_000_000,
            key: Some((&b"key"[..]).into()),
            value: Some((&b"value value value value value value"[..]).into()),
            headers: vec![
                Header {
                    key: "h".into(),
                    value: Some((&b"hv"[..]).into()),
                },
                Header {
                    key: "null".into(),
                    value: None,
                },
            ],
        })
        .with(Record {
            offset: 0,
            timestamp: 1_699_999_999_000,
            key: None,
            value: None,
            headers: vec![],
        })
        .with(Record::value(1_700_000_000_005, noise(40, 9)))
        .build()
        .unwrap()
}

/// Replaces the records of `batch` with `body` under codec attribute `codec_bits`, fixing
/// the length and the CRC.
fn with_body(batch: &[u8], codec_bits: i16, body: &[u8]) -> Vec<u8> {
    let mut out = batch[..BATCH_HEADER_LEN].to_vec();
    out.extend_from_slice(body);
    let length = (out.len() - 12) as i32;
    out[8..12].copy_from_slice(&length.to_be_bytes());
    let attributes = (i16::from_be_bytes([out[21], out[22]]) & !0x07) | codec_bits;
    out[21..23].copy_from_slice(&attributes.to_be_bytes());
    reseal(&mut out);
    out
}

fn set_i32(buf: &mut [u8], at: usize, v: i32) {
    buf[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(Index, u8),
    Truncate(Index),
    Insert(Index, u8),
    Remove(Index),
    /// Adds a small amount to an i32 field: batch length (8), last offset delta (23) or
    /// records count (57).
    Nudge(usize, i32),
    /// Sets one of those fields to anything.
    Set(usize, i32),
    Attributes(i16),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let field = prop::sample::select(vec![8usize, 23, 57]);
    prop_oneof![
        4 => (any::<Index>(), 1u8..=255).prop_map(|(i, m)| Mutation::Flip(i, m)),
        2 => any::<Index>().prop_map(Mutation::Truncate),
        1 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => any::<Index>().prop_map(Mutation::Remove),
        2 => (field.clone(), -70i32..70).prop_map(|(f, d)| Mutation::Nudge(f, d)),
        1 => (field, any::<i32>()).prop_map(|(f, v)| Mutation::Set(f, v)),
        1 => any::<i16>().prop_map(Mutation::Attributes),
    ]
}

fn apply(buf: &mut Vec<u8>, m: &Mutation) {
    if buf.is_empty() {
        return;
    }
    match m {
        Mutation::Flip(i, mask) => {
            let at = i.index(buf.len());
            buf[at] ^= mask;
        }
        Mutation::Truncate(i) => buf.truncate(i.index(buf.len())),
        Mutation::Insert(i, b) => {
            let at = i.index(buf.len() + 1);
            buf.insert(at, *b);
        }
        Mutation::Remove(i) => {
            let at = i.index(buf.len());
            buf.remove(at);
        }
        Mutation::Nudge(at, d) if buf.len() >= at + 4 => {
            let v = i32::from_be_bytes(buf[*at..at + 4].try_into().unwrap());
            set_i32(buf, *at, v.wrapping_add(*d));
        }
        Mutation::Set(at, v) if buf.len() >= at + 4 => set_i32(buf, *at, *v),
        Mutation::Attributes(a) if buf.len() >= 23 => buf[21..23].copy_from_slice(&a.to_be_bytes()),
        _ => {}
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn decoder_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        exercise(&bytes);
    }

    #[test]
    fn decoder_never_panics_on_arbitrary_records_behind_a_valid_header(
        attributes in any::<i16>(),
        last_offset_delta in prop_oneof![0i32..20, any::<i32>()],
        records_count in prop_oneof![0i32..20, any::<i32>()],
        body in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        // The CRC is right, so decoding reaches the record parser and the decompressors.
        exercise(&forge(attributes, last_offset_delta, records_count, &body));
        exercise(&forge(attributes & 0x07, last_offset_delta, records_count, &body));
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn mutated_batches_return_typed_errors_and_never_panic(
        spec in batch_spec(),
        mutations in prop::collection::vec(mutation(), 1..4),
        fix_crc in any::<bool>(),
    ) {
        let mut bytes = spec.build();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        if fix_crc {
            // Gets the damage past the CRC into the records and the decompressors.
            reseal(&mut bytes);
        }
        exercise(&bytes);
        let mut two = bytes.clone();
        two.extend_from_slice(&spec.build());
        exercise(&two);
    }

    #[test]
    fn flipped_byte_is_detected_by_crc(spec in batch_spec(), at in any::<Index>(), mask in 1u8..=255) {
        let mut bytes = spec.build();
        let at = CRC_START + at.index(bytes.len() - CRC_START);
        bytes[at] ^= mask;
        let crc_mismatch = |e: &WireError| matches!(e, WireError::CrcMismatch { .. });
        let validated = BatchHeader::validate(&bytes, usize::MAX);
        prop_assert!(validated.as_ref().is_err_and(crc_mismatch), "validate: {:?}", validated);
        let decoded = DecodedBatch::decode(&bytes, DEFAULT_MAX_DECOMPRESSED);
        prop_assert!(decoded.as_ref().is_err_and(crc_mismatch), "decode: {:?}", decoded);
        let mut iter = BatchIter::new(&bytes, usize::MAX);
        let first = iter.next();
        prop_assert!(matches!(&first, Some(Err((0, e))) if crc_mismatch(e)), "iter: {:?}", first);
        prop_assert!(iter.next().is_none());
    }

    #[test]
    fn batch_iter_over_arbitrary_batches_cut_anywhere_reports_truncation_at_the_cut_batch(
        specs in prop::collection::vec(batch_spec(), 1..5),
        cut in any::<Index>(),
    ) {
        let batches: Vec<Vec<u8>> = specs.iter().map(|s| s.build()).collect();
        let all: Vec<u8> = batches.concat();
        let cut = cut.index(all.len() + 1);
        let buf = &all[..cut];
        let mut starts = vec![0];
        for b in &batches {
            starts.push(starts.last().unwrap() + b.len());
        }
        let whole = starts.iter().filter(|&&s| s <= cut).count() - 1;
        let items: Vec<_> = BatchIter::new(buf, usize::MAX).collect();
        for (i, item) in items.iter().take(whole).enumerate() {
            let (_, bytes) = item.as_ref().expect("whole batches validate");
            prop_assert_eq!(*bytes, &batches[i][..]);
        }
        if starts.contains(&cut) {
            prop_assert_eq!(items.len(), whole);
        } else {
            prop_assert_eq!(items.len(), whole + 1);
            let (pos, err) = items[whole].as_ref().unwrap_err();
            prop_assert_eq!(*pos, starts[whole]);
            prop_assert!(matches!(err, WireError::Truncated { .. }), "{err:?}");
        }
    }
}

#[test]
fn every_single_byte_flip_in_the_crc_region_is_rejected() {
    for codec in CODECS {
        let batch = sample_batch(codec);
        for at in CRC_START..batch.len() {
            for mask in [0x01, 0x80, 0xff, 0x5a] {
                let mut bytes = batch.clone();
                bytes[at] ^= mask;
                let err = DecodedBatch::decode(&bytes, DEFAULT_MAX_DECOMPRESSED).unwrap_err();
                assert!(
                    matches!(err, WireError::CrcMismatch { .. }),
                    "{codec:?}: flip {mask:#x} at {at} gave {err:?}"
                );
            }
        }
    }
}

#[test]
fn flips_before_the_crc_region_are_harmless_or_rejected() {
    for codec in CODECS {
        let batch = sample_batch(codec);
        for at in 0..CRC_START {
            for mask in [0x01, 0x80, 0xff] {
                let mut bytes = batch.clone();
                bytes[at] ^= mask;
                let result = DecodedBatch::decode(&bytes, DEFAULT_MAX_DECOMPRESSED);
                match at {
                    // Base offset and partition leader epoch: what the log stamps.
                    0..=7 | 12..=15 => assert!(result.is_ok(), "{codec:?}: at {at}: {result:?}"),
                    8..=11 => assert!(
                        matches!(
                            result,
                            Err(WireError::InvalidLength { .. }
                                | WireError::Truncated { .. }
                                | WireError::CrcMismatch { .. })
                        ),
                        "{codec:?}: at {at}: {result:?}"
                    ),
                    16 => assert_eq!(result, Err(WireError::UnsupportedMagic((2 ^ mask) as i8))),
                    _ => assert!(matches!(result, Err(WireError::CrcMismatch { .. }))),
                }
            }
        }
    }
}

#[test]
fn header_accessors_never_panic_on_unvalidated_fields() {
    let mut bytes = sample_batch(Compression::None);
    set_i32(&mut bytes, 23, -1);
    stamp_base_offset(&mut bytes, i64::MIN);
    let h = BatchHeader::parse(&bytes).expect("parse does not look at the offset delta");
    assert_eq!(h.offset_count(), 0);
    assert_eq!(h.last_offset(), i64::MIN);
    reseal(&mut bytes);
    assert!(matches!(
        BatchHeader::validate(&bytes, usize::MAX),
        Err(WireError::Inconsistent(_))
    ));
    let h = BatchHeader {
        batch_length: i32::MIN,
        last_offset_delta: i32::MAX,
        base_offset: i64::MAX,
        ..h
    };
    assert_eq!(h.total_len(), 0);
    assert_eq!(h.offset_count(), 1 << 31);
    assert_eq!(h.last_offset(), i64::MAX);
}

#[test]
fn other_magics_are_refused() {
    let batch = sample_batch(Compression::None);
    for magic in [0u8, 1, 3, 0xff] {
        let mut bytes = batch.clone();
        bytes[16] = magic;
        assert_eq!(
            BatchHeader::parse(&bytes),
            Err(WireError::UnsupportedMagic(magic as i8))
        );
        assert_eq!(
            BatchHeader::validate(&bytes, usize::MAX),
            Err(WireError::UnsupportedMagic(magic as i8))
        );
    }
}

#[test]
fn short_input_is_reported_as_truncated_with_what_was_needed() {
    let batch = sample_batch(Compression::Lz4);
    for len in 0..batch.len() {
        let part = &batch[..len];
        let needed = if len < 12 { 12 } else { batch.len() };
        assert_eq!(
            BatchHeader::validate(part, usize::MAX),
            Err(WireError::Truncated {
                needed,
                available: len
            })
        );
        assert_eq!(
            DecodedBatch::decode(part, DEFAULT_MAX_DECOMPRESSED),
            Err(WireError::Truncated {
                needed,
                available: len
            })
        );
        if len < BATCH_HEADER_LEN {
            assert_eq!(
                BatchHeader::parse(part),
                Err(WireError::Truncated {
                    needed: BATCH_HEADER_LEN,
                    available: len
                })
            );
        }
    }
}

#[test]
fn impossible_lengths_are_refused() {
    let batch = sample_batch(Compression::None);
    for length in [i32::MIN, -1, 0, 48] {
        let mut bytes = batch.clone();
        set_i32(&mut bytes, 8, length);
        assert!(matches!(
            BatchHeader::validate(&bytes, usize::MAX),
            Err(WireError::InvalidLength { .. })
        ));
        assert!(matches!(
            BatchHeader::parse(&bytes),
            Err(WireError::InvalidLength { .. })
        ));
    }
    // Over the caller's limit, even if the bytes are all there.
    assert!(matches!(
        BatchHeader::validate(&batch, batch.len() - 1),
        Err(WireError::InvalidLength { .. })
    ));
    assert!(BatchHeader::validate(&batch, batch.len()).is_ok());
}

#[test]
fn unknown_codecs_are_refused() {
    let batch = sample_batch(Compression::None);
    for bits in 5..=7 {
        let body = &batch[BATCH_HEADER_LEN..];
        let bytes = with_body(&batch, bits, body);
        assert_eq!(
            BatchHeader::validate(&bytes, usize::MAX),
            Err(WireError::UnknownCodec(bits as u8))
        );
        assert_eq!(
            DecodedBatch::decode(&bytes, DEFAULT_MAX_DECOMPRESSED),
            Err(WireError::UnknownCodec(bits as u8))
        );
    }
}

#[test]
fn header_counts_that_contradict_each_other_or_the_records_are_refused() {
    let batch = sample_batch(Compression::Zstd); // 3 records, last offset delta 2
    let edit = |at: usize, v: i32| {
        let mut bytes = batch.clone();
        set_i32(&mut bytes, at, v);
        reseal(&mut bytes);
        DecodedBatch::decode(&bytes, DEFAULT_MAX_DECOMPRESSED)
    };
    assert!(matches!(edit(23, -1), Err(WireError::Inconsistent(_))));
    assert!(matches!(edit(57, -1), Err(WireError::Inconsistent(_))));
    assert!(matches!(edit(57, 4), Err(WireError::Inconsistent(_)))); // more records than offsets
    assert!(matches!(edit(23, 1), Err(WireError::Inconsistent(_)))); // likewise, by the delta
    assert!(matches!(edit(57, 2), Err(WireError::Inconsistent(_)))); // a record left over
    assert!(matches!(edit(57, 0), Err(WireError::Inconsistent(_))));
    assert!(matches!(
        edit(57, i32::MAX),
        Err(WireError::Inconsistent(_))
    ));
    assert!(edit(23, 10).is_ok(), "offset gaps (compaction) are legal");
    let mut more = batch.clone();
    set_i32(&mut more, 23, 3);
    set_i32(&mut more, 57, 4);
    reseal(&mut more);
    assert!(matches!(
        DecodedBatch::decode(&more, DEFAULT_MAX_DECOMPRESSED),
        Err(WireError::MalformedRecord { index: 3, .. })
    ));
}

#[test]
fn a_record_offset_past_the_batch_last_offset_is_refused() {
    let mut bytes = BatchBuilder::new(Compression::None)
        .with(Record::value(0, &b"v"[..]))
        .build()
        .unwrap();
    // length, attributes, timestamp delta, offset delta: 0 -> 1 (zig-zag 2)
    assert_eq!(bytes[BATCH_HEADER_LEN + 3], 0);
    bytes[BATCH_HEADER_LEN + 3] = 2;
    reseal(&mut bytes);
    assert!(matches!(
        DecodedBatch::decode(&bytes, DEFAULT_MAX_DECOMPRESSED),
        Err(WireError::Inconsistent(_))
    ));
}

#[test]
fn decompression_bomb_is_refused_with_decompressed_too_large() {
    let bomb = vec![0u8; 2 << 20];
    let raw_len = BatchBuilder::new(Compression::None)
        .with(Record::value(0, bomb.clone()))
        .build()
        .unwrap()
        .len()
        - BATCH_HEADER_LEN;
    for codec in [
        Compression::Zstd,
        Compression::Gzip,
        Compression::Lz4,
        Compression::Snappy,
    ] {
        let batch = BatchBuilder::new(codec)
            .with(Record::value(0, bomb.clone()))
            .build()
            .unwrap();
        assert!(
            batch.len() * 20 < raw_len,
            "{codec:?}: {} bytes is not a bomb",
            batch.len()
        );
        for limit in [0, 64 << 10, raw_len - 1] {
            assert_eq!(
                DecodedBatch::decode(&batch, limit),
                Err(WireError::DecompressedTooLarge { limit }),
                "{codec:?}"
            );
        }
        let decoded = DecodedBatch::decode(&batch, raw_len).expect("exactly at the limit decodes");
        assert_eq!(decoded.records[0].value.as_deref(), Some(&bomb[..]));
    }
}

#[test]
fn snappy_blocks_claiming_huge_lengths_are_refused_before_allocating() {
    let batch = sample_batch(Compression::None);
    // A bare snappy block whose preamble claims 4 GiB - 1.
    let raw = [0xff, 0xff, 0xff, 0xff, 0x0f, 0x00, 0x00];
    let bytes = with_body(&batch, 2, &raw);
    assert_eq!(
        DecodedBatch::decode(&bytes, 1 << 20),
        Err(WireError::DecompressedTooLarge { limit: 1 << 20 })
    );
    // The same inside xerial framing.
    let mut xerial = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01".to_vec();
    xerial.extend_from_slice(&(raw.len() as i32).to_be_bytes());
    xerial.extend_from_slice(&raw);
    let bytes = with_body(&batch, 2, &xerial);
    assert_eq!(
        DecodedBatch::decode(&bytes, 1 << 20),
        Err(WireError::DecompressedTooLarge { limit: 1 << 20 })
    );
}

fn xerial(chunks: &[&[u8]]) -> Vec<u8> {
    let mut out = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01".to_vec();
    for chunk in chunks {
        let block = snap::raw::Encoder::new().compress_vec(chunk).unwrap();
        out.extend_from_slice(&(block.len() as i32).to_be_bytes());
        out.extend_from_slice(&block);
    }
    out
}

#[test]
fn snappy_reads_xerial_framing_raw_blocks_and_concatenated_xerial_streams() {
    let plain = sample_batch(Compression::None);
    let expected = DecodedBatch::decode(&plain, DEFAULT_MAX_DECOMPRESSED)
        .unwrap()
        .records;
    let body = &plain[BATCH_HEADER_LEN..];
    let (a, b) = body.split_at(body.len() / 2);
    let raw = snap::raw::Encoder::new().compress_vec(body).unwrap();
    let bodies = [
        ("xerial, one block", xerial(&[body])),
        ("xerial, two blocks", xerial(&[a, b])),
        ("xerial, empty block", xerial(&[a, b"", b])),
        ("two xerial streams", [xerial(&[a]), xerial(&[b])].concat()),
        ("raw block (librdkafka)", raw),
    ];
    for (what, snappy) in bodies {
        let bytes = with_body(&plain, 2, &snappy);
        let decoded = DecodedBatch::decode(&bytes, DEFAULT_MAX_DECOMPRESSED);
        assert_eq!(decoded.map(|d| d.records), Ok(expected.clone()), "{what}");
    }
    let mut cut = xerial(&[a, b]);
    cut.pop();
    let bytes = with_body(&plain, 2, &cut);
    assert!(matches!(
        DecodedBatch::decode(&bytes, DEFAULT_MAX_DECOMPRESSED),
        Err(WireError::Decompression {
            codec: "snappy",
            ..
        })
    ));
}

#[test]
fn corrupt_compressed_payloads_are_decompression_errors() {
    for codec in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let batch = sample_batch(codec);
        let body = &batch[BATCH_HEADER_LEN..];
        for garbage in [
            &[][..],
            &[0u8; 16][..],
            &noise(64, 3)[..],
            &body[..body.len() / 2],
        ] {
            let bytes = with_body(&batch, codec.attribute() as i16, garbage);
            let result = DecodedBatch::decode(&bytes, DEFAULT_MAX_DECOMPRESSED);
            assert!(
                matches!(
                    result,
                    Err(WireError::Decompression { .. }
                        | WireError::MalformedRecord { .. }
                        | WireError::Inconsistent(_))
                ),
                "{codec:?}: {result:?}"
            );
        }
    }
}

#[test]
fn batch_iter_yields_every_concatenated_batch() {
    let mut buf = Vec::new();
    let mut expected = Vec::new();
    for (i, codec) in CODECS.iter().enumerate() {
        let mut batch = sample_batch(*codec);
        stamp_base_offset(&mut batch, 100 + 3 * i as i64);
        expected.push(batch.clone());
        buf.extend_from_slice(&batch);
    }
    let mut iter = BatchIter::new(&buf, 1 << 20);
    let mut pos = 0;
    for (i, want) in expected.iter().enumerate() {
        assert_eq!(iter.position(), pos);
        let (h, bytes) = iter.next().unwrap().unwrap();
        assert_eq!(bytes, &want[..]);
        assert_eq!(h.base_offset, 100 + 3 * i as i64);
        assert_eq!(h.compression(), Ok(CODECS[i]));
        let decoded = DecodedBatch::decode(bytes, DEFAULT_MAX_DECOMPRESSED).unwrap();
        assert_eq!(decoded.records[2].offset, 102 + 3 * i as i64);
        pos += want.len();
    }
    assert_eq!(iter.position(), buf.len());
    assert!(iter.next().is_none());
    assert!(BatchIter::new(&[], 1 << 20).next().is_none());
}

#[test]
fn batch_iter_reports_a_trailing_partial_batch_as_truncated_with_its_position() {
    let first = sample_batch(Compression::Gzip);
    let last = sample_batch(Compression::Snappy);
    for cut in 1..last.len() {
        let mut buf = first.clone();
        buf.extend_from_slice(&last[..cut]);
        let mut iter = BatchIter::new(&buf, 1 << 20);
        assert_eq!(iter.next().unwrap().unwrap().1, &first[..]);
        let needed = if cut < 12 { 12 } else { last.len() };
        assert_eq!(
            iter.next(),
            Some(Err((
                first.len(),
                WireError::Truncated {
                    needed,
                    available: cut
                }
            )))
        );
        assert!(iter.next().is_none());
        assert_eq!(iter.position(), first.len());
    }
}

#[test]
fn batch_iter_stops_at_a_corrupt_batch_and_reports_its_position() {
    let good = sample_batch(Compression::None);
    let mut bad = sample_batch(Compression::Zstd);
    let n = bad.len();
    bad[n - 1] ^= 1;
    let buf = [good.clone(), bad, good.clone()].concat();
    let items: Vec<_> = BatchIter::new(&buf, 1 << 20).collect();
    assert_eq!(items.len(), 2);
    assert!(items[0].is_ok());
    assert!(matches!(items[1], Err((p, WireError::CrcMismatch { .. })) if p == good.len()));
}

#[test]
fn batch_iter_refuses_a_batch_over_its_size_limit() {
    let batch = sample_batch(Compression::None);
    let buf = [batch.clone(), batch.clone()].concat();
    let items: Vec<_> = BatchIter::new(&buf, batch.len() - 1).collect();
    assert!(matches!(
        items[..],
        [Err((0, WireError::InvalidLength { .. }))]
    ));
    assert_eq!(
        BatchIter::new(&buf, batch.len())
            .filter(|r| r.is_ok())
            .count(),
        2
    );
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn any_limit_below_the_records_size_is_enforced(codec in codec(), len in 1usize..20_000, seed in any::<u64>()) {
        let value = if seed % 2 == 0 { noise(len, seed | 1) } else { vec![seed as u8; len] };
        let batch = BatchBuilder::new(codec).with(Record::value(0, value)).build().unwrap();
        let plain_len = BatchBuilder::new(Compression::None)
            .with(Record::value(0, vec![0u8; len]))
            .build()
            .unwrap()
            .len()
            - BATCH_HEADER_LEN;
        let limit = plain_len - 1;
        if codec == Compression::None {
            // Nothing to decompress: the limit is about decompression only.
            prop_assert!(DecodedBatch::decode(&batch, limit).is_ok());
        } else {
            prop_assert_eq!(DecodedBatch::decode(&batch, limit), Err(WireError::DecompressedTooLarge { limit }));
        }
        prop_assert!(DecodedBatch::decode(&batch, plain_len).is_ok());
    }
}
