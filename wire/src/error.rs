//! Errors of the wire formats. Every one means "these bytes are not a valid batch"; they are
//! split by what was wrong so a caller can report it precisely (and a log can tell a torn
//! tail, [`WireError::Truncated`], from corruption).

use thiserror::Error;

/// A batch or record could not be decoded or encoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// Fewer bytes than the structure needs: `needed` bytes were required, `available` remain.
    /// At the end of a log file this is a torn write, not corruption.
    #[error("truncated input: needed {needed} bytes, {available} available")]
    Truncated { needed: usize, available: usize },
    /// The magic byte is not 2 (only RecordBatch v2 is accepted).
    #[error("unsupported record batch magic {0} (only magic 2 is accepted)")]
    UnsupportedMagic(i8),
    /// The batch length field is impossible (smaller than a header or over the limit).
    #[error("invalid batch length {length} (minimum {min}, maximum {max})")]
    InvalidLength { length: i64, min: usize, max: usize },
    /// The CRC32C stored in the header does not match the bytes it covers.
    #[error("batch crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    /// The attributes name a compression codec that does not exist.
    #[error("unknown compression codec {0}")]
    UnknownCodec(u8),
    /// A compressed payload could not be decompressed.
    #[error("{codec} decompression failed: {reason}")]
    Decompression { codec: &'static str, reason: String },
    /// A payload could not be compressed.
    #[error("{codec} compression failed: {reason}")]
    Compression { codec: &'static str, reason: String },
    /// Decompressed records would exceed the caller's limit (a decompression bomb guard).
    #[error("decompressed records exceed the limit of {limit} bytes")]
    DecompressedTooLarge { limit: usize },
    /// A record inside the batch is malformed; `index` is its position in the batch.
    #[error("malformed record {index}: {reason}")]
    MalformedRecord { index: usize, reason: &'static str },
    /// The header fields contradict each other or the records (e.g. record count and last
    /// offset delta disagree).
    #[error("inconsistent batch: {0}")]
    Inconsistent(&'static str),
    /// A batch to be encoded has no records, or more than a batch can carry.
    #[error("cannot encode batch: {0}")]
    Unencodable(&'static str),
}
