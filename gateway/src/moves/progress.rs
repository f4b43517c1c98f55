//! The state of a shard's move on this broker: whether the shard is fenced for a hand-over
//! and when the leader may try the next step.
//!
//! Invariant: at most one step of a move runs per shard at a time ([`MoveProgress::claim`]);
//! the fence is raised only by that step and always lowered when it ends, whatever the
//! outcome, so a failed hand-over never leaves the shard refusing publishes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;

/// One shard's move state on this broker.
pub struct MoveProgress {
    /// Raised while the leader hands the shard over: publishes wait ([`super::hold`]).
    fence: watch::Sender<bool>,
    /// A step (hand-over or finish) is running.
    running: AtomicBool,
    /// No step starts before this (after a step failed or timed out).
    not_before: Mutex<Option<Instant>>,
    /// The last hand-over this broker proposed: (the new generation, the new leader). A
    /// watch is told `shard_moved` only when this broker follows exactly that
    /// (`cache/moving.rs`).
    handed: Mutex<Option<(u64, u64)>>,
}

impl Default for MoveProgress {
    fn default() -> Self {
        MoveProgress {
            fence: watch::channel(false).0,
            running: AtomicBool::new(false),
            not_before: Mutex::new(None),
            handed: Mutex::new(None),
        }
    }
}

impl MoveProgress {
    /// Whether the shard is fenced for a hand-over now.
    pub fn fenced(&self) -> bool {
        *self.fence.borrow()
    }

    /// Changes when the fence is raised or lowered.
    pub fn watch_fence(&self) -> watch::Receiver<bool> {
        self.fence.subscribe()
    }

    pub(crate) fn set_fence(&self, up: bool) {
        self.fence.send_if_modified(|f| {
            let changed = *f != up;
            *f = up;
            changed
        });
    }

    /// Takes the right to run the next step, unless one runs or a retry is not due yet;
    /// the step ends with [`MoveProgress::release`].
    pub(crate) fn claim(&self) -> bool {
        if let Some(t) = *self.not_before.lock()
            && Instant::now() < t
        {
            return false;
        }
        !self.running.swap(true, Ordering::AcqRel)
    }

    /// Ends a step: lowers the fence and lets the next step start.
    pub(crate) fn release(&self) {
        self.set_fence(false);
        self.running.store(false, Ordering::Release);
    }

    /// Records that this broker proposes to hand the shard over: `to` to lead `generation`.
    pub(crate) fn handed_over(&self, generation: u64, to: u64) {
        *self.handed.lock() = Some((generation, to));
    }

    /// The last hand-over this broker proposed: (the new generation, the new leader).
    pub fn handed_over_to(&self) -> Option<(u64, u64)> {
        *self.handed.lock()
    }

    /// The next step waits `delay` (after a refusal or a timeout).
    pub(crate) fn retry_after(&self, delay: Duration) {
        *self.not_before.lock() = Some(Instant::now() + delay);
    }
}
