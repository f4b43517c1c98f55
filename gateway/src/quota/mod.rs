//! Per-tenant publish quotas (spec: "Quota Enforcement"): whether a tenant's publish fits its
//! publish rate on this broker now, and if not, how long it should wait.
//!
//! Each broker keeps, per tenant with a limit, a token bucket of record-batch bytes and one
//! of records ([`bucket`]), sized by its own settings ([`limits`]). A publish is charged
//! what its batches weigh as sent (the encoded record batches, headers and compression
//! included: what crosses the network and lands in the log) and how many records they hold,
//! once, at the broker a client sent it to: a publish forwarded to the shard's leader is
//! not charged again there. A client publish over quota is refused (`overloaded`,
//! `tenant_quota`, with `retry_after_ms` = when both buckets will hold it) or, sent
//! fire-and-forget, shed; a Kafka produce is let through and answered with the
//! `throttle_time_ms` that pays its debt back.
//!
//! Invariant: a refused or shed publish takes no tokens and is charged before anything else
//! is taken for it (no slot, no log write); a charged publish that is not written after all
//! gets its tokens back.

pub mod bucket;
pub mod limits;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_wire::HeaderIter;
use felix_wire::protocol::{AckMode, ErrorBody, codes};
use parking_lot::Mutex;

use crate::metrics::{Metrics, TenantAction};
use bucket::TokenBucket;
pub use limits::{LimitError, QuotaLimits, Rates};

/// The longest `throttle_time_ms` a Kafka produce is told: librdkafka and the Java client
/// keep their requests' timeouts running while throttled, so a longer mute would turn into
/// timeouts rather than a slower producer.
pub const MAX_KAFKA_THROTTLE: Duration = Duration::from_secs(10);

/// What a publish costs: its record-batch bytes as sent and its records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishCost {
    pub bytes: u64,
    pub records: u64,
}

impl PublishCost {
    /// The cost of a publish body not yet checked (one forwarded on, a Kafka produce):
    /// its length and the records its batch headers claim. A body the owner then refuses as
    /// malformed was charged anyway, as a Kafka broker's quota would.
    pub fn of(body: &Bytes) -> PublishCost {
        let records = HeaderIter::new(body)
            .map_while(Result::ok)
            .map(|(h, _)| h.records_count.max(0) as u64)
            .sum();
        PublishCost {
            bytes: body.len() as u64,
            records,
        }
    }
}

/// One tenant's buckets: `None` for a kind without a limit.
struct TenantBuckets {
    bytes: Option<TokenBucket>,
    records: Option<TokenBucket>,
}

impl TenantBuckets {
    fn new(rates: Rates, now: Instant) -> TenantBuckets {
        TenantBuckets {
            bytes: rates.bytes.map(|r| TokenBucket::new(r, now)),
            records: rates.records.map(|r| TokenBucket::new(r, now)),
        }
    }

    fn each(&mut self, cost: PublishCost) -> impl Iterator<Item = (&mut TokenBucket, u64)> {
        [
            self.bytes.as_mut().map(|b| (b, cost.bytes)),
            self.records.as_mut().map(|b| (b, cost.records)),
        ]
        .into_iter()
        .flatten()
    }
}

/// A publish's charge, to give back if it is not written after all.
#[must_use = "a charge not written must be refunded"]
#[derive(Debug)]
pub struct Charge {
    cost: PublishCost,
}

/// Every tenant's buckets on this broker.
pub struct TenantQuotas {
    limits: QuotaLimits,
    /// Whether any tenant has a limit; without one, publishes skip the lock altogether.
    enabled: bool,
    tenants: Mutex<HashMap<String, TenantBuckets>>,
}

impl TenantQuotas {
    pub fn new(limits: QuotaLimits) -> TenantQuotas {
        TenantQuotas {
            enabled: !limits.is_unlimited(),
            limits,
            tenants: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `f` on `tenant`'s buckets; `None` when the tenant has no limit at all.
    fn with_buckets<T>(&self, tenant: &str, f: impl FnOnce(&mut TenantBuckets) -> T) -> Option<T> {
        if !self.enabled {
            return None;
        }
        let mut tenants = self.tenants.lock();
        if !tenants.contains_key(tenant) {
            let rates = self.limits.of(tenant);
            if rates.is_unlimited() {
                return None;
            }
            tenants.insert(tenant.to_owned(), TenantBuckets::new(rates, Instant::now()));
        }
        tenants.get_mut(tenant).map(f)
    }

    /// Takes `cost` from `tenant`'s buckets if both can let it through now; otherwise takes
    /// nothing and says how long until they can.
    pub fn try_take(&self, tenant: &str, cost: PublishCost) -> Result<Charge, Duration> {
        let now = Instant::now();
        let wait = self.with_buckets(tenant, |b| {
            let wait = b
                .each(cost)
                .map(|(bucket, c)| bucket.wait_for(c, now))
                .max()
                .unwrap_or_default();
            if wait.is_zero() {
                b.each(cost).for_each(|(bucket, c)| bucket.take(c, now));
            }
            wait
        });
        match wait {
            Some(wait) if !wait.is_zero() => Err(wait),
            _ => Ok(Charge { cost }),
        }
    }

    /// Takes `cost` whatever the buckets hold (a Kafka produce) and says how long the
    /// producer should hold off for the debt to be paid back (at most
    /// [`MAX_KAFKA_THROTTLE`]).
    pub fn take_throttled(&self, tenant: &str, cost: PublishCost) -> Duration {
        let now = Instant::now();
        self.with_buckets(tenant, |b| {
            b.each(cost)
                .map(|(bucket, c)| {
                    bucket.take(c, now);
                    bucket.debt_wait(now)
                })
                .max()
                .unwrap_or_default()
        })
        .unwrap_or_default()
        .min(MAX_KAFKA_THROTTLE)
    }

    /// Gives a charge back: its publish was not written (refused later, or shed).
    pub fn refund(&self, tenant: &str, charge: Charge) {
        let now = Instant::now();
        self.with_buckets(tenant, |b| {
            b.each(charge.cost)
                .for_each(|(bucket, c)| bucket.refund(c, now))
        });
    }

    /// The quota check of a client's publish, before anything else is taken for it:
    /// `Ok(Some)` to go on, `Ok(None)` when a fire-and-forget publish over quota was shed,
    /// `Err` when an acknowledged one is refused. Counted in
    /// `felix_tenant_quota_throttled_total`.
    pub fn admit(
        &self,
        tenant: &str,
        ack: AckMode,
        cost: PublishCost,
        metrics: &Metrics,
    ) -> Result<Option<Charge>, ErrorBody> {
        let wait = match self.try_take(tenant, cost) {
            Ok(charge) => return Ok(Some(charge)),
            Err(wait) => wait,
        };
        let shed = ack == AckMode::None;
        count(metrics, tenant, if shed { "shed" } else { "refused" });
        if shed {
            return Ok(None);
        }
        Err(over_quota(tenant, &self.limits.of(tenant), wait))
    }
}

/// Counts one publish held back by its tenant's quota (the actions are
/// `crate::metrics::QUOTA_ACTIONS`).
pub fn count(metrics: &Metrics, tenant: &str, action: &str) {
    metrics
        .quota_throttled
        .get_or_create(&TenantAction {
            tenant: tenant.to_owned(),
            action: action.to_owned(),
        })
        .inc();
}

/// The refusal of an acknowledged publish over quota: nothing was written, retry after
/// `wait`.
pub fn over_quota(tenant: &str, rates: &Rates, wait: Duration) -> ErrorBody {
    let shown = |r: Option<u64>, unit: &str| r.map(|r| format!("{r} {unit}/s"));
    let rates: Vec<String> = [shown(rates.bytes, "bytes"), shown(rates.records, "records")]
        .into_iter()
        .flatten()
        .collect();
    let ms = (wait.as_secs_f64() * 1000.0).ceil().max(1.0) as u64;
    ErrorBody::new(
        codes::OVERLOADED,
        "tenant_quota",
        format!(
            "tenant {tenant} is over its publish quota on this broker ({}); nothing was \
             written; retry after {ms} ms",
            rates.join(", ")
        ),
    )
    .retry_after(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(quotas: &str) -> QuotaLimits {
        QuotaLimits::parse(Some("1000B/s"), None, Some(quotas)).unwrap()
    }

    #[test]
    fn an_over_quota_publish_takes_nothing_and_says_when_to_come_back() {
        let q = TenantQuotas::new(limits("big=1MB/s"));
        let cost = PublishCost {
            bytes: 800,
            records: 1,
        };
        let charge = q.try_take("a", cost).expect("a full bucket");
        let wait = q.try_take("a", cost).expect_err("200 left");
        assert!(wait > Duration::from_millis(500) && wait <= Duration::from_millis(600));
        // Another tenant has its own bucket; an override its own rate.
        assert!(q.try_take("b", cost).is_ok());
        assert!(q.try_take("big", cost).is_ok() && q.try_take("big", cost).is_ok());
        // A refund puts back what was taken.
        q.refund("a", charge);
        assert!(q.try_take("a", cost).is_ok());
    }

    #[test]
    fn both_kinds_must_fit_and_the_wait_is_the_longer() {
        let q = TenantQuotas::new(QuotaLimits::parse(Some("1000"), Some("10"), None).unwrap());
        let cost = PublishCost {
            bytes: 100,
            records: 10,
        };
        assert!(q.try_take("a", cost).is_ok());
        // Bytes would fit; records (0 left, 10 wanted at 10/s) need a second.
        let wait = q.try_take("a", cost).expect_err("out of records");
        assert!(wait > Duration::from_millis(900), "{wait:?}");
    }

    #[test]
    fn a_kafka_produce_goes_through_and_is_told_to_pay_its_debt_back() {
        let q = TenantQuotas::new(limits(""));
        let cost = PublishCost {
            bytes: 3000,
            records: 1,
        };
        // 2000 in debt at 1000 B/s (less the instant since the bucket was filled).
        let throttle = q.take_throttled("a", cost);
        assert!(
            throttle > Duration::from_millis(1900) && throttle <= Duration::from_secs(2),
            "{throttle:?}"
        );
        let refused = q
            .try_take(
                "a",
                PublishCost {
                    bytes: 1,
                    records: 1,
                },
            )
            .expect_err("in debt");
        assert!(refused >= Duration::from_secs(2));
        // However deep the debt, the throttle asked for is bounded.
        let huge = PublishCost {
            bytes: 1_000_000,
            records: 1,
        };
        assert_eq!(q.take_throttled("a", huge), MAX_KAFKA_THROTTLE);
    }

    #[test]
    fn without_limits_nothing_is_kept() {
        let q = TenantQuotas::new(QuotaLimits::default());
        let cost = PublishCost {
            bytes: u64::MAX,
            records: u64::MAX,
        };
        assert!(q.try_take("a", cost).is_ok());
        assert_eq!(q.take_throttled("a", cost), Duration::ZERO);
        assert!(q.tenants.lock().is_empty());
    }

    #[test]
    fn the_refusal_is_a_retryable_overloaded_with_reason_tenant_quota() {
        let rates = Rates {
            bytes: Some(1000),
            records: None,
        };
        let e = over_quota("acme", &rates, Duration::from_micros(1500));
        assert_eq!(e.code, codes::OVERLOADED);
        assert_eq!(e.reason, "tenant_quota");
        assert_eq!(e.retry_after_ms, Some(2));
        assert!(e.message.contains("1000 bytes/s"), "{}", e.message);
    }
}
