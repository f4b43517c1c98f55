//! Reading back a log the broker keeps for itself (a shard's group journal, the Kafka group
//! offsets log) from its first record to its committed end, as its state is rebuilt at
//! open: the one loop those replays share.
//!
//! Decides what an unreadable batch costs: it is skipped (the caller says whether to log
//! it) and the replay goes on, so one damaged batch does not cost a journal every record
//! after it. A log that cannot be read at all is an error.

use felix_hot::{LogError, ShardLog};
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{BatchIter, DecodedBatch, Record, WireError};

/// Calls `each` with every record of `log`'s committed records, in order, and `unreadable`
/// with the error of every batch that does not decode.
pub(crate) fn each_record(
    log: &ShardLog,
    mut each: impl FnMut(Record),
    mut unreadable: impl FnMut(&WireError),
) -> Result<(), LogError> {
    let end = log.committed_offset();
    let mut offset = log.first_offset();
    while offset < end {
        let read = log.read(offset, 4 << 20, None)?;
        if read.batches.is_empty() {
            break;
        }
        for (_, bytes) in BatchIter::new(&read.batches, usize::MAX).flatten() {
            match DecodedBatch::decode(bytes, DEFAULT_MAX_DECOMPRESSED) {
                Ok(decoded) => decoded.records.into_iter().for_each(&mut each),
                Err(e) => unreadable(&e),
            }
        }
        offset = read.next_offset;
    }
    Ok(())
}
