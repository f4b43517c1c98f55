//! Which files on a broker's disk belong to which stream.
//!
//! A stream's shards live under `<data_dir>/streams/<tenant>/<namespace>/<name>/<shard>`.
//! The name alone does not say *which* stream of that name the files are from: a stream
//! deleted and created again is another stream, and a broker that missed the delete (a
//! follower, a crash between the control plane's record and the file removal) would
//! otherwise serve the old records as the new stream's. So the stream directory carries
//! a marker, `incarnation`, naming the [`felix_meta::model::Stream::incarnation`] it was
//! made for, written (and synced) before any shard's log is opened in it:
//!
//! * opening a shard whose directory names another incarnation (or none, for a stream
//!   that has one) first removes what is there: those files are a deleted stream's;
//! * [`sweep`] removes, at start-up, the directories of incarnations the control plane no
//!   longer has, so a delete interrupted by a crash finishes;
//! * [`remove_replica_files`] removes a shard's files the control plane now places only on
//!   other brokers (a replica moved away), called at start-up by `Shards`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tracing::{info, warn};

const MARKER: &str = "incarnation";

/// The incarnation a stream directory was made for: `None` without a (readable) marker.
pub fn incarnation_of(dir: &Path) -> Option<u64> {
    std::fs::read_to_string(dir.join(MARKER))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Makes `dir` the directory of `incarnation`: removes the files of any other one, then
/// writes the marker durably. Streams from before incarnations (0) keep their files.
pub fn claim(dir: &Path, incarnation: u64) -> std::io::Result<()> {
    let found = incarnation_of(dir);
    if found == Some(incarnation) || (incarnation == 0 && found.is_none()) {
        return Ok(());
    }
    if dir.exists() {
        info!(
            dir = %dir.display(),
            found = ?found,
            incarnation,
            "removing the files of a deleted stream of the same name"
        );
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{MARKER}.tmp"));
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(incarnation.to_string().as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(MARKER))?;
    std::fs::File::open(dir)?.sync_all()
}

/// The stream directories under `streams_root` (`<tenant>/<namespace>/<name>`).
fn stream_dirs(streams_root: &Path) -> Vec<(String, PathBuf)> {
    let children = |p: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(p)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default()
    };
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let mut out = Vec::new();
    for tenant in children(streams_root) {
        for namespace in children(&tenant) {
            for stream in children(&namespace) {
                if let (Some(t), Some(n), Some(s)) =
                    (name(&tenant), name(&namespace), name(&stream))
                {
                    out.push((format!("{t}/{n}/{s}"), stream));
                }
            }
        }
    }
    out
}

/// The streams a linearizable read of the control plane found: `tenant/namespace/name` →
/// incarnation, and the last incarnation handed out by then.
pub struct LiveStreams {
    pub streams: HashMap<String, u64>,
    pub handed_out: u64,
    /// In a cluster, the shards placed only on other brokers (moved away from this one, or
    /// never here): their local files are a copy nobody reads.
    pub elsewhere: Vec<felix_meta::model::ShardKey>,
}

impl LiveStreams {
    /// `me` is this broker in a cluster; `None` on a single node, which holds every shard.
    pub fn of(state: &felix_meta::model::MetaState, me: Option<u64>) -> LiveStreams {
        let elsewhere = match me {
            Some(me) => state
                .placements
                .iter()
                .filter(|(_, p)| !p.replicas.contains(&me) && p.leader != Some(me))
                .map(|(k, _)| k.clone())
                .collect(),
            None => Vec::new(),
        };
        LiveStreams {
            streams: state
                .streams
                .iter()
                .map(|(k, s)| (k.clone(), s.incarnation))
                .collect(),
            handed_out: state.stream_incarnations,
            elsewhere,
        }
    }
}

/// Removes the directories of streams the control plane no longer has. A directory is
/// removed only when it is certainly a deleted stream's: its marker names an incarnation
/// handed out before the read and no longer live, or, without a marker, no stream of its
/// name exists. Returns how many went.
pub fn sweep(streams_root: &Path, state: &LiveStreams) -> usize {
    let mut removed = 0;
    for (key, dir) in stream_dirs(streams_root) {
        let live = state.streams.get(&key).copied();
        let dead = match (incarnation_of(&dir), live) {
            // Made for this stream, or by a create newer than the read: keep.
            (Some(i), Some(l)) => i != l && i <= state.handed_out,
            (Some(i), None) => i <= state.handed_out,
            (None, live) => live.is_none() && !recently_touched(&dir),
        };
        if !dead {
            continue;
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                info!(stream = key, dir = %dir.display(), "removed the files of a deleted stream");
                removed += 1;
            }
            Err(e) => {
                warn!(dir = %dir.display(), error = %e, "could not remove a deleted stream's files")
            }
        }
    }
    removed
}

/// Removes shard `shard`'s log and group journal under stream directory `dir`; whether
/// anything was there.
pub fn remove_replica_files(dir: &Path, shard: u32) -> bool {
    let mut gone = false;
    for d in [
        dir.join(shard.to_string()),
        dir.join("groups").join(shard.to_string()),
    ] {
        match std::fs::remove_dir_all(&d) {
            Ok(()) => gone = true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!(dir = %d.display(), error = %e, "could not remove a moved replica's files")
            }
        }
    }
    gone
}

/// A directory without a marker may be one being claimed right now.
fn recently_touched(dir: &Path) -> bool {
    std::fs::metadata(dir)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_none_or(|age| age < std::time::Duration::from_secs(60))
}
