//! One token bucket: how much a tenant may publish now, and how long until it may publish a
//! given amount.
//!
//! The bucket holds at most one second of its rate (the burst) and refills continuously. A
//! publish that costs more than the burst could never find that many tokens, so it is let
//! through once the bucket is full and leaves the bucket in debt: the publishes after it
//! wait until the debt is paid back. Invariant: over any interval of `t` seconds the bucket
//! lets through at most `rate × t + burst + one oversized publish`, and a publish is told to
//! wait only as long as it takes the bucket to hold what it needs.

use std::time::{Duration, Instant};

/// A token bucket refilled at `rate` tokens a second, holding at most `rate` (one second).
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket for `rate` tokens a second (`rate` ≥ 1).
    pub fn new(rate: u64, now: Instant) -> TokenBucket {
        let rate = rate.max(1) as f64;
        TokenBucket {
            rate,
            tokens: rate,
            at: now,
        }
    }

    /// The most the bucket holds: one second of its rate.
    pub fn burst(&self) -> f64 {
        self.rate
    }

    /// The tokens held at `now` (negative while in debt).
    pub fn tokens(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.tokens
    }

    fn refill(&mut self, now: Instant) {
        // An `Instant` before the last one (callers racing for the lock) adds nothing.
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
        self.at = self.at.max(now);
    }

    /// How long until the bucket can let `cost` through: zero when it can now. A cost above
    /// the burst needs a full bucket.
    pub fn wait_for(&mut self, cost: u64, now: Instant) -> Duration {
        self.refill(now);
        let needed = (cost as f64).min(self.rate);
        if self.tokens >= needed {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((needed - self.tokens) / self.rate)
        }
    }

    /// Takes `cost` tokens, going into debt if it holds fewer.
    pub fn take(&mut self, cost: u64, now: Instant) {
        self.refill(now);
        self.tokens -= cost as f64;
    }

    /// Gives back `cost` tokens taken for a publish that was not written after all.
    pub fn refund(&mut self, cost: u64, now: Instant) {
        self.refill(now);
        self.tokens = (self.tokens + cost as f64).min(self.rate);
    }

    /// How long until the debt is paid back (zero when not in debt).
    pub fn debt_wait(&mut self, now: Instant) -> Duration {
        self.refill(now);
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_new_bucket_holds_one_second_of_its_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1000, t0);
        assert_eq!(b.burst(), 1000.0);
        assert_eq!(b.wait_for(1000, t0), Duration::ZERO);
        b.take(1000, t0);
        assert_eq!(b.tokens(t0), 0.0);
        // Refilled continuously: 250 ms later a quarter of a second's worth is back.
        assert!((b.tokens(t0 + 250 * MS) - 250.0).abs() < 1e-6);
        // Never more than the burst, however long it sits.
        assert_eq!(b.tokens(t0 + Duration::from_secs(60)), 1000.0);
    }

    #[test]
    fn the_wait_is_the_time_until_the_bucket_holds_the_cost() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1000, t0);
        b.take(900, t0);
        // 100 held, 400 wanted: 300 more at 1000/s is 300 ms.
        let wait = b.wait_for(400, t0);
        assert!((wait.as_secs_f64() - 0.3).abs() < 1e-9, "{wait:?}");
        assert_eq!(b.wait_for(400, t0 + wait), Duration::ZERO);
    }

    #[test]
    fn a_cost_above_the_burst_waits_for_a_full_bucket_then_leaves_debt() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1000, t0);
        b.take(500, t0);
        // 3000 can never be held: it needs a full bucket, 500 ms away.
        let wait = b.wait_for(3000, t0);
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-9, "{wait:?}");
        let t1 = t0 + wait;
        assert_eq!(b.wait_for(3000, t1), Duration::ZERO);
        b.take(3000, t1);
        // 2000 in debt: two seconds before anything goes through, plus what is asked.
        assert!((b.debt_wait(t1).as_secs_f64() - 2.0).abs() < 1e-9);
        let next = b.wait_for(100, t1);
        assert!((next.as_secs_f64() - 2.1).abs() < 1e-9, "{next:?}");
    }

    #[test]
    fn a_refund_gives_back_no_more_than_the_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1000, t0);
        b.take(600, t0);
        b.refund(600, t0);
        assert_eq!(b.tokens(t0), 1000.0);
        b.refund(600, t0);
        assert_eq!(b.tokens(t0), 1000.0);
    }

    proptest! {
        /// Whatever the costs and the gaps between them, a bucket that lets a publish through
        /// only when `wait_for` says zero lets through at most rate × elapsed + burst, plus
        /// one publish larger than the burst.
        #[test]
        fn what_goes_through_is_bounded_by_rate_times_time_plus_burst(
            rate in 1u64..10_000,
            steps in proptest::collection::vec((0u64..30_000, 0u64..2_000), 1..200),
        ) {
            let t0 = Instant::now();
            let mut b = TokenBucket::new(rate, t0);
            let mut now = t0;
            let (mut through, mut largest) = (0u64, 0u64);
            for (cost, gap_ms) in steps {
                now += Duration::from_millis(gap_ms);
                let wait = b.wait_for(cost, now);
                if wait.is_zero() {
                    b.take(cost, now);
                    through += cost;
                    largest = largest.max(cost);
                } else {
                    // Told to wait: after exactly that wait it would go through.
                    let mut probe = b.clone();
                    prop_assert!(probe.wait_for(cost, now + wait + MS).is_zero());
                }
            }
            let elapsed = now.duration_since(t0).as_secs_f64();
            let bound = rate as f64 * elapsed + rate as f64 + largest as f64;
            prop_assert!(through as f64 <= bound + 1e-6, "{through} > {bound}");
        }
    }
}
