//! Interoperability with Kafka: golden batches written by kafka-python's own RecordBatch v2
//! builder (tests/fixtures, made by gen_kafka_vectors.py) must decode to the records that
//! kafka-python reads from them; and Felix's encoding of the same records is what kafka-python
//! reads back (the ignored test writes those batches for `gen_kafka_vectors.py --verify`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use felix_wire::batch::{BatchIter, stamp_base_offset, stamp_partition_leader_epoch};
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{BatchBuilder, Compression, DecodedBatch, Header, Record};
use proptest::strategy::{Just, Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use serde_json::{Value, json};

use crate::common::{BatchSpec, CODECS, batch_spec_with};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// One batch as kafka-python decoded it.
#[derive(Debug)]
struct Expected {
    base_offset: i64,
    partition_leader_epoch: i32,
    batch_length: i32,
    codec: Compression,
    attributes: i16,
    transactional: bool,
    control: bool,
    log_append_time: bool,
    last_offset_delta: i32,
    base_timestamp: i64,
    max_timestamp: i64,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    records_count: i32,
    records: Vec<Record>,
}

struct Vector {
    file: String,
    bytes: Vec<u8>,
    batches: Vec<Expected>,
}

fn int<T: TryFrom<i64>>(v: &Value, field: &str) -> T {
    let n = v[field]
        .as_i64()
        .unwrap_or_else(|| panic!("{field} is not an integer"));
    T::try_from(n).unwrap_or_else(|_| panic!("{field} out of range"))
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Hex, null, or `{"pattern": N}` (the N bytes `i % 251`).
fn bytes_of(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(hex(s)),
        Value::Object(o) => {
            let n = o["pattern"].as_u64().expect("pattern length") as usize;
            Some((0..n).map(|i| (i % 251) as u8).collect())
        }
        other => panic!("not a byte string: {other}"),
    }
}

fn record_of(v: &Value) -> Record {
    Record {
        offset: int(v, "offset"),
        timestamp: int(v, "timestamp"),
        key: bytes_of(&v["key"]).map(Into::into),
        value: bytes_of(&v["value"]).map(Into::into),
        headers: v["headers"]
            .as_array()
            .expect("headers")
            .iter()
            .map(|h| Header {
                key: h[0].as_str().expect("header key").to_owned(),
                value: bytes_of(&h[1]).map(Into::into),
            })
            .collect(),
    }
}

fn expected_of(v: &Value) -> Expected {
    Expected {
        base_offset: int(v, "base_offset"),
        partition_leader_epoch: int(v, "partition_leader_epoch"),
        batch_length: int(v, "batch_length"),
        codec: v["codec"]
            .as_str()
            .expect("codec")
            .parse()
            .expect("known codec"),
        attributes: int(v, "attributes"),
        transactional: v["transactional"].as_bool().expect("transactional"),
        control: v["control"].as_bool().expect("control"),
        log_append_time: v["log_append_time"].as_bool().expect("log_append_time"),
        last_offset_delta: int(v, "last_offset_delta"),
        base_timestamp: int(v, "base_timestamp"),
        max_timestamp: int(v, "max_timestamp"),
        producer_id: int(v, "producer_id"),
        producer_epoch: int(v, "producer_epoch"),
        base_sequence: int(v, "base_sequence"),
        records_count: int(v, "records_count"),
        records: v["records"]
            .as_array()
            .expect("records")
            .iter()
            .map(record_of)
            .collect(),
    }
}

fn vectors() -> Vec<Vector> {
    let json =
        std::fs::read_to_string(fixtures().join("kafka_vectors.json")).expect("kafka_vectors.json");
    let doc: Value = serde_json::from_str(&json).expect("valid json");
    doc["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| {
            let file = f["file"].as_str().expect("file").to_owned();
            let bytes =
                std::fs::read(fixtures().join(&file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            let batches = f["batches"]
                .as_array()
                .expect("batches")
                .iter()
                .map(expected_of)
                .collect();
            Vector {
                file,
                bytes,
                batches,
            }
        })
        .collect()
}

fn check_batch(file: &str, bytes: &[u8], want: &Expected, check_length: bool) {
    let d = DecodedBatch::decode(bytes, DEFAULT_MAX_DECOMPRESSED)
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let h = d.header;
    assert_eq!(h.base_offset, want.base_offset, "{file}");
    assert_eq!(
        h.partition_leader_epoch, want.partition_leader_epoch,
        "{file}"
    );
    if check_length {
        assert_eq!(h.batch_length, want.batch_length, "{file}");
        assert_eq!(h.attributes, want.attributes, "{file}");
    }
    assert_eq!(h.compression(), Ok(want.codec), "{file}");
    assert_eq!(h.is_transactional(), want.transactional, "{file}");
    assert_eq!(h.is_control(), want.control, "{file}");
    assert_eq!(h.is_log_append_time(), want.log_append_time, "{file}");
    assert_eq!(h.last_offset_delta, want.last_offset_delta, "{file}");
    assert_eq!(h.base_timestamp, want.base_timestamp, "{file}");
    assert_eq!(h.max_timestamp, want.max_timestamp, "{file}");
    assert_eq!(
        (h.producer_id, h.producer_epoch, h.base_sequence),
        (want.producer_id, want.producer_epoch, want.base_sequence),
        "{file}"
    );
    assert_eq!(h.records_count, want.records_count, "{file}");
    assert_eq!(d.records, want.records, "{file}");
    // The zero-copy decode gives the same batch.
    let shared = DecodedBatch::decode_shared(
        &bytes::Bytes::copy_from_slice(bytes),
        DEFAULT_MAX_DECOMPRESSED,
    )
    .unwrap_or_else(|e| panic!("{file} (shared): {e}"));
    assert_eq!(shared, d, "{file}");
}

#[test]
fn every_kafka_python_vector_decodes_to_its_expected_records() {
    let vectors = vectors();
    assert!(vectors.len() >= 13, "fixtures missing: {}", vectors.len());
    for v in &vectors {
        let batches: Vec<&[u8]> = BatchIter::new(&v.bytes, 1 << 20)
            .map(|b| {
                b.unwrap_or_else(|(pos, e)| panic!("{}: at {pos}: {e}", v.file))
                    .1
            })
            .collect();
        assert_eq!(batches.len(), v.batches.len(), "{}", v.file);
        for (bytes, want) in batches.iter().zip(&v.batches) {
            check_batch(&v.file, bytes, want, true);
        }
    }
}

#[test]
fn kafka_python_vectors_cover_every_codec_and_batch_kind() {
    let vectors = vectors();
    let all: Vec<&Expected> = vectors.iter().flat_map(|v| &v.batches).collect();
    let codecs: BTreeSet<&str> = all.iter().map(|b| b.codec.name()).collect();
    assert_eq!(codecs.len(), 5, "{codecs:?}");
    assert!(all.iter().any(|b| b.control));
    assert!(all.iter().any(|b| b.transactional));
    assert!(all.iter().any(|b| b.log_append_time));
    assert!(all.iter().any(|b| b.producer_id >= 0));
    assert!(vectors.iter().any(|v| v.file.contains("snappy_raw")));
    assert!(vectors.iter().any(|v| v.batches.len() > 1));
    let records = all.iter().flat_map(|b| &b.records);
    assert!(records.clone().any(|r| r.key.is_none()));
    assert!(records.clone().any(|r| r.value.is_none()));
    assert!(
        records
            .clone()
            .any(|r| r.headers.iter().any(|h| h.value.is_none()))
    );
    assert!(
        all.iter()
            .any(|b| b.records.iter().any(|r| r.timestamp < b.base_timestamp))
    );
}

/// Felix's encoding of a vector's batch: same records, codec, producer fields and flags,
/// stamped with the same base offset and leader epoch.
fn felix_encode(want: &Expected) -> Vec<u8> {
    let mut builder = BatchBuilder::new(want.codec)
        .producer(want.producer_id, want.producer_epoch, want.base_sequence)
        .transactional(want.transactional)
        .control(want.control);
    for r in &want.records {
        builder.push(r.clone());
    }
    let mut bytes = builder.build().expect("encodes");
    stamp_base_offset(&mut bytes, want.base_offset);
    stamp_partition_leader_epoch(&mut bytes, want.partition_leader_epoch);
    bytes
}

/// The vectors Felix's builder can reproduce: LogAppendTime is a broker rewrite.
fn reproducible(v: &Vector) -> bool {
    v.batches.iter().all(|b| !b.log_append_time)
}

#[test]
fn felix_uncompressed_encoding_matches_kafka_python_byte_for_byte() {
    let vectors = vectors();
    let mut compared = 0;
    for v in vectors.iter().filter(|v| reproducible(v)) {
        if v.batches.iter().all(|b| b.codec == Compression::None) {
            let felix: Vec<u8> = v.batches.iter().flat_map(felix_encode).collect();
            assert!(
                felix == v.bytes,
                "{}: Felix's bytes differ from kafka-python's",
                v.file
            );
            compared += 1;
        }
    }
    assert!(compared >= 2, "kafka_none.bin and kafka_control_commit.bin");
}

#[test]
fn felix_encoding_of_every_vector_decodes_to_the_same_records() {
    for v in vectors().iter().filter(|v| reproducible(v)) {
        for want in &v.batches {
            check_batch(&v.file, &felix_encode(want), want, false);
        }
    }
}

fn json_bytes(b: Option<&[u8]>) -> Value {
    match b {
        None => Value::Null,
        Some(b) => Value::String(b.iter().map(|x| format!("{x:02x}")).collect()),
    }
}

/// The kafka_vectors.json description of a batch built from `spec`, from the spec itself
/// (not from Felix's decoder), with `base_offset` and `epoch` stamped.
fn describe(spec: &BatchSpec, bytes: &[u8], base_offset: i64, epoch: i32) -> Value {
    let n = spec.records.len();
    let (producer_id, producer_epoch, base_sequence) = spec.producer.unwrap_or((-1, -1, -1));
    let attributes = spec.codec.attribute() as i16
        | if spec.transactional { 0x10 } else { 0 }
        | if spec.control { 0x20 } else { 0 };
    let records: Vec<Value> = spec
        .records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            json!({
                "offset": base_offset + i as i64,
                "timestamp": r.timestamp,
                "key": json_bytes(r.key.as_deref()),
                "value": json_bytes(r.value.as_deref()),
                "headers": r.headers.iter().map(|h| json!([h.key, json_bytes(h.value.as_deref())])).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "base_offset": base_offset,
        "partition_leader_epoch": epoch,
        "batch_length": bytes.len() - 12,
        "codec": spec.codec.name(),
        "attributes": attributes,
        "transactional": spec.transactional,
        "control": spec.control,
        "log_append_time": false,
        "last_offset_delta": n - 1,
        "base_timestamp": spec.records[0].timestamp,
        "max_timestamp": spec.records.iter().map(|r| r.timestamp).max(),
        "producer_id": producer_id,
        "producer_epoch": producer_epoch,
        "base_sequence": base_sequence,
        "records_count": n,
        "records": records,
    })
}

/// Writes, for `python3 wire/tests/fixtures/gen_kafka_vectors.py --verify
/// target/tmp/felix-kafka-verify`:
/// * Felix's encoding of every reproducible golden vector, under the vector's file name;
/// * `felix_random_<codec>.bin`, 40 proptest-generated batches per codec (fixed seed), and
///   `felix_vectors.json` describing them from the specs they were built from.
#[test]
#[ignore = "writes files for kafka-python to verify; run by hand"]
fn felix_batches_for_kafka_python() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("felix-kafka-verify");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for v in vectors().iter().filter(|v| reproducible(v)) {
        let bytes: Vec<u8> = v.batches.iter().flat_map(felix_encode).collect();
        std::fs::write(dir.join(&v.file), bytes).unwrap();
    }

    let mut runner = TestRunner::deterministic();
    let mut files = Vec::new();
    for codec in CODECS {
        let (mut all, mut batches, mut base_offset) = (Vec::new(), Vec::new(), 0i64);
        while batches.len() < 40 {
            let mut spec = batch_spec_with(Just(codec))
                .new_tree(&mut runner)
                .unwrap()
                .current();
            // kafka-python parses a control batch's record keys as markers; random ones aren't.
            spec.control = false;
            // Kafka computes base + delta without wrapping (Java's long would wrap like
            // Felix, Python's int does not): keep to timestamps whose deltas fit.
            let base_ts = spec.records[0].timestamp;
            if spec
                .records
                .iter()
                .any(|r| r.timestamp.checked_sub(base_ts).is_none())
            {
                continue;
            }
            let mut bytes = spec.build();
            let epoch = batches.len() as i32;
            stamp_base_offset(&mut bytes, base_offset);
            stamp_partition_leader_epoch(&mut bytes, epoch);
            batches.push(describe(&spec, &bytes, base_offset, epoch));
            base_offset += spec.records.len() as i64;
            all.extend_from_slice(&bytes);
        }
        let file = format!("felix_random_{}.bin", codec.name());
        std::fs::write(dir.join(&file), all).unwrap();
        files.push(json!({ "file": file, "batches": batches }));
    }
    let doc = json!({ "generator": "felix-wire felix_batches_for_kafka_python", "files": files });
    std::fs::write(
        dir.join("felix_vectors.json"),
        serde_json::to_string_pretty(&doc).unwrap(),
    )
    .unwrap();
    println!("wrote Felix batches to {}", dir.display());
}
