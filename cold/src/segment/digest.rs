//! The content digest of a row group: a CRC32C over a canonical encoding of exactly what
//! the rebuild reproduces, so bytes that rotted in a way Parquet and zstd still decode are
//! caught even though every rebuilt batch gets a fresh CRC. Invariant: the encoder (from
//! the pushed batches) and the rebuild (from the rows read back) feed the digest the same
//! bytes in the same order for the same content, batch by batch:
//! * per record, [`digest_record_prefix`] (a tag, offset, timestamp), then the record's
//!   body as RecordBatch v2 encodes it ([`felix_wire::RecordFields::put_body`]);
//! * per batch, after its records, [`batch_trailer`].

use crc32c::crc32c_append;
use felix_wire::batch::ATTR_COMPRESSION_MASK;
use felix_wire::{BatchHeader, DecodedBatch};

use super::SegmentError;

/// The content digests of the row groups written so far (see the module documentation).
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
    /// A record's canonical body, reused.
    scratch: Vec<u8>,
}

impl RowGroupDigests {
    pub(super) fn push_batch(&mut self, batch: &DecodedBatch) -> Result<(), SegmentError> {
        if !batch.records.is_empty() && self.cut {
            self.done.push(std::mem::take(&mut self.current));
            self.cut = false;
        }
        let h = &batch.header;
        let mut crc = self.current;
        for r in &batch.records {
            crc = crc32c_append(crc, &digest_record_prefix(r.offset, r.timestamp));
            self.scratch.clear();
            // The deltas are not part of the body, so any will do.
            r.fields(0, 0)
                .put_body(&mut self.scratch)
                .map_err(|e| SegmentError::Corrupt(e.to_string()))?;
            crc = crc32c_append(crc, &self.scratch);
        }
        let count = i32::try_from(batch.records.len())
            .map_err(|_| SegmentError::InvalidArgument("batch with too many records".into()))?;
        let rebuilt = BatchHeader {
            attributes: h.attributes & !ATTR_COMPRESSION_MASK,
            records_count: count,
            ..*h
        };
        self.current = batch_trailer(crc, &rebuilt, h.last_offset());
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

/// The first bytes of a record's canonical encoding in a content digest: a tag, its offset
/// and its timestamp (big-endian). The rest is the record's key, value and headers as
/// RecordBatch v2 encodes them (zig-zag varint lengths, -1 for null; a header count, then
/// each header's key and value), which is also what the rebuild writes.
pub(super) fn digest_record_prefix(offset: i64, timestamp: i64) -> [u8; 17] {
    let mut p = [0u8; 17];
    p[0] = b'R';
    p[1..9].copy_from_slice(&offset.to_be_bytes());
    p[9..17].copy_from_slice(&timestamp.to_be_bytes());
    p
}

/// Adds the end of a batch's canonical encoding to a content digest: a tag (`B`, or `E` for
/// a batch without records), then big-endian base offset, last offset (`last`), attributes
/// without the codec bits, generation, producer ID, producer epoch, base sequence and record
/// count, as `b` holds them for the rebuilt batch. A batch without records adds its base and
/// max timestamps: they come from the footer. A batch with records does not: the rebuild
/// derives them from the record timestamps (already in the digest), not from the original
/// header.
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
