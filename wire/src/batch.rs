//! The RecordBatch v2 header: where every field sits, how the CRC is checked, and how the log
//! stamps offsets and generations without touching the bytes the CRC covers.
//!
//! Layout (big-endian), 61 bytes before the records:
//!
//! ```text
//!  0 base_offset i64        12 partition_leader_epoch i32   17 crc u32 (CRC32C of 21..)
//!  8 batch_length i32       16 magic i8 (= 2)               21 attributes i16
//! 23 last_offset_delta i32  27 base_timestamp i64           35 max_timestamp i64
//! 43 producer_id i64        51 producer_epoch i16           53 base_sequence i32
//! 57 records_count i32      61 records...
//! ```
//!
//! `batch_length` counts the bytes after itself, so a whole batch is `12 + batch_length`.
//! The CRC covers attributes through the end, which is why the base offset and the partition
//! leader epoch (Felix's shard generation) can be rewritten in place.

use crate::codec::Compression;
use crate::error::WireError;

/// Bytes before the first record.
pub const BATCH_HEADER_LEN: usize = 61;
/// Bytes of `base_offset` + `batch_length`: what must be read to learn a batch's size.
pub const LOG_OVERHEAD: usize = 12;
/// Where the CRC-covered region starts.
const CRC_START: usize = 21;
/// The only magic Felix accepts.
pub const MAGIC_V2: i8 = 2;

/// The attribute bits that name the compression codec.
pub const ATTR_COMPRESSION_MASK: i16 = 0x07;
const ATTR_LOG_APPEND_TIME: i16 = 0x08;
const ATTR_TRANSACTIONAL: i16 = 0x10;
const ATTR_CONTROL: i16 = 0x20;

/// The decoded fixed header of one batch. Cheap to copy; it borrows nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be_i64(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

impl BatchHeader {
    /// Reads the size of the batch starting at `buf` from its first 12 bytes: the whole
    /// batch's length in bytes, checked against `max_batch_bytes`.
    pub fn peek_total_len(buf: &[u8], max_batch_bytes: usize) -> Result<usize, WireError> {
        if buf.len() < LOG_OVERHEAD {
            return Err(WireError::Truncated {
                needed: LOG_OVERHEAD,
                available: buf.len(),
            });
        }
        let length = be_i32(buf, 8) as i64;
        // Compared as u64: `max_batch_bytes` may be `usize::MAX` ("no limit"), which an `as
        // i64` cast would turn into -1 and so refuse every batch.
        let total = length + LOG_OVERHEAD as i64;
        if length < (BATCH_HEADER_LEN - LOG_OVERHEAD) as i64
            || total as u64 > max_batch_bytes as u64
        {
            return Err(WireError::InvalidLength {
                length,
                min: BATCH_HEADER_LEN - LOG_OVERHEAD,
                max: max_batch_bytes.saturating_sub(LOG_OVERHEAD),
            });
        }
        Ok(total as usize)
    }

    /// Parses the header at the start of `buf` without checking the CRC or that the whole
    /// batch is present. Refuses anything but magic 2 and impossible lengths.
    pub fn parse(buf: &[u8]) -> Result<BatchHeader, WireError> {
        if buf.len() < BATCH_HEADER_LEN {
            return Err(WireError::Truncated {
                needed: BATCH_HEADER_LEN,
                available: buf.len(),
            });
        }
        let magic = buf[16] as i8;
        if magic != MAGIC_V2 {
            return Err(WireError::UnsupportedMagic(magic));
        }
        let header = BatchHeader {
            base_offset: be_i64(buf, 0),
            batch_length: be_i32(buf, 8),
            partition_leader_epoch: be_i32(buf, 12),
            magic,
            crc: u32::from_be_bytes([buf[17], buf[18], buf[19], buf[20]]),
            attributes: be_i16(buf, 21),
            last_offset_delta: be_i32(buf, 23),
            base_timestamp: be_i64(buf, 27),
            max_timestamp: be_i64(buf, 35),
            producer_id: be_i64(buf, 43),
            producer_epoch: be_i16(buf, 51),
            base_sequence: be_i32(buf, 53),
            records_count: be_i32(buf, 57),
        };
        if (header.batch_length as i64) < (BATCH_HEADER_LEN - LOG_OVERHEAD) as i64 {
            return Err(WireError::InvalidLength {
                length: header.batch_length as i64,
                min: BATCH_HEADER_LEN - LOG_OVERHEAD,
                max: i32::MAX as usize,
            });
        }
        Ok(header)
    }

    /// Parses and fully validates one whole batch at the start of `buf`: the length fits in
    /// `buf` and under `max_batch_bytes`, the magic is 2, the CRC matches, the codec exists
    /// and the offset/count fields are consistent. Returns the header and the batch's length.
    pub fn validate(buf: &[u8], max_batch_bytes: usize) -> Result<(BatchHeader, usize), WireError> {
        let total = Self::peek_total_len(buf, max_batch_bytes)?;
        if buf.len() < total {
            return Err(WireError::Truncated {
                needed: total,
                available: buf.len(),
            });
        }
        let header = Self::parse(buf)?;
        let computed = crc32c::crc32c(&buf[CRC_START..total]);
        if computed != header.crc {
            return Err(WireError::CrcMismatch {
                stored: header.crc,
                computed,
            });
        }
        header.compression()?;
        if header.last_offset_delta < 0 {
            return Err(WireError::Inconsistent("negative last offset delta"));
        }
        if header.records_count < 0 {
            return Err(WireError::Inconsistent("negative record count"));
        }
        // A batch with no records is legal only as a control batch (e.g. an emptied batch
        // kept for its producer state); offsets may have gaps, never more records than offsets.
        if header.records_count as i64 > header.last_offset_delta as i64 + 1 {
            return Err(WireError::Inconsistent(
                "more records than offsets in the batch",
            ));
        }
        Ok((header, total))
    }

    /// The compression codec named by the attributes.
    pub fn compression(&self) -> Result<Compression, WireError> {
        Compression::from_attribute((self.attributes & ATTR_COMPRESSION_MASK) as u8)
    }
    /// Whether this is a control batch (markers such as a new leader's generation start).
    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }
    /// Whether this batch belongs to a transaction.
    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }
    /// Whether timestamps were set by the log (LogAppendTime) rather than the producer.
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & ATTR_LOG_APPEND_TIME != 0
    }
    /// The offset of the batch's last record (base offset plus last offset delta).
    pub fn last_offset(&self) -> i64 {
        self.base_offset
            .saturating_add(self.last_offset_delta as i64)
    }
    /// How many offsets the batch spans (last offset delta + 1); 0 for a negative delta,
    /// which only an unvalidated header can have.
    pub fn offset_count(&self) -> u64 {
        u64::try_from(self.last_offset_delta as i64 + 1).unwrap_or(0)
    }
    /// The whole batch's length in bytes, header included (`batch_length` + 12, at least 0:
    /// only a hand-built header can have a negative length, [`BatchHeader::parse`] refuses it).
    pub fn total_len(&self) -> usize {
        usize::try_from(self.batch_length as i64 + LOG_OVERHEAD as i64).unwrap_or(0)
    }
}

impl BatchHeader {
    /// The header's 61 bytes, every field as it is in `self` (the CRC included: see
    /// [`seal_batch`] for writing a header whose CRC and length are computed).
    pub fn encode(&self) -> [u8; BATCH_HEADER_LEN] {
        let mut b = [0u8; BATCH_HEADER_LEN];
        b[0..8].copy_from_slice(&self.base_offset.to_be_bytes());
        b[8..12].copy_from_slice(&self.batch_length.to_be_bytes());
        b[12..16].copy_from_slice(&self.partition_leader_epoch.to_be_bytes());
        b[16] = self.magic as u8;
        b[17..21].copy_from_slice(&self.crc.to_be_bytes());
        b[21..23].copy_from_slice(&self.attributes.to_be_bytes());
        b[23..27].copy_from_slice(&self.last_offset_delta.to_be_bytes());
        b[27..35].copy_from_slice(&self.base_timestamp.to_be_bytes());
        b[35..43].copy_from_slice(&self.max_timestamp.to_be_bytes());
        b[43..51].copy_from_slice(&self.producer_id.to_be_bytes());
        b[51..53].copy_from_slice(&self.producer_epoch.to_be_bytes());
        b[53..57].copy_from_slice(&self.base_sequence.to_be_bytes());
        b[57..61].copy_from_slice(&self.records_count.to_be_bytes());
        b
    }
}

/// Finishes a batch whose records are in place: `buf` is the whole batch, its first 61
/// bytes reserved for the header. Writes `header` there with `batch_length` taken from
/// `buf`'s length and the CRC computed over the result; the `batch_length` and `crc` given
/// in `header` are ignored. Refuses a batch over 2 GiB or shorter than a header.
pub fn seal_batch(buf: &mut [u8], header: &BatchHeader) -> Result<(), WireError> {
    if buf.len() < BATCH_HEADER_LEN {
        return Err(WireError::Truncated {
            needed: BATCH_HEADER_LEN,
            available: buf.len(),
        });
    }
    let batch_length = i32::try_from(buf.len() - LOG_OVERHEAD)
        .map_err(|_| WireError::Unencodable("batch over 2 GiB"))?;
    let header = BatchHeader {
        batch_length,
        crc: 0,
        ..*header
    };
    buf[..BATCH_HEADER_LEN].copy_from_slice(&header.encode());
    seal_crc(buf);
    Ok(())
}

/// Overwrites the base offset of the batch at the start of `buf` (outside the CRC).
///
/// # Panics
/// If `buf` is shorter than a batch header; callers stamp only batches they validated.
pub fn stamp_base_offset(buf: &mut [u8], base_offset: i64) {
    buf[0..8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Overwrites the partition leader epoch (Felix's shard generation) of the batch at the
/// start of `buf` (outside the CRC).
///
/// # Panics
/// If `buf` is shorter than a batch header; callers stamp only batches they validated.
pub fn stamp_partition_leader_epoch(buf: &mut [u8], epoch: i32) {
    buf[12..16].copy_from_slice(&epoch.to_be_bytes());
}

/// Computes and stores the CRC of a batch whose other fields are final (for code that
/// builds batches itself, e.g. rebuilding them from columnar storage). `buf` must hold at
/// least a whole header.
pub fn seal_crc(buf: &mut [u8]) {
    let crc = crc32c::crc32c(&buf[CRC_START..]);
    buf[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// Iterates over the whole, validated batches in a buffer of concatenated batches (a log
/// read, a produce request's record set). Stops with an error at the first invalid batch;
/// a trailing partial batch is reported as [`WireError::Truncated`].
pub struct BatchIter<'a> {
    buf: &'a [u8],
    pos: usize,
    max_batch_bytes: usize,
    failed: bool,
}

impl<'a> BatchIter<'a> {
    pub fn new(buf: &'a [u8], max_batch_bytes: usize) -> Self {
        BatchIter {
            buf,
            pos: 0,
            max_batch_bytes,
            failed: false,
        }
    }
    /// Byte position of the next batch in the buffer.
    pub fn position(&self) -> usize {
        self.pos
    }
}

impl<'a> Iterator for BatchIter<'a> {
    /// The header, and the whole batch's bytes.
    type Item = Result<(BatchHeader, &'a [u8]), (usize, WireError)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.buf.len() {
            return None;
        }
        let rest = &self.buf[self.pos..];
        match BatchHeader::validate(rest, self.max_batch_bytes) {
            Ok((header, len)) => {
                self.pos += len;
                Some(Ok((header, &rest[..len])))
            }
            Err(e) => {
                self.failed = true;
                Some(Err((self.pos, e)))
            }
        }
    }
}

/// Walks the headers of concatenated batches without checking their CRCs or decoding their
/// records: for bytes that were checked when they entered (a log read, a rebuilt row group)
/// or that will be checked later, when only header fields are wanted (record counts,
/// attributes, offsets). Yields each parsable header and where its batch starts; stops at
/// the end or at the first header that does not parse (the error says why).
pub struct HeaderIter<'a> {
    buf: &'a [u8],
    pos: usize,
    failed: bool,
}

impl<'a> HeaderIter<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        HeaderIter {
            buf,
            pos: 0,
            failed: false,
        }
    }
}

impl Iterator for HeaderIter<'_> {
    /// A batch's header and its byte position, or the position and why its header is not
    /// one.
    type Item = Result<(BatchHeader, usize), (usize, WireError)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.buf.len() {
            return None;
        }
        let at = self.pos;
        match BatchHeader::parse(&self.buf[at..]) {
            Ok(h) => {
                // `parse` refuses lengths shorter than a header, so this always advances.
                self.pos = at.saturating_add(h.total_len().max(1));
                Some(Ok((h, at)))
            }
            Err(e) => {
                self.failed = true;
                Some(Err((at, e)))
            }
        }
    }
}
