//! Seal-to-record lag of a stream's segments, as a client sees it.
//!
//! Decides how the lag is observed from outside the broker: by listing the stream's
//! segments on a connection of its own every [`WATCH_POLL`]. The broker's own histogram
//! (`felix_tier_upload_lag_seconds`) is read by `broker_metrics`; this watch also sees the
//! segments sealed while the uploader was busy.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use felix_client::Connection;
use serde::Serialize;
use tokio::sync::watch;

use crate::common::TENANT;

/// How often the upload watch lists a stream's segments.
pub(crate) const WATCH_POLL: Duration = Duration::from_millis(50);

/// Every segment's seal-to-record lag as a client sees it: `list_segments` every
/// [`WATCH_POLL`] on a connection of its own, noting when each segment (by last offset)
/// is first listed sealed (`uploading`, or `hot` with timestamps, which the active segment
/// lacks) and when first listed `cold` (recorded in the manifest). Each time is late by up
/// to one poll, so a lag is within about ±[`WATCH_POLL`]. Unlike the broker's histogram,
/// it sees every segment, including those sealed while the uploader was busy.
pub(crate) struct UploadWatch {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<WatchFigures>,
}

/// What the upload watch saw.
#[derive(Serialize, Default)]
pub(crate) struct WatchFigures {
    poll_ms: u64,
    /// Segments seen sealed and then recorded.
    segments: u64,
    /// Segments recorded without ever being listed as sealed (sealed and recorded within
    /// one poll); counted in the quantiles as a lag of 0.
    recorded_within_one_poll: u64,
    p50_seconds: Option<f64>,
    p99_seconds: Option<f64>,
    max_seconds: Option<f64>,
    mean_seconds: Option<f64>,
    /// Most sealed segments (and their bytes) waiting for upload in any one listing.
    max_backlog_segments: u64,
    max_backlog_bytes: u64,
    /// Listings that failed (ignored).
    list_errors: u64,
}

impl UploadWatch {
    /// Starts watching `stream` (in tenant `bench`, `namespace`) on `client`, which it
    /// closes when finished.
    pub(crate) fn start(client: Connection, namespace: &str, stream: &str) -> UploadWatch {
        let stream = stream.to_owned();
        let namespace = namespace.to_owned();
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut sealed: BTreeMap<u64, Instant> = BTreeMap::new();
            let mut recorded: BTreeMap<u64, Instant> = BTreeMap::new();
            let mut f = WatchFigures {
                poll_ms: WATCH_POLL.as_millis() as u64,
                ..WatchFigures::default()
            };
            let mut tick = tokio::time::interval(WATCH_POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    _ = tick.tick() => {}
                }
                let list = match client.list_segments(TENANT, &namespace, &stream).await {
                    Ok(list) => list,
                    Err(_) => {
                        f.list_errors += 1;
                        continue;
                    }
                };
                let now = Instant::now();
                let (mut waiting, mut bytes) = (0, 0);
                for seg in list.iter().filter(|s| s.shard == 0) {
                    let is_sealed = seg.tier == "uploading"
                        || (seg.tier == "hot" && (seg.min_timestamp, seg.max_timestamp) != (0, 0));
                    if seg.tier == "cold" {
                        recorded.entry(seg.last_offset).or_insert(now);
                    } else if is_sealed {
                        sealed.entry(seg.last_offset).or_insert(now);
                        waiting += 1;
                        bytes += seg.size_bytes;
                    }
                }
                f.max_backlog_segments = f.max_backlog_segments.max(waiting);
                f.max_backlog_bytes = f.max_backlog_bytes.max(bytes);
            }
            client.close().await;
            let mut lags: Vec<f64> = Vec::new();
            for (last, at) in &recorded {
                match sealed.get(last) {
                    Some(s) => lags.push(at.saturating_duration_since(*s).as_secs_f64()),
                    None => {
                        f.recorded_within_one_poll += 1;
                        lags.push(0.0);
                    }
                }
            }
            lags.sort_by(f64::total_cmp);
            f.segments = lags.len() as u64;
            let q = |q: f64| -> Option<f64> {
                // The nearest-rank quantile.
                let n = lags.len();
                (n > 0).then(|| lags[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
            };
            f.p50_seconds = q(0.50);
            f.p99_seconds = q(0.99);
            f.max_seconds = lags.last().copied();
            f.mean_seconds =
                (!lags.is_empty()).then(|| lags.iter().sum::<f64>() / lags.len() as f64);
            f
        });
        UploadWatch { stop, task }
    }

    pub(crate) async fn finish(self) -> anyhow::Result<WatchFigures> {
        let _ = self.stop.send(true);
        self.task.await.context("upload watch task")
    }
}
