//! The records inside a RecordBatch v2: varint-framed records, optionally compressed as one
//! block with gzip, snappy, lz4 or zstd. [`BatchBuilder`] encodes a batch the way a Kafka
//! producer would; [`DecodedBatch::decode`] reads any batch a Kafka client may send.
//!
//! Record layout (varints are zig-zag, as in Kafka):
//!
//! ```text
//! length varint | attributes i8 | timestamp_delta varlong | offset_delta varint
//! key_length varint (-1 = null) | key | value_length varint (-1 = null) | value
//! header_count varint | { key_length varint | key (utf-8) | value_length varint | value }*
//! ```

use bytes::Bytes;

use crate::batch::{BATCH_HEADER_LEN, BatchHeader, MAGIC_V2, seal_batch};
use crate::codec::{Compression, compress, decompress, decompressed_len};
use crate::error::WireError;

/// A record header: a UTF-8 key and an optional value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub key: String,
    pub value: Option<Bytes>,
}

/// One record with absolute offset and timestamp (milliseconds since the Unix epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<Header>,
}

impl Record {
    /// A record with a value and nothing else; offset and timestamp are set by the builder
    /// and the log.
    pub fn value(timestamp: i64, value: impl Into<Bytes>) -> Record {
        Record {
            offset: 0,
            timestamp,
            key: None,
            value: Some(value.into()),
            headers: Vec::new(),
        }
    }
}

/// A batch decoded into its header and records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedBatch {
    pub header: BatchHeader,
    pub records: Vec<Record>,
}

/// Default cap on a batch's decompressed records, so a small compressed batch cannot make a
/// decoder allocate without bound.
pub const DEFAULT_MAX_DECOMPRESSED: usize = 256 * 1024 * 1024;

impl DecodedBatch {
    /// Validates and decodes the whole batch at the start of `buf`, decompressing at most
    /// `max_decompressed` bytes of records. Trailing bytes after the batch are ignored.
    pub fn decode(buf: &[u8], max_decompressed: usize) -> Result<DecodedBatch, WireError> {
        Self::decode_from(buf, None, max_decompressed)
    }

    /// [`DecodedBatch::decode`] without copying keys, values and header values: they are
    /// slices of `buf` (or, for a compressed batch, of its decompressed records), so the
    /// records keep that memory alive. For readers that hand records on whole, like a
    /// subscriber.
    pub fn decode_shared(buf: &Bytes, max_decompressed: usize) -> Result<DecodedBatch, WireError> {
        Self::decode_from(buf, Some(buf), max_decompressed)
    }

    /// [`DecodedBatch::decode_shared`] of a batch whose header [`BatchHeader::validate`]
    /// (or [`crate::batch::BatchIter`]) has just returned: the CRC is not computed a second
    /// time. Everything else is checked as usual, so a header that does not belong to `buf`
    /// is an error, never a wrong read.
    pub fn decode_shared_validated(
        buf: &Bytes,
        header: BatchHeader,
        max_decompressed: usize,
    ) -> Result<DecodedBatch, WireError> {
        let total = header.total_len();
        if buf.len() < total {
            return Err(WireError::Truncated {
                needed: total,
                available: buf.len(),
            });
        }
        Self::decode_body(buf, header, total, Some(buf), max_decompressed)
    }

    fn decode_from(
        buf: &[u8],
        owner: Option<&Bytes>,
        max_decompressed: usize,
    ) -> Result<DecodedBatch, WireError> {
        let (header, total) = BatchHeader::validate(buf, usize::MAX)?;
        Self::decode_body(buf, header, total, owner, max_decompressed)
    }

    fn decode_body(
        buf: &[u8],
        header: BatchHeader,
        total: usize,
        owner: Option<&Bytes>,
        max_decompressed: usize,
    ) -> Result<DecodedBatch, WireError> {
        if total < BATCH_HEADER_LEN {
            return Err(WireError::Inconsistent("batch shorter than its header"));
        }
        let body = &buf[BATCH_HEADER_LEN..total];
        let codec = header.compression()?;
        let decompressed;
        let (records_bytes, owner): (&[u8], Option<&Bytes>) = match codec {
            Compression::None => (body, owner),
            other => {
                decompressed = Bytes::from(decompress(other, body, max_decompressed)?);
                (&decompressed, owner.map(|_| &decompressed))
            }
        };
        let count = header.records_count as usize;
        // Each record takes at least 7 bytes, so a count larger than that is a lie we can
        // refuse before allocating for it.
        if count > records_bytes.len() / 7 + 1 {
            return Err(WireError::Inconsistent(
                "record count exceeds what the bytes can hold",
            ));
        }
        let mut records = Vec::with_capacity(count);
        let mut cur = Cursor {
            buf: records_bytes,
            owner,
            pos: 0,
        };
        for index in 0..count {
            records.push(decode_record(&mut cur, &header, index)?);
        }
        if cur.pos != records_bytes.len() {
            return Err(WireError::Inconsistent(
                "bytes left over after the last record",
            ));
        }
        if let Some(last) = records.last()
            && last.offset > header.last_offset()
        {
            return Err(WireError::Inconsistent(
                "record offset past the batch's last offset",
            ));
        }
        Ok(DecodedBatch { header, records })
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    /// The `Bytes` that `buf` lies in, when fields may be slices of it instead of copies.
    owner: Option<&'a Bytes>,
    pos: usize,
}

impl Cursor<'_> {
    fn byte(&mut self, index: usize) -> Result<u8, WireError> {
        let b = *self.buf.get(self.pos).ok_or(WireError::MalformedRecord {
            index,
            reason: "record ends early",
        })?;
        self.pos += 1;
        Ok(b)
    }
    fn varlong(&mut self, index: usize) -> Result<i64, WireError> {
        let mut value: u64 = 0;
        for shift in (0..70).step_by(7) {
            let b = self.byte(index)?;
            if shift == 63 && b > 1 {
                return Err(WireError::MalformedRecord {
                    index,
                    reason: "varint overflows 64 bits",
                });
            }
            value |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
            }
        }
        Err(WireError::MalformedRecord {
            index,
            reason: "varint longer than 10 bytes",
        })
    }
    fn varint(&mut self, index: usize) -> Result<i32, WireError> {
        let v = self.varlong(index)?;
        i32::try_from(v).map_err(|_| WireError::MalformedRecord {
            index,
            reason: "varint overflows 32 bits",
        })
    }
    fn bytes(&mut self, len: usize, index: usize) -> Result<&[u8], WireError> {
        let end = self
            .pos
            .checked_add(len)
            .filter(|&e| e <= self.buf.len())
            .ok_or(WireError::MalformedRecord {
                index,
                reason: "field longer than the record",
            })?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }
    fn nullable(&mut self, index: usize) -> Result<Option<Bytes>, WireError> {
        let len = self.varint(index)?;
        match len {
            -1 => Ok(None),
            n if n < -1 => Err(WireError::MalformedRecord {
                index,
                reason: "negative field length",
            }),
            n => {
                let owner = self.owner;
                let field = self.bytes(n as usize, index)?;
                Ok(Some(match owner {
                    Some(o) => o.slice_ref(field),
                    None => Bytes::copy_from_slice(field),
                }))
            }
        }
    }
}

fn decode_record(cur: &mut Cursor<'_>, h: &BatchHeader, index: usize) -> Result<Record, WireError> {
    let length = cur.varint(index)?;
    if length < 0 {
        return Err(WireError::MalformedRecord {
            index,
            reason: "negative record length",
        });
    }
    let start = cur.pos;
    let end = start
        .checked_add(length as usize)
        .filter(|&e| e <= cur.buf.len())
        .ok_or(WireError::MalformedRecord {
            index,
            reason: "record length past the end of the batch",
        })?;
    let _attributes = cur.byte(index)?;
    let timestamp_delta = cur.varlong(index)?;
    let offset_delta = cur.varint(index)?;
    if offset_delta < 0 {
        return Err(WireError::MalformedRecord {
            index,
            reason: "negative offset delta",
        });
    }
    let key = cur.nullable(index)?;
    let value = cur.nullable(index)?;
    let header_count = cur.varint(index)?;
    if header_count < 0 || header_count as usize > end.saturating_sub(cur.pos) {
        return Err(WireError::MalformedRecord {
            index,
            reason: "impossible header count",
        });
    }
    let mut headers = Vec::with_capacity(header_count as usize);
    for _ in 0..header_count {
        let key_len = cur.varint(index)?;
        if key_len < 0 {
            return Err(WireError::MalformedRecord {
                index,
                reason: "null header key",
            });
        }
        let key = std::str::from_utf8(cur.bytes(key_len as usize, index)?)
            .map_err(|_| WireError::MalformedRecord {
                index,
                reason: "header key is not utf-8",
            })?
            .to_owned();
        let value = cur.nullable(index)?;
        headers.push(Header { key, value });
    }
    if cur.pos != end {
        return Err(WireError::MalformedRecord {
            index,
            reason: "record length disagrees with its fields",
        });
    }
    let timestamp = if h.is_log_append_time() {
        h.max_timestamp
    } else {
        h.base_timestamp.wrapping_add(timestamp_delta)
    };
    Ok(Record {
        offset: h.base_offset.wrapping_add(offset_delta as i64),
        timestamp,
        key,
        value,
        headers,
    })
}

/// One record's fields as RecordBatch v2 lays them out, borrowed from wherever the caller
/// keeps them (a [`Record`], or the columns of a cold object being rebuilt). Offsets and
/// timestamps are deltas from the batch's base offset and base timestamp.
#[derive(Debug, Clone)]
pub struct RecordFields<'a, H> {
    pub timestamp_delta: i64,
    pub offset_delta: i32,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// Each header's key (UTF-8) and value.
    pub headers: H,
}

impl<'a, H> RecordFields<'a, H>
where
    H: ExactSizeIterator<Item = (&'a [u8], Option<&'a [u8]>)> + Clone,
{
    /// Appends the record to `out`: its length prefix, attributes, deltas and body (see
    /// [`RecordFields::put_body`]). Returns where the body starts in `out`. The length is
    /// computed from the fields, so the record is written once, in place.
    pub fn put(&self, out: &mut Vec<u8>) -> Result<usize, WireError> {
        let mut len = 1 + varlong_len(self.timestamp_delta) + varlong_len(self.offset_delta as i64);
        len += nullable_len(self.key)? + nullable_len(self.value)?;
        len += varlong_len(self.headers.len() as i64);
        for (key, value) in self.headers.clone() {
            len += nullable_len(Some(key))? + nullable_len(value)?;
        }
        put_varlong(out, len as i64);
        let record_start = out.len();
        out.push(0); // record attributes: unused in v2
        put_varlong(out, self.timestamp_delta);
        put_varlong(out, self.offset_delta as i64);
        let body_start = out.len();
        self.put_body(out)?;
        debug_assert_eq!(out.len() - record_start, len, "record length prefix");
        Ok(body_start)
    }

    /// Appends the record's body: key, value, header count and headers (zig-zag varint
    /// lengths, -1 for null). What is left of a record once its offset and timestamp are
    /// taken out: the cold tier's content digests cover exactly these bytes.
    pub fn put_body(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        put_nullable(out, self.key)?;
        put_nullable(out, self.value)?;
        put_varlong(out, self.headers.len() as i64);
        for (key, value) in self.headers.clone() {
            put_nullable(out, Some(key))?;
            put_nullable(out, value)?;
        }
        Ok(())
    }
}

/// The header pairs of a [`Record`], as [`RecordFields`] takes them.
pub type RecordHeaders<'a> =
    std::iter::Map<std::slice::Iter<'a, Header>, fn(&'a Header) -> (&'a [u8], Option<&'a [u8]>)>;

impl Record {
    /// The record's fields at `offset_delta` in a batch whose base timestamp is given.
    pub fn fields(
        &self,
        offset_delta: i32,
        base_timestamp: i64,
    ) -> RecordFields<'_, RecordHeaders<'_>> {
        fn pair(h: &Header) -> (&[u8], Option<&[u8]>) {
            (h.key.as_bytes(), h.value.as_deref())
        }
        RecordFields {
            timestamp_delta: self.timestamp.wrapping_sub(base_timestamp),
            offset_delta,
            key: self.key.as_deref(),
            value: self.value.as_deref(),
            headers: self
                .headers
                .iter()
                .map(pair as fn(&'_ Header) -> (&'_ [u8], Option<&'_ [u8]>)),
        }
    }
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

fn field_len(b: &[u8]) -> Result<i32, WireError> {
    i32::try_from(b.len()).map_err(|_| WireError::Unencodable("field over 2 GiB"))
}

/// Bytes `put_nullable` writes for `v`.
fn nullable_len(v: Option<&[u8]>) -> Result<usize, WireError> {
    Ok(match v {
        None => varlong_len(-1),
        Some(b) => varlong_len(field_len(b)? as i64) + b.len(),
    })
}

fn put_nullable(out: &mut Vec<u8>, v: Option<&[u8]>) -> Result<(), WireError> {
    match v {
        None => put_varlong(out, -1),
        Some(b) => {
            put_varlong(out, field_len(b)? as i64);
            out.extend_from_slice(b);
        }
    }
    Ok(())
}

/// Encodes a RecordBatch v2 the way a Kafka producer does: offsets dense from delta 0,
/// base timestamp from the first record, CRC32C computed last. The base offset is 0 and the
/// partition leader epoch -1 until the log stamps them.
#[derive(Debug, Clone, Default)]
pub struct BatchBuilder {
    compression: Compression,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    transactional: bool,
    control: bool,
    records: Vec<Record>,
}

impl BatchBuilder {
    /// A builder for a batch with the given codec and no producer identity.
    pub fn new(compression: Compression) -> Self {
        BatchBuilder {
            compression,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            ..Default::default()
        }
    }
    /// Stamps an idempotent producer's identity and the sequence of the first record.
    pub fn producer(mut self, id: i64, epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = id;
        self.producer_epoch = epoch;
        self.base_sequence = base_sequence;
        self
    }
    /// Marks the batch as a control batch (markers the log writes, never user data).
    pub fn control(mut self, control: bool) -> Self {
        self.control = control;
        self
    }
    /// Marks the batch as transactional.
    pub fn transactional(mut self, transactional: bool) -> Self {
        self.transactional = transactional;
        self
    }
    /// Adds a record; its `offset` field is ignored (records are numbered in order).
    pub fn push(&mut self, record: Record) -> &mut Self {
        self.records.push(record);
        self
    }
    /// Adds a record, builder style.
    pub fn with(mut self, record: Record) -> Self {
        self.records.push(record);
        self
    }
    /// How many records have been added.
    pub fn len(&self) -> usize {
        self.records.len()
    }
    /// Whether no record has been added.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Encodes the batch.
    pub fn build(&self) -> Result<Vec<u8>, WireError> {
        if self.records.is_empty() {
            return Err(WireError::Unencodable("a batch needs at least one record"));
        }
        let count = i32::try_from(self.records.len())
            .map_err(|_| WireError::Unencodable("too many records for one batch"))?;
        let base_ts = self.records[0].timestamp;
        let max_ts = self
            .records
            .iter()
            .map(|r| r.timestamp)
            .max()
            .unwrap_or(base_ts);

        // Records go straight after a header-sized gap when uncompressed; compressed, they
        // are written to a block of their own first.
        let records_len: usize = self.records.iter().map(approx_len).sum();
        let mut out = Vec::with_capacity(BATCH_HEADER_LEN + records_len);
        out.resize(BATCH_HEADER_LEN, 0);
        let mut block = match self.compression {
            Compression::None => std::mem::take(&mut out),
            _ => Vec::with_capacity(records_len),
        };
        for (delta, r) in self.records.iter().enumerate() {
            r.fields(delta as i32, base_ts).put(&mut block)?;
        }
        let mut out = match self.compression {
            Compression::None => block,
            codec => {
                out.extend_from_slice(&compress(codec, &block)?);
                out
            }
        };
        let mut attributes = self.compression.attribute() as i16;
        if self.transactional {
            attributes |= 0x10;
        }
        if self.control {
            attributes |= 0x20;
        }
        let header = BatchHeader {
            base_offset: 0,
            batch_length: 0,
            partition_leader_epoch: -1,
            magic: MAGIC_V2,
            crc: 0,
            attributes,
            last_offset_delta: count - 1,
            base_timestamp: base_ts,
            max_timestamp: max_ts,
            producer_id: self.producer_id,
            producer_epoch: self.producer_epoch,
            base_sequence: self.base_sequence,
            records_count: count,
        };
        seal_batch(&mut out, &header)?;
        Ok(out)
    }
}

fn approx_len(r: &Record) -> usize {
    16 + r.key.as_ref().map_or(0, |k| k.len())
        + r.value.as_ref().map_or(0, |v| v.len())
        + r.headers
            .iter()
            .map(|h| 4 + h.key.len() + h.value.as_ref().map_or(0, |v| v.len()))
            .sum::<usize>()
}

/// The size of a validated batch once its records are decompressed (its header included):
/// what a reader must hold in memory to decode it and what tiering writes. Refuses with
/// [`WireError::DecompressedTooLarge`] as soon as the records pass `limit` bytes, so a
/// small compressed batch that expands without bound costs at most `limit` bytes of
/// decompression work and no memory beyond the decoder's own buffers.
pub fn decompressed_size(
    batch: &[u8],
    header: &BatchHeader,
    limit: usize,
) -> Result<usize, WireError> {
    let total = header.total_len().min(batch.len());
    let body = batch
        .get(BATCH_HEADER_LEN..total)
        .ok_or(WireError::Inconsistent("batch shorter than its header"))?;
    Ok(BATCH_HEADER_LEN + decompressed_len(header.compression()?, body, limit)?)
}
