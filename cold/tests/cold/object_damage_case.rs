//! One case of "damage an object's bytes, parse its footer, decode its row groups": shared
//! by the property test in `object_damage.rs` (run by every `cargo test`) and the
//! cargo-fuzz target `fuzz/fuzz_targets/object_decode.rs`, which includes this file. The
//! promise: damaged bytes never make the decoder panic or return a record that was not
//! written at that offset. Parsing may be refused, a row group may be refused; what decodes
//! is what was written.

use std::collections::BTreeMap;

use bytes::Bytes;
use felix_cold::segment::{
    EncodeOptions, ObjectFooter, ObjectInfo, decode_row_group, encode_to_bytes,
};
use felix_wire::batch::stamp_base_offset;
use felix_wire::{BatchBuilder, BatchIter, Compression, DecodedBatch, Header, Record};

/// One batch of the object: its codec and its records' (key, value) lengths.
#[derive(Debug, Clone)]
pub struct BatchShape {
    pub codec: u8,
    pub records: Vec<(usize, usize)>,
}

/// One change to the object's bytes.
#[derive(Debug, Clone)]
pub enum ObjectDamage {
    /// XOR the byte at (a fraction of the object's length) with a non-zero mask.
    Flip { at: f64, mask: u8 },
    /// Write these bytes over the object from there (never past its end).
    Overwrite { at: f64, bytes: Vec<u8> },
    /// Cut the object there.
    Truncate { at: f64 },
}

const CODECS: [Compression; 5] = [
    Compression::None,
    Compression::Gzip,
    Compression::Snappy,
    Compression::Lz4,
    Compression::Zstd,
];

/// A deterministic byte pattern, so a changed byte is a changed record.
fn pattern(seed: u64, len: usize) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

/// The batches of the shapes, stamped with dense offsets from 0, as a sealed segment holds
/// them.
fn segment(shapes: &[BatchShape]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut next = 0i64;
    for (b, shape) in shapes.iter().enumerate() {
        let mut builder = BatchBuilder::new(CODECS[shape.codec as usize % CODECS.len()]);
        for (r, (key_len, value_len)) in shape.records.iter().enumerate() {
            let seed = (b * 1000 + r) as u64;
            builder.push(Record {
                offset: 0,
                timestamp: 1_700_000_000_000 + seed as i64,
                key: (*key_len > 0).then(|| pattern(seed, *key_len)),
                value: Some(pattern(!seed, *value_len)),
                headers: if r % 3 == 0 {
                    vec![Header {
                        key: format!("h{r}"),
                        value: Some(pattern(seed ^ 7, 3)),
                    }]
                } else {
                    Vec::new()
                },
            });
        }
        let mut batch = builder.build().expect("the test's batch encodes");
        stamp_base_offset(&mut batch, next);
        next += shape.records.len() as i64;
        out.extend_from_slice(&batch);
    }
    out
}

type Written = BTreeMap<u64, (i64, Option<Bytes>, Option<Bytes>, Vec<Header>)>;

fn records_of(batches: &[u8]) -> Written {
    let mut out = BTreeMap::new();
    for batch in BatchIter::new(batches, usize::MAX) {
        let (_, bytes) = batch.expect("whole, valid batches");
        let decoded = DecodedBatch::decode(bytes, usize::MAX).expect("decodes");
        for r in decoded.records {
            out.insert(r.offset as u64, (r.timestamp, r.key, r.value, r.headers));
        }
    }
    out
}

fn apply(object: &mut Vec<u8>, damage: &ObjectDamage) {
    if object.is_empty() {
        return;
    }
    let at = |f: f64| ((object.len() as f64 * f) as usize).min(object.len() - 1);
    match damage {
        ObjectDamage::Flip { at: f, mask } => {
            let i = at(*f);
            object[i] ^= mask;
        }
        ObjectDamage::Overwrite { at: f, bytes } => {
            let i = at(*f);
            let n = bytes.len().min(object.len() - i);
            object[i..i + n].copy_from_slice(&bytes[..n]);
        }
        ObjectDamage::Truncate { at: f } => {
            let i = at(*f);
            object.truncate(i);
        }
    }
}

/// Parses the footer the way a reader does: a suffix first, then as much as it asks for.
fn footer(object: &[u8]) -> Option<ObjectFooter> {
    let len = object.len() as u64;
    let suffix = ObjectFooter::SUFFIX_HINT.min(len);
    match ObjectFooter::parse(&object[(len - suffix) as usize..], len).ok()? {
        Ok(footer) => Some(footer),
        Err(needed) if needed <= len => {
            ObjectFooter::parse(&object[(len - needed) as usize..], len)
                .ok()?
                .ok()
        }
        Err(_) => None,
    }
}

pub fn damaged_object_case(
    shapes: Vec<BatchShape>,
    row_group_bytes: usize,
    damages: Vec<ObjectDamage>,
) {
    let segment = segment(&shapes);
    let written = records_of(&segment);
    let info = ObjectInfo {
        tenant: "acme".into(),
        namespace: "orders".into(),
        stream: "created".into(),
        shard: 1,
    };
    let opts = EncodeOptions {
        row_group_bytes,
        ..EncodeOptions::default()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let (object, _) = runtime
        .block_on(encode_to_bytes(&segment, &info, &opts))
        .expect("the test's segment encodes");
    let mut object = object.to_vec();
    for d in &damages {
        apply(&mut object, d);
    }
    let object = Bytes::from(object);

    // Refusing the footer is allowed; a footer that parses must lead only to true records.
    let Some(footer) = footer(&object) else {
        return;
    };
    for (i, rg) in footer.row_groups.iter().enumerate() {
        let (start, end) = (rg.byte_range.start as usize, rg.byte_range.end as usize);
        if start > end || end > object.len() {
            continue;
        }
        let Ok(decoded) = decode_row_group(&footer, i, object.slice(start..end)) else {
            continue;
        };
        assert!(
            decoded.covers(rg.first_offset, rg.last_offset),
            "row group {i} decoded to offsets other than its footer's {}..={}",
            rg.first_offset,
            rg.last_offset
        );
        for (offset, record) in records_of(&decoded.batches) {
            let expected = written
                .get(&offset)
                .unwrap_or_else(|| panic!("offset {offset} was never written but decodes"));
            assert_eq!(
                (&record.0, &record.1, &record.2, &record.3),
                (&expected.0, &expected.1, &expected.2, &expected.3),
                "the record decoded at offset {offset} is not the one written there"
            );
        }
    }
}

/// A case from a fuzzer's bytes: batch shapes, a row-group size, then the damages, each
/// read from a few bytes (a short input makes a short case; nothing is refused).
pub fn from_fuzz_input(data: &[u8]) -> (Vec<BatchShape>, usize, Vec<ObjectDamage>) {
    let mut bytes = data.iter().copied();
    let mut next = || bytes.next().unwrap_or(0);
    let shapes = (0..1 + next() % 12)
        .map(|_| BatchShape {
            codec: next(),
            records: (0..1 + next() % 5)
                .map(|_| (next() as usize % 24, next() as usize % 200))
                .collect(),
        })
        .collect();
    let row_group_bytes = 256 + usize::from(next()) * 16;
    let fraction = |hi: u8, lo: u8| f64::from(u16::from_be_bytes([hi, lo])) / 65536.0;
    let mut damages = Vec::new();
    for _ in 0..1 + next() % 3 {
        let (kind, hi, lo, arg) = (next(), next(), next(), next());
        let at = fraction(hi, lo);
        damages.push(match kind % 4 {
            0 | 1 => ObjectDamage::Flip {
                at,
                mask: arg.max(1),
            },
            2 => ObjectDamage::Overwrite {
                at,
                bytes: (0..1 + arg % 16).map(|_| next()).collect(),
            },
            _ => ObjectDamage::Truncate { at },
        });
    }
    (shapes, row_group_bytes, damages)
}
