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
//! digest (`felix.row_group_digests`): a CRC32C over a canonical encoding of what the rebuild
//! reproduces exactly (see [`OpenBatch::digest_trailer`] and [`digest_record_prefix`]),
//! computed from the pushed batches when writing and from the rebuilt rows when reading.
//! A row group whose rebuilt content does not match is refused before any batch of it is
//! returned or cached.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryArray, BinaryBuilder, Int16Array, Int16Builder, Int32Array,
    Int32Builder, Int64Array, Int64Builder, ListArray, RecordBatch, StringArray, StringBuilder,
    StructArray, TimestampMillisecondArray,
};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use arrow::error::ArrowError;
use bytes::{Buf, Bytes};
use crc32c::crc32c_append;
use felix_wire::batch::{BATCH_HEADER_LEN, LOG_OVERHEAD, MAGIC_V2};
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{BatchHeader, DecodedBatch, WireError};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::async_writer::{AsyncArrowWriter, AsyncFileWriter};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::metadata::{
    KeyValue, PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader, RowGroupMetaData,
    SortingColumn,
};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::statistics::Statistics;
use parquet::schema::types::ColumnPath;
use serde::{Deserialize, Serialize};

/// The version of the layout below, which this build writes. Version 2 objects always carry
/// content digests (`felix.row_group_digests`), so one without them is corrupt: a damaged
/// footer key can not quietly turn the content check off. Version 1 objects (written before
/// version 2) are read too, with their digests checked when they have them.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest version this build reads.
pub const OLDEST_FORMAT_VERSION: u32 = 1;

/// Rows per data page: small enough that a reader pruning on `offset` or `timestamp` through
/// the page index skips most of a row group, large enough that page headers stay negligible.
const PAGE_ROWS: usize = 8192;
/// Input records are handed to the Parquet writer in chunks of about this many bytes, so a
/// large push does not build one huge Arrow batch (Arrow binary columns address 2 GiB).
const ARROW_CHUNK_BYTES: usize = 8 << 20;
/// Rows per Arrow batch when reading a row group back.
const READ_BATCH_ROWS: usize = 8192;
/// Most a row group's rebuild allocates up front (a hint; the output grows past it).
const MAX_REBUILD_RESERVE: usize = 64 << 20;

const ATTR_COMPRESSION_MASK: i16 = 0x07;

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

fn writer_properties(
    info: &ObjectInfo,
    opts: &EncodeOptions,
) -> Result<WriterProperties, SegmentError> {
    let col = |name: &str| ColumnPath::from(name);
    let header_col = |leaf: &str| {
        ColumnPath::new(vec![
            "headers".into(),
            "list".into(),
            "element".into(),
            leaf.into(),
        ])
    };
    let zstd = ZstdLevel::try_new(opts.zstd_level).map_err(|e| {
        SegmentError::InvalidArgument(format!("zstd level {}: {e}", opts.zstd_level))
    })?;
    let mut b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(zstd))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_data_page_row_count_limit(PAGE_ROWS)
        // Row groups end where `push` flushes (on batch boundaries), never inside a batch.
        .set_max_row_group_row_count(None)
        .set_max_row_group_bytes(None)
        .set_sorting_columns(Some(vec![SortingColumn {
            column_idx: COL_OFFSET as i32,
            descending: false,
            nulls_first: false,
        }]))
        .set_key_value_metadata(Some(vec![
            kv(KEY_VERSION, FORMAT_VERSION),
            kv(KEY_TENANT, &info.tenant),
            kv(KEY_NAMESPACE, &info.namespace),
            kv(KEY_STREAM, &info.stream),
            kv(KEY_SHARD, info.shard),
        ]));
    // Offsets and timestamps grow (nearly) by one step per row: delta encoding stores them in
    // a few bits, where a dictionary would only grow.
    for name in ["offset", "timestamp", "sequence"] {
        b = b
            .set_column_dictionary_enabled(col(name), false)
            .set_column_encoding(col(name), Encoding::DELTA_BINARY_PACKED);
    }
    // Nobody prunes on payload bytes; min/max of them would only fatten the page index.
    b = b
        .set_column_dictionary_enabled(col("payload"), false)
        .set_column_statistics_enabled(col("payload"), EnabledStatistics::None)
        .set_column_statistics_enabled(header_col("key"), EnabledStatistics::None)
        .set_column_statistics_enabled(header_col("value"), EnabledStatistics::None);
    Ok(b.build())
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

/// Rows not yet handed to the Parquet writer, column by column.
#[derive(Default)]
struct PendingRows {
    offset: Vec<i64>,
    timestamp: Vec<i64>,
    key: BinaryBuilder,
    payload: BinaryBuilder,
    header_offsets: Vec<i32>,
    header_keys: StringBuilder,
    header_values: BinaryBuilder,
    producer_id: Int64Builder,
    sequence: Int32Builder,
    producer_epoch: Int16Builder,
    batch_offset: Vec<i64>,
    batch_attributes: Vec<i16>,
    generation: Vec<i32>,
    bytes: usize,
}

impl PendingRows {
    fn push_batch(&mut self, batch: &DecodedBatch) {
        let h = &batch.header;
        let attributes = h.attributes & !ATTR_COMPRESSION_MASK;
        for r in &batch.records {
            if self.header_offsets.is_empty() {
                self.header_offsets.push(0);
            }
            self.offset.push(r.offset);
            self.timestamp.push(r.timestamp);
            self.key.append_option(r.key.as_deref());
            self.payload.append_option(r.value.as_deref());
            for hd in &r.headers {
                self.header_keys.append_value(&hd.key);
                self.header_values.append_option(hd.value.as_deref());
                self.bytes += hd.key.len() + hd.value.as_ref().map_or(0, |v| v.len());
            }
            let last = *self.header_offsets.last().unwrap_or(&0);
            self.header_offsets.push(last + r.headers.len() as i32);
            self.producer_id
                .append_option((h.producer_id != -1).then_some(h.producer_id));
            let delta = (r.offset - h.base_offset) as i32;
            self.sequence.append_option(
                (h.base_sequence != -1).then(|| h.base_sequence.wrapping_add(delta)),
            );
            self.producer_epoch
                .append_option((h.producer_epoch != -1).then_some(h.producer_epoch));
            self.batch_offset.push(h.base_offset);
            self.batch_attributes.push(attributes);
            self.generation.push(h.partition_leader_epoch);
            self.bytes += 48
                + r.key.as_ref().map_or(0, |k| k.len())
                + r.value.as_ref().map_or(0, |v| v.len());
        }
    }

    fn rows(&self) -> usize {
        self.offset.len()
    }

    /// Hands the pending rows over as one Arrow batch and starts empty.
    fn take(&mut self, schema: &SchemaRef) -> Result<RecordBatch, SegmentError> {
        let mut p = std::mem::take(self);
        if p.header_offsets.is_empty() {
            p.header_offsets.push(0);
        }
        let headers = StructArray::try_new(
            header_fields(),
            vec![
                Arc::new(p.header_keys.finish()) as ArrayRef,
                Arc::new(p.header_values.finish()),
            ],
            None,
        )?;
        let headers = ListArray::try_new(
            header_element(header_fields()),
            OffsetBuffer::new(ScalarBuffer::from(p.header_offsets)),
            Arc::new(headers),
            None,
        )?;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(p.offset)),
            Arc::new(TimestampMillisecondArray::from(p.timestamp).with_timezone("UTC")),
            Arc::new(p.key.finish()),
            Arc::new(p.payload.finish()),
            Arc::new(headers),
            Arc::new(p.producer_id.finish()),
            Arc::new(p.sequence.finish()),
            Arc::new(p.producer_epoch.finish()),
            Arc::new(Int64Array::from(p.batch_offset)),
            Arc::new(Int16Array::from(p.batch_attributes)),
            Arc::new(Int32Array::from(p.generation)),
        ];
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }
}

/// Streams batches into a Parquet object. `W` is any parquet [`AsyncFileWriter`]: a
/// `Vec<u8>` or other tokio `AsyncWrite`, or an object store multipart writer.
///
/// Memory: the row group in progress (compressed pages) plus up to ~8 MiB of rows not yet
/// encoded. After any error the encoder refuses further work ([`SegmentError::Aborted`]):
/// the object it was writing is incomplete and must be abandoned.
pub struct SegmentEncoder<W> {
    writer: AsyncArrowWriter<W>,
    schema: SchemaRef,
    row_group_bytes: usize,
    pending: PendingRows,
    bytes_since_flush: usize,
    base_offset: Option<u64>,
    /// One past the last offset pushed.
    next_offset: Option<u64>,
    records: u64,
    batches: u64,
    min_timestamp: i64,
    max_timestamp: i64,
    empty_batches: Vec<EmptyBatch>,
    digests: RowGroupDigests,
    failed: bool,
}

/// The content digests of the row groups written so far (see the module documentation).
#[derive(Default)]
struct RowGroupDigests {
    /// Of the row groups that are complete: all their batches, empty ones included, are in.
    done: Vec<u32>,
    /// Of the row group the last batches went into.
    current: u32,
    /// The writer closed the row group `current` belongs to: the next batch with records
    /// starts a new one. (A batch without records has no rows; it joins the row group before
    /// it, as the reader rebuilds it, see `decode_row_group`.)
    cut: bool,
    /// A record's canonical body, reused.
    scratch: Vec<u8>,
}

impl RowGroupDigests {
    fn push_batch(&mut self, batch: &DecodedBatch) -> Result<(), SegmentError> {
        if !batch.records.is_empty() && self.cut {
            self.done.push(std::mem::take(&mut self.current));
            self.cut = false;
        }
        let h = &batch.header;
        let mut crc = self.current;
        for r in &batch.records {
            crc = crc32c_append(crc, &digest_record_prefix(r.offset, r.timestamp));
            self.scratch.clear();
            put_nullable(&mut self.scratch, r.key.as_deref())?;
            put_nullable(&mut self.scratch, r.value.as_deref())?;
            put_varlong(&mut self.scratch, r.headers.len() as i64);
            for hd in &r.headers {
                put_nullable(&mut self.scratch, Some(hd.key.as_bytes()))?;
                put_nullable(&mut self.scratch, hd.value.as_deref())?;
            }
            crc = crc32c_append(crc, &self.scratch);
        }
        let count = i32::try_from(batch.records.len())
            .map_err(|_| SegmentError::InvalidArgument("batch with too many records".into()))?;
        let b = OpenBatch {
            start: 0,
            base_offset: h.base_offset,
            attributes: h.attributes & !ATTR_COMPRESSION_MASK,
            generation: h.partition_leader_epoch,
            producer_id: h.producer_id,
            producer_epoch: h.producer_epoch,
            base_sequence: h.base_sequence,
            base_timestamp: h.base_timestamp,
            max_timestamp: h.max_timestamp,
            count,
            last_record: h.base_offset,
        };
        self.current = b.digest_trailer(crc, h.last_offset());
        Ok(())
    }

    /// The writer has closed `flushed` row groups.
    fn flushed(&mut self, flushed: usize) {
        if flushed > self.done.len() {
            self.cut = true;
        }
    }

    /// All digests, once the last batch is in; `row_groups` is how many the object has.
    fn finish(mut self, row_groups: usize) -> Result<String, SegmentError> {
        self.done.push(self.current);
        if self.done.len() != row_groups {
            return Err(SegmentError::InvalidArgument(format!(
                "a bug: {} row group digests for {row_groups} row groups",
                self.done.len()
            )));
        }
        Ok(self
            .done
            .iter()
            .map(|d| format!("{d:08x}"))
            .collect::<Vec<_>>()
            .join(","))
    }
}

/// The first bytes of a record's canonical encoding in a content digest: a tag, its offset
/// and its timestamp (big-endian). The rest is the record's key, value and headers as
/// RecordBatch v2 encodes them (zig-zag varint lengths, -1 for null; a header count, then
/// each header's key and value), which is also what the rebuild writes.
fn digest_record_prefix(offset: i64, timestamp: i64) -> [u8; 17] {
    let mut p = [0u8; 17];
    p[0] = b'R';
    p[1..9].copy_from_slice(&offset.to_be_bytes());
    p[9..17].copy_from_slice(&timestamp.to_be_bytes());
    p
}

impl<W: AsyncFileWriter> SegmentEncoder<W> {
    pub fn new(writer: W, info: &ObjectInfo, opts: &EncodeOptions) -> Result<Self, SegmentError> {
        let schema = arrow_schema();
        let props = writer_properties(info, opts)?;
        Ok(SegmentEncoder {
            writer: AsyncArrowWriter::try_new(writer, schema.clone(), Some(props))?,
            schema,
            row_group_bytes: opts.row_group_bytes,
            pending: PendingRows::default(),
            bytes_since_flush: 0,
            base_offset: None,
            next_offset: None,
            records: 0,
            batches: 0,
            min_timestamp: i64::MAX,
            max_timestamp: i64::MIN,
            empty_batches: Vec::new(),
            digests: RowGroupDigests::default(),
            failed: false,
        })
    }

    /// Appends whole RecordBatch v2 batches, concatenated, in offset order, continuing where
    /// the previous push ended. Each batch's CRC and records are checked.
    pub async fn push(&mut self, batches: &[u8]) -> Result<(), SegmentError> {
        if self.failed {
            return Err(SegmentError::Aborted);
        }
        let result = self.push_batches(batches).await;
        self.failed = result.is_err();
        result
    }

    async fn push_batches(&mut self, input: &[u8]) -> Result<(), SegmentError> {
        let mut position = 0;
        while position < input.len() {
            let rest = &input[position..];
            let wire = |source| SegmentError::Wire { position, source };
            let total = BatchHeader::peek_total_len(rest, usize::MAX).map_err(wire)?;
            let bytes = rest.get(..total).ok_or(wire(WireError::Truncated {
                needed: total,
                available: rest.len(),
            }))?;
            let batch = DecodedBatch::decode(bytes, DEFAULT_MAX_DECOMPRESSED).map_err(wire)?;
            self.check_offsets(&batch, position)?;
            self.note_batch(&batch)?;
            position += total;
            self.bytes_since_flush += total;
            if self.bytes_since_flush >= self.row_group_bytes {
                self.write_pending().await?;
                self.writer.flush().await?;
                self.digests.flushed(self.writer.flushed_row_groups().len());
                self.bytes_since_flush = 0;
            } else if self.pending.bytes >= ARROW_CHUNK_BYTES {
                self.write_pending().await?;
            }
        }
        // Rows stay pending across pushes: a caller pushing batch by batch should not make
        // one tiny Arrow batch per push.
        Ok(())
    }

    fn check_offsets(&self, batch: &DecodedBatch, position: usize) -> Result<(), SegmentError> {
        let invalid = |why| SegmentError::Wire {
            position,
            source: WireError::Inconsistent(why),
        };
        let base =
            u64::try_from(batch.header.base_offset).map_err(|_| invalid("negative base offset"))?;
        if let Some(expected) = self.next_offset
            && base != expected
        {
            return Err(SegmentError::Discontiguous {
                expected,
                got: base,
            });
        }
        // Decoding checked that deltas are non-negative and the last is within the batch;
        // the rebuild also needs them strictly ascending.
        if batch.records.windows(2).any(|w| w[0].offset >= w[1].offset) {
            return Err(invalid("record offsets do not ascend"));
        }
        Ok(())
    }

    fn note_batch(&mut self, batch: &DecodedBatch) -> Result<(), SegmentError> {
        let h = &batch.header;
        let base = h.base_offset as u64;
        let last = h.last_offset() as u64;
        self.base_offset.get_or_insert(base);
        self.next_offset = Some(last + 1);
        self.batches += 1;
        self.records += batch.records.len() as u64;
        for r in &batch.records {
            self.min_timestamp = self.min_timestamp.min(r.timestamp);
            self.max_timestamp = self.max_timestamp.max(r.timestamp);
        }
        if batch.records.is_empty() {
            self.empty_batches.push(EmptyBatch {
                base_offset: base,
                last_offset: last,
                attributes: h.attributes & !ATTR_COMPRESSION_MASK,
                generation: h.partition_leader_epoch,
                producer_id: h.producer_id,
                producer_epoch: h.producer_epoch,
                base_sequence: h.base_sequence,
                base_timestamp: h.base_timestamp,
                max_timestamp: h.max_timestamp,
            });
        }
        self.pending.push_batch(batch);
        self.digests.push_batch(batch)
    }

    async fn write_pending(&mut self) -> Result<(), SegmentError> {
        if self.pending.rows() > 0 {
            let rows = self.pending.take(&self.schema)?;
            self.writer.write(&rows).await?;
        }
        Ok(())
    }

    /// Writes the footer (with Felix's key/value metadata) and closes the writer. An object
    /// without records is refused with [`SegmentError::Empty`] and the writer is dropped
    /// unfinished.
    pub async fn finish(self) -> Result<SegmentSummary, SegmentError> {
        self.finish_into_writer().await.map(|(summary, _)| summary)
    }

    async fn finish_into_writer(mut self) -> Result<(SegmentSummary, W), SegmentError> {
        if self.failed {
            return Err(SegmentError::Aborted);
        }
        let (Some(base_offset), Some(next_offset)) = (self.base_offset, self.next_offset) else {
            return Err(SegmentError::Empty);
        };
        if self.records == 0 {
            return Err(SegmentError::Empty);
        }
        self.write_pending().await?;
        let last_offset = next_offset - 1;
        for (key, value) in [
            (KEY_BASE, base_offset.to_string()),
            (KEY_LAST, last_offset.to_string()),
            (KEY_RECORDS, self.records.to_string()),
            (KEY_BATCHES, self.batches.to_string()),
        ] {
            self.writer.append_key_value_metadata(kv(key, value));
        }
        if !self.empty_batches.is_empty() {
            let json = serde_json::to_string(&self.empty_batches)
                .map_err(|e| SegmentError::BadMetadata(e.to_string()))?;
            self.writer
                .append_key_value_metadata(kv(KEY_EMPTY_BATCHES, json));
        }
        let row_groups = self.writer.flushed_row_groups().len()
            + usize::from(self.writer.in_progress_rows() > 0);
        let digests = std::mem::take(&mut self.digests).finish(row_groups)?;
        self.writer
            .append_key_value_metadata(kv(KEY_ROW_GROUP_DIGESTS, digests));
        let meta = self.writer.finish().await?;
        let summary = SegmentSummary {
            base_offset,
            last_offset,
            min_timestamp: self.min_timestamp,
            max_timestamp: self.max_timestamp,
            records: self.records,
            batches: self.batches,
            row_groups: meta.num_row_groups(),
        };
        Ok((summary, self.writer.into_inner()))
    }
}

/// Encodes `batches` (see [`SegmentEncoder::push`]) into an object held in memory.
pub async fn encode_to_bytes(
    batches: &[u8],
    info: &ObjectInfo,
    opts: &EncodeOptions,
) -> Result<(Bytes, SegmentSummary), SegmentError> {
    let mut encoder = SegmentEncoder::new(Vec::<u8>::new(), info, opts)?;
    encoder.push(batches).await?;
    let (summary, bytes) = encoder.finish_into_writer().await?;
    Ok((Bytes::from(bytes), summary))
}

/// Where one row group lies, in offsets, time and bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowGroupInfo {
    /// Base offset of its first batch (row groups tile the object: no gaps, no overlap).
    pub first_offset: u64,
    /// Last offset of its last batch.
    pub last_offset: u64,
    pub min_timestamp: i64,
    pub max_timestamp: i64,
    pub rows: u64,
    /// In the file: from the first column chunk's start to the last one's end.
    pub byte_range: Range<u64>,
    /// The CRC32C of the row group's canonical content (`felix.row_group_digests`), which
    /// [`decode_row_group`] checks the rebuilt batches against. `None` in objects written
    /// before the digests existed: for those only the structure and offsets are checked.
    pub content_digest: Option<u32>,
}

/// The parsed footer of an object: everything needed to pick and fetch row groups.
#[derive(Debug, Clone)]
pub struct ObjectFooter {
    pub file_len: u64,
    pub info: ObjectInfo,
    pub summary: SegmentSummary,
    pub row_groups: Vec<RowGroupInfo>,
    metadata: ArrowReaderMetadata,
    empty_batches: Vec<EmptyBatch>,
}

impl ObjectFooter {
    /// Bytes to fetch from the end of the object to get the footer in one GET, usually.
    pub const SUFFIX_HINT: u64 = 64 * 1024;

    /// Parses the footer from the last `tail.len()` bytes of an object of `file_len` bytes.
    /// If the tail is too short, returns `Ok(Err(needed_suffix_len))` so the caller fetches
    /// that many bytes and retries. The page index is not loaded (row groups are fetched
    /// whole), so the suffix needed is the Parquet footer alone.
    pub fn parse(tail: &[u8], file_len: u64) -> Result<Result<ObjectFooter, u64>, SegmentError> {
        if tail.len() as u64 > file_len {
            return Err(SegmentError::InvalidArgument(format!(
                "a tail of {} bytes from an object of {file_len} bytes",
                tail.len()
            )));
        }
        let mut reader = ParquetMetaDataReader::new().with_page_index_policy(PageIndexPolicy::Skip);
        match reader.try_parse_sized(&Bytes::copy_from_slice(tail), file_len) {
            Ok(()) => {}
            Err(ParquetError::NeedMoreData(needed)) => return Ok(Err(needed as u64)),
            Err(e) => return Err(corrupt("parquet footer", e)),
        }
        let metadata = reader.finish().map_err(|e| corrupt("parquet footer", e))?;
        read_footer(metadata, file_len).map(Ok)
    }

    /// The row group holding `offset`, or the first one after it if `offset` falls in a gap
    /// (or before the object); `None` past the end.
    pub fn row_group_for(&self, offset: u64) -> Option<usize> {
        let i = self
            .row_groups
            .partition_point(|rg| rg.last_offset < offset);
        (i < self.row_groups.len()).then_some(i)
    }

    /// The first row group with a record at or after `timestamp_ms` (by max timestamp);
    /// `None` if none.
    pub fn row_group_for_time(&self, timestamp_ms: i64) -> Option<usize> {
        self.row_groups
            .iter()
            .position(|rg| rg.max_timestamp >= timestamp_ms)
    }

    /// The Parquet metadata (schema, row groups, column chunk statistics).
    pub fn parquet_metadata(&self) -> &Arc<ParquetMetaData> {
        self.metadata.metadata()
    }
}

/// The footer's key/value metadata.
struct FooterKv(HashMap<String, String>);

impl FooterKv {
    fn of(metadata: &ParquetMetaData) -> FooterKv {
        FooterKv(
            metadata
                .file_metadata()
                .key_value_metadata()
                .into_iter()
                .flatten()
                .filter_map(|kv| Some((kv.key.clone(), kv.value.clone()?)))
                .collect(),
        )
    }

    fn text(&self, key: &str) -> Result<String, SegmentError> {
        self.0
            .get(key)
            .cloned()
            .ok_or_else(|| bad(format!("no {key}")))
    }

    fn number<T: std::str::FromStr>(&self, key: &str) -> Result<T, SegmentError> {
        let text = self.text(key)?;
        text.parse()
            .map_err(|_| bad(format!("{key} is {text:?}, not a number")))
    }
}

/// Checks that a parsed Parquet footer is a Felix object this build reads, and extracts
/// what a reader needs from it.
fn read_footer(metadata: ParquetMetaData, file_len: u64) -> Result<ObjectFooter, SegmentError> {
    let kv = FooterKv::of(&metadata);
    let version =
        kv.0.get(KEY_VERSION)
            .ok_or_else(|| SegmentError::NotFelix(format!("no {KEY_VERSION} in the footer")))?;
    let version = match version.parse::<u32>() {
        Ok(v) if (OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&v) => v,
        _ => {
            return Err(SegmentError::UnsupportedVersion {
                found: version.clone(),
            });
        }
    };
    let info = ObjectInfo {
        tenant: kv.text(KEY_TENANT)?,
        namespace: kv.text(KEY_NAMESPACE)?,
        stream: kv.text(KEY_STREAM)?,
        shard: kv.number(KEY_SHARD)?,
    };
    let base_offset: u64 = kv.number(KEY_BASE)?;
    let last_offset: u64 = kv.number(KEY_LAST)?;
    let records: u64 = kv.number(KEY_RECORDS)?;
    let batches: u64 = kv.number(KEY_BATCHES)?;
    if last_offset < base_offset {
        return Err(bad(format!(
            "last offset {last_offset} before base offset {base_offset}"
        )));
    }
    let empty_batches = empty_batches(&kv, base_offset, last_offset)?;

    let metadata = ArrowReaderMetadata::try_new(Arc::new(metadata), ArrowReaderOptions::new())
        .map_err(|e| bad(format!("schema: {e}")))?;
    if metadata.schema().fields() != arrow_schema().fields() {
        return Err(bad(format!(
            "schema {:?} is not Felix's",
            metadata.schema().fields()
        )));
    }
    let mut row_groups = row_group_infos(metadata.metadata(), base_offset, last_offset, file_len)?;
    match row_group_digests(&kv, row_groups.len())? {
        Some(digests) => {
            for (rg, digest) in row_groups.iter_mut().zip(digests) {
                rg.content_digest = Some(digest);
            }
        }
        None if version >= 2 => {
            return Err(SegmentError::Corrupt(format!(
                "a version {version} object without {KEY_ROW_GROUP_DIGESTS}"
            )));
        }
        None => {}
    }
    let rows: u64 = row_groups.iter().map(|rg| rg.rows).sum();
    if rows != records {
        return Err(bad(format!(
            "{KEY_RECORDS} says {records}, the row groups hold {rows}"
        )));
    }
    let summary = SegmentSummary {
        base_offset,
        last_offset,
        min_timestamp: row_groups
            .iter()
            .map(|r| r.min_timestamp)
            .min()
            .unwrap_or(0),
        max_timestamp: row_groups
            .iter()
            .map(|r| r.max_timestamp)
            .max()
            .unwrap_or(0),
        records,
        batches,
        row_groups: row_groups.len(),
    };
    Ok(ObjectFooter {
        file_len,
        info,
        summary,
        row_groups,
        metadata,
        empty_batches,
    })
}

/// The content digest of each row group; `None` for an object written without them.
fn row_group_digests(kv: &FooterKv, row_groups: usize) -> Result<Option<Vec<u32>>, SegmentError> {
    let Some(text) = kv.0.get(KEY_ROW_GROUP_DIGESTS) else {
        return Ok(None);
    };
    let digests = text
        .split(',')
        .map(|d| {
            (d.len() == 8)
                .then(|| u32::from_str_radix(d, 16).ok())
                .flatten()
                .ok_or_else(|| {
                    SegmentError::Corrupt(format!("{KEY_ROW_GROUP_DIGESTS}: {d:?} is not a digest"))
                })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    if digests.len() != row_groups {
        return Err(SegmentError::Corrupt(format!(
            "{KEY_ROW_GROUP_DIGESTS} has {} digests for {row_groups} row groups",
            digests.len()
        )));
    }
    Ok(Some(digests))
}

fn empty_batches(kv: &FooterKv, base: u64, last: u64) -> Result<Vec<EmptyBatch>, SegmentError> {
    let Some(json) = kv.0.get(KEY_EMPTY_BATCHES) else {
        return Ok(Vec::new());
    };
    let empties: Vec<EmptyBatch> =
        serde_json::from_str(json).map_err(|e| bad(format!("{KEY_EMPTY_BATCHES}: {e}")))?;
    let mut next = base;
    for e in &empties {
        if e.base_offset < next || e.last_offset < e.base_offset || e.last_offset > last {
            return Err(bad(format!(
                "empty batch {}..={} out of order or outside the object",
                e.base_offset, e.last_offset
            )));
        }
        next = e.last_offset + 1;
    }
    Ok(empties)
}

/// Where each row group lies. Row groups tile `base..=last`: the first starts at `base`,
/// each other one at its smallest `batch_offset`, and each ends one before the next starts.
fn row_group_infos(
    parquet: &ParquetMetaData,
    base: u64,
    last: u64,
    file_len: u64,
) -> Result<Vec<RowGroupInfo>, SegmentError> {
    let leaf = |name: &str| {
        parquet
            .file_metadata()
            .schema_descr()
            .columns()
            .iter()
            .position(|c| c.path().string() == name)
            .ok_or_else(|| bad(format!("no column {name}")))
    };
    let (offset_col, ts_col, batch_col) =
        (leaf("offset")?, leaf("timestamp")?, leaf("batch_offset")?);
    let mut infos: Vec<RowGroupInfo> = Vec::with_capacity(parquet.num_row_groups());
    // The largest record offset of each row group, checked once its end is known.
    let mut max_offsets = Vec::with_capacity(parquet.num_row_groups());
    for (i, rg) in parquet.row_groups().iter().enumerate() {
        let what = |s: &str| bad(format!("row group {i}: {s}"));
        let rows = u64::try_from(rg.num_rows())
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| what("no rows"))?;
        let stats = |col: usize, name: &str| {
            int64_range(rg, col).ok_or_else(|| what(&format!("no {name} statistics")))
        };
        let (min_offset, max_offset) = stats(offset_col, "offset")?;
        let (min_timestamp, max_timestamp) = stats(ts_col, "timestamp")?;
        let (min_batch, _) = stats(batch_col, "batch_offset")?;
        let first_offset = match infos.last_mut() {
            None => base,
            Some(prev) => {
                let first = u64::try_from(min_batch)
                    .ok()
                    .filter(|&f| f > prev.first_offset)
                    .ok_or_else(|| what("row groups out of offset order"))?;
                prev.last_offset = first - 1;
                first
            }
        };
        if min_batch < first_offset as i64 || min_offset < min_batch || max_offset > last as i64 {
            return Err(what("offsets outside the object's range"));
        }
        max_offsets.push(max_offset as u64);
        infos.push(RowGroupInfo {
            first_offset,
            last_offset: last,
            min_timestamp,
            max_timestamp,
            rows,
            byte_range: byte_range(rg, file_len)
                .ok_or_else(|| what("column chunks outside the file"))?,
            content_digest: None,
        });
    }
    if infos.is_empty() {
        return Err(bad("no row groups".into()));
    }
    for (i, (info, max_offset)) in infos.iter().zip(max_offsets).enumerate() {
        if max_offset > info.last_offset {
            return Err(bad(format!(
                "row group {i}: records past the start of the next row group"
            )));
        }
    }
    Ok(infos)
}

fn bad(message: String) -> SegmentError {
    SegmentError::BadMetadata(message)
}

fn int64_range(rg: &RowGroupMetaData, column: usize) -> Option<(i64, i64)> {
    match rg.columns().get(column)?.statistics()? {
        Statistics::Int64(s) => Some((*s.min_opt()?, *s.max_opt()?)),
        _ => None,
    }
}

/// The bytes of a row group's column chunks. Computed here rather than with
/// `ColumnChunkMetaData::byte_range`, which panics on negative values from a corrupt footer.
fn byte_range(rg: &RowGroupMetaData, file_len: u64) -> Option<Range<u64>> {
    let mut range: Option<Range<u64>> = None;
    for c in rg.columns() {
        let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
        let start = u64::try_from(start).ok()?;
        let end = start.checked_add(u64::try_from(c.compressed_size()).ok()?)?;
        if end > file_len {
            return None;
        }
        range = Some(match range {
            None => start..end,
            Some(r) => r.start.min(start)..r.end.max(end),
        });
    }
    range
}

/// A row group turned back into record batches.
#[derive(Debug, Clone)]
pub struct DecodedRowGroup {
    /// Concatenated RecordBatch v2, offsets ascending, uncompressed, CRCs valid.
    pub batches: Bytes,
    /// Per batch: (first offset, one past last offset, byte range in `batches`).
    pub index: Vec<(u64, u64, Range<usize>)>,
}

impl DecodedRowGroup {
    /// Indexes batches decoded earlier (the cache keeps only the bytes). Checks that every
    /// batch is valid, CRC included (the disk tier can rot too, and these bytes are served
    /// as they are), lies inside the buffer and follows the one before it in offset order.
    /// The batches' content was checked against the row group's digest when they were
    /// rebuilt; their CRCs, sealed then, cover them since.
    pub fn from_batches(batches: Bytes) -> Result<DecodedRowGroup, SegmentError> {
        let mut index = Vec::new();
        let mut at = 0usize;
        let mut expect: Option<u64> = None;
        while at < batches.len() {
            let rest = &batches[at..];
            let (header, len) = BatchHeader::validate(rest, usize::MAX)
                .map_err(|e| corrupt(&format!("cached batch at byte {at}"), e))?;
            let first = u64::try_from(header.base_offset).ok();
            let (Some(first), true) = (first, len <= rest.len()) else {
                return Err(SegmentError::Corrupt(format!(
                    "cached batch at byte {at}: base offset {} or length {len} out of range",
                    header.base_offset
                )));
            };
            if expect.is_some_and(|e| e != first) {
                return Err(SegmentError::Corrupt(format!(
                    "cached batch at byte {at} starts at offset {first}, not {}",
                    expect.unwrap_or_default()
                )));
            }
            let next = first + header.offset_count();
            index.push((first, next, at..at + len));
            expect = Some(next);
            at += len;
        }
        Ok(DecodedRowGroup { batches, index })
    }

    /// Whether the batches hold exactly offsets `first..=last`.
    pub fn covers(&self, first: u64, last: u64) -> bool {
        self.index.first().is_some_and(|b| b.0 == first)
            && self.index.last().is_some_and(|b| b.1 == last + 1)
    }
}

/// Rebuilds the batches of row group `i`. `data` is exactly the bytes of
/// `footer.row_groups[i].byte_range`. CPU-bound: run it off the async executor.
pub fn decode_row_group(
    footer: &ObjectFooter,
    i: usize,
    data: Bytes,
) -> Result<DecodedRowGroup, SegmentError> {
    let rg = footer.row_groups.get(i).ok_or_else(|| {
        SegmentError::InvalidArgument(format!(
            "row group {i} of an object with {}",
            footer.row_groups.len()
        ))
    })?;
    let want = rg.byte_range.end - rg.byte_range.start;
    if data.len() as u64 != want {
        return Err(SegmentError::InvalidArgument(format!(
            "row group {i} is {want} bytes, {} given",
            data.len()
        )));
    }
    let source = RowGroupBytes {
        file_len: footer.file_len,
        start: rg.byte_range.start,
        data,
    };
    let reader =
        ParquetRecordBatchReaderBuilder::new_with_metadata(source, footer.metadata.clone())
            .with_row_groups(vec![i])
            .with_batch_size(READ_BATCH_ROWS)
            .build()
            .map_err(|e| corrupt(&format!("row group {i}"), e))?;
    let empties = footer
        .empty_batches
        .iter()
        .filter(|e| e.base_offset >= rg.first_offset && e.base_offset <= rg.last_offset);
    // The rebuilt batches are a little smaller than the row group's uncompressed column
    // data (offsets and timestamps shrink to varint deltas), so that size, capped, saves
    // the output's regrowth copies.
    let capacity = footer
        .metadata
        .metadata()
        .row_group(i)
        .total_byte_size()
        .clamp(0, MAX_REBUILD_RESERVE as i64) as usize;
    let mut rebuild = Rebuild::new(rg, empties.collect(), capacity);
    rebuild.digest = rg.content_digest.map(|_| 0);
    // The Parquet and Arrow readers can panic on some damaged bytes (a flipped bit in a
    // page's definition levels has made arrow-buffer index out of bounds) instead of
    // returning an error; that is corruption too, and must not take the caller down.
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut rows = 0u64;
        for columns in reader {
            let columns = columns.map_err(|e| corrupt(&format!("row group {i}"), e))?;
            rows += columns.num_rows() as u64;
            rebuild.rows(&Columns::of(&columns)?)?;
        }
        Ok::<u64, SegmentError>(rows)
    }));
    let rows = match read {
        Ok(rows) => rows?,
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            return Err(SegmentError::Corrupt(format!(
                "row group {i}: the Parquet reader failed on its bytes: {why}"
            )));
        }
    };
    if rows != rg.rows {
        return Err(SegmentError::Corrupt(format!(
            "row group {i}: {rows} rows read, the footer says {}",
            rg.rows
        )));
    }
    let (decoded, digest) = rebuild.finish()?;
    // The rebuild has checked that the batches tile exactly first_offset..=last_offset.
    debug_assert!(decoded.covers(rg.first_offset, rg.last_offset));
    if let (Some(want), Some(got)) = (rg.content_digest, digest)
        && want != got
    {
        return Err(SegmentError::Corrupt(format!(
            "row group {i} (offsets {}..={}): content digest mismatch \
             (the footer has {want:08x}, the rebuilt batches {got:08x})",
            rg.first_offset, rg.last_offset
        )));
    }
    Ok(decoded)
}

/// One row group's bytes, served as if they were the whole object: a read outside them is
/// an error (the reader asked for something the footer did not place in this row group).
struct RowGroupBytes {
    file_len: u64,
    start: u64,
    data: Bytes,
}

impl RowGroupBytes {
    fn local(&self, start: u64, len: usize) -> parquet::errors::Result<usize> {
        start
            .checked_sub(self.start)
            .and_then(|at| usize::try_from(at).ok())
            .filter(|at| {
                at.checked_add(len)
                    .is_some_and(|end| end <= self.data.len())
            })
            .ok_or_else(|| {
                ParquetError::General(format!(
                    "read of {len} bytes at {start} outside the fetched range {}..{}",
                    self.start,
                    self.start + self.data.len() as u64
                ))
            })
    }
}

impl Length for RowGroupBytes {
    fn len(&self) -> u64 {
        self.file_len
    }
}

impl ChunkReader for RowGroupBytes {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let at = self.local(start, 0)?;
        Ok(self.data.slice(at..).reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let at = self.local(start, length)?;
        Ok(self.data.slice(at..at + length))
    }
}

/// The columns of one Arrow batch read back, typed.
struct Columns<'a> {
    offset: &'a Int64Array,
    timestamp: &'a TimestampMillisecondArray,
    key: &'a BinaryArray,
    payload: &'a BinaryArray,
    headers: &'a ListArray,
    header_keys: &'a StringArray,
    header_values: &'a BinaryArray,
    producer_id: &'a Int64Array,
    sequence: &'a Int32Array,
    producer_epoch: &'a Int16Array,
    batch_offset: &'a Int64Array,
    batch_attributes: &'a Int16Array,
    generation: &'a Int32Array,
}

impl<'a> Columns<'a> {
    fn of(batch: &'a RecordBatch) -> Result<Columns<'a>, SegmentError> {
        fn col<T: 'static>(b: &RecordBatch, i: usize) -> Result<&T, SegmentError> {
            b.columns()
                .get(i)
                .and_then(|c| c.as_any().downcast_ref::<T>())
                .ok_or_else(|| SegmentError::Corrupt(format!("column {i} has the wrong type")))
        }
        let headers: &ListArray = col(batch, COL_HEADERS)?;
        let entries = headers
            .values()
            .as_any()
            .downcast_ref::<StructArray>()
            .ok_or_else(|| SegmentError::Corrupt("headers are not a list of structs".into()))?;
        let field = |i: usize| entries.columns().get(i).map(|c| c.as_any());
        Ok(Columns {
            offset: col(batch, COL_OFFSET)?,
            timestamp: col(batch, COL_TIMESTAMP)?,
            key: col(batch, COL_KEY)?,
            payload: col(batch, COL_PAYLOAD)?,
            headers,
            header_keys: field(0)
                .and_then(|c| c.downcast_ref())
                .ok_or_else(|| SegmentError::Corrupt("header keys are not text".into()))?,
            header_values: field(1)
                .and_then(|c| c.downcast_ref())
                .ok_or_else(|| SegmentError::Corrupt("header values are not binary".into()))?,
            producer_id: col(batch, COL_PRODUCER_ID)?,
            sequence: col(batch, COL_SEQUENCE)?,
            producer_epoch: col(batch, COL_PRODUCER_EPOCH)?,
            batch_offset: col(batch, COL_BATCH_OFFSET)?,
            batch_attributes: col(batch, COL_BATCH_ATTRIBUTES)?,
            generation: col(batch, COL_GENERATION)?,
        })
    }
}

fn opt<T: arrow::array::ArrowPrimitiveType>(
    a: &arrow::array::PrimitiveArray<T>,
    row: usize,
) -> Option<T::Native> {
    a.is_valid(row).then(|| a.value(row))
}

fn bytes_at(a: &BinaryArray, row: usize) -> Option<&[u8]> {
    a.is_valid(row).then(|| a.value(row))
}

/// The batch being rebuilt: its header fields, and where its bytes start in the output.
struct OpenBatch {
    start: usize,
    base_offset: i64,
    attributes: i16,
    generation: i32,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    base_timestamp: i64,
    max_timestamp: i64,
    count: i32,
    last_record: i64,
}

impl OpenBatch {
    /// Adds the end of the batch's canonical encoding to a content digest: a tag (`B`, or
    /// `E` for a batch without records), then big-endian base offset, last offset (`last`),
    /// attributes without the codec bits, generation, producer ID, producer epoch, base
    /// sequence and record count. A batch without records adds its base and max timestamps:
    /// they come from the footer. A batch with records does not: the rebuild derives them
    /// from the record timestamps (already in the digest), not from the original header.
    fn digest_trailer(&self, crc: u32, last: i64) -> u32 {
        let mut t = [0u8; 1 + 8 + 8 + 2 + 4 + 8 + 2 + 4 + 4 + 16];
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            t[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        put(if self.count == 0 { b"E" } else { b"B" });
        put(&self.base_offset.to_be_bytes());
        put(&last.to_be_bytes());
        put(&self.attributes.to_be_bytes());
        put(&self.generation.to_be_bytes());
        put(&self.producer_id.to_be_bytes());
        put(&self.producer_epoch.to_be_bytes());
        put(&self.base_sequence.to_be_bytes());
        put(&self.count.to_be_bytes());
        if self.count == 0 {
            put(&self.base_timestamp.to_be_bytes());
            put(&self.max_timestamp.to_be_bytes());
        }
        crc32c_append(crc, &t[..at])
    }
}

/// Turns rows back into batches: rows with the same `batch_offset` form one batch, and each
/// batch ends one before the next one starts (the row group's last offset for the last).
struct Rebuild<'a> {
    first_offset: i64,
    last_offset: i64,
    empties: std::iter::Peekable<std::vec::IntoIter<&'a EmptyBatch>>,
    out: Vec<u8>,
    index: Vec<(u64, u64, Range<usize>)>,
    open: Option<OpenBatch>,
    /// Where the next batch must start, when no batch is open.
    expect: i64,
    /// The content digest of what was rebuilt so far, if it is to be checked.
    digest: Option<u32>,
}

impl<'a> Rebuild<'a> {
    /// `capacity`: about the bytes the batches will take, so the output is allocated once.
    fn new(rg: &RowGroupInfo, empties: Vec<&'a EmptyBatch>, capacity: usize) -> Rebuild<'a> {
        Rebuild {
            first_offset: rg.first_offset as i64,
            last_offset: rg.last_offset as i64,
            empties: empties.into_iter().peekable(),
            out: Vec::with_capacity(capacity),
            index: Vec::new(),
            open: None,
            expect: rg.first_offset as i64,
            digest: None,
        }
    }

    fn rows(&mut self, c: &Columns<'_>) -> Result<(), SegmentError> {
        let header_offsets = c.headers.value_offsets();
        for row in 0..c.offset.len() {
            let offset = c.offset.value(row);
            let batch_offset = c.batch_offset.value(row);
            if self.open.as_ref().map(|b| b.base_offset) != Some(batch_offset) {
                self.begin_rows_batch(c, row)?;
            }
            let Some(b) = self.open.as_mut() else {
                return Err(SegmentError::Corrupt("no batch open".into()));
            };
            // Offsets ascend within a batch and stay inside the row group.
            let in_order = (b.count == 0 || offset > b.last_record)
                && offset >= b.base_offset
                && offset <= self.last_offset;
            let delta = i32::try_from(offset.wrapping_sub(b.base_offset))
                .ok()
                .filter(|_| in_order)
                .ok_or_else(|| {
                    SegmentError::Corrupt(format!(
                        "offset {offset} out of order in the batch at {}",
                        b.base_offset
                    ))
                })?;
            let same_batch = c.batch_attributes.value(row) == b.attributes
                && c.generation.value(row) == b.generation
                && opt(c.producer_id, row).unwrap_or(-1) == b.producer_id
                && opt(c.producer_epoch, row).unwrap_or(-1) == b.producer_epoch
                && opt(c.sequence, row)
                    == (b.base_sequence != -1).then(|| b.base_sequence.wrapping_add(delta));
            if !same_batch {
                return Err(SegmentError::Corrupt(format!(
                    "offset {offset}: batch fields differ from the rest of the batch at {}",
                    b.base_offset
                )));
            }
            let timestamp = c.timestamp.value(row);
            if b.count == 0 {
                b.base_timestamp = timestamp;
                b.max_timestamp = timestamp;
            }
            b.max_timestamp = b.max_timestamp.max(timestamp);
            b.count = b
                .count
                .checked_add(1)
                .ok_or_else(|| SegmentError::Corrupt("batch with too many records".into()))?;
            b.last_record = offset;

            if c.headers.is_null(row) {
                return Err(SegmentError::Corrupt(format!(
                    "offset {offset}: null headers"
                )));
            }
            let (from, to) = (
                header_offsets[row] as usize,
                header_offsets[row + 1] as usize,
            );
            if let Some(h) = (from..to).find(|&h| !c.header_keys.is_valid(h)) {
                return Err(SegmentError::Corrupt(format!(
                    "offset {offset}: null header key {}",
                    h - from
                )));
            }
            // The record goes straight into the output: its length prefix comes first, so
            // it is computed from the fields rather than by encoding the record twice.
            let ts_delta = timestamp.wrapping_sub(b.base_timestamp);
            let (key, payload) = (bytes_at(c.key, row), bytes_at(c.payload, row));
            let mut len = 1
                + varlong_len(ts_delta)
                + varlong_len(delta as i64)
                + nullable_len(key)?
                + nullable_len(payload)?
                + varlong_len((to - from) as i64);
            for h in from..to {
                len += nullable_len(Some(c.header_keys.value(h).as_bytes()))?
                    + nullable_len(bytes_at(c.header_values, h))?;
            }
            let out = &mut self.out;
            put_varlong(out, len as i64);
            let record_start = out.len();
            out.push(0); // record attributes: unused in v2
            put_varlong(out, ts_delta);
            put_varlong(out, delta as i64);
            let body_start = out.len();
            put_nullable(out, key)?;
            put_nullable(out, payload)?;
            put_varlong(out, (to - from) as i64);
            for h in from..to {
                put_nullable(out, Some(c.header_keys.value(h).as_bytes()))?;
                put_nullable(out, bytes_at(c.header_values, h))?;
            }
            debug_assert_eq!(out.len() - record_start, len, "record length prefix");
            // The record's canonical encoding ends with the bytes just written: key, value
            // and headers, as the encoder digested them from the pushed batch.
            if let Some(d) = self.digest.as_mut() {
                *d = crc32c_append(*d, &digest_record_prefix(offset, timestamp));
                *d = crc32c_append(*d, &out[body_start..]);
            }
        }
        Ok(())
    }

    /// Closes the open batch (if any) and opens the one whose first row is `row`, after any
    /// empty batch that lies between them.
    fn begin_rows_batch(&mut self, c: &Columns<'_>, row: usize) -> Result<(), SegmentError> {
        let base = c.batch_offset.value(row);
        while let Some(e) = self.empties.next_if(|e| (e.base_offset as i64) < base) {
            self.begin(e.base_offset as i64)?;
            self.write_empty(e)?;
        }
        self.begin(base)?;
        let attributes = c.batch_attributes.value(row);
        if attributes & ATTR_COMPRESSION_MASK != 0 {
            return Err(SegmentError::Corrupt(format!(
                "batch at {base}: attributes {attributes:#x} name a codec"
            )));
        }
        let first_delta = c.offset.value(row).wrapping_sub(base) as i32;
        self.open = Some(OpenBatch {
            start: self.out.len(),
            base_offset: base,
            attributes,
            generation: c.generation.value(row),
            producer_id: opt(c.producer_id, row).unwrap_or(-1),
            producer_epoch: opt(c.producer_epoch, row).unwrap_or(-1),
            base_sequence: opt(c.sequence, row).map_or(-1, |s| s.wrapping_sub(first_delta)),
            base_timestamp: 0,
            max_timestamp: 0,
            count: 0,
            last_record: base,
        });
        self.out.resize(self.out.len() + BATCH_HEADER_LEN, 0);
        Ok(())
    }

    /// A batch starts at `base`: closes the open one just before it, or checks that `base`
    /// is where the previous batch ended.
    fn begin(&mut self, base: i64) -> Result<(), SegmentError> {
        match self.open.take() {
            Some(b) if base > b.last_record && base > b.base_offset => self.close(b, base - 1),
            Some(b) => Err(SegmentError::Corrupt(format!(
                "batch at {base} overlaps the batch at {}",
                b.base_offset
            ))),
            None if base == self.expect => Ok(()),
            None => Err(SegmentError::Corrupt(format!(
                "batch at {base}, expected one at {} (the row group starts at {})",
                self.expect, self.first_offset
            ))),
        }
    }

    fn write_empty(&mut self, e: &EmptyBatch) -> Result<(), SegmentError> {
        let b = OpenBatch {
            start: self.out.len(),
            base_offset: e.base_offset as i64,
            attributes: e.attributes,
            generation: e.generation,
            producer_id: e.producer_id,
            producer_epoch: e.producer_epoch,
            base_sequence: e.base_sequence,
            base_timestamp: e.base_timestamp,
            max_timestamp: e.max_timestamp,
            count: 0,
            last_record: e.base_offset as i64,
        };
        self.out.resize(self.out.len() + BATCH_HEADER_LEN, 0);
        self.close(b, e.last_offset as i64)
    }

    /// Fills in the header of `b`, which ends at `last` (inclusive), and seals its CRC.
    fn close(&mut self, b: OpenBatch, last: i64) -> Result<(), SegmentError> {
        let last_offset_delta = last
            .checked_sub(b.base_offset)
            .and_then(|d| i32::try_from(d).ok())
            .filter(|&d| d >= 0 && last <= self.last_offset)
            .ok_or_else(|| {
                SegmentError::Corrupt(format!(
                    "batch at {} cannot end at {last} (row group ends at {})",
                    b.base_offset, self.last_offset
                ))
            })?;
        let batch = &mut self.out[b.start..];
        let batch_length = i32::try_from(batch.len() - LOG_OVERHEAD)
            .map_err(|_| SegmentError::Corrupt(format!("batch at {} over 2 GiB", b.base_offset)))?;
        let mut h = Vec::with_capacity(BATCH_HEADER_LEN);
        h.extend_from_slice(&b.base_offset.to_be_bytes());
        h.extend_from_slice(&batch_length.to_be_bytes());
        h.extend_from_slice(&b.generation.to_be_bytes());
        h.push(MAGIC_V2 as u8);
        h.extend_from_slice(&[0; 4]); // crc, sealed below
        h.extend_from_slice(&b.attributes.to_be_bytes());
        h.extend_from_slice(&last_offset_delta.to_be_bytes());
        h.extend_from_slice(&b.base_timestamp.to_be_bytes());
        h.extend_from_slice(&b.max_timestamp.to_be_bytes());
        h.extend_from_slice(&b.producer_id.to_be_bytes());
        h.extend_from_slice(&b.producer_epoch.to_be_bytes());
        h.extend_from_slice(&b.base_sequence.to_be_bytes());
        h.extend_from_slice(&b.count.to_be_bytes());
        batch[..BATCH_HEADER_LEN].copy_from_slice(&h);
        seal_crc(batch).map_err(|e| corrupt(&format!("rebuilt batch at {}", b.base_offset), e))?;
        if let Some(d) = self.digest.as_mut() {
            *d = b.digest_trailer(*d, last);
        }
        self.index.push((
            b.base_offset as u64,
            last as u64 + 1,
            b.start..self.out.len(),
        ));
        self.expect = last + 1;
        Ok(())
    }

    /// The rebuilt row group, and its content digest if that was asked for.
    fn finish(mut self) -> Result<(DecodedRowGroup, Option<u32>), SegmentError> {
        while let Some(e) = self.empties.next() {
            self.begin(e.base_offset as i64)?;
            self.write_empty(e)?;
        }
        match self.open.take() {
            Some(b) => self.close(b, self.last_offset)?,
            None if self.expect == self.last_offset + 1 => {}
            None => {
                return Err(SegmentError::Corrupt(format!(
                    "the row group's batches end before {}, not at its last offset {}",
                    self.expect, self.last_offset
                )));
            }
        }
        let decoded = DecodedRowGroup {
            batches: Bytes::from(self.out),
            index: self.index,
        };
        Ok((decoded, self.digest))
    }
}

/// Stores the CRC32C of a batch whose other fields are final, and checks that the rebuilt
/// header parses.
fn seal_crc(batch: &mut [u8]) -> Result<(), WireError> {
    BatchHeader::parse(batch)?;
    felix_wire::batch::seal_crc(batch);
    Ok(())
}

fn put_varlong(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// Bytes `put_varlong` writes for `v`.
fn varlong_len(v: i64) -> usize {
    let z = ((v << 1) ^ (v >> 63)) as u64;
    (64 - (z | 1).leading_zeros() as usize).div_ceil(7)
}

/// Bytes `put_nullable` writes for `v`.
fn nullable_len(v: Option<&[u8]>) -> Result<usize, SegmentError> {
    Ok(match v {
        None => varlong_len(-1),
        Some(b) => {
            let len = i32::try_from(b.len())
                .map_err(|_| SegmentError::Corrupt("field over 2 GiB".into()))?;
            varlong_len(len as i64) + b.len()
        }
    })
}

fn put_nullable(out: &mut Vec<u8>, v: Option<&[u8]>) -> Result<(), SegmentError> {
    match v {
        None => put_varlong(out, -1),
        Some(b) => {
            let len = i32::try_from(b.len())
                .map_err(|_| SegmentError::Corrupt("field over 2 GiB".into()))?;
            put_varlong(out, len as i64);
            out.extend_from_slice(b);
        }
    }
    Ok(())
}
