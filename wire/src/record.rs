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

use std::io::{Read, Write};

use bytes::Bytes;

use crate::batch::{BATCH_HEADER_LEN, BatchHeader, LOG_OVERHEAD, MAGIC_V2, seal_crc};
use crate::error::WireError;

/// The compression codec of a batch (attribute bits 0..=2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    #[default]
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Compression {
    /// The codec for attribute bits 0..=2.
    pub fn from_attribute(bits: u8) -> Result<Compression, WireError> {
        Ok(match bits {
            0 => Compression::None,
            1 => Compression::Gzip,
            2 => Compression::Snappy,
            3 => Compression::Lz4,
            4 => Compression::Zstd,
            other => return Err(WireError::UnknownCodec(other)),
        })
    }
    /// The attribute bits of this codec.
    pub fn attribute(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }
    /// The codec's name as Kafka and Felix configuration spell it.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Compression::None),
            "gzip" => Ok(Compression::Gzip),
            "snappy" => Ok(Compression::Snappy),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            other => Err(format!(
                "unknown codec {other:?} (expected none, gzip, snappy, lz4 or zstd)"
            )),
        }
    }
}

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

fn put_varlong(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn put_nullable(out: &mut Vec<u8>, v: Option<&[u8]>) -> Result<(), WireError> {
    match v {
        None => put_varlong(out, -1),
        Some(b) => {
            let len =
                i32::try_from(b.len()).map_err(|_| WireError::Unencodable("field over 2 GiB"))?;
            put_varlong(out, len as i64);
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

        let mut body = Vec::with_capacity(self.records.iter().map(approx_len).sum());
        let mut rec = Vec::with_capacity(64);
        for (delta, r) in self.records.iter().enumerate() {
            rec.clear();
            rec.push(0); // record attributes: unused in v2
            put_varlong(&mut rec, r.timestamp.wrapping_sub(base_ts));
            put_varlong(&mut rec, delta as i64);
            put_nullable(&mut rec, r.key.as_deref())?;
            put_nullable(&mut rec, r.value.as_deref())?;
            put_varlong(&mut rec, r.headers.len() as i64);
            for h in &r.headers {
                put_nullable(&mut rec, Some(h.key.as_bytes()))?;
                put_nullable(&mut rec, h.value.as_deref())?;
            }
            put_varlong(&mut body, rec.len() as i64);
            body.extend_from_slice(&rec);
        }
        let body = match self.compression {
            Compression::None => body,
            codec => compress(codec, &body)?,
        };
        let total = BATCH_HEADER_LEN + body.len();
        let batch_length = i32::try_from(total - LOG_OVERHEAD)
            .map_err(|_| WireError::Unencodable("batch over 2 GiB"))?;
        let mut attributes = self.compression.attribute() as i16;
        if self.transactional {
            attributes |= 0x10;
        }
        if self.control {
            attributes |= 0x20;
        }
        let mut out = Vec::with_capacity(total);
        out.extend_from_slice(&0i64.to_be_bytes());
        out.extend_from_slice(&batch_length.to_be_bytes());
        out.extend_from_slice(&(-1i32).to_be_bytes());
        out.push(MAGIC_V2 as u8);
        out.extend_from_slice(&[0; 4]); // crc, filled below
        out.extend_from_slice(&attributes.to_be_bytes());
        out.extend_from_slice(&(count - 1).to_be_bytes());
        out.extend_from_slice(&base_ts.to_be_bytes());
        out.extend_from_slice(&max_ts.to_be_bytes());
        out.extend_from_slice(&self.producer_id.to_be_bytes());
        out.extend_from_slice(&self.producer_epoch.to_be_bytes());
        out.extend_from_slice(&self.base_sequence.to_be_bytes());
        out.extend_from_slice(&count.to_be_bytes());
        out.extend_from_slice(&body);
        seal_crc(&mut out);
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

/// The framing Kafka's Java client (via xerial snappy-java) puts around snappy blocks.
const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
const XERIAL_BLOCK: usize = 32 * 1024;

fn compress(codec: Compression, input: &[u8]) -> Result<Vec<u8>, WireError> {
    let err = |reason: std::io::Error| WireError::Compression {
        codec: codec.name(),
        reason: reason.to_string(),
    };
    match codec {
        Compression::None => Ok(input.to_vec()),
        Compression::Gzip => {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(input).map_err(err)?;
            enc.finish().map_err(err)
        }
        Compression::Snappy => {
            // xerial framing, as the Java producer writes it; every Kafka client reads it.
            let mut out = Vec::with_capacity(input.len() / 2 + 32);
            out.extend_from_slice(&XERIAL_MAGIC);
            out.extend_from_slice(&1i32.to_be_bytes());
            out.extend_from_slice(&1i32.to_be_bytes());
            let mut enc = snap::raw::Encoder::new();
            for chunk in input.chunks(XERIAL_BLOCK) {
                let block = enc
                    .compress_vec(chunk)
                    .map_err(|e| WireError::Compression {
                        codec: "snappy",
                        reason: e.to_string(),
                    })?;
                out.extend_from_slice(&(block.len() as i32).to_be_bytes());
                out.extend_from_slice(&block);
            }
            Ok(out)
        }
        Compression::Lz4 => {
            let mut enc = lz4_flex::frame::FrameEncoder::new(Vec::new());
            enc.write_all(input).map_err(err)?;
            enc.finish().map_err(|e| WireError::Compression {
                codec: "lz4",
                reason: e.to_string(),
            })
        }
        Compression::Zstd => zstd::bulk::compress(input, 3).map_err(err),
    }
}

/// Copies a whole decompressing stream into `out`, refusing to produce more than `limit`
/// bytes; returns how many it produced.
fn copy_limited(
    reader: impl Read,
    codec: &'static str,
    limit: usize,
    out: &mut impl Write,
) -> Result<usize, WireError> {
    let cap = (limit as u64).saturating_add(1);
    let n = std::io::copy(&mut reader.take(cap), out).map_err(|e| WireError::Decompression {
        codec,
        reason: e.to_string(),
    })?;
    if n > limit as u64 {
        return Err(WireError::DecompressedTooLarge { limit });
    }
    Ok(n as usize)
}

/// A framed codec's streaming decoder and the codec's name.
type StreamDecoder<'a> = (Box<dyn Read + 'a>, &'static str);

/// The streaming decoder of a framed codec (gzip, lz4, zstd) over `input`; `None` for the
/// codecs that are not streamed (none, snappy).
fn stream_decoder(
    codec: Compression,
    input: &[u8],
) -> Result<Option<StreamDecoder<'_>>, WireError> {
    Ok(Some(match codec {
        Compression::None | Compression::Snappy => return Ok(None),
        Compression::Gzip => (Box::new(flate2::read::MultiGzDecoder::new(input)), "gzip"),
        Compression::Lz4 => (Box::new(lz4_flex::frame::FrameDecoder::new(input)), "lz4"),
        Compression::Zstd => {
            let dec = zstd::stream::read::Decoder::with_buffer(input).map_err(|e| {
                WireError::Decompression {
                    codec: "zstd",
                    reason: e.to_string(),
                }
            })?;
            (Box::new(dec), "zstd")
        }
    }))
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
    let codec = header.compression()?;
    let records = match stream_decoder(codec, body)? {
        Some((reader, name)) => copy_limited(reader, name, limit, &mut std::io::sink())?,
        None if codec == Compression::Snappy => snappy_decompress(body, limit)?.len(),
        None => body.len(),
    };
    if records > limit {
        return Err(WireError::DecompressedTooLarge { limit });
    }
    Ok(BATCH_HEADER_LEN + records)
}

fn decompress(codec: Compression, input: &[u8], limit: usize) -> Result<Vec<u8>, WireError> {
    match stream_decoder(codec, input)? {
        Some((reader, name)) => {
            let mut out = Vec::new();
            copy_limited(reader, name, limit, &mut out)?;
            Ok(out)
        }
        None if codec == Compression::Snappy => snappy_decompress(input, limit),
        None => Ok(input.to_vec()),
    }
}

fn snappy_decompress(input: &[u8], limit: usize) -> Result<Vec<u8>, WireError> {
    let fail = |reason: String| WireError::Decompression {
        codec: "snappy",
        reason,
    };
    let mut dec = snap::raw::Decoder::new();
    let mut raw_block = |block: &[u8], out: &mut Vec<u8>| -> Result<(), WireError> {
        let len = snap::raw::decompress_len(block).map_err(|e| fail(e.to_string()))?;
        if out.len().saturating_add(len) > limit {
            return Err(WireError::DecompressedTooLarge { limit });
        }
        let start = out.len();
        out.resize(start + len, 0);
        dec.decompress(block, &mut out[start..])
            .map_err(|e| fail(e.to_string()))?;
        Ok(())
    };
    let mut out = Vec::new();
    if !input.starts_with(&XERIAL_MAGIC) {
        // librdkafka and others may send a bare snappy block.
        raw_block(input, &mut out)?;
        return Ok(out);
    }
    let mut pos = XERIAL_MAGIC.len() + 8; // magic, version, compatible version
    if input.len() < pos {
        return Err(fail("xerial header cut short".into()));
    }
    while pos < input.len() {
        // snappy-java reads concatenated xerial streams (a new header where a block length
        // would be); its magic read as a length is negative, so this is never a real block.
        if input[pos..].starts_with(&XERIAL_MAGIC) {
            pos = pos
                .checked_add(XERIAL_MAGIC.len() + 8)
                .filter(|&p| p <= input.len())
                .ok_or_else(|| fail("xerial header cut short".into()))?;
            continue;
        }
        let len_bytes: [u8; 4] = input
            .get(pos..pos + 4)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| fail("xerial block length cut short".into()))?;
        let len = i32::from_be_bytes(len_bytes);
        pos += 4;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| pos.checked_add(l))
            .filter(|&e| e <= input.len())
            .ok_or_else(|| fail("xerial block longer than the input".into()))?;
        raw_block(&input[pos..end], &mut out)?;
        pos = end;
    }
    Ok(out)
}
