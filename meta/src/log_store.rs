//! The Raft log store: the log, the vote, the committed log id and the purge marker, kept in
//! plain files under the node's data directory ("files with the log's own discipline", no
//! embedded database).
//!
//! What it decides:
//!
//! * **Entries** go to an append-only file `raft-log` of records
//!   `[len u32 LE][crc32c u32 LE][serde_json of the entry]` (the CRC covers the JSON bytes).
//!   One `append` call is one `write` of all its records followed by `sync_data`; only then is
//!   openraft told the entries are durable. Every entry is also kept in memory: the metadata
//!   log is small and snapshots purge it, so reads never touch the disk.
//! * **Truncate and purge** rewrite the whole file: the kept entries are written to
//!   `raft-log.tmp`, fsynced, renamed over `raft-log`, and the directory is fsynced. Rewriting
//!   is fine here because purges follow snapshots (the kept log is short) and truncation
//!   (a follower dropping a conflicting suffix) is rare.
//! * **Vote, committed log id and last purged log id** live in `raft-state.json`, replaced
//!   atomically (temp file, fsync, rename, directory fsync) on every `save_vote`,
//!   `save_committed` and `purge`. A purge writes the marker *before* rewriting the log, and
//!   recovery drops entries at or below the marker, so a crash in between is harmless.
//!
//! Invariants:
//!
//! * An entry is reported durable (`LogFlushed::log_io_completed`) only after the `fsync` of
//!   the write that holds it has returned.
//! * After recovery `raft-log` is always a valid prefix of what was written: a torn, short or
//!   CRC-bad tail (a crash in the middle of an append that was never acknowledged) is cut back
//!   to the last whole record, with a warning. A record whose CRC matches but whose JSON does
//!   not decode is not a torn write, and opening fails instead of dropping it.
//! * The in-memory view equals replaying the files: a later record for an index replaces an
//!   earlier one, exactly as an in-memory insert does.
//!
//! Concurrency: openraft issues writes one at a time from its core task, while log readers
//! (replication) read concurrently. Writes hold the `io` mutex for the file work (on a
//! blocking thread) and publish to the `mem` mutex only afterwards; readers take only `mem`,
//! so a read never waits for an fsync. Lock order: `io`, then `mem`.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageIOError};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::types::{Entry, LogId, NodeId, StorageError, TypeConfig, Vote};

const LOG_FILE: &str = "raft-log";
const LOG_TMP: &str = "raft-log.tmp";
const STATE_FILE: &str = "raft-state.json";
const STATE_TMP: &str = "raft-state.json.tmp";
/// Record header: payload length and CRC32C, both little-endian u32.
const HEADER: usize = 8;

/// What `raft-state.json` holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct HardState {
    #[serde(default)]
    vote: Option<Vote>,
    #[serde(default)]
    committed: Option<LogId>,
    #[serde(default)]
    last_purged: Option<LogId>,
}

/// What readers see: the files' content, in memory.
#[derive(Debug, Default)]
struct Mem {
    log: BTreeMap<u64, Entry>,
    state: HardState,
}

/// The open log file, touched only by writers.
#[derive(Debug)]
struct Io {
    /// `raft-log`, opened for appending.
    file: File,
    /// Its length: the end of the last whole record.
    len: u64,
}

#[derive(Debug)]
struct Shared {
    dir: PathBuf,
    io: Mutex<Io>,
    mem: Mutex<Mem>,
}

/// The durable Raft log store. Clones share the same files and memory (openraft takes one as
/// the store and more as log readers; the node keeps one).
#[derive(Debug, Clone)]
pub struct LogStore {
    shared: Arc<Shared>,
}

impl LogStore {
    /// Opens (or creates) the log store in `dir`, recovering the log and cutting off a torn
    /// tail.
    pub fn open(dir: &Path) -> io::Result<LogStore> {
        std::fs::create_dir_all(dir)?;
        // Leftovers of an interrupted rewrite: the rename never happened, so the real files
        // are intact.
        remove_if_exists(&dir.join(LOG_TMP))?;
        remove_if_exists(&dir.join(STATE_TMP))?;

        let state_path = dir.join(STATE_FILE);
        let state: HardState = match std::fs::read(&state_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}", state_path.display()),
                )
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => HardState::default(),
            Err(e) => return Err(e),
        };

        let log_path = dir.join(LOG_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&log_path)?;
        // The file may just have been created: make its directory entry durable.
        sync_dir(dir)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (records, valid) = decode_records(&bytes).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", log_path.display()),
            )
        })?;
        if valid < bytes.len() {
            tracing::warn!(
                path = %log_path.display(),
                valid_bytes = valid,
                dropped_bytes = bytes.len() - valid,
                "raft log has a torn or corrupt tail (an unacknowledged append); cutting it off"
            );
            file.set_len(valid as u64)?;
            file.sync_all()?;
        }

        let purged = state.last_purged.map(|l| l.index);
        let mut log = BTreeMap::new();
        for entry in records {
            // Entries at or below the purge marker may survive a crash between writing the
            // marker and rewriting the log.
            if purged.is_some_and(|p| entry.log_id.index <= p) {
                continue;
            }
            log.insert(entry.log_id.index, entry);
        }

        Ok(LogStore {
            shared: Arc::new(Shared {
                dir: dir.to_path_buf(),
                io: Mutex::new(Io {
                    file,
                    len: valid as u64,
                }),
                mem: Mutex::new(Mem { log, state }),
            }),
        })
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Whether this store has ever been used: a vote was saved, or there are entries or a
    /// purge marker. A node that was part of a cluster and finds no state has lost its volume.
    pub fn has_state(&self) -> bool {
        let mem = self.shared.mem.lock();
        mem.state.vote.is_some()
            || mem.state.committed.is_some()
            || mem.state.last_purged.is_some()
            || !mem.log.is_empty()
    }

    /// Runs file work on a blocking thread, holding the `io` lock; an I/O error becomes a
    /// storage error about `subject`.
    async fn with_io<T, F>(&self, subject: ErrorSubject<NodeId>, f: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Shared, &mut Io) -> io::Result<T> + Send + 'static,
    {
        let shared = self.shared.clone();
        let result = tokio::task::spawn_blocking(move || {
            let mut io = shared.io.lock();
            f(&shared, &mut io)
        })
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)));
        result.map_err(|e| StorageIOError::new(subject, ErrorVerb::Write, AnyError::new(&e)).into())
    }
}

impl Shared {
    /// Replaces `raft-state.json` atomically.
    fn write_state(&self, state: &HardState) -> io::Result<()> {
        let bytes = serde_json::to_vec(state).map_err(io::Error::other)?;
        let tmp = self.dir.join(STATE_TMP);
        {
            let mut f = File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, self.dir.join(STATE_FILE))?;
        sync_dir(&self.dir)
    }

    /// Replaces `raft-log` atomically with exactly `entries`; the new file becomes the append
    /// handle.
    fn rewrite_log<'a>(
        &self,
        io: &mut Io,
        entries: impl Iterator<Item = &'a Entry>,
    ) -> io::Result<()> {
        let mut buf = Vec::new();
        for entry in entries {
            encode_record(&mut buf, entry)?;
        }
        let tmp = self.dir.join(LOG_TMP);
        remove_if_exists(&tmp)?;
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .open(&tmp)?;
        file.write_all(&buf)?;
        file.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(LOG_FILE))?;
        // From here on `raft-log` is the new file: appends must go to it even if the
        // directory sync below fails.
        io.file = file;
        io.len = buf.len() as u64;
        sync_dir(&self.dir)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => match s.checked_add(1) {
                Some(s) => s,
                None => return Ok(Vec::new()),
            },
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => Bound::Included(e),
            Bound::Excluded(&e) => Bound::Excluded(e),
            Bound::Unbounded => Bound::Unbounded,
        };
        let empty = match end {
            Bound::Included(e) => e < start,
            Bound::Excluded(e) => e <= start,
            Bound::Unbounded => false,
        };
        if empty {
            return Ok(Vec::new());
        }
        let mem = self.shared.mem.lock();
        Ok(mem
            .log
            .range((Bound::Included(start), end))
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let mem = self.shared.mem.lock();
        let last_purged_log_id = mem.state.last_purged;
        let last_log_id = mem
            .log
            .last_key_value()
            .map(|(_, e)| e.log_id)
            .or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let vote = *vote;
        self.with_io(ErrorSubject::Vote, move |shared, _io| {
            let mut state = shared.mem.lock().state.clone();
            state.vote = Some(vote);
            shared.write_state(&state)?;
            shared.mem.lock().state = state;
            Ok(())
        })
        .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.shared.mem.lock().state.vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Kept in memory and written with the next vote or purge, not on every advance: the
        // committed id only lets a restarted node apply before it hears from a leader, and an
        // older value on disk is always safe. Writing it here would cost two fsyncs per commit.
        self.shared.mem.lock().state.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.shared.mem.lock().state.committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let mut buf = Vec::new();
        for entry in &entries {
            encode_record(&mut buf, entry)
                .map_err(|e| StorageIOError::write_log_entry(entry.log_id, AnyError::new(&e)))?;
        }
        let result = self
            .with_io(ErrorSubject::Logs, move |shared, io| {
                let written = io.file.write_all(&buf).and_then(|()| io.file.sync_data());
                if let Err(e) = written {
                    // Take back a partial write so the next append does not land after
                    // garbage; if that fails too, recovery cuts it off on reopen.
                    let _ = io.file.set_len(io.len);
                    return Err(e);
                }
                io.len += buf.len() as u64;
                let mut mem = shared.mem.lock();
                for entry in entries {
                    mem.log.insert(entry.log_id.index, entry);
                }
                Ok(())
            })
            .await;
        match result {
            Ok(()) => {
                // Only now, after the fsync, are the entries durable.
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(io::Error::other(e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.with_io(ErrorSubject::Logs, move |shared, io| {
            let kept: Vec<Entry> = {
                let mem = shared.mem.lock();
                if mem.log.range(log_id.index..).next().is_none() {
                    return Ok(());
                }
                mem.log
                    .range(..log_id.index)
                    .map(|(_, e)| e.clone())
                    .collect()
            };
            shared.rewrite_log(io, kept.iter())?;
            drop(shared.mem.lock().log.split_off(&log_id.index));
            Ok(())
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.with_io(ErrorSubject::Logs, move |shared, io| {
            let (state, kept, any_removed) = {
                let mem = shared.mem.lock();
                if mem
                    .state
                    .last_purged
                    .is_some_and(|p| p.index >= log_id.index)
                {
                    return Ok(());
                }
                let mut state = mem.state.clone();
                state.last_purged = Some(log_id);
                let any_removed = mem.log.range(..=log_id.index).next().is_some();
                let kept: Vec<Entry> = if any_removed {
                    mem.log
                        .range((Bound::Excluded(log_id.index), Bound::Unbounded))
                        .map(|(_, e)| e.clone())
                        .collect()
                } else {
                    Vec::new()
                };
                (state, kept, any_removed)
            };
            // The marker first: recovery drops entries at or below it, so the log rewrite
            // that follows may be interrupted without leaving a gap.
            shared.write_state(&state)?;
            {
                let mut mem = shared.mem.lock();
                mem.state = state;
                mem.log.retain(|&index, _| index > log_id.index);
            }
            // Rewriting the whole file is fine: purges follow snapshots, so the kept log is
            // short.
            if any_removed {
                shared.rewrite_log(io, kept.iter())?;
            }
            Ok(())
        })
        .await
    }
}

/// Appends one record for `entry` to `buf`.
fn encode_record(buf: &mut Vec<u8>, entry: &Entry) -> io::Result<()> {
    let payload = serde_json::to_vec(entry).map_err(io::Error::other)?;
    let len = u32::try_from(payload.len())
        .map_err(|_| io::Error::other("log entry larger than 4 GiB"))?;
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    buf.extend_from_slice(&payload);
    Ok(())
}

/// Decodes the whole records at the start of `bytes`; returns them and the length of the
/// valid prefix. Stops at the first torn, short or CRC-bad record; fails on a record whose CRC
/// matches but whose JSON does not decode.
fn decode_records(bytes: &[u8]) -> Result<(Vec<Entry>, usize), String> {
    let mut entries = Vec::new();
    let mut pos = 0usize;
    while bytes.len() - pos >= HEADER {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().expect("4 bytes"));
        // A zero length is never written (an entry's JSON is not empty); it is what a
        // zero-filled tail looks like, and crc32c of nothing is 0.
        if len == 0 || len > bytes.len() - pos - HEADER {
            break;
        }
        let payload = &bytes[pos + HEADER..pos + HEADER + len];
        if crc32c::crc32c(payload) != crc {
            break;
        }
        let entry: Entry = serde_json::from_slice(payload).map_err(|e| {
            format!("record at offset {pos} has a valid checksum but does not decode: {e}")
        })?;
        entries.push(entry);
        pos += HEADER + len;
    }
    Ok((entries, pos))
}

fn remove_if_exists(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
