//! Turning one row group back into record batches. Decides how rows regroup into batches
//! (rows with the same `batch_offset` form one, each batch ends one before the next starts,
//! batches without records come back from the footer) and how the batches are written: with
//! felix-wire's record writer ([`RecordFields`]) and header writer ([`seal_batch`]),
//! uncompressed, CRCs sealed. Invariant: a row group is returned only whole, tiling exactly
//! its offset range, and, when the footer has a content digest, only if the rebuilt content
//! matches it; damaged bytes are an error, never a panic or a wrong read.

use std::ops::Range;

use arrow::array::{
    Array, BinaryArray, Int16Array, Int32Array, Int64Array, ListArray, RecordBatch, StringArray,
    StructArray, TimestampMillisecondArray,
};
use bytes::{Buf, Bytes};
use crc32c::crc32c_append;
use felix_wire::batch::{ATTR_COMPRESSION_MASK, BATCH_HEADER_LEN, MAGIC_V2, seal_batch};
use felix_wire::{BatchHeader, RecordFields};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::errors::ParquetError;
use parquet::file::reader::{ChunkReader, Length};

use super::digest::{DigestKind, batch_trailer, digest_record_prefix};
use super::footer::{ObjectFooter, RowGroupInfo};
use super::{
    COL_BATCH_ATTRIBUTES, COL_BATCH_OFFSET, COL_GENERATION, COL_HEADERS, COL_KEY, COL_OFFSET,
    COL_PAYLOAD, COL_PRODUCER_EPOCH, COL_PRODUCER_ID, COL_SEQUENCE, COL_TIMESTAMP, EmptyBatch,
    SegmentError, corrupt,
};

/// About how many bytes of column data one Arrow batch read back holds. The Arrow reader
/// reserves a batch's value buffer page by page and doubles it when a page does not fit, and
/// every doubling copies what the batch holds so far: at 8,192 rows of 1 KiB, eight pages a
/// batch, seven eighths of the payload were copied once more (about 4% of a broker's CPU
/// during a cold replay, profiled). A batch well under one page (1 MiB by default) mostly
/// fits the first reservation.
const READ_BATCH_BYTES: u64 = 256 << 10;
/// Bounds of the rows per Arrow batch: small rows still come in batches large enough that
/// the per-batch work is negligible, and large row counts stay as before.
const READ_BATCH_ROWS: std::ops::RangeInclusive<u64> = 64..=8192;
/// Most a row group's rebuild allocates up front (a hint; the output grows past it).
const MAX_REBUILD_RESERVE: usize = 64 << 20;
/// Bytes a rebuilt record may take beyond its column data: its length, attributes,
/// timestamp and offset deltas and header count as varints, and its share of the batch's
/// 61-byte header. Reserving them up front saves the copy of the whole output that growing
/// past a too-small reservation costs (the column data is dictionary- and delta-encoded, so
/// its size alone falls short of the rebuilt batches).
const REBUILT_RECORD_OVERHEAD: u64 = 24;

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
    let column_bytes = footer
        .metadata
        .metadata()
        .row_group(i)
        .total_byte_size()
        .max(0) as u64;
    let batch_rows = (READ_BATCH_BYTES * rg.rows)
        .checked_div(column_bytes)
        .unwrap_or(*READ_BATCH_ROWS.end())
        .clamp(*READ_BATCH_ROWS.start(), *READ_BATCH_ROWS.end());
    let reader =
        ParquetRecordBatchReaderBuilder::new_with_metadata(source, footer.metadata.clone())
            .with_row_groups(vec![i])
            .with_batch_size(batch_rows as usize)
            .build()
            .map_err(|e| corrupt(&format!("row group {i}"), e))?;
    let empties = footer
        .empty_batches
        .iter()
        .filter(|e| e.base_offset >= rg.first_offset && e.base_offset <= rg.last_offset);
    // The column data plus each record's framing, capped: the output is allocated once.
    let capacity = column_bytes
        .saturating_add(rg.rows.saturating_mul(REBUILT_RECORD_OVERHEAD))
        .min(MAX_REBUILD_RESERVE as u64) as usize;
    let mut rebuild = Rebuild::new(rg, empties.collect(), capacity);
    rebuild.digest = rg
        .content_digest
        .filter(|_| super::digest_switch::content_digests_checked())
        .map(|_| (footer.digest_kind, 0));
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
/// The batch being rebuilt: its header as far as the rows so far tell it, where its bytes
/// start in the output, and the offset of its last record.
struct OpenBatch {
    start: usize,
    header: BatchHeader,
    last_record: i64,
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
    digest: Option<(DigestKind, u32)>,
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
            if self.open.as_ref().map(|b| b.header.base_offset) != Some(batch_offset) {
                self.begin_rows_batch(c, row)?;
            }
            let Some(b) = self.open.as_mut() else {
                return Err(SegmentError::Corrupt("no batch open".into()));
            };
            let h = &mut b.header;
            // Offsets ascend within a batch and stay inside the row group.
            let in_order = (h.records_count == 0 || offset > b.last_record)
                && offset >= h.base_offset
                && offset <= self.last_offset;
            let delta = i32::try_from(offset.wrapping_sub(h.base_offset))
                .ok()
                .filter(|_| in_order)
                .ok_or_else(|| {
                    SegmentError::Corrupt(format!(
                        "offset {offset} out of order in the batch at {}",
                        h.base_offset
                    ))
                })?;
            let same_batch = c.batch_attributes.value(row) == h.attributes
                && c.generation.value(row) == h.partition_leader_epoch
                && opt(c.producer_id, row).unwrap_or(-1) == h.producer_id
                && opt(c.producer_epoch, row).unwrap_or(-1) == h.producer_epoch
                && opt(c.sequence, row)
                    == (h.base_sequence != -1).then(|| h.base_sequence.wrapping_add(delta));
            if !same_batch {
                return Err(SegmentError::Corrupt(format!(
                    "offset {offset}: batch fields differ from the rest of the batch at {}",
                    h.base_offset
                )));
            }
            let timestamp = c.timestamp.value(row);
            if h.records_count == 0 {
                h.base_timestamp = timestamp;
                h.max_timestamp = timestamp;
            }
            h.max_timestamp = h.max_timestamp.max(timestamp);
            h.records_count = h
                .records_count
                .checked_add(1)
                .ok_or_else(|| SegmentError::Corrupt("batch with too many records".into()))?;
            let timestamp_delta = timestamp.wrapping_sub(h.base_timestamp);
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
            let record = RecordFields {
                timestamp_delta,
                offset_delta: delta,
                key: bytes_at(c.key, row),
                value: bytes_at(c.payload, row),
                headers: (from..to).map(|h| {
                    (
                        c.header_keys.value(h).as_bytes(),
                        bytes_at(c.header_values, h),
                    )
                }),
            };
            let body_start = record
                .put(&mut self.out)
                .map_err(|e| corrupt(&format!("offset {offset}"), e))?;
            // Version 1 and 2 digests: the record's canonical encoding ends with its body,
            // just written: key, value and headers, as the encoder digested them from the
            // pushed batch. (Version 3 digests take the batch's header when it is sealed.)
            if let Some((DigestKind::Records, d)) = self.digest.as_mut() {
                *d = crc32c_append(*d, &digest_record_prefix(offset, timestamp));
                *d = crc32c_append(*d, &self.out[body_start..]);
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
        self.open_batch(
            BatchHeader {
                partition_leader_epoch: c.generation.value(row),
                attributes,
                producer_id: opt(c.producer_id, row).unwrap_or(-1),
                producer_epoch: opt(c.producer_epoch, row).unwrap_or(-1),
                base_sequence: opt(c.sequence, row).map_or(-1, |s| s.wrapping_sub(first_delta)),
                ..header_at(base)
            },
            base,
        );
        Ok(())
    }

    /// Starts a batch with `header` (its timestamps and record count still to come from its
    /// rows), leaving room for the header in the output.
    fn open_batch(&mut self, header: BatchHeader, last_record: i64) {
        self.open = Some(OpenBatch {
            start: self.out.len(),
            header,
            last_record,
        });
        self.out.resize(self.out.len() + BATCH_HEADER_LEN, 0);
    }

    /// A batch starts at `base`: closes the open one just before it, or checks that `base`
    /// is where the previous batch ended.
    fn begin(&mut self, base: i64) -> Result<(), SegmentError> {
        match self.open.take() {
            Some(b) if base > b.last_record && base > b.header.base_offset => {
                self.close(b, base - 1)
            }
            Some(b) => Err(SegmentError::Corrupt(format!(
                "batch at {base} overlaps the batch at {}",
                b.header.base_offset
            ))),
            None if base == self.expect => Ok(()),
            None => Err(SegmentError::Corrupt(format!(
                "batch at {base}, expected one at {} (the row group starts at {})",
                self.expect, self.first_offset
            ))),
        }
    }

    fn write_empty(&mut self, e: &EmptyBatch) -> Result<(), SegmentError> {
        let base = e.base_offset as i64;
        self.open_batch(
            BatchHeader {
                partition_leader_epoch: e.generation,
                attributes: e.attributes,
                base_timestamp: e.base_timestamp,
                max_timestamp: e.max_timestamp,
                producer_id: e.producer_id,
                producer_epoch: e.producer_epoch,
                base_sequence: e.base_sequence,
                ..header_at(base)
            },
            base,
        );
        match self.open.take() {
            Some(b) => self.close(b, e.last_offset as i64),
            None => Err(SegmentError::Corrupt("no batch open".into())),
        }
    }

    /// Writes the header of `b`, which ends at `last` (inclusive), with felix-wire's header
    /// writer, which also seals its CRC.
    fn close(&mut self, mut b: OpenBatch, last: i64) -> Result<(), SegmentError> {
        let base = b.header.base_offset;
        b.header.last_offset_delta = last
            .checked_sub(base)
            .and_then(|d| i32::try_from(d).ok())
            .filter(|&d| d >= 0 && last <= self.last_offset)
            .ok_or_else(|| {
                SegmentError::Corrupt(format!(
                    "batch at {base} cannot end at {last} (row group ends at {})",
                    self.last_offset
                ))
            })?;
        seal_batch(&mut self.out[b.start..], &b.header)
            .map_err(|e| corrupt(&format!("rebuilt batch at {base}"), e))?;
        match self.digest.as_mut() {
            Some((DigestKind::Records, d)) => *d = batch_trailer(*d, &b.header, last),
            // The sealed header: its CRC covers everything after it.
            Some((DigestKind::BatchHeaders, d)) => {
                *d = crc32c_append(*d, &self.out[b.start..b.start + BATCH_HEADER_LEN])
            }
            None => {}
        }
        self.index
            .push((base as u64, last as u64 + 1, b.start..self.out.len()));
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
        Ok((decoded, self.digest.map(|(_, d)| d)))
    }
}

/// The header of a rebuilt batch at `base` before anything else is known: no records, no
/// producer, generation 0 (length and CRC are filled in when it is sealed).
fn header_at(base: i64) -> BatchHeader {
    BatchHeader {
        base_offset: base,
        batch_length: 0,
        partition_leader_epoch: 0,
        magic: MAGIC_V2,
        crc: 0,
        attributes: 0,
        last_offset_delta: 0,
        base_timestamp: 0,
        max_timestamp: 0,
        producer_id: -1,
        producer_epoch: -1,
        base_sequence: -1,
        records_count: 0,
    }
}
