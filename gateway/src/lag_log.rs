//! Logging subscribers that fall behind live delivery.
//!
//! Drops are counted per batch (`felix_sub_queue_dropped_total`); the log says when a
//! subscriber *starts* falling behind and when it is delivered to again. An episode begins
//! at the first batch dropped for a subscriber and ends at the next batch queued for it (or
//! with the subscription, which on a durable stream ends at its first drop). Each episode is
//! logged once at its start, however many batches it drops, and its end is logged only when
//! its start was.
//!
//! Rate limit: a subscriber whose episodes come and go logs at most one start per
//! [`PER_SUBSCRIBER`], and the broker at most [`BURST`] starts per [`WINDOW`] across every
//! subscriber; the starts left out are counted and reported on the next line logged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Least time between two logged starts for one subscriber.
const PER_SUBSCRIBER: Duration = Duration::from_secs(10);
/// The broker-wide window and how many starts it may log.
const WINDOW: Duration = Duration::from_secs(10);
const BURST: u32 = 20;

/// Starts not logged because of the rate limit, since the last one that was.
static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
/// The current window's start and the starts logged in it.
static BROKER_WINDOW: Mutex<Option<(Instant, u32)>> = Mutex::new(None);

/// One subscriber's lag state, kept with its queue and changed under the fanout's lock.
#[derive(Default)]
pub struct LagEpisode {
    /// Batches dropped in the current episode (0: not behind).
    dropped: u64,
    /// Whether the current episode's start was logged.
    logged: bool,
    last_logged: Option<Instant>,
}

impl LagEpisode {
    /// A batch starting at `offset` was dropped for subscription `id` of `tenant`;
    /// `ends_subscription` when that ends it (a durable stream's subscriber that asked to be
    /// told).
    pub fn dropped(&mut self, id: u64, tenant: &str, offset: u64, ends_subscription: bool) {
        self.dropped += 1;
        if self.dropped > 1 {
            return;
        }
        let now = Instant::now();
        let recent = self
            .last_logged
            .is_some_and(|at| now.duration_since(at) < PER_SUBSCRIBER);
        if recent || !window_allows(&BROKER_WINDOW, now) {
            self.logged = false;
            SUPPRESSED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.logged = true;
        self.last_logged = Some(now);
        let suppressed = SUPPRESSED.swap(0, Ordering::Relaxed);
        let outcome = if ends_subscription {
            "its subscription ends with subscription_lagged"
        } else {
            "records are dropped for it until it keeps up"
        };
        tracing::warn!(
            subscription = id,
            tenant,
            first_dropped_offset = offset,
            suppressed_since_last = suppressed,
            "a subscriber fell behind live delivery and its queue is full: {outcome}"
        );
    }

    /// A batch was queued for subscription `id`: an episode under way ends here.
    pub fn delivered(&mut self, id: u64, tenant: &str) {
        if self.dropped == 0 {
            return;
        }
        if self.logged {
            tracing::info!(
                subscription = id,
                tenant,
                batches_dropped = self.dropped,
                "a subscriber that fell behind is being delivered to again"
            );
        }
        self.dropped = 0;
        self.logged = false;
    }
}

/// Whether `window` (the broker-wide budget) has room for one more start at `now`.
fn window_allows(window: &Mutex<Option<(Instant, u32)>>, now: Instant) -> bool {
    let mut window = window.lock();
    match &mut *window {
        Some((start, count)) if now.duration_since(*start) < WINDOW => {
            if *count >= BURST {
                return false;
            }
            *count += 1;
        }
        _ => *window = Some((now, 1)),
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_episode_is_logged_once_and_the_next_one_only_after_the_per_subscriber_gap() {
        let mut e = LagEpisode::default();
        e.dropped(1, "t", 10, false);
        assert!(e.logged);
        e.dropped(1, "t", 11, false);
        assert_eq!(e.dropped, 2);
        e.delivered(1, "t");
        assert_eq!((e.dropped, e.logged), (0, false));
        // A new episode right after: counted, not logged.
        e.dropped(1, "t", 20, false);
        assert!(!e.logged);
    }

    #[test]
    fn the_broker_logs_at_most_a_burst_of_starts_per_window() {
        let window = Mutex::new(None);
        let t0 = Instant::now();
        for _ in 0..BURST {
            assert!(window_allows(&window, t0));
        }
        assert!(!window_allows(&window, t0 + WINDOW / 2), "over the burst");
        assert!(window_allows(&window, t0 + WINDOW), "a new window");
    }
}
