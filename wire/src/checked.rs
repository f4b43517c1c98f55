//! A batch whose bytes were checked once, carrying the proof in its type. Invariant: a
//! [`CheckedBatch`] exists only for bytes that [`BatchHeader::validate`] accepted as exactly
//! one whole batch (length, magic, CRC, codec, offset and count fields), and its bytes
//! cannot change afterwards, so a later stage (the log's append) may take it without
//! computing the CRC again. Stamping the base offset and generation, which the CRC does not
//! cover, is the only change a checked batch may still undergo, on the log's own copy.

use bytes::Bytes;

use crate::batch::{BatchHeader, BatchIter};
use crate::error::WireError;

/// One whole, validated RecordBatch v2 and its parsed header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedBatch {
    header: BatchHeader,
    bytes: Bytes,
}

impl CheckedBatch {
    /// Validates `bytes` as exactly one whole batch of at most `max_batch_bytes`.
    pub fn check(bytes: Bytes, max_batch_bytes: usize) -> Result<CheckedBatch, WireError> {
        let (header, len) = BatchHeader::validate(&bytes, max_batch_bytes)?;
        if len != bytes.len() {
            return Err(WireError::Inconsistent("bytes after the end of the batch"));
        }
        Ok(CheckedBatch { header, bytes })
    }

    /// Validates every batch in `body` (concatenated batches, e.g. a publish request),
    /// each sharing `body`'s memory. Stops at the first invalid batch with its byte
    /// position, as [`BatchIter`] does.
    pub fn split(
        body: &Bytes,
        max_batch_bytes: usize,
    ) -> impl Iterator<Item = Result<CheckedBatch, (usize, WireError)>> + '_ {
        BatchIter::new(body, max_batch_bytes).map(|item| {
            item.map(|(header, bytes)| CheckedBatch {
                header,
                bytes: body.slice_ref(bytes),
            })
        })
    }

    /// The header, as validated.
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// The batch's bytes, exactly as checked.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The batch's length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Always false: a batch has at least a header.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The header and the bytes, giving up the proof.
    pub fn into_parts(self) -> (BatchHeader, Bytes) {
        (self.header, self.bytes)
    }
}
