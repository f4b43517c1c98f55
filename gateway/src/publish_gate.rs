//! How many publish answers one connection may owe at once.
//!
//! The spec bounds the acknowledged publishes a stream may have waiting: past 1,024 answers
//! owed, the next acked publish is refused with a retryable `overloaded` before it is
//! queued, so a client that retries it cannot get it written twice. Every request is its own
//! QUIC stream here, so the count is kept per connection: the publishes a connection has
//! sent, read whole and not yet been answered for.
//!
//! Invariant: a publish counted here is uncounted exactly once, when its answer has been
//! written (or its stream has gone), by dropping its [`Owed`].

use std::sync::atomic::{AtomicUsize, Ordering};

use felix_wire::protocol::{ErrorBody, codes};

/// Most acknowledged publishes a connection may have unanswered; the next is refused.
pub const MAX_ANSWERS_OWED: usize = 1024;

/// How soon a refused publish may be retried: by then some answers have gone out.
const RETRY_AFTER_MS: u64 = 50;

/// One connection's count of acked publishes not yet answered.
#[derive(Default)]
pub struct AnswersOwed(AtomicUsize);

/// One answer owed; dropping it (after the answer is written) gives the place back.
pub struct Owed<'a>(&'a AtomicUsize);

impl Drop for Owed<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl AnswersOwed {
    /// Counts one more answer owed, or `None` when [`MAX_ANSWERS_OWED`] are owed already.
    pub fn take(&self) -> Option<Owed<'_>> {
        let taken = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_ANSWERS_OWED).then_some(n + 1)
            })
            .is_ok();
        // Lazily: a guard built and dropped on refusal would give back a place not taken.
        taken.then(|| Owed(&self.0))
    }

    /// The answers owed now.
    pub fn owed(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// The refusal of a publish on a connection that owes [`MAX_ANSWERS_OWED`] answers: the
/// same retryable `overloaded` as a full publish queue, since nothing was queued.
pub fn too_many_owed(tenant: &str) -> ErrorBody {
    ErrorBody::new(
        codes::OVERLOADED,
        "publish_queue_full",
        format!(
            "this connection already owes {MAX_ANSWERS_OWED} publish answers; \
             tenant {tenant}'s publish was not queued"
        ),
    )
    .retry_after(RETRY_AFTER_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_past_the_limit_is_refused_until_one_is_given() {
        let owed = AnswersOwed::default();
        let held: Vec<Owed<'_>> = (0..MAX_ANSWERS_OWED)
            .map(|_| owed.take().expect("below the limit"))
            .collect();
        assert!(owed.take().is_none(), "one past the limit is refused");
        assert_eq!(owed.owed(), MAX_ANSWERS_OWED);
        drop(held);
        assert_eq!(owed.owed(), 0);
        assert!(owed.take().is_some());
    }
}
