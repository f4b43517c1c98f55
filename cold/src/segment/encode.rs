//! Writing an object: record batches in, Parquet out. Decides where row groups end (at the
//! first batch boundary after `row_group_bytes` of input, never inside a batch), how pages
//! are laid out and compressed, and what goes in the footer. Invariant: every pushed batch
//! is decoded and checked (CRC, records, contiguous offsets) before any of its rows is
//! written, and an encoder that failed once refuses all further work, so an object is
//! either complete and correct or never finished.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryBuilder, Int16Array, Int16Builder, Int32Array, Int32Builder, Int64Array,
    Int64Builder, ListArray, RecordBatch, StringBuilder, StructArray, TimestampMillisecondArray,
};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use felix_wire::batch::ATTR_COMPRESSION_MASK;
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{BatchHeader, DecodedBatch, WireError};
use parquet::arrow::async_writer::{AsyncArrowWriter, AsyncFileWriter};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::SortingColumn;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use super::digest::RowGroupDigests;
use super::{
    COL_OFFSET, EmptyBatch, EncodeOptions, FORMAT_VERSION, KEY_BASE, KEY_BATCHES,
    KEY_EMPTY_BATCHES, KEY_LAST, KEY_NAMESPACE, KEY_RECORDS, KEY_ROW_GROUP_DIGESTS, KEY_SHARD,
    KEY_STREAM, KEY_TENANT, KEY_VERSION, ObjectInfo, SegmentError, SegmentSummary, arrow_schema,
    header_element, header_fields, kv,
};

/// Rows per data page: small enough that a reader pruning on `offset` or `timestamp` through
/// the page index skips most of a row group, large enough that page headers stay negligible.
const PAGE_ROWS: usize = 8192;
/// The columns written without compression (see `writer_properties`).
const UNCOMPRESSED_COLUMNS: [&str; 8] = [
    "offset",
    "timestamp",
    "producer_id",
    "sequence",
    "producer_epoch",
    "batch_offset",
    "batch_attributes",
    "generation",
];
/// A page of users' bytes is stored compressed only if zstd saves at least this share of it
/// (see `writer_properties`).
const MIN_ZSTD_SAVING: f64 = 0.05;
/// Input records are handed to the Parquet writer in chunks of about this many bytes, so a
/// large push does not build one huge Arrow batch (Arrow binary columns address 2 GiB).
const ARROW_CHUNK_BYTES: usize = 8 << 20;

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
    // Felix's own numbers are stored without zstd: delta or dictionary encoding already
    // shrinks them to a few bytes per page, and every compressed column chunk costs a
    // reader (the broker's cold decode, once per row group) a new zstd compression and
    // decompression context from the Parquet crate's codec, about 3% of a cold read's CPU
    // when all twelve columns had one. Keys, payloads and headers (the users' bytes) keep
    // zstd.
    for name in UNCOMPRESSED_COLUMNS {
        b = b.set_column_compression(col(name), Compression::UNCOMPRESSED);
    }
    // Data pages of version 2 say, page by page, whether their values are compressed: a
    // page zstd shrinks by less than [`MIN_ZSTD_SAVING`] is stored as it is, so reading it
    // back is a slice of the fetched bytes instead of a zstd pass that only copies (users'
    // bytes are often incompressible: encrypted, or compressed by the producer; that copy
    // was 4% of a cold replay's CPU). Version 2 also changes the encodings a column falls
    // back to when its dictionary fills up (DELTA_BYTE_ARRAY for bytes, costly to decode):
    // the byte columns are pinned to PLAIN, as version 1 wrote them. Readers need no
    // change: every Parquet reader reads both page versions, and objects of either mix.
    b = b
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_data_page_v2_compression_ratio_threshold(1.0 - MIN_ZSTD_SAVING);
    for path in [
        col("key"),
        col("payload"),
        header_col("key"),
        header_col("value"),
    ] {
        b = b.set_column_encoding(path, Encoding::PLAIN);
    }
    // Nobody prunes on payload bytes; min/max of them would only fatten the page index.
    b = b
        .set_column_dictionary_enabled(col("payload"), false)
        .set_column_statistics_enabled(col("payload"), EnabledStatistics::None)
        .set_column_statistics_enabled(header_col("key"), EnabledStatistics::None)
        .set_column_statistics_enabled(header_col("value"), EnabledStatistics::None);
    Ok(b.build())
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
