//! The content digest of a row group, so bytes that rotted in a way Parquet and zstd still
//! decode are caught even though every rebuilt batch gets a fresh CRC. Two kinds, by the
//! object's format version ([`DigestKind`]):
//!
//! * version 3 (written now), [`DigestKind::BatchHeaders`]: a CRC32C over the 61-byte
//!   headers of the rebuilt batches, in order. Each header holds the CRC32C the rebuild
//!   sealed over everything after it (attributes, offsets, timestamps, producer fields,
//!   every record's bytes) next to the base offset, length and generation, which that CRC
//!   does not cover; so the digest covers the rebuilt batches whole, while the reader adds
//!   only 61 bytes per batch to what it hashes anyway (the batch CRC it must seal). The
//!   encoder builds each batch as the rebuild will ([`RowGroupDigests::push_batch`]) to
//!   know those headers;
//! * versions 1 and 2, [`DigestKind::Records`]: a CRC32C over a canonical encoding of each
//!   record (per record, [`digest_record_prefix`] then its body as RecordBatch v2 encodes
//!   it) and, per batch after its records, [`batch_trailer`]. Still checked on read, so
//!   objects written before version 3 stay verified; it costs the reader a second pass over
//!   every record's bytes.
//!
//! Invariant: for the same content the encoder (from the pushed batches) and the rebuild
//! (from the rows read back) feed the digest the same bytes in the same order.

use crc32c::crc32c_append;
use felix_wire::batch::{ATTR_COMPRESSION_MASK, BATCH_HEADER_LEN, MAGIC_V2, seal_batch};
use felix_wire::{BatchHeader, DecodedBatch};

use super::SegmentError;

/// What a row group's content digest is computed over, by format version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DigestKind {
    /// Versions 1 and 2: a canonical encoding of every record and batch.
    Records,
    /// Version 3: the headers of the rebuilt batches, whose CRCs cover the rest.
    BatchHeaders,
}

impl DigestKind {
    pub(super) fn of_version(version: u32) -> DigestKind {
        if version >= 3 {
            DigestKind::BatchHeaders
        } else {
            DigestKind::Records
        }
    }
}

/// The content digests of the row groups written so far, of the kind this build writes
/// ([`DigestKind::BatchHeaders`]).
#[derive(Default)]
pub(super) struct RowGroupDigests {
    /// Of the row groups that are complete: all their batches, empty ones included, are in.
    done: Vec<u32>,
    /// Of the row group the last batches went into.
    current: u32,
    /// The writer closed the row group `current` belongs to: the next batch with records
    /// starts a new one. (A batch without records has no rows; it joins the row group before
    /// it, as the reader rebuilds it, see `decode_row_group`.)
    cut: bool,
    /// The batch as the rebuild will write it, reused.
    scratch: Vec<u8>,
}

impl RowGroupDigests {
    pub(super) fn push_batch(&mut self, batch: &DecodedBatch) -> Result<(), SegmentError> {
        if !batch.records.is_empty() && self.cut {
            self.done.push(std::mem::take(&mut self.current));
            self.cut = false;
        }
        let header = rebuilt_batch(batch, &mut self.scratch)?;
        seal_batch(&mut self.scratch, &header).map_err(|e| SegmentError::Corrupt(e.to_string()))?;
        self.current = crc32c_append(self.current, &self.scratch[..BATCH_HEADER_LEN]);
        Ok(())
    }

    /// The writer has closed `flushed` row groups.
    pub(super) fn flushed(&mut self, flushed: usize) {
        if flushed > self.done.len() {
            self.cut = true;
        }
    }

    /// All digests, once the last batch is in; `row_groups` is how many the object has.
    pub(super) fn finish(mut self, row_groups: usize) -> Result<String, SegmentError> {
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

/// Writes `batch` into `out` (cleared first) as `decode_row_group` rebuilds it: records
/// re-encoded uncompressed, the base timestamp the first record's, the max timestamp the
/// largest record's (a batch without records keeps its own, as the footer does), codec
/// bits cleared. Returns the header to seal it with; the header bytes in `out` are zeros.
fn rebuilt_batch(batch: &DecodedBatch, out: &mut Vec<u8>) -> Result<BatchHeader, SegmentError> {
    let h = &batch.header;
    out.clear();
    out.resize(BATCH_HEADER_LEN, 0);
    let (base_timestamp, max_timestamp) = match batch.records.first() {
        Some(first) => (
            first.timestamp,
            batch
                .records
                .iter()
                .map(|r| r.timestamp)
                .max()
                .unwrap_or(first.timestamp),
        ),
        None => (h.base_timestamp, h.max_timestamp),
    };
    for r in &batch.records {
        let delta = i32::try_from(r.offset.wrapping_sub(h.base_offset))
            .map_err(|_| SegmentError::InvalidArgument("offset delta out of range".into()))?;
        r.fields(delta, base_timestamp)
            .put(out)
            .map_err(|e| SegmentError::Corrupt(e.to_string()))?;
    }
    let records_count = i32::try_from(batch.records.len())
        .map_err(|_| SegmentError::InvalidArgument("batch with too many records".into()))?;
    Ok(BatchHeader {
        base_offset: h.base_offset,
        batch_length: 0,
        partition_leader_epoch: h.partition_leader_epoch,
        magic: MAGIC_V2,
        crc: 0,
        attributes: h.attributes & !ATTR_COMPRESSION_MASK,
        last_offset_delta: h.last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id: h.producer_id,
        producer_epoch: h.producer_epoch,
        base_sequence: h.base_sequence,
        records_count,
    })
}

/// Version 1 and 2 digests: the first bytes of a record's canonical encoding, a tag, its
/// offset and its timestamp (big-endian). The rest is the record's key, value and headers
/// as RecordBatch v2 encodes them (zig-zag varint lengths, -1 for null; a header count,
/// then each header's key and value), which is also what the rebuild writes.
pub(super) fn digest_record_prefix(offset: i64, timestamp: i64) -> [u8; 17] {
    let mut p = [0u8; 17];
    p[0] = b'R';
    p[1..9].copy_from_slice(&offset.to_be_bytes());
    p[9..17].copy_from_slice(&timestamp.to_be_bytes());
    p
}

/// Version 1 and 2 digests: adds the end of a batch's canonical encoding to a content
/// digest: a tag (`B`, or `E` for a batch without records), then big-endian base offset,
/// last offset (`last`), attributes without the codec bits, generation, producer ID,
/// producer epoch, base sequence and record count, as `b` holds them for the rebuilt batch.
/// A batch without records adds its base and max timestamps: they come from the footer. A
/// batch with records does not: the rebuild derives them from the record timestamps
/// (already in the digest), not from the original header.
pub(super) fn batch_trailer(crc: u32, b: &BatchHeader, last: i64) -> u32 {
    let mut t = [0u8; 1 + 8 + 8 + 2 + 4 + 8 + 2 + 4 + 4 + 16];
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        t[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    put(if b.records_count == 0 { b"E" } else { b"B" });
    put(&b.base_offset.to_be_bytes());
    put(&last.to_be_bytes());
    put(&b.attributes.to_be_bytes());
    put(&b.partition_leader_epoch.to_be_bytes());
    put(&b.producer_id.to_be_bytes());
    put(&b.producer_epoch.to_be_bytes());
    put(&b.base_sequence.to_be_bytes());
    put(&b.records_count.to_be_bytes());
    if b.records_count == 0 {
        put(&b.base_timestamp.to_be_bytes());
        put(&b.max_timestamp.to_be_bytes());
    }
    crc32c_append(crc, &t[..at])
}
