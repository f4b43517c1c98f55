//! Encoding then decoding gives back what went in, for every codec, and the log's stamping
//! never breaks a batch.

use felix_wire::batch::{BatchHeader, stamp_base_offset, stamp_partition_leader_epoch};
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{
    BATCH_HEADER_LEN, BatchBuilder, Compression, DecodedBatch, Header, Record, WireError,
};
use proptest::prelude::*;

use crate::common::{BatchSpec, CODECS, batch_spec, config, noise, reseal};

/// The records as the decoder must return them: numbered densely from `base_offset`.
fn expected_records(spec: &BatchSpec, base_offset: i64) -> Vec<Record> {
    spec.records
        .iter()
        .enumerate()
        .map(|(i, r)| Record {
            offset: base_offset.wrapping_add(i as i64),
            ..r.clone()
        })
        .collect()
}

/// Every header field the builder sets, checked against what went in.
fn check_header(spec: &BatchSpec, h: &BatchHeader, base_offset: i64, epoch: i32, len: usize) {
    let n = spec.records.len();
    let (id, producer_epoch, seq) = spec.producer.unwrap_or((-1, -1, -1));
    assert_eq!(h.base_offset, base_offset);
    assert_eq!(h.partition_leader_epoch, epoch);
    assert_eq!(h.magic, 2);
    assert_eq!(h.total_len(), len);
    assert_eq!(h.records_count as usize, n);
    assert_eq!(h.last_offset_delta as usize, n - 1);
    assert_eq!(h.offset_count(), n as u64);
    assert_eq!(h.base_timestamp, spec.records[0].timestamp);
    assert_eq!(
        h.max_timestamp,
        spec.records.iter().map(|r| r.timestamp).max().unwrap()
    );
    assert_eq!(
        (h.producer_id, h.producer_epoch, h.base_sequence),
        (id, producer_epoch, seq)
    );
    assert_eq!(h.is_control(), spec.control);
    assert_eq!(h.is_transactional(), spec.transactional);
    assert!(!h.is_log_append_time());
    assert_eq!(h.compression(), Ok(spec.codec));
}

proptest! {
    #![proptest_config(config(192))]

    #[test]
    fn every_codec_round_trips_records(spec in batch_spec()) {
        let bytes = spec.build();
        let (h, len) = BatchHeader::validate(&bytes, bytes.len()).expect("validate accepts built bytes");
        prop_assert_eq!(len, bytes.len());
        check_header(&spec, &h, 0, -1, bytes.len());
        let decoded = DecodedBatch::decode(&bytes, DEFAULT_MAX_DECOMPRESSED).expect("decodes");
        prop_assert_eq!(decoded.header, h);
        prop_assert_eq!(decoded.records, expected_records(&spec, 0));
    }

    #[test]
    fn stamping_base_offset_and_leader_epoch_keeps_the_crc_valid_and_shifts_offsets(
        spec in batch_spec(),
        base_offset in prop_oneof![0i64..1 << 40, any::<i64>()],
        epoch in any::<i32>(),
    ) {
        let built = spec.build();
        let mut bytes = built.clone();
        stamp_base_offset(&mut bytes, base_offset);
        stamp_partition_leader_epoch(&mut bytes, epoch);
        // Only the first 16 bytes change: the CRC and everything it covers stay as built.
        prop_assert_eq!(&bytes[16..], &built[16..]);
        let (h, len) = BatchHeader::validate(&bytes, usize::MAX).expect("stamped batch validates");
        check_header(&spec, &h, base_offset, epoch, len);
        prop_assert_eq!(h.last_offset(), base_offset.saturating_add(spec.records.len() as i64 - 1));
        let decoded = DecodedBatch::decode(&bytes, DEFAULT_MAX_DECOMPRESSED).expect("decodes");
        prop_assert_eq!(decoded.records, expected_records(&spec, base_offset));
    }

    #[test]
    fn decode_ignores_bytes_after_the_batch(
        spec in batch_spec(),
        trailer in prop::collection::vec(any::<u8>(), 0..100),
    ) {
        let mut bytes = spec.build();
        let len = bytes.len();
        bytes.extend_from_slice(&trailer);
        prop_assert_eq!(BatchHeader::validate(&bytes, usize::MAX).map(|(_, l)| l), Ok(len));
        let decoded = DecodedBatch::decode(&bytes, DEFAULT_MAX_DECOMPRESSED).expect("decodes");
        prop_assert_eq!(decoded.records, expected_records(&spec, 0));
    }
}

#[test]
fn a_new_batch_has_base_offset_zero_no_leader_epoch_and_no_producer() {
    let bytes = BatchBuilder::new(Compression::None)
        .with(Record::value(5, &b"v"[..]))
        .build()
        .unwrap();
    let h = BatchHeader::parse(&bytes).unwrap();
    assert_eq!((h.base_offset, h.partition_leader_epoch), (0, -1));
    assert_eq!(
        (h.producer_id, h.producer_epoch, h.base_sequence),
        (-1, -1, -1)
    );
    assert_eq!(h.attributes, 0);
}

#[test]
fn uncompressed_layout_matches_the_documented_offsets() {
    let bytes = BatchBuilder::new(Compression::None)
        .producer(0x0102_0304_0506_0708, 0x090a, 0x0b0c_0d0e)
        .with(Record {
            offset: 99, // ignored: records are numbered by the builder
            timestamp: 1000,
            key: Some((&b"k"[..]).into()),
            value: Some((&b"v"[..]).into()),
            headers: vec![],
        })
        .build()
        .unwrap();
    // length 8 (zig-zag 0x10), attributes 0, timestamp delta 0, offset delta 0,
    // key length 1 (0x02) "k", value length 1 (0x02) "v", no headers.
    let record = [0x10, 0, 0, 0, 0x02, b'k', 0x02, b'v', 0];
    assert_eq!(bytes.len(), BATCH_HEADER_LEN + record.len());
    assert_eq!(&bytes[0..8], &0i64.to_be_bytes());
    assert_eq!(&bytes[8..12], &((bytes.len() - 12) as i32).to_be_bytes());
    assert_eq!(&bytes[12..16], &(-1i32).to_be_bytes());
    assert_eq!(bytes[16], 2);
    assert_eq!(&bytes[17..21], &crc32c::crc32c(&bytes[21..]).to_be_bytes());
    assert_eq!(&bytes[21..23], &0i16.to_be_bytes());
    assert_eq!(&bytes[23..27], &0i32.to_be_bytes());
    assert_eq!(&bytes[27..35], &1000i64.to_be_bytes());
    assert_eq!(&bytes[35..43], &1000i64.to_be_bytes());
    assert_eq!(&bytes[43..51], &0x0102_0304_0506_0708i64.to_be_bytes());
    assert_eq!(&bytes[51..53], &0x090ai16.to_be_bytes());
    assert_eq!(&bytes[53..57], &0x0b0c_0d0ei32.to_be_bytes());
    assert_eq!(&bytes[57..61], &1i32.to_be_bytes());
    assert_eq!(&bytes[61..], &record);
}

#[test]
fn every_codec_round_trips_records_larger_than_its_blocks() {
    // Spans several xerial snappy blocks (32 KiB) and lz4 blocks (64 KiB), with both
    // incompressible and compressible data, and enough records for multi-byte offset deltas.
    let mut spec = BatchSpec {
        codec: Compression::None,
        producer: Some((77, 1, 1000)),
        transactional: false,
        control: false,
        records: vec![
            Record::value(1_000, noise(150_000, 1)),
            Record::value(999, vec![b'x'; 200_000]),
        ],
    };
    for i in 0..300u32 {
        spec.records.push(Record {
            offset: 0,
            timestamp: 1_000 - i as i64,
            key: Some(i.to_be_bytes().to_vec().into()),
            value: (i % 7 != 0).then(|| noise(i as usize, i as u64 + 2).into()),
            headers: vec![Header {
                key: format!("h{i}"),
                value: None,
            }],
        });
    }
    for codec in CODECS {
        spec.codec = codec;
        let bytes = spec.build();
        let (h, _) = BatchHeader::validate(&bytes, usize::MAX).unwrap();
        check_header(&spec, &h, 0, -1, bytes.len());
        let decoded = DecodedBatch::decode(&bytes, DEFAULT_MAX_DECOMPRESSED).unwrap();
        assert_eq!(decoded.records, expected_records(&spec, 0), "{codec:?}");
    }
}

#[test]
fn log_append_time_batches_read_every_timestamp_as_the_max_timestamp() {
    for codec in CODECS {
        let mut bytes = BatchBuilder::new(codec)
            .with(Record::value(10, &b"a"[..]))
            .with(Record::value(30, &b"b"[..]))
            .with(Record::value(20, &b"c"[..]))
            .build()
            .unwrap();
        // What a broker with LogAppendTime does: set the attribute and the max timestamp.
        bytes[22] |= 0x08;
        bytes[35..43].copy_from_slice(&555i64.to_be_bytes());
        reseal(&mut bytes);
        let decoded = DecodedBatch::decode(&bytes, DEFAULT_MAX_DECOMPRESSED).unwrap();
        assert!(decoded.header.is_log_append_time());
        let timestamps: Vec<i64> = decoded.records.iter().map(|r| r.timestamp).collect();
        assert_eq!(timestamps, [555, 555, 555], "{codec:?}");
    }
}

#[test]
fn an_empty_batch_cannot_be_encoded() {
    for codec in CODECS {
        let builder = BatchBuilder::new(codec);
        assert!(builder.is_empty());
        assert_eq!(builder.len(), 0);
        assert!(matches!(builder.build(), Err(WireError::Unencodable(_))));
    }
}

#[test]
fn codec_attributes_and_names_round_trip() {
    for codec in CODECS {
        assert_eq!(Compression::from_attribute(codec.attribute()), Ok(codec));
        assert_eq!(codec.name().parse::<Compression>(), Ok(codec));
    }
    for bits in 5..=7 {
        assert_eq!(
            Compression::from_attribute(bits),
            Err(WireError::UnknownCodec(bits))
        );
    }
    assert!("brotli".parse::<Compression>().is_err());
    assert_eq!(Compression::default(), Compression::None);
}
