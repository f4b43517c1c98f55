//! A buffer of concatenated batches (a log read, a produce request's record set) walked with
//! `BatchIter`: it must yield consecutive whole batches, then at most one error at the
//! position of the bad batch, then stop; and every batch it yields must decode or fail with
//! a typed error.
#![no_main]

use felix_wire::batch::BatchIter;
use felix_wire::{BatchHeader, DecodedBatch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first two bytes pick the size limit, so "over the limit" paths get exercised too.
    let (max, buf) = match data {
        [a, b, rest @ ..] => (61 + (u16::from_be_bytes([*a, *b]) as usize) * 4, rest),
        _ => (usize::MAX, data),
    };
    for max in [max, usize::MAX] {
        let mut iter = BatchIter::new(buf, max);
        let mut pos = 0;
        let mut failed = false;
        while let Some(item) = iter.next() {
            assert!(!failed, "BatchIter yielded after an error");
            match item {
                Ok((h, bytes)) => {
                    assert_eq!(bytes.as_ptr(), buf[pos..].as_ptr());
                    assert_eq!(bytes.len(), h.total_len());
                    assert!(bytes.len() <= max);
                    assert_eq!(BatchHeader::validate(bytes, max).map(|(h, _)| h), Ok(h));
                    let _ = DecodedBatch::decode(bytes, 1 << 20);
                    pos += bytes.len();
                }
                Err((at, _)) => {
                    assert_eq!(at, pos);
                    failed = true;
                }
            }
            assert_eq!(iter.position(), pos);
        }
        assert!(iter.next().is_none());
        if !failed {
            assert_eq!(pos, buf.len());
        }
    }
});
