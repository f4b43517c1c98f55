//! The Parquet object format: batches survive the round trip record for record and header
//! field for field, the footer answers where offsets and times are, bad input and damaged
//! objects give typed errors, and pyarrow reads what Felix writes.

use std::process::Command;
use std::sync::Arc;

use bytes::Bytes;
use felix_cold::segment::{
    DecodedRowGroup, EncodeOptions, ObjectFooter, ObjectInfo, SegmentEncoder, SegmentError,
    SegmentSummary, decode_row_group, encode_to_bytes,
};
use felix_wire::batch::{stamp_base_offset, stamp_partition_leader_epoch};
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{
    BatchBuilder, BatchHeader, BatchIter, Compression, DecodedBatch, Header, Record, WireError,
};
use proptest::prelude::*;

const CODECS: [Compression; 5] = [
    Compression::None,
    Compression::Gzip,
    Compression::Snappy,
    Compression::Lz4,
    Compression::Zstd,
];

fn info() -> ObjectInfo {
    ObjectInfo {
        tenant: "acme".into(),
        namespace: "orders".into(),
        stream: "created".into(),
        shard: 3,
    }
}

fn opts(row_group_bytes: usize) -> EncodeOptions {
    EncodeOptions {
        row_group_bytes,
        ..EncodeOptions::default()
    }
}

fn record(
    timestamp: i64,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(&str, Option<&[u8]>)],
) -> Record {
    Record {
        offset: 0,
        timestamp,
        key: key.map(Bytes::copy_from_slice),
        value: value.map(Bytes::copy_from_slice),
        headers: headers
            .iter()
            .map(|(k, v)| Header {
                key: (*k).to_owned(),
                value: v.map(Bytes::copy_from_slice),
            })
            .collect(),
    }
}

/// Stores the CRC of a batch whose CRC-covered bytes a test changed by hand.
fn reseal(batch: &mut [u8]) {
    batch[17..21].fill(0);
    match BatchHeader::validate(batch, usize::MAX) {
        Ok(_) => {}
        Err(WireError::CrcMismatch { computed, .. }) => {
            batch[17..21].copy_from_slice(&computed.to_be_bytes())
        }
        Err(e) => panic!("forged batch is invalid: {e}"),
    }
}

/// A log being written: batches stamped with contiguous base offsets and a generation.
struct Log {
    bytes: Vec<u8>,
    next: i64,
}

impl Log {
    fn starting_at(offset: i64) -> Log {
        Log {
            bytes: Vec::new(),
            next: offset,
        }
    }

    fn append(&mut self, mut batch: Vec<u8>, generation: i32) {
        stamp_base_offset(&mut batch, self.next);
        stamp_partition_leader_epoch(&mut batch, generation);
        let (h, _) = BatchHeader::validate(&batch, usize::MAX).expect("valid batch");
        self.next = h.last_offset() + 1;
        self.bytes.extend_from_slice(&batch);
    }

    fn build(&mut self, builder: BatchBuilder, generation: i32) {
        self.append(builder.build().expect("encodable batch"), generation);
    }

    fn batches(&self) -> Vec<DecodedBatch> {
        BatchIter::new(&self.bytes, usize::MAX)
            .map(|b| {
                DecodedBatch::decode(b.expect("valid").1, DEFAULT_MAX_DECOMPRESSED)
                    .expect("decodes")
            })
            .collect()
    }
}

/// A batch with timestamps set by the log (LogAppendTime): every record reads as `at`.
fn log_append_time_batch(at: i64) -> Vec<u8> {
    let mut b = BatchBuilder::new(Compression::None)
        .with(record(5, Some(b"lat"), Some(b"one"), &[]))
        .with(record(9, None, Some(b"two"), &[]))
        .build()
        .expect("batch");
    let attributes = i16::from_be_bytes([b[21], b[22]]) | 0x08;
    b[21..23].copy_from_slice(&attributes.to_be_bytes());
    b[35..43].copy_from_slice(&at.to_be_bytes());
    reseal(&mut b);
    b
}

/// A batch whose last records were removed (as compaction does): its offsets run `extra`
/// past its last record.
fn trailing_gap_batch(extra: i32) -> Vec<u8> {
    let mut b = BatchBuilder::new(Compression::None)
        .with(record(1_700_000_150_000, Some(b"g"), Some(b"kept"), &[]))
        .with(record(
            1_700_000_150_001,
            Some(b"g"),
            Some(b"kept too"),
            &[],
        ))
        .build()
        .expect("batch");
    let delta = i32::from_be_bytes([b[23], b[24], b[25], b[26]]) + extra;
    b[23..27].copy_from_slice(&delta.to_be_bytes());
    reseal(&mut b);
    b
}

/// An idempotent producer's batch whose records sit at offset deltas 1, 3, 5, ... (the
/// records between, and the first, were removed).
fn spread_offsets_batch(records: usize) -> Vec<u8> {
    let mut builder = BatchBuilder::new(Compression::None).producer(5000, 1, 100);
    for i in 0..records {
        builder.push(record(1_699_999_000_000, None, Some(&[i as u8; 3]), &[]));
    }
    let mut b = builder.build().expect("batch");
    // Each record is: length, attributes, timestamp delta (0), offset delta, ...: one byte
    // each here, so the offset delta can be rewritten in place (zig-zag: 2 * delta).
    let mut pos = 61;
    for i in 0..records {
        let len = (b[pos] >> 1) as usize;
        b[pos + 3] = (2 * (2 * i + 1)) as u8;
        pos += 1 + len;
    }
    let last_delta = 2 * records as i32 - 1;
    b[23..27].copy_from_slice(&last_delta.to_be_bytes());
    reseal(&mut b);
    b
}

/// A control batch with no records left, spanning `span` offsets (kept for its producer).
fn empty_batch(span: i32) -> Vec<u8> {
    let mut b = Vec::with_capacity(61);
    b.extend_from_slice(&0i64.to_be_bytes()); // base offset
    b.extend_from_slice(&49i32.to_be_bytes()); // batch length
    b.extend_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
    b.push(2); // magic
    b.extend_from_slice(&[0; 4]); // crc
    b.extend_from_slice(&0x30i16.to_be_bytes()); // transactional + control
    b.extend_from_slice(&(span - 1).to_be_bytes());
    b.extend_from_slice(&1_000i64.to_be_bytes());
    b.extend_from_slice(&1_001i64.to_be_bytes());
    b.extend_from_slice(&2_000i64.to_be_bytes()); // producer id
    b.extend_from_slice(&4i16.to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes()); // records
    reseal(&mut b);
    b
}

/// Every kind of batch Felix may tier, starting at offset 100.
fn varied_log() -> Log {
    let mut log = Log::starting_at(100);
    for round in 0..4i64 {
        for (c, codec) in CODECS.into_iter().enumerate() {
            let t = 1_700_000_000_000 + round * 10_000 + c as i64 * 100;
            let generation = 1 + round as i32;
            let mut b = BatchBuilder::new(codec);
            b.push(record(
                t,
                Some(b"k1"),
                Some(b"hello"),
                &[("trace", Some(b"abc")), ("empty", None)],
            ));
            b.push(record(t - 50, None, Some(b"no key"), &[]));
            b.push(record(
                t + 7,
                Some(b"k2"),
                None,
                &[("tombstone", Some(b""))],
            ));
            b.push(record(t + 3, Some(b""), Some(&[0u8, 255, 1]), &[]));
            let b = match c {
                1 => b.producer(1000, 2, (round * 10) as i32),
                2 => b.producer(1001, 0, i32::MAX - 1), // sequence wraps inside the batch
                _ => b,
            };
            log.build(b, generation);
        }
        // A transaction: two transactional batches then the commit marker.
        let txn = |seq| {
            BatchBuilder::new(Compression::Lz4)
                .producer(2000, 4, seq)
                .transactional(true)
                .with(record(
                    1_700_000_100_000 + round,
                    Some(b"txn"),
                    Some(b"in a transaction"),
                    &[],
                ))
        };
        log.build(txn(round as i32 * 2), 9);
        log.build(txn(round as i32 * 2 + 1), 9);
        let commit = BatchBuilder::new(Compression::None)
            .producer(2000, 4, -1)
            .transactional(true)
            .control(true)
            .with(record(
                1_700_000_100_500,
                Some(&[0, 0, 0, 1]),
                Some(&[0, 0, 0, 0, 0, 5]),
                &[],
            ));
        log.build(commit, 9);
        log.append(log_append_time_batch(1_700_000_200_000 + round), 10);
        log.append(trailing_gap_batch(3), 10);
        log.append(spread_offsets_batch(5), 10);
        log.append(empty_batch(2), 10);
    }
    // A batch with many records, so some row groups hold many pages' worth of rows.
    let mut big = BatchBuilder::new(Compression::Zstd).producer(3000, 0, 0);
    for i in 0..20_000i64 {
        big.push(record(
            1_700_000_300_000 + i,
            Some(format!("key-{}", i % 17).as_bytes()),
            Some(&i.to_be_bytes()),
            &[],
        ));
    }
    log.build(big, 11);
    log
}

fn attributes_without_codec(h: &BatchHeader) -> i16 {
    h.attributes & !0x07
}

/// Asserts that `rebuilt` is `original` without compression: same records and the same
/// header fields, except the codec and the timestamps the format does not keep.
fn assert_same_batch(rebuilt: &DecodedBatch, original: &DecodedBatch) {
    let (r, o) = (&rebuilt.header, &original.header);
    let at = o.base_offset;
    assert_eq!(r.base_offset, o.base_offset, "base offset");
    assert_eq!(
        r.last_offset_delta, o.last_offset_delta,
        "last offset delta of the batch at {at}"
    );
    assert_eq!(r.producer_id, o.producer_id, "producer id at {at}");
    assert_eq!(r.producer_epoch, o.producer_epoch, "producer epoch at {at}");
    assert_eq!(r.base_sequence, o.base_sequence, "base sequence at {at}");
    assert_eq!(
        attributes_without_codec(r),
        attributes_without_codec(o),
        "attributes at {at}"
    );
    assert_eq!(r.attributes & 0x07, 0, "rebuilt batches are uncompressed");
    assert_eq!(
        r.partition_leader_epoch, o.partition_leader_epoch,
        "generation at {at}"
    );
    assert_eq!(r.records_count, o.records_count, "record count at {at}");
    assert_eq!(
        rebuilt.records, original.records,
        "records of the batch at {at}"
    );
}

/// Fetches the footer the way a reader does: a suffix, and a second fetch if it asks.
fn parse_footer(object: &Bytes, suffix: u64) -> ObjectFooter {
    let len = object.len() as u64;
    let tail = &object[(len - suffix.min(len)) as usize..];
    match ObjectFooter::parse(tail, len).expect("a Felix object") {
        Ok(footer) => footer,
        Err(needed) => {
            assert!(
                needed > suffix && needed <= len,
                "needs {needed} of {len} after {suffix}"
            );
            let tail = &object[(len - needed) as usize..];
            ObjectFooter::parse(tail, len)
                .expect("a Felix object")
                .expect("the requested suffix is enough")
        }
    }
}

fn row_group_bytes(object: &Bytes, footer: &ObjectFooter, i: usize) -> Bytes {
    let r = &footer.row_groups[i].byte_range;
    object.slice(r.start as usize..r.end as usize)
}

/// Decodes every row group and checks the batches against the originals; returns, per row
/// group, the rebuilt batches.
fn check_round_trip(
    object: &Bytes,
    footer: &ObjectFooter,
    originals: &[DecodedBatch],
) -> Vec<Vec<DecodedBatch>> {
    let mut next = 0;
    let mut per_group = Vec::new();
    for (i, rg) in footer.row_groups.iter().enumerate() {
        let decoded = decode_row_group(footer, i, row_group_bytes(object, footer, i))
            .expect("row group decodes");
        let mut rebuilt = Vec::new();
        let mut end = 0;
        for (n, item) in BatchIter::new(&decoded.batches, usize::MAX).enumerate() {
            let (h, bytes) = item.expect("rebuilt batches are valid, CRCs included");
            let (first, past_last, range) = &decoded.index[n];
            assert_eq!(range.start, end, "index ranges are contiguous");
            assert_eq!(&decoded.batches[range.clone()], bytes);
            assert_eq!(
                (*first, *past_last),
                (h.base_offset as u64, h.last_offset() as u64 + 1)
            );
            end = range.end;
            let batch = DecodedBatch::decode(bytes, DEFAULT_MAX_DECOMPRESSED).expect("decodes");
            assert_same_batch(&batch, &originals[next]);
            next += 1;
            rebuilt.push(batch);
        }
        assert_eq!(end, decoded.batches.len());
        assert_eq!(decoded.index.len(), rebuilt.len());
        // What the cache keeps (the bytes alone) indexes back to the same row group.
        let cached = DecodedRowGroup::from_batches(decoded.batches.clone()).expect("re-indexes");
        assert_eq!(cached.index, decoded.index);
        assert!(cached.covers(rg.first_offset, rg.last_offset));
        assert!(!cached.covers(rg.first_offset, rg.last_offset + 1));
        // Row groups hold whole batches and tile the object's offsets.
        assert_eq!(
            rebuilt[0].header.base_offset as u64, rg.first_offset,
            "row group {i} starts on a batch"
        );
        assert_eq!(
            rebuilt.last().map(|b| b.header.last_offset() as u64),
            Some(rg.last_offset),
            "row group {i} ends on a batch"
        );
        let records: Vec<&Record> = rebuilt.iter().flat_map(|b| &b.records).collect();
        assert_eq!(records.len() as u64, rg.rows);
        assert_eq!(
            records.iter().map(|r| r.timestamp).min(),
            Some(rg.min_timestamp)
        );
        assert_eq!(
            records.iter().map(|r| r.timestamp).max(),
            Some(rg.max_timestamp)
        );
        per_group.push(rebuilt);
    }
    assert_eq!(next, originals.len(), "every batch comes back");
    per_group
}

fn summary_of(originals: &[DecodedBatch], row_groups: usize) -> SegmentSummary {
    let records: Vec<&Record> = originals.iter().flat_map(|b| &b.records).collect();
    SegmentSummary {
        base_offset: originals[0].header.base_offset as u64,
        last_offset: originals
            .last()
            .map_or(0, |b| b.header.last_offset() as u64),
        min_timestamp: records.iter().map(|r| r.timestamp).min().unwrap_or(0),
        max_timestamp: records.iter().map(|r| r.timestamp).max().unwrap_or(0),
        records: records.len() as u64,
        batches: originals.len() as u64,
        row_groups,
    }
}

#[tokio::test]
async fn every_batch_kind_round_trips_through_several_row_groups() {
    let log = varied_log();
    let originals = log.batches();
    let (object, summary) = encode_to_bytes(&log.bytes, &info(), &opts(600))
        .await
        .expect("encodes");
    assert!(summary.row_groups >= 8, "tiny row groups: {summary:?}");
    assert_eq!(summary, summary_of(&originals, summary.row_groups));

    let footer = parse_footer(&object, ObjectFooter::SUFFIX_HINT);
    assert_eq!(footer.summary, summary);
    assert_eq!(footer.info, info());
    assert_eq!(footer.file_len, object.len() as u64);
    assert_eq!(footer.row_groups.len(), summary.row_groups);
    assert_eq!(footer.row_groups[0].first_offset, 100);
    assert_eq!(
        footer.row_groups.last().map(|r| r.last_offset),
        Some(summary.last_offset)
    );
    for pair in footer.row_groups.windows(2) {
        assert_eq!(
            pair[1].first_offset,
            pair[0].last_offset + 1,
            "row groups tile the offsets"
        );
        assert!(pair[0].byte_range.end <= pair[1].byte_range.start);
    }
    let per_group = check_round_trip(&object, &footer, &originals);

    // Every offset of every batch, including offsets whose records were removed, is found
    // in the row group holding its batch; before the object is the first, past it none.
    for (i, batches) in per_group.iter().enumerate() {
        for b in batches {
            for offset in b.header.base_offset..=b.header.last_offset() {
                assert_eq!(
                    footer.row_group_for(offset as u64),
                    Some(i),
                    "offset {offset}"
                );
            }
        }
    }
    assert_eq!(footer.row_group_for(0), Some(0));
    assert_eq!(footer.row_group_for(summary.last_offset + 1), None);

    // By time: the first row group holding a record at or after the timestamp.
    let max_ts: Vec<i64> = per_group
        .iter()
        .map(|bs| {
            bs.iter()
                .flat_map(|b| &b.records)
                .map(|r| r.timestamp)
                .max()
                .expect("rows")
        })
        .collect();
    let mut probes: Vec<i64> = per_group
        .iter()
        .flatten()
        .flat_map(|b| &b.records)
        .map(|r| r.timestamp)
        .collect();
    probes.extend([
        i64::MIN,
        0,
        summary.max_timestamp,
        summary.max_timestamp + 1,
        i64::MAX,
    ]);
    for t in probes {
        let expected = max_ts.iter().position(|&m| m >= t);
        assert_eq!(footer.row_group_for_time(t), expected, "timestamp {t}");
    }
    assert_eq!(footer.row_group_for_time(summary.min_timestamp), Some(0));
    assert_eq!(footer.row_group_for_time(summary.max_timestamp + 1), None);
}

#[tokio::test]
async fn footer_parse_asks_for_more_when_the_tail_is_short() {
    let log = varied_log();
    let (object, _) = encode_to_bytes(&log.bytes, &info(), &opts(600))
        .await
        .expect("encodes");
    let len = object.len() as u64;
    // Less than the 8-byte Parquet trailer: it asks for the trailer first.
    assert_eq!(
        ObjectFooter::parse(&object[object.len() - 3..], len)
            .expect("no error")
            .err(),
        Some(8)
    );
    // The trailer alone: it now knows the footer's size and asks for all of it.
    let needed = ObjectFooter::parse(&object[object.len() - 8..], len)
        .expect("no error")
        .expect_err("needs more");
    assert!(needed > 8 && needed < len, "needed {needed} of {len}");
    let footer = ObjectFooter::parse(&object[(len - needed) as usize..], len)
        .expect("no error")
        .expect("exactly the requested suffix is enough");
    assert_eq!(
        footer.summary.records,
        log.batches()
            .iter()
            .map(|b| b.records.len() as u64)
            .sum::<u64>()
    );
    // The whole object works as a tail too.
    assert!(ObjectFooter::parse(&object, len).expect("no error").is_ok());
}

#[tokio::test]
async fn pushes_of_any_size_make_the_same_rows_and_row_groups_end_on_batches() {
    let log = varied_log();
    let originals = log.batches();
    let mut encoder = SegmentEncoder::new(Vec::<u8>::new(), &info(), &opts(1)).expect("encoder");
    let mut pos = 0;
    for item in BatchIter::new(&log.bytes, usize::MAX) {
        let (_, bytes) = item.expect("valid");
        encoder
            .push(&log.bytes[pos..pos + bytes.len()])
            .await
            .expect("push");
        pos += bytes.len();
    }
    let summary = encoder.finish().await.expect("finish");
    // One row group per batch that has records: a flush after every batch.
    let with_records = originals.iter().filter(|b| !b.records.is_empty()).count();
    assert_eq!(summary.row_groups, with_records);
    assert_eq!(summary, summary_of(&originals, with_records));
}

/// Felix's numbers (offsets, timestamps, producer fields, batch fields) are stored without
/// compression, the users' bytes (key, payload, headers) with zstd: a reader then creates
/// zstd contexts for four column chunks per row group, not twelve.
#[tokio::test]
async fn numbers_are_stored_uncompressed_and_the_users_bytes_with_zstd() {
    let log = varied_log();
    let (object, _) = encode_to_bytes(&log.bytes, &info(), &opts(1 << 20))
        .await
        .expect("encodes");
    let footer = parse_footer(&object, ObjectFooter::SUFFIX_HINT);
    let metadata = footer.parquet_metadata();
    assert!(metadata.num_row_groups() > 0);
    for rg in metadata.row_groups() {
        let mut compressed = Vec::new();
        for column in rg.columns() {
            let path = column.column_path().string();
            match column.compression() {
                parquet::basic::Compression::UNCOMPRESSED => {}
                parquet::basic::Compression::ZSTD(_) => compressed.push(path),
                other => panic!("{path}: {other:?}"),
            }
        }
        compressed.sort();
        assert_eq!(
            compressed,
            [
                "headers.list.element.key",
                "headers.list.element.value",
                "key",
                "payload"
            ]
        );
        assert_eq!(rg.columns().len(), 12);
    }
}

/// A log of 1 KiB payloads, random (`random`) or one repeated phrase.
fn payload_log(random: bool) -> Log {
    let mut log = Log::starting_at(0);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in 0..8 {
        let mut builder = BatchBuilder::new(Compression::None);
        for r in 0..64 {
            let payload: Vec<u8> = if random {
                (0..1024)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect()
            } else {
                b"the same order, again and again; ".repeat(32)[..1024].to_vec()
            };
            builder.push(record(
                1_700_000_000_000 + b * 64 + r,
                None,
                Some(&payload),
                &[],
            ));
        }
        log.build(builder, 1);
    }
    log
}

/// Pages of the payload column that zstd would not shrink are stored as they are (read
/// back without a zstd pass); compressible ones are compressed. Both read back intact.
#[tokio::test]
async fn incompressible_payload_pages_are_stored_as_they_are() {
    use parquet::column::page::Page;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    for random in [true, false] {
        let log = payload_log(random);
        let (object, _) = encode_to_bytes(&log.bytes, &info(), &opts(1 << 20))
            .await
            .expect("encodes");
        let footer = parse_footer(&object, ObjectFooter::SUFFIX_HINT);
        check_round_trip(&object, &footer, &log.batches());
        let reader = SerializedFileReader::new(object.clone()).expect("parquet");
        let rg = reader.get_row_group(0).expect("row group 0");
        let payload = (0..rg.num_columns())
            .find(|&c| rg.metadata().column(c).column_path().string() == "payload")
            .expect("a payload column");
        let mut pages = rg.get_column_page_reader(payload).expect("pages");
        let mut flags = Vec::new();
        while let Some(page) = pages.get_next_page().expect("page") {
            match page {
                Page::DataPageV2 { is_compressed, .. } => flags.push(is_compressed),
                Page::DictionaryPage { .. } => panic!("payloads have no dictionary"),
                Page::DataPage { .. } => panic!("version 1 data page"),
            }
        }
        assert!(!flags.is_empty());
        assert!(
            flags.iter().all(|&c| c != random),
            "random payloads stored as they are, repeated ones compressed: {flags:?}"
        );
    }
}

#[tokio::test]
async fn footer_metadata_names_the_shard_and_range() {
    let log = varied_log();
    let (object, summary) = encode_to_bytes(&log.bytes, &info(), &opts(1 << 20))
        .await
        .expect("encodes");
    let footer = parse_footer(&object, ObjectFooter::SUFFIX_HINT);
    let kv: std::collections::HashMap<String, String> = footer
        .parquet_metadata()
        .file_metadata()
        .key_value_metadata()
        .expect("key/value metadata")
        .iter()
        .filter_map(|kv| Some((kv.key.clone(), kv.value.clone()?)))
        .collect();
    for (key, value) in [
        ("felix.format_version", "3".to_owned()),
        ("felix.tenant", "acme".to_owned()),
        ("felix.namespace", "orders".to_owned()),
        ("felix.stream", "created".to_owned()),
        ("felix.shard", "3".to_owned()),
        ("felix.base_offset", summary.base_offset.to_string()),
        ("felix.last_offset", summary.last_offset.to_string()),
        ("felix.records", summary.records.to_string()),
    ] {
        assert_eq!(kv.get(key), Some(&value), "{key}");
    }
}

fn arb_record() -> impl Strategy<Value = Record> {
    let bytes = || proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40));
    (
        -1_000i64..1_000,
        bytes(),
        bytes(),
        proptest::collection::vec(("[a-z\u{e9}]{0,6}", bytes()), 0..3),
    )
        .prop_map(|(ts, key, value, headers)| Record {
            offset: 0,
            timestamp: 1_700_000_000_000 + ts,
            key: key.map(Bytes::from),
            value: value.map(Bytes::from),
            headers: headers
                .into_iter()
                .map(|(key, value)| Header {
                    key,
                    value: value.map(Bytes::from),
                })
                .collect(),
        })
}

#[derive(Debug, Clone)]
struct ArbBatch {
    codec: usize,
    producer: Option<(i64, i16, i32)>,
    transactional: bool,
    generation: i32,
    records: Vec<Record>,
}

fn arb_batch() -> impl Strategy<Value = ArbBatch> {
    (
        0..CODECS.len(),
        proptest::option::of((0i64..1 << 40, 0i16..10, 0..i32::MAX)),
        any::<bool>(),
        0i32..5,
        proptest::collection::vec(arb_record(), 1..12),
    )
        .prop_map(
            |(codec, producer, transactional, generation, records)| ArbBatch {
                codec,
                producer,
                transactional,
                generation,
                records,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_records_round_trip(
        batches in proptest::collection::vec(arb_batch(), 1..12),
        base in 0i64..1 << 50,
        row_group_bytes in 1usize..3_000,
    ) {
        let mut log = Log::starting_at(base);
        for b in &batches {
            let mut builder = BatchBuilder::new(CODECS[b.codec]).transactional(b.transactional);
            if let Some((id, epoch, seq)) = b.producer {
                builder = builder.producer(id, epoch, seq);
            }
            for r in &b.records {
                builder.push(r.clone());
            }
            log.build(builder, b.generation);
        }
        let originals = log.batches();
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let (object, summary) = runtime
            .block_on(encode_to_bytes(&log.bytes, &info(), &opts(row_group_bytes)))
            .expect("encodes");
        prop_assert_eq!(&summary, &summary_of(&originals, summary.row_groups));
        let footer = parse_footer(&object, 1024);
        prop_assert_eq!(&footer.summary, &summary);
        prop_assert!(footer.row_groups.iter().all(|rg| rg.content_digest.is_some()));
        check_round_trip(&object, &footer, &originals);
    }
}

fn simple_batch(n: usize, base: i64) -> Vec<u8> {
    let mut b = BatchBuilder::new(Compression::None);
    for i in 0..n {
        b.push(record(1_000 + i as i64, None, Some(b"v"), &[]));
    }
    let mut b = b.build().expect("batch");
    stamp_base_offset(&mut b, base);
    b
}

#[tokio::test]
async fn a_batch_with_a_bad_crc_is_refused_and_the_encoder_stops() {
    let first = simple_batch(3, 0);
    let mut second = simple_batch(2, 3);
    second[19] ^= 0x40; // inside the stored CRC
    let mut input = first.clone();
    input.extend_from_slice(&second);
    let mut encoder =
        SegmentEncoder::new(Vec::<u8>::new(), &info(), &opts(1 << 20)).expect("encoder");
    match encoder.push(&input).await {
        Err(SegmentError::Wire {
            position,
            source: WireError::CrcMismatch { .. },
        }) => {
            assert_eq!(position, first.len(), "names where the bad batch starts")
        }
        other => panic!("expected a CRC error, got {other:?}"),
    }
    assert!(matches!(
        encoder.push(&simple_batch(1, 5)).await,
        Err(SegmentError::Aborted)
    ));
    assert!(matches!(encoder.finish().await, Err(SegmentError::Aborted)));

    let cut = &first[..first.len() - 1];
    let err = encode_to_bytes(cut, &info(), &opts(1))
        .await
        .expect_err("truncated");
    assert!(
        matches!(
            err,
            SegmentError::Wire {
                position: 0,
                source: WireError::Truncated { .. }
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_gap_or_overlap_between_pushes_is_discontiguous() {
    let mut encoder =
        SegmentEncoder::new(Vec::<u8>::new(), &info(), &opts(1 << 20)).expect("encoder");
    encoder
        .push(&simple_batch(3, 10))
        .await
        .expect("first push");
    let err = encoder.push(&simple_batch(1, 14)).await.expect_err("gap");
    assert!(
        matches!(
            err,
            SegmentError::Discontiguous {
                expected: 13,
                got: 14
            }
        ),
        "{err:?}"
    );

    let mut encoder =
        SegmentEncoder::new(Vec::<u8>::new(), &info(), &opts(1 << 20)).expect("encoder");
    let mut input = simple_batch(3, 10);
    input.extend_from_slice(&simple_batch(1, 12));
    let err = encoder.push(&input).await.expect_err("overlap");
    assert!(
        matches!(
            err,
            SegmentError::Discontiguous {
                expected: 13,
                got: 12
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_object_without_records_is_refused() {
    let encoder = SegmentEncoder::new(Vec::<u8>::new(), &info(), &opts(1)).expect("encoder");
    assert!(matches!(encoder.finish().await, Err(SegmentError::Empty)));
    let mut only_empty = empty_batch(3);
    stamp_base_offset(&mut only_empty, 7);
    let err = encode_to_bytes(&only_empty, &info(), &opts(1))
        .await
        .expect_err("no records");
    assert!(matches!(err, SegmentError::Empty), "{err:?}");
}

/// A Parquet file written by something else, with the given footer metadata.
fn foreign_parquet(kv: Vec<(&str, &str)>) -> Bytes {
    use arrow::array::{ArrayRef, Int64Array, RecordBatch};
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::KeyValue;
    use parquet::file::properties::WriterProperties;

    let column: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
    let batch = RecordBatch::try_from_iter([("offset", column)]).expect("batch");
    let props = WriterProperties::builder()
        .set_key_value_metadata(Some(
            kv.into_iter()
                .map(|(k, v)| KeyValue::new(k.into(), v.to_owned()))
                .collect(),
        ))
        .build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).expect("writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
    Bytes::from(out)
}

#[tokio::test]
async fn objects_that_are_not_felix_objects_get_typed_errors() {
    let plain = foreign_parquet(vec![]);
    let err = ObjectFooter::parse(&plain, plain.len() as u64).expect_err("not Felix");
    assert!(matches!(err, SegmentError::NotFelix(_)), "{err:?}");

    for version in ["4", "0", "two"] {
        let future = foreign_parquet(vec![("felix.format_version", version)]);
        let err = ObjectFooter::parse(&future, future.len() as u64).expect_err("unknown version");
        assert!(
            matches!(&err, SegmentError::UnsupportedVersion { found } if found == version),
            "{err:?}"
        );
    }

    let mislabelled = foreign_parquet(vec![
        ("felix.format_version", "1"),
        ("felix.tenant", "t"),
        ("felix.namespace", "n"),
        ("felix.stream", "s"),
        ("felix.shard", "0"),
        ("felix.base_offset", "1"),
        ("felix.last_offset", "3"),
        ("felix.records", "3"),
        ("felix.batches", "1"),
    ]);
    let err =
        ObjectFooter::parse(&mislabelled, mislabelled.len() as u64).expect_err("wrong schema");
    assert!(matches!(err, SegmentError::BadMetadata(_)), "{err:?}");

    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let err = ObjectFooter::parse(&garbage, garbage.len() as u64).expect_err("garbage");
    assert!(matches!(err, SegmentError::Corrupt(_)), "{err:?}");
    let err = ObjectFooter::parse(&garbage[..100], 50).expect_err("tail longer than the object");
    assert!(matches!(err, SegmentError::InvalidArgument(_)), "{err:?}");
}

#[tokio::test]
async fn cached_row_group_bytes_that_do_not_index_are_refused() {
    let mut batches = simple_batch(3, 0);
    batches.extend_from_slice(&simple_batch(2, 3));
    let whole = Bytes::from(batches);
    let rg = DecodedRowGroup::from_batches(whole.clone()).expect("two contiguous batches");
    assert_eq!(
        rg.index.iter().map(|i| (i.0, i.1)).collect::<Vec<_>>(),
        [(0, 3), (3, 5)]
    );
    assert!(rg.covers(0, 4));
    // Cut short, a gap between batches, garbage: typed errors.
    for bad in [
        whole.slice(..whole.len() - 1),
        {
            let mut gap = simple_batch(3, 0);
            gap.extend_from_slice(&simple_batch(2, 4));
            Bytes::from(gap)
        },
        Bytes::from(vec![0xAB; 200]),
        // A record byte rotted on the disk tier: the header still parses, the CRC does not
        // match.
        {
            let mut rotted = whole.to_vec();
            let last = rotted.len() - 1;
            rotted[last] ^= 0x01;
            Bytes::from(rotted)
        },
    ] {
        let err = DecodedRowGroup::from_batches(bad).expect_err("refused");
        assert!(matches!(err, SegmentError::Corrupt(_)), "{err:?}");
    }
}

#[tokio::test]
async fn a_truncated_or_damaged_object_gives_errors_not_panics() {
    let log = varied_log();
    let (object, _) = encode_to_bytes(&log.bytes, &info(), &opts(600))
        .await
        .expect("encodes");
    let len = object.len();

    // Cut short: the trailer's magic is gone.
    let cut = &object[..len - 10];
    let err = ObjectFooter::parse(cut, cut.len() as u64).expect_err("truncated");
    assert!(matches!(err, SegmentError::Corrupt(_)), "{err:?}");

    // Every byte of the footer flipped in turn: an error or (rarely) a footer, never a panic.
    let footer_len =
        u32::from_le_bytes(object[len - 8..len - 4].try_into().expect("4 bytes")) as usize;
    for at in (len - 8 - footer_len..len).step_by(3) {
        let mut damaged = object.to_vec();
        damaged[at] ^= 0x5a;
        let _ = ObjectFooter::parse(&damaged, len as u64);
    }

    // Damaged row group bytes: an error or different rows, never a panic.
    let footer = parse_footer(&object, ObjectFooter::SUFFIX_HINT);
    let data = row_group_bytes(&object, &footer, 0);
    for at in (0..data.len()).step_by(11) {
        let mut damaged = data.to_vec();
        damaged[at] ^= 0xa5;
        let _ = decode_row_group(&footer, 0, Bytes::from(damaged));
    }
    let err = decode_row_group(&footer, 0, data.slice(1..)).expect_err("short");
    assert!(matches!(err, SegmentError::InvalidArgument(_)), "{err:?}");
    let err = decode_row_group(&footer, footer.row_groups.len(), data).expect_err("no such group");
    assert!(matches!(err, SegmentError::InvalidArgument(_)), "{err:?}");
}

/// The records pyarrow reads from an object, as JSON, by running `script` with the
/// object's path as its argument. Fails (never skips) when pyarrow is missing.
fn pyarrow(script: &str, path: &std::path::Path) -> serde_json::Value {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(path)
        .output()
        .expect("python3 must be installed to check that pyarrow reads Felix objects");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'pyarrow'"),
        "pyarrow is not installed: run `pip install pyarrow` (scripts/test.sh installs it)"
    );
    assert!(out.status.success(), "python3 failed: {stderr}");
    serde_json::from_slice(&out.stdout).expect("the script prints JSON")
}

fn hex(b: Option<&Bytes>) -> serde_json::Value {
    match b {
        None => serde_json::Value::Null,
        Some(b) => b
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
            .into(),
    }
}

const READ_WITH_PYARROW: &str = r#"
import json, sys
import pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
h = lambda b: None if b is None else b.hex()
print(json.dumps({
    "offset": t.column("offset").to_pylist(),
    "timestamp": t.column("timestamp").cast("int64").to_pylist(),
    "timestamp_type": str(t.schema.field("timestamp").type),
    "key": [h(k) for k in t.column("key").to_pylist()],
    "payload": [h(v) for v in t.column("payload").to_pylist()],
    "headers": [[[e["key"], h(e["value"])] for e in hs] for hs in t.column("headers").to_pylist()],
}))
"#;

/// The pyarrow example of docs/tiering-format.md, on a directory of objects.
const DOCS_PYARROW_EXAMPLE: &str = r#"
import json, sys
import pyarrow.dataset as ds
from datetime import datetime, timezone

objects = ds.dataset(sys.argv[1], format="parquet", partitioning="hive")
table = objects.to_table(
    columns=["offset", "timestamp", "key", "payload", "shard"],
    filter=(ds.field("tenant") == "acme")
    & (ds.field("offset") >= 120)
    & (ds.field("timestamp") >= datetime(2023, 11, 14, 22, 13, 30, tzinfo=timezone.utc)),
)
print(json.dumps({"offset": table.column("offset").to_pylist(), "shard": table.column("shard").to_pylist()}))
"#;

#[tokio::test]
async fn pyarrow_reads_the_records_felix_writes() {
    let log = varied_log();
    let originals = log.batches();
    let (object, summary) = encode_to_bytes(&log.bytes, &info(), &opts(600))
        .await
        .expect("encodes");
    let dir = tempfile::tempdir().expect("tempdir");
    let shard_dir = dir
        .path()
        .join("objects/tenant=acme/namespace=orders/stream=created/shard=3");
    std::fs::create_dir_all(&shard_dir).expect("mkdir");
    let path = shard_dir.join(format!(
        "{:020}-{:020}.parquet",
        summary.base_offset, summary.last_offset
    ));
    std::fs::write(&path, &object).expect("write object");

    let read = pyarrow(READ_WITH_PYARROW, &path);
    let records: Vec<&Record> = originals.iter().flat_map(|b| &b.records).collect();
    let column = |name: &str| {
        read[name]
            .as_array()
            .unwrap_or_else(|| panic!("column {name}"))
            .clone()
    };
    assert_eq!(read["timestamp_type"], "timestamp[ms, tz=UTC]");
    assert_eq!(
        column("offset"),
        records
            .iter()
            .map(|r| r.offset.into())
            .collect::<Vec<serde_json::Value>>()
    );
    assert_eq!(
        column("timestamp"),
        records
            .iter()
            .map(|r| r.timestamp.into())
            .collect::<Vec<serde_json::Value>>()
    );
    assert_eq!(
        column("key"),
        records
            .iter()
            .map(|r| hex(r.key.as_ref()))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        column("payload"),
        records
            .iter()
            .map(|r| hex(r.value.as_ref()))
            .collect::<Vec<_>>()
    );
    let headers: Vec<serde_json::Value> = records
        .iter()
        .map(|r| {
            r.headers
                .iter()
                .map(|h| serde_json::json!([h.key, hex(h.value.as_ref())]))
                .collect()
        })
        .collect();
    assert_eq!(column("headers"), headers);

    // The documented dataset example filters on the partition columns, offset and time.
    let read = pyarrow(DOCS_PYARROW_EXAMPLE, &dir.path().join("objects"));
    let since = 1_700_000_010_000; // 2023-11-14T22:13:30Z
    let expected: Vec<serde_json::Value> = records
        .iter()
        .filter(|r| r.offset >= 120 && r.timestamp >= since)
        .map(|r| r.offset.into())
        .collect();
    assert!(!expected.is_empty() && expected.len() < records.len());
    let mut offsets = read["offset"].as_array().expect("offsets").clone();
    offsets.sort_by_key(|v| v.as_i64());
    assert_eq!(offsets, expected);
    assert!(
        read["shard"]
            .as_array()
            .expect("shards")
            .iter()
            .all(|s| s == 3)
    );
}

/// `object` as written before row group digests existed: the footer key is renamed in place
/// (same length, so the footer stays valid Parquet), and readers no longer find it.
/// The object as a version 1 object written before content digests existed.
fn without_digests(object: &Bytes) -> Bytes {
    strip_digests(object, 3)
}

/// An object of format `version` relabelled version 1, its digests key renamed.
fn strip_digests(object: &Bytes, version: u8) -> Bytes {
    let v1 = replace_in_footer(
        object,
        &[
            b"felix.format_version\x18\x01".as_slice(),
            &[b'0' + version],
        ]
        .concat(),
        b"felix.format_version\x18\x011",
    );
    replace_in_footer(&v1, b"felix.row_group_digests", b"felix.row_group_digestX")
}

fn replace_in_footer(object: &Bytes, from: &[u8], to: &[u8]) -> Bytes {
    assert_eq!(from.len(), to.len());
    let len = object.len();
    let footer_len =
        u32::from_le_bytes(object[len - 8..len - 4].try_into().expect("4 bytes")) as usize;
    let start = len - 8 - footer_len;
    let at = object[start..]
        .windows(from.len())
        .position(|w| w == from)
        .expect("found in the footer")
        + start;
    let mut out = object.to_vec();
    out[at..at + to.len()].copy_from_slice(to);
    Bytes::from(out)
}

/// A log of batches whose payloads do not compress (so zstd keeps them as raw literals and
/// a flipped byte there decodes to a different payload), with headers and null keys.
fn incompressible_log(codec: Compression) -> Log {
    let mut log = Log::starting_at(1_000);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for b in 0..12 {
        let mut builder = BatchBuilder::new(codec).producer(77, 1, b * 8);
        for r in 0..8 {
            let payload: Vec<u8> = (0..64)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let key = (r % 3 != 0).then_some(&b"k"[..]);
            builder.push(record(
                1_700_000_000_000 + (b * 8 + r) as i64,
                key,
                Some(&payload),
                &[("h", Some(b"v"))],
            ));
        }
        log.build(builder, 2);
    }
    log.append(empty_batch(2), 2);
    log
}

#[tokio::test]
async fn a_rotted_payload_byte_that_still_decodes_is_refused_by_the_content_digest() {
    for codec in [Compression::None, Compression::Zstd] {
        let log = incompressible_log(codec);
        let (object, summary) = encode_to_bytes(&log.bytes, &info(), &opts(1_500))
            .await
            .expect("encodes");
        assert!(summary.row_groups >= 3, "{codec:?}: {summary:?}");
        let footer = parse_footer(&object, ObjectFooter::SUFFIX_HINT);
        assert!(
            footer
                .row_groups
                .iter()
                .all(|rg| rg.content_digest.is_some()),
            "every row group has a digest"
        );
        check_round_trip(&object, &footer, &log.batches());
        assert_payload_flips_caught(&format!("{codec:?}"), &object, 3);
    }
}

/// Flips each byte of row group 1's payload column chunk in turn: every flip that decodes
/// to other records without the digests (the object relabelled version 1 with its digests
/// key renamed) is refused with the content digest's error when they are checked.
/// `version` is the object's format version.
fn assert_payload_flips_caught(codec: &str, object: &Bytes, version: u8) {
    {
        let footer = parse_footer(object, ObjectFooter::SUFFIX_HINT);
        let legacy = strip_digests(object, version);
        let legacy_footer = parse_footer(&legacy, ObjectFooter::SUFFIX_HINT);
        let object = object.clone();

        let n = 1;
        let rg = &footer.row_groups[n];
        let good = decode_row_group(&footer, n, row_group_bytes(&object, &footer, n))
            .expect("decodes")
            .batches;
        // The payload column chunk of row group `n`, in the row group's bytes.
        let meta = footer.parquet_metadata();
        let payload = meta
            .file_metadata()
            .schema_descr()
            .columns()
            .iter()
            .position(|c| c.path().string() == "payload")
            .expect("payload column");
        let chunk = meta.row_group(n).column(payload);
        let chunk_start = chunk
            .dictionary_page_offset()
            .unwrap_or(chunk.data_page_offset());
        let from = (chunk_start as u64 - rg.byte_range.start) as usize;
        let to = from + chunk.compressed_size() as usize;

        let data = row_group_bytes(&object, &footer, n);
        let (mut silently_wrong, mut caught) = (0, 0);
        for at in from..to {
            let mut damaged = data.to_vec();
            damaged[at] ^= 0x01;
            let damaged = Bytes::from(damaged);
            // Without digests (what the broker did before): wrong records, valid CRCs.
            let unchecked = decode_row_group(&legacy_footer, n, damaged.clone());
            let wrong_without = matches!(&unchecked, Ok(rg) if rg.batches != good);
            match decode_row_group(&footer, n, damaged) {
                Ok(decoded) => assert_eq!(
                    decoded.batches, good,
                    "{codec:?}: byte {at} flipped, different records served"
                ),
                Err(SegmentError::Corrupt(message)) => {
                    if wrong_without {
                        assert!(
                            message.contains("content digest mismatch")
                                && message.contains(&format!("row group {n}"))
                                && message
                                    .contains(&format!("{}..={}", rg.first_offset, rg.last_offset)),
                            "{message}"
                        );
                        caught += 1;
                    }
                }
                Err(e) => panic!("{codec:?}: byte {at} flipped: {e:?}"),
            }
            silently_wrong += usize::from(wrong_without);
        }
        assert!(
            silently_wrong > 0,
            "{codec:?}: no flipped payload byte decoded to other records; the test proves nothing"
        );
        assert_eq!(caught, silently_wrong, "{codec:?}");
    }
}

#[tokio::test]
async fn an_object_written_without_digests_still_decodes() {
    let log = varied_log();
    let (object, _) = encode_to_bytes(&log.bytes, &info(), &opts(600))
        .await
        .expect("encodes");
    let legacy = without_digests(&object);
    let footer = parse_footer(&legacy, ObjectFooter::SUFFIX_HINT);
    assert!(footer.row_groups.len() >= 8);
    assert!(
        footer
            .row_groups
            .iter()
            .all(|rg| rg.content_digest.is_none())
    );
    check_round_trip(&legacy, &footer, &log.batches());
}

/// A damaged footer key must not turn the content check off: a version 2 object always
/// has its digests, so one whose digests are gone is corrupt, not a legacy object.
#[tokio::test]
async fn a_current_object_whose_digests_are_gone_is_corruption_not_a_legacy_object() {
    let log = varied_log();
    let (object, _) = encode_to_bytes(&log.bytes, &info(), &opts(600))
        .await
        .expect("encodes");
    let damaged = replace_in_footer(
        &object,
        b"felix.row_group_digests",
        b"felix.row_group_digestX",
    );
    let len = damaged.len() as u64;
    let err = ObjectFooter::parse(&damaged, len).expect_err("a v2 object without digests");
    assert!(
        matches!(&err, SegmentError::Corrupt(m) if m.contains("without felix.row_group_digests")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_wrong_or_malformed_digest_in_the_footer_is_corruption() {
    let log = varied_log();
    let (object, _) = encode_to_bytes(&log.bytes, &info(), &opts(600))
        .await
        .expect("encodes");
    let footer = parse_footer(&object, ObjectFooter::SUFFIX_HINT);
    let digest = format!(
        "{:08x}",
        footer.row_groups[2].content_digest.expect("digest")
    );
    let mut other = digest.clone().into_bytes();
    other[7] = if other[7] == b'0' { b'1' } else { b'0' };

    // Good rows, a digest that does not match them: the row group is refused.
    let wrong = replace_in_footer(&object, digest.as_bytes(), &other);
    let wrong_footer = parse_footer(&wrong, ObjectFooter::SUFFIX_HINT);
    let err = decode_row_group(&wrong_footer, 2, row_group_bytes(&wrong, &wrong_footer, 2))
        .expect_err("digest mismatch");
    assert!(
        matches!(&err, SegmentError::Corrupt(m) if m.contains("content digest mismatch")),
        "{err:?}"
    );
    // The other row groups are unaffected.
    decode_row_group(&wrong_footer, 1, row_group_bytes(&wrong, &wrong_footer, 1))
        .expect("row group 1 decodes");

    // A digest that is not eight hex digits: the footer is refused.
    other[7] = b'z';
    let malformed = replace_in_footer(&object, digest.as_bytes(), &other);
    let len = malformed.len() as u64;
    let err = ObjectFooter::parse(&malformed, len).expect_err("malformed digest");
    assert!(matches!(err, SegmentError::Corrupt(_)), "{err:?}");
}

/// What the content digest costs a decode: a ~64 MiB object decoded whole, with its digests
/// and with them stripped (the rebuild then computes none), best of 9 each; and what the
/// CRC check of a cached row group costs. Run in release:
/// `cargo test --release -p felix-cold --test cold decode_cost -- --ignored --nocapture`
#[tokio::test]
#[ignore = "a measurement, run by hand in release"]
async fn decode_cost_of_content_digests() {
    use std::time::{Duration, Instant};

    // As the broker runs (felix_cold::malloc), unless asked for glibc's defaults.
    let defaults = std::env::var_os("DECODE_COST_GLIBC_DEFAULTS").is_some();
    if !defaults {
        assert!(felix_cold::malloc::keep_decode_buffers());
    }
    eprintln!(
        "allocator: {}",
        if defaults {
            "glibc defaults"
        } else {
            "felix_cold::malloc thresholds"
        }
    );

    let mut log = Log::starting_at(0);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    // 128 batches of 512 records of ~1 KiB: half text-like (compressible), half random.
    for b in 0..128i64 {
        let mut builder = BatchBuilder::new(Compression::None).producer(9, 0, (b * 512) as i32);
        for r in 0..512i64 {
            let mut payload =
                format!("{{\"order\":{},\"customer\":\"c-{}\",\"items\":[", b, r).into_bytes();
            while payload.len() < 512 {
                payload.extend_from_slice(b"{\"sku\":\"abc-123\",\"qty\":2},");
            }
            payload.extend((0..512).map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            }));
            builder.push(record(
                1_700_000_000_000 + b * 512 + r,
                Some(format!("key-{}", r % 64).as_bytes()),
                Some(&payload),
                &[("trace", Some(b"0123456789abcdef"))],
            ));
        }
        log.build(builder, 1);
    }
    let (object, summary) = encode_to_bytes(&log.bytes, &info(), &EncodeOptions::default())
        .await
        .expect("encodes");
    let legacy = without_digests(&object);
    let decode_all = |object: &Bytes, footer: &ObjectFooter| {
        let start = Instant::now();
        let mut out = 0;
        for i in 0..footer.row_groups.len() {
            let rg =
                decode_row_group(footer, i, row_group_bytes(object, footer, i)).expect("decodes");
            out += rg.batches.len();
        }
        (start.elapsed(), out)
    };
    // Interleaved, so that load from other processes hits both alike; the best of each.
    let (checked, unchecked) = (
        parse_footer(&object, ObjectFooter::SUFFIX_HINT),
        parse_footer(&legacy, ObjectFooter::SUFFIX_HINT),
    );
    let (mut with, mut without, mut out) = (Duration::MAX, Duration::MAX, 0);
    for _ in 0..9 {
        let (d, n) = decode_all(&object, &checked);
        with = with.min(d);
        out = n;
        without = without.min(decode_all(&legacy, &unchecked).0);
    }
    let footer = parse_footer(&object, ObjectFooter::SUFFIX_HINT);
    let decoded: Vec<Bytes> = (0..footer.row_groups.len())
        .map(|i| {
            decode_row_group(&footer, i, row_group_bytes(&object, &footer, i))
                .expect("decodes")
                .batches
        })
        .collect();
    let mut cached = Duration::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        for b in &decoded {
            DecodedRowGroup::from_batches(b.clone()).expect("indexes");
        }
        cached = cached.min(start.elapsed());
    }
    let mib = |d: Duration| out as f64 / (1 << 20) as f64 / d.as_secs_f64();
    eprintln!(
        "{} MiB of input batches, object {} MiB in {} row groups, {} MiB rebuilt",
        log.bytes.len() >> 20,
        object.len() >> 20,
        summary.row_groups,
        out >> 20
    );
    eprintln!(
        "decode with digests {with:?} ({:.0} MiB/s), without {without:?} ({:.0} MiB/s): +{:.1}%",
        mib(with),
        mib(without),
        (with.as_secs_f64() / without.as_secs_f64() - 1.0) * 100.0
    );
    eprintln!(
        "cached row groups re-indexed with CRC checks: {cached:?} ({:.0} MiB/s)",
        mib(cached)
    );
}

/// Objects written by the build before format version 3 (version 2: digests over a
/// canonical encoding of every record), kept as they were written.
fn v2_fixture(name: &str) -> Bytes {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    Bytes::from(std::fs::read(&path).expect("fixture"))
}

#[tokio::test]
async fn a_version_2_object_still_decodes_with_its_digests_checked() {
    let object = v2_fixture("v2-varied.parquet");
    let footer = parse_footer(&object, ObjectFooter::SUFFIX_HINT);
    let version = footer
        .parquet_metadata()
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|kv| kv.key == "felix.format_version"))
        .and_then(|kv| kv.value.clone());
    assert_eq!(version.as_deref(), Some("2"));
    assert!(footer.row_groups.len() >= 8);
    assert!(
        footer
            .row_groups
            .iter()
            .all(|rg| rg.content_digest.is_some())
    );
    check_round_trip(&object, &footer, &varied_log().batches());
    // The same log written now: a version 3 object with other digests, same batches.
    let (current, _) = encode_to_bytes(&varied_log().bytes, &info(), &opts(600))
        .await
        .expect("encodes");
    let current_footer = parse_footer(&current, ObjectFooter::SUFFIX_HINT);
    assert_eq!(current_footer.row_groups.len(), footer.row_groups.len());
    for (i, (old, new)) in footer
        .row_groups
        .iter()
        .zip(&current_footer.row_groups)
        .enumerate()
    {
        assert_ne!(old.content_digest, new.content_digest, "row group {i}");
        assert_eq!(
            decode_row_group(&footer, i, row_group_bytes(&object, &footer, i))
                .expect("v2")
                .batches,
            decode_row_group(
                &current_footer,
                i,
                row_group_bytes(&current, &current_footer, i)
            )
            .expect("v3")
            .batches,
            "row group {i}"
        );
    }
}

#[tokio::test]
async fn a_rotted_payload_byte_in_a_version_2_object_is_still_refused() {
    let object = v2_fixture("v2-incompressible.parquet");
    let footer = parse_footer(&object, ObjectFooter::SUFFIX_HINT);
    check_round_trip(
        &object,
        &footer,
        &incompressible_log(Compression::Zstd).batches(),
    );
    assert_payload_flips_caught("v2 zstd", &object, 2);
}
