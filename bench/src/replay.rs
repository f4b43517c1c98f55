//! A consumer replaying a stream from its first record, as the catch-up scenario measures
//! it.
//!
//! Decides what counts as a correct replay: it starts at offset 0 (else records were lost)
//! and every record's offset is the one after the last (no gap, no repeat), up to the end
//! the stream had when the replay began. Timing runs from the subscribe call, so it includes
//! finding the first record wherever it is (local disk, cache or object store).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use felix_client::{Connection, StartAt};
use serde::Serialize;
use tokio::sync::watch;

use crate::common::TENANT;

/// What one subscriber read.
#[derive(Serialize, Default, Clone)]
pub(crate) struct ReplayFigures {
    pub(crate) records: u64,
    pub(crate) payload_bytes: u64,
    /// Subscribe call to the last record.
    pub(crate) seconds: f64,
    /// Subscribe call to the first record.
    pub(crate) first_record_ms: f64,
    pub(crate) payload_mb_per_sec: f64,
    pub(crate) records_per_sec: f64,
    /// Times the reader started again from offset 0 after reaching the end.
    pub(crate) passes_completed: u64,
    /// Payload MB/s in each [`TIMELINE_STEP`] since the subscribe call (the last step
    /// partial), for the MB/s-over-time chart.
    pub(crate) timeline_mb_per_sec: Vec<f64>,
}

/// The width of one step of [`ReplayFigures::timeline_mb_per_sec`].
pub(crate) const TIMELINE_STEP: std::time::Duration = std::time::Duration::from_millis(250);

/// Reads `stream` (in tenant `bench`, `namespace`) from `earliest` up to `end` (exclusive),
/// checking the offsets are contiguous; again from the start after reaching `end` while
/// `repeat`, until `stop` turns true. Offsets of each pass must begin at 0.
pub(crate) async fn replay(
    client: &Connection,
    namespace: &str,
    stream: &str,
    end: u64,
    repeat: bool,
    stop: watch::Receiver<bool>,
    progress: Arc<AtomicU64>,
) -> anyhow::Result<ReplayFigures> {
    replay_from(client, namespace, stream, 0, end, repeat, stop, progress).await
}

/// [`replay`] from offset `from` instead of `earliest` (a reader of many that start at
/// different places); each pass must begin at `from`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn replay_from(
    client: &Connection,
    namespace: &str,
    stream: &str,
    from: u64,
    end: u64,
    repeat: bool,
    mut stop: watch::Receiver<bool>,
    progress: Arc<AtomicU64>,
) -> anyhow::Result<ReplayFigures> {
    let mut f = ReplayFigures::default();
    let start = Instant::now();
    let step = TIMELINE_STEP.as_secs_f64();
    let (mut step_end, mut step_bytes) = (start + TIMELINE_STEP, 0u64);
    'passes: loop {
        let start_at = if from == 0 {
            StartAt::Earliest
        } else {
            StartAt::Offset(from)
        };
        let mut sub = client
            .subscribe(TENANT, namespace, stream, 0, start_at)
            .await
            .context("subscribe")?;
        if sub.start_offset() != from {
            bail!(
                "the replay starts at offset {}, not {from}: records were lost",
                sub.start_offset()
            );
        }
        let mut expected = from;
        while expected < end {
            let event = tokio::select! {
                biased;
                _ = stop.changed() => break 'passes,
                e = sub.next_event() => e,
            };
            let event = match event {
                Ok(Some(event)) => event,
                Ok(None) => bail!("the subscription ended at offset {expected} of {end}"),
                Err(e) => {
                    return Err(e).with_context(|| format!("subscription at offset {expected}"));
                }
            };
            if event.offset != expected {
                bail!("expected offset {expected}, got {}", event.offset);
            }
            if f.records == 0 {
                f.first_record_ms = start.elapsed().as_secs_f64() * 1e3;
            }
            expected += 1;
            f.records += 1;
            f.payload_bytes += event.payload.len() as u64;
            let now = Instant::now();
            while now >= step_end {
                f.timeline_mb_per_sec.push(step_bytes as f64 / step / 1e6);
                step_bytes = 0;
                step_end += TIMELINE_STEP;
            }
            step_bytes += event.payload.len() as u64;
            if f.records.is_multiple_of(4096) {
                progress.store(f.records, Ordering::Relaxed);
            }
        }
        f.passes_completed += 1;
        if !repeat || *stop.borrow() {
            break;
        }
    }
    progress.store(f.records, Ordering::Relaxed);
    f.seconds = start.elapsed().as_secs_f64();
    // A last step shorter than half a step would chart as noise: drop it.
    let partial = f.seconds - f.timeline_mb_per_sec.len() as f64 * step;
    if partial >= step / 2.0 {
        f.timeline_mb_per_sec
            .push(step_bytes as f64 / partial / 1e6);
    }
    let secs = f.seconds.max(1e-9);
    f.payload_mb_per_sec = f.payload_bytes as f64 / secs / 1e6;
    f.records_per_sec = f.records as f64 / secs;
    Ok(f)
}
