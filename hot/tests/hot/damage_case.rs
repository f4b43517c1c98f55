//! One case of "damage a closed log's files, reopen, read": shared by the property test
//! in `damage.rs` (run by every `cargo test`) and the cargo-fuzz target
//! `fuzz/fuzz_targets/segment_recovery.rs`, which includes this file. The promise: random
//! damage never makes the log panic or serve a record that was not written at that offset.
//! Opening may be refused, a read may be refused; what is read is what was appended.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use felix_hot::ShardLog;
use felix_wire::{BatchIter, DecodedBatch};

use super::common::*;

/// One change to one file of the log's directory.
#[derive(Debug, Clone)]
pub enum Damage {
    /// XOR the byte at (a fraction of the file's length) with a non-zero mask.
    Flip { at: f64, mask: u8 },
    /// Cut the file there.
    Truncate { at: f64 },
    /// Write these bytes over the file from there (growing it if they run past its end).
    Overwrite { at: f64, bytes: Vec<u8> },
    /// Append these bytes.
    Append { bytes: Vec<u8> },
    /// Change the base offset of one batch of a segment file (the field the batch CRC does
    /// not cover): the batch at (a fraction of the file's batches) gets `delta` added.
    Rebase { at: f64, delta: i64 },
    /// Remove the file.
    Remove,
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn apply(path: &Path, damage: &Damage) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = |f: f64| ((bytes.len() as f64 * f) as usize).min(bytes.len().saturating_sub(1));
    match damage {
        Damage::Flip { at: f, mask } => {
            if !bytes.is_empty() {
                let i = at(*f);
                bytes[i] ^= mask;
            }
        }
        Damage::Truncate { at: f } => {
            let i = at(*f);
            bytes.truncate(i);
        }
        Damage::Overwrite { at: f, bytes: new } => {
            let i = at(*f);
            let end = i + new.len();
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[i..end].copy_from_slice(new);
        }
        Damage::Append { bytes: new } => bytes.extend_from_slice(new),
        Damage::Rebase { at: f, delta } => {
            // Batch starts, as far as the file parses; other files are left alone.
            let mut starts = Vec::new();
            let mut iter = BatchIter::new(&bytes, usize::MAX);
            loop {
                let position = iter.position();
                match iter.next() {
                    Some(Ok(_)) => starts.push(position),
                    _ => break,
                }
            }
            if starts.is_empty() {
                return;
            }
            let start = starts[((starts.len() as f64 * f) as usize).min(starts.len() - 1)];
            let field = &mut bytes[start..start + 8];
            let base = i64::from_be_bytes(field.try_into().unwrap());
            field.copy_from_slice(&(base + delta).to_be_bytes());
        }
        Damage::Remove => {
            std::fs::remove_file(path).unwrap();
            return;
        }
    }
    std::fs::write(path, bytes).unwrap();
}

/// What was appended: offset → (timestamp, value).
fn written(sent: &[Sent]) -> BTreeMap<u64, (i64, Option<Bytes>)> {
    let mut out = BTreeMap::new();
    for s in sent {
        let batch = DecodedBatch::decode(&s.bytes, usize::MAX).expect("the test's own batch");
        for (i, r) in batch.records.into_iter().enumerate() {
            out.insert(s.base + i as u64, (r.timestamp, r.value));
        }
    }
    out
}

/// Reads the reopened log from its first offset; every record served must be the one
/// written at its offset. A refusal ends the read (that is allowed); a panic or a wrong
/// record fails the test.
fn check_served(log: &ShardLog, written: &BTreeMap<u64, (i64, Option<Bytes>)>) {
    let _ = log.verify();
    let end = log.committed_offset();
    let mut next = log.first_offset();
    while next < end {
        let Ok(read) = log.read(next, 2048, None) else {
            return;
        };
        let mut served = 0;
        for batch in BatchIter::new(&read.batches, usize::MAX) {
            let (_, bytes) = batch.expect("a read serves whole, checksummed batches");
            let decoded = DecodedBatch::decode(bytes, usize::MAX).expect("a served batch decodes");
            for r in decoded.records {
                let offset = r.offset as u64;
                assert_eq!(
                    offset, next,
                    "records are served densely from the requested offset"
                );
                let expected = written
                    .get(&offset)
                    .unwrap_or_else(|| panic!("offset {offset} was never written but is served"));
                assert_eq!(
                    (&r.timestamp, &r.value),
                    (&expected.0, &expected.1),
                    "the record served at offset {offset} is not the one written there"
                );
                next += 1;
                served += 1;
            }
        }
        assert!(
            served > 0,
            "a read at {next} below the end {end} served nothing"
        );
    }
}

pub fn damaged_log_case(batches: Vec<(usize, usize)>, damages: Vec<(usize, Damage)>) {
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments(512);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sent = runtime.block_on(async {
        let log = ShardLog::open(dir.path(), config.clone()).unwrap();
        let mut sent = Vec::new();
        for (i, (records, value_len)) in batches.iter().enumerate() {
            sent.push(append_committed(&log, batch(i as u64, *records, *value_len)).await);
        }
        sent
    });
    let written = written(&sent);

    for (which, d) in &damages {
        let files = files(dir.path());
        if files.is_empty() {
            break;
        }
        apply(&files[which % files.len()], d);
    }

    runtime.block_on(async {
        // Refusing to open is allowed; what opens must serve only what was written.
        if let Ok(log) = ShardLog::open(dir.path(), config) {
            check_served(&log, &written);
        }
    });
}

/// A case: the (records, value length) of each batch appended, then each damage with the
/// file it hits (an index into the directory's sorted files, modulo their number).
pub type Case = (Vec<(usize, usize)>, Vec<(usize, Damage)>);

/// A case from a fuzzer's bytes: the batch shapes first, then the damages, each read from
/// a few bytes (a short input makes a short case; nothing is refused).
pub fn from_fuzz_input(data: &[u8]) -> Case {
    let mut bytes = data.iter().copied();
    let mut next = || bytes.next().unwrap_or(0);
    let count = 4 + next() as usize % 16;
    let batches = (0..count)
        .map(|_| (1 + next() as usize % 3, 1 + next() as usize % 80))
        .collect();
    let fraction = |hi: u8, lo: u8| f64::from(u16::from_be_bytes([hi, lo])) / 65536.0;
    let mut damages = Vec::new();
    for _ in 0..1 + next() % 3 {
        let (kind, which, hi, lo, arg) = (next(), next(), next(), next(), next());
        let at = fraction(hi, lo);
        let fill: Vec<u8> = (0..1 + arg % 64).map(|_| next()).collect();
        let damage = match kind % 6 {
            0 => Damage::Flip {
                at,
                mask: arg.max(1),
            },
            1 => Damage::Truncate { at },
            2 => Damage::Overwrite { at, bytes: fill },
            3 => Damage::Append { bytes: fill },
            4 => Damage::Rebase {
                at,
                delta: i64::from(arg % 7) - 3,
            },
            _ => Damage::Remove,
        };
        damages.push((which as usize, damage));
    }
    (batches, damages)
}
