//! The object format of a cold segment: a sealed, contiguous range of a shard's log stored as
//! one Parquet file, one row per record, readable by any Parquet tool and convertible back
//! into record batches that carry the same records, offsets and producer state.
//!
//! Invariants an object keeps (docs/tiering-format.md is the user-facing description):
//! * batches are contiguous: each batch starts one past where the previous one ended, so a
//!   batch's last offset is the next batch's base offset minus one (the object's
//!   `felix.last_offset` for the very last). That is how the last offset delta of a batch
//!   whose trailing records were removed survives without a column of its own;
//! * a row group ends only on a batch boundary, so row groups tile the object's offset range
//!   and one row group can be turned back into whole batches on its own;
//! * batches without records (legal for control batches) have no rows; they are kept in the
//!   footer (`felix.empty_batches`) so the rebuilt batch sequence is the original one.
//!
//! Rebuilt batches are uncompressed: records, offsets, timestamps and producer fields are the
//! originals, the batch bytes differ wherever the original was compressed.
//!
//! Because a rebuilt batch gets a fresh CRC, the batch CRCs can not catch an object whose
//! bytes rotted in a way Parquet and zstd still decode. So each row group carries a content
//! digest (`felix.row_group_digests`): a CRC32C over what the rebuild reproduces exactly
//! (the rebuilt batches' headers, whose CRCs cover the rest, see `digest`), computed from
//! the pushed batches when writing and from the rebuilt batches when reading. A row group whose rebuilt content does not match is
//! refused before any batch of it is returned or cached.
//!
//! This module holds what every part shares: the schema, the footer keys, the version and
//! the errors. Each decision has its own file:
//! * `encode` — batches in, Parquet out: row group cuts, page layout, the footer written;
//! * `digest` — what a row group's content digest covers, by format version;
//! * `footer` — reading and checking a footer: which row group holds an offset or a time;
//! * `rebuild` — one row group's rows back into record batches (built with felix-wire's
//!   header and record writers), checked against the digest.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use arrow::error::ArrowError;
use felix_wire::WireError;
use parquet::errors::ParquetError;
use parquet::file::metadata::KeyValue;
use serde::{Deserialize, Serialize};

mod digest;
mod digest_switch;
mod encode;
mod footer;
mod rebuild;

pub use digest_switch::skip_content_digests;
pub use encode::{SegmentEncoder, encode_to_bytes};
pub use footer::{ObjectFooter, RowGroupInfo};
pub use rebuild::{DecodedRowGroup, decode_row_group};

/// The version of the layout below, which this build writes. Version 2 and 3 objects always
/// carry content digests (`felix.row_group_digests`), so one without them is corrupt: a
/// damaged footer key can not quietly turn the content check off. Versions differ only in
/// what the digests cover (`digest`): version 3 digests the rebuilt batches' headers,
/// whose CRCs cover the rest, version 2 a canonical encoding of every record. Version 1
/// and 2 objects (written before version 3) are read too, with their digests checked when
/// they have them.
pub const FORMAT_VERSION: u32 = 3;
/// The oldest version this build reads.
pub const OLDEST_FORMAT_VERSION: u32 = 1;

// Footer key/value metadata.
const KEY_VERSION: &str = "felix.format_version";
const KEY_TENANT: &str = "felix.tenant";
const KEY_NAMESPACE: &str = "felix.namespace";
const KEY_STREAM: &str = "felix.stream";
const KEY_SHARD: &str = "felix.shard";
const KEY_BASE: &str = "felix.base_offset";
const KEY_LAST: &str = "felix.last_offset";
const KEY_RECORDS: &str = "felix.records";
const KEY_BATCHES: &str = "felix.batches";
const KEY_EMPTY_BATCHES: &str = "felix.empty_batches";
const KEY_ROW_GROUP_DIGESTS: &str = "felix.row_group_digests";

// Column positions in the Arrow schema (see `arrow_schema`).
const COL_OFFSET: usize = 0;
const COL_TIMESTAMP: usize = 1;
const COL_KEY: usize = 2;
const COL_PAYLOAD: usize = 3;
const COL_HEADERS: usize = 4;
const COL_PRODUCER_ID: usize = 5;
const COL_SEQUENCE: usize = 6;
const COL_PRODUCER_EPOCH: usize = 7;
const COL_BATCH_OFFSET: usize = 8;
const COL_BATCH_ATTRIBUTES: usize = 9;
const COL_GENERATION: usize = 10;

/// Which shard an object belongs to (goes in the footer metadata).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub tenant: String,
    pub namespace: String,
    pub stream: String,
    pub shard: u32,
}

/// How an object is written.
#[derive(Debug, Clone)]
pub struct EncodeOptions {
    /// A row group is closed at the first batch boundary after this many bytes of input
    /// batches (as pushed, so compressed batches count their compressed size).
    pub row_group_bytes: usize,
    /// zstd level of the Parquet pages (1..=22; anything else is an `InvalidArgument`).
    pub zstd_level: i32,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            row_group_bytes: 4 << 20,
            zstd_level: 3,
        }
    }
}

/// What an encoded object holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSummary {
    /// Base offset of the first batch.
    pub base_offset: u64,
    /// Last offset of the last batch (which may be past its last record).
    pub last_offset: u64,
    pub min_timestamp: i64,
    pub max_timestamp: i64,
    pub records: u64,
    /// Batches, including batches without records.
    pub batches: u64,
    pub row_groups: usize,
}

/// The object can not be written or read. Split by what the caller does about it:
/// * fix the input: [`Wire`](Self::Wire), [`Discontiguous`](Self::Discontiguous),
///   [`Empty`](Self::Empty), [`InvalidArgument`](Self::InvalidArgument);
/// * retry the upload with a new encoder: [`Parquet`](Self::Parquet) (most often the
///   writer's I/O failed), [`Aborted`](Self::Aborted);
/// * the object is unusable (fetch it again, or re-upload the range from the hot log):
///   [`NotFelix`](Self::NotFelix), [`UnsupportedVersion`](Self::UnsupportedVersion),
///   [`BadMetadata`](Self::BadMetadata), [`Corrupt`](Self::Corrupt).
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// A pushed batch is not a valid RecordBatch v2 (bad CRC, truncated, malformed records).
    /// `position` is its byte position in the slice given to that push.
    #[error("invalid record batch at byte {position} of the pushed input: {source}")]
    Wire {
        position: usize,
        #[source]
        source: WireError,
    },
    /// A pushed batch does not start one past the end of the previous one.
    #[error("batch at offset {got} does not continue the object, which ends before {expected}")]
    Discontiguous { expected: u64, got: u64 },
    /// The object would hold no record (no batch at all, or only batches without records).
    #[error("an object must hold at least one record")]
    Empty,
    /// An earlier push on this encoder failed, so the object would be incomplete.
    #[error("an earlier push failed; this encoder can no longer produce an object")]
    Aborted,
    /// The Parquet writer failed; when encoding this is usually the underlying writer's I/O.
    #[error("parquet: {0}")]
    Parquet(#[from] ParquetError),
    /// Records could not be assembled into Arrow arrays (a bug, not bad input).
    #[error("arrow: {0}")]
    Arrow(#[from] ArrowError),
    /// A readable Parquet file without Felix's footer metadata.
    #[error("not a Felix object: {0}")]
    NotFelix(String),
    /// A Felix object of a format version this build does not read.
    #[error(
        "Felix object format version {found} is not supported (this build reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION})"
    )]
    UnsupportedVersion { found: String },
    /// Felix's footer metadata or schema is missing a field or contradicts itself.
    #[error("bad Felix object metadata: {0}")]
    BadMetadata(String),
    /// The object's bytes do not decode, or decode to rows that break the format's rules.
    #[error("corrupt object: {0}")]
    Corrupt(String),
    /// The caller passed something impossible (a row group index past the end, bytes that
    /// are not the requested range, a tail longer than the object).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> SegmentError {
    SegmentError::Corrupt(format!("{what}: {e}"))
}

/// The Arrow schema of every object (the user-facing contract, docs/tiering-format.md).
fn arrow_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("offset", DataType::Int64, false),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            false,
        ),
        Field::new("key", DataType::Binary, true),
        Field::new("payload", DataType::Binary, true),
        Field::new(
            "headers",
            DataType::List(header_element(header_fields())),
            false,
        ),
        Field::new("producer_id", DataType::Int64, true),
        Field::new("sequence", DataType::Int32, true),
        Field::new("producer_epoch", DataType::Int16, true),
        Field::new("batch_offset", DataType::Int64, false),
        Field::new("batch_attributes", DataType::Int16, false),
        Field::new("generation", DataType::Int32, false),
    ]))
}

fn header_fields() -> Fields {
    Fields::from(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Binary, true),
    ])
}

fn header_element(fields: Fields) -> Arc<Field> {
    Arc::new(Field::new("element", DataType::Struct(fields), false))
}

fn kv(key: &str, value: impl ToString) -> KeyValue {
    KeyValue::new(key.to_owned(), value.to_string())
}

/// A batch without records: it has no rows, so its header is kept in the footer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct EmptyBatch {
    base_offset: u64,
    last_offset: u64,
    attributes: i16,
    generation: i32,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    base_timestamp: i64,
    max_timestamp: i64,
}
