//! One batch, fully decoded: header parsing, validation, CRC, decompression (with a small
//! limit, so bombs are cheap to find) and the record parser. Any input must give Ok or a
//! typed error, and what the entry points return must agree.
//!
//! Each input is checked twice: as it is, and "forged" into one whole v2 batch (length,
//! magic, codec bits in range, CRC recomputed) so random bytes get past the CRC into the
//! decompressors and the record parser. A valid batch (e.g. a tests/fixtures file used as a
//! seed) forges to itself.
#![no_main]

use felix_wire::batch::BatchHeader;
use felix_wire::{BATCH_HEADER_LEN, DecodedBatch};
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= BATCH_HEADER_LEN {
        check(&forge(data));
    }
});

fn check(buf: &[u8]) {
    let _ = BatchHeader::peek_total_len(buf, usize::MAX);
    if let Ok(h) = BatchHeader::parse(buf) {
        let _ = (
            h.compression(),
            h.last_offset(),
            h.offset_count(),
            h.total_len(),
        );
        let _ = (h.is_control(), h.is_transactional(), h.is_log_append_time());
    }
    let validated = BatchHeader::validate(buf, usize::MAX);
    if let Ok((h, len)) = validated {
        assert!(len <= buf.len());
        assert_eq!(len, h.total_len());
        assert_eq!(BatchHeader::parse(buf), Ok(h));
    }
    if let Ok(batch) = DecodedBatch::decode(buf, LIMIT) {
        let (h, _) = validated.expect("decode accepted what validate refused");
        assert_eq!(batch.header, h);
        assert_eq!(batch.records.len(), h.records_count as usize);
        if let Some(last) = batch.records.last() {
            assert!(last.offset <= h.last_offset());
        }
    }
}

/// `data` as one whole batch: length, magic 2, a codec that exists, and a correct CRC.
fn forge(data: &[u8]) -> Vec<u8> {
    let mut buf = data.to_vec();
    let length = (buf.len() - 12) as i32;
    buf[8..12].copy_from_slice(&length.to_be_bytes());
    buf[16] = 2;
    buf[22] = (buf[22] & !0x07) | ((buf[22] & 0x07) % 5);
    let crc = crc32c(&buf[21..]);
    buf[17..21].copy_from_slice(&crc.to_be_bytes());
    buf
}

/// CRC32C (Castagnoli), bitwise: the fuzz crate keeps felix-wire as its only dependency.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
