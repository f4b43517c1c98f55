//! A full data volume is survivable: publishes stop before the disk does.
//!
//! Everything a broker keeps lives on one volume: the shards' logs, the control plane's
//! Raft log and snapshots, Kafka group offsets. If publishes fill it to the last byte, the
//! control plane's next write fails, the node stops, and the remedies an operator reaches
//! for (delete a stream, lower its retention) are refused because they are control-plane
//! commands. So the broker keeps a reserve: it samples the volume's free space every
//! [`SAMPLE_EVERY`] and refuses a durable publish that would leave less than
//! `disk_reserve_bytes` free with `disk_full` (retryable: space comes back when retention,
//! uploads or a delete free it). The control plane, which writes little, keeps running in
//! the reserve, and publishes resume by themselves once space is free again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use felix_wire::protocol::{ErrorBody, codes};
use prometheus_client::metrics::gauge::Gauge;

/// How often the free space is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// The automatic reserve: 2% of the volume, at most 1 GiB.
const AUTO_RESERVE_MAX: u64 = 1 << 30;

/// Free and total bytes of the volume holding `path` (for an unprivileged writer).
pub fn volume_space(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a valid NUL-terminated path; `st` is plain data statvfs fills in.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let unit = st.f_frsize as u64;
    Ok((st.f_bavail as u64 * unit, st.f_blocks as u64 * unit))
}

/// The data volume's free space, as last sampled, and the reserve publishes keep.
pub struct DiskSpace {
    path: PathBuf,
    free: AtomicU64,
    reserve: u64,
    gauge: Gauge,
}

impl DiskSpace {
    /// Samples `path` once. `reserve` 0 means automatic (2% of the volume, at most 1 GiB).
    pub fn new(path: &Path, reserve: u64, gauge: Gauge) -> std::io::Result<Arc<DiskSpace>> {
        let (free, total) = volume_space(path)?;
        let reserve = match reserve {
            0 => (total / 50).min(AUTO_RESERVE_MAX),
            r => r,
        };
        gauge.set(free as i64);
        Ok(Arc::new(DiskSpace {
            path: path.to_owned(),
            free: AtomicU64::new(free),
            reserve,
            gauge,
        }))
    }

    /// The reserve in force.
    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    /// Refuses a write of `bytes` that would leave less than the reserve free.
    pub fn check(&self, bytes: u64) -> Result<(), ErrorBody> {
        let free = self.free.load(Ordering::Relaxed);
        if free.saturating_sub(bytes) >= self.reserve {
            // Counted down by every accepted write until the next sample, so publishes
            // faster than the sampling cannot run through the reserve between samples.
            self.free.fetch_sub(bytes.min(free), Ordering::Relaxed);
            return Ok(());
        }
        Err(ErrorBody::new(
            codes::OVERLOADED,
            "disk_full",
            format!(
                "the broker's data volume has {free} bytes free, under its reserve of {} (disk_reserve_bytes): \
                 free space by lowering retention or deleting a stream; publishes resume by themselves",
                self.reserve
            ),
        )
        .retry_after(1000))
    }

    fn sample(&self) {
        match volume_space(&self.path) {
            Ok((free, _)) => {
                self.free.store(free, Ordering::Relaxed);
                self.gauge.set(free as i64);
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read the data volume's free space")
            }
        }
    }

    /// Samples every [`SAMPLE_EVERY`] until this is the last reference (the broker is gone).
    pub async fn run(self: Arc<Self>) {
        let mut warned = false;
        loop {
            tokio::time::sleep(SAMPLE_EVERY).await;
            if Arc::strong_count(&self) == 1 {
                return;
            }
            self.sample();
            let low = self.free.load(Ordering::Relaxed) < self.reserve;
            if low && !warned {
                tracing::error!(path = %self.path.display(), reserve = self.reserve,
                    "data volume is down to its reserve: durable publishes are refused with disk_full");
            } else if !low && warned {
                tracing::info!(path = %self.path.display(), "data volume has room again: publishes resume");
            }
            warned = low;
        }
    }
}
