//! What a cluster client may retry, and how long it waits between tries.
//!
//! Invariant: a request is re-sent only when the broker certainly did not act on it (it
//! refused: `not_leader`, `shard_unavailable`, `metadata_unavailable`, or `overloaded`
//! for its tenant's publish quota, `tenant_quota`, which is checked before anything is
//! queued; or it never got the whole request: no connection, no stream, the frame not
//! written) — unless the caller says
//! the request is idempotent, in which case an unknown outcome (connection lost after
//! sending, timeout, `quorum_timeout`, `leadership_lost`) is retried too. Waits go 100 ms, 200 ms, ... up to
//! 1 s between tries (or longer when the broker asks with `retry_after_ms`), and no try
//! starts after the deadline.

use std::time::Duration;

use felix_wire::protocol::codes;
use tokio::time::Instant;

use crate::ClientError;

/// The first wait between tries.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between tries.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What a failed try says about trying again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing was done: re-route and try again.
    Refused,
    /// It may have been done: only an idempotent request may be re-sent.
    Ambiguous,
    /// Trying again does not help (a bad request, an unknown stream, ...).
    Final,
}

/// Classifies a failed try. `sent` says whether the whole request reached QUIC (see
/// `request::Failed`); a broker's answer is judged by its code alone.
pub(crate) fn classify(error: &ClientError, sent: bool) -> Verdict {
    match error {
        ClientError::Broker(body) => match body.code {
            codes::NOT_LEADER
            | codes::SHARD_UNAVAILABLE
            | codes::METADATA_UNAVAILABLE
            | codes::SHARD_MOVED => Verdict::Refused,
            codes::OVERLOADED if over_quota(error) => Verdict::Refused,
            // The write may be stored: the broker could not confirm it, not refused it.
            codes::QUORUM_TIMEOUT | codes::LEADERSHIP_LOST => Verdict::Ambiguous,
            _ => Verdict::Final,
        },
        ClientError::Connect(_) => Verdict::Refused,
        ClientError::Transport(_) | ClientError::Timeout if !sent => Verdict::Refused,
        ClientError::Transport(_) | ClientError::Timeout => Verdict::Ambiguous,
        _ => Verdict::Final,
    }
}

/// Whether the broker refused the request for its tenant's publish quota: nothing was
/// queued, the route is right, and `retry_after_ms` says when it will fit.
pub(crate) fn over_quota(error: &ClientError) -> bool {
    matches!(error, ClientError::Broker(body)
        if body.code == codes::OVERLOADED && body.reason == "tenant_quota")
}

/// A copy of an error whose outcome is unknown (those kinds carry plain data; others are
/// `None`).
pub(crate) fn copy_of_unknown(error: &ClientError) -> Option<ClientError> {
    match error {
        ClientError::Transport(m) => Some(ClientError::Transport(m.clone())),
        ClientError::Timeout => Some(ClientError::Timeout),
        ClientError::Broker(body)
            if matches!(body.code, codes::QUORUM_TIMEOUT | codes::LEADERSHIP_LOST) =>
        {
            Some(ClientError::Broker(body.clone()))
        }
        _ => None,
    }
}

/// Whether a try that failed so may be re-sent.
pub(crate) fn may_retry(error: &ClientError, sent: bool, idempotent: bool) -> bool {
    match classify(error, sent) {
        Verdict::Refused => true,
        Verdict::Ambiguous => idempotent,
        Verdict::Final => false,
    }
}

/// Whether a subscription that ended so should be opened again where it stopped: the
/// shard moved or is between leaders, the connection was lost, or it lagged.
pub(crate) fn resumable_end(error: &ClientError) -> bool {
    match error {
        ClientError::SubscriptionLagged { .. } => true,
        ClientError::Broker(body) => matches!(
            body.code,
            codes::NOT_LEADER
                | codes::SHARD_UNAVAILABLE
                | codes::METADATA_UNAVAILABLE
                | codes::SHARD_MOVED
        ),
        ClientError::Connect(_) | ClientError::Transport(_) | ClientError::Timeout => true,
        _ => false,
    }
}

/// Waits between tries: 100 ms, doubling, at most 1 s.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    pub(crate) fn new() -> Backoff {
        Backoff {
            next: FIRST_BACKOFF,
        }
    }

    /// The wait before the next try: the backoff step, or what the broker asked for if
    /// that is longer (never more than the broker's ask or 1 s, whichever is larger).
    pub(crate) fn next_delay(&mut self, error: &ClientError) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        match error.retry_after() {
            Some(asked) if asked > step => asked,
            _ => step,
        }
    }

    /// Starts again from 100 ms (after progress).
    pub(crate) fn reset(&mut self) {
        self.next = FIRST_BACKOFF;
    }
}

/// When an operation gives up: `request_timeout` after it started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Instant,
}

impl Deadline {
    pub(crate) fn after(budget: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + budget,
        }
    }

    /// Time left (zero once passed).
    pub(crate) fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// Whether a try started after waiting `wait` would still begin before the deadline.
    pub(crate) fn allows(&self, wait: Duration) -> bool {
        Instant::now() + wait < self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_wire::protocol::ErrorBody;

    fn broker(code: u16, reason: &str) -> ClientError {
        ClientError::Broker(ErrorBody::new(code, reason, "test"))
    }

    #[test]
    fn backoff_doubles_from_100_ms_to_a_ceiling_of_1_s() {
        let mut b = Backoff::new();
        let e = ClientError::Timeout;
        let waits: Vec<u128> = (0..7).map(|_| b.next_delay(&e).as_millis()).collect();
        assert_eq!(waits, vec![100, 200, 400, 800, 1000, 1000, 1000]);
        b.reset();
        assert_eq!(b.next_delay(&e), FIRST_BACKOFF);
    }

    #[test]
    fn backoff_honours_a_longer_retry_after_from_the_broker() {
        let mut b = Backoff::new();
        let asked = ClientError::Broker(
            ErrorBody::new(codes::SHARD_UNAVAILABLE, "no_leader", "electing").retry_after(250),
        );
        assert_eq!(b.next_delay(&asked), Duration::from_millis(250));
        assert_eq!(b.next_delay(&asked), Duration::from_millis(250));
        assert_eq!(b.next_delay(&asked), Duration::from_millis(400));
    }

    #[test]
    fn refusals_are_retried_whatever_the_request() {
        for e in [
            broker(codes::NOT_LEADER, "not_leader"),
            broker(codes::SHARD_UNAVAILABLE, "fenced"),
            broker(codes::SHARD_UNAVAILABLE, "no_leader"),
            broker(codes::METADATA_UNAVAILABLE, "metadata_unavailable"),
            broker(codes::OVERLOADED, "tenant_quota"),
            ClientError::Connect("refused".into()),
        ] {
            assert_eq!(classify(&e, true), Verdict::Refused, "{e}");
            assert!(may_retry(&e, true, false), "{e}");
        }
    }

    #[test]
    fn a_lost_connection_before_the_request_was_sent_is_a_refusal() {
        let lost = ClientError::Transport("connection lost".into());
        assert_eq!(classify(&lost, false), Verdict::Refused);
        assert!(may_retry(&lost, false, false));
        assert!(may_retry(&ClientError::Timeout, false, false));
    }

    #[test]
    fn a_plain_publish_is_not_resent_after_an_ambiguous_outcome() {
        for e in [
            ClientError::Transport("connection lost".into()),
            ClientError::Timeout,
            broker(codes::QUORUM_TIMEOUT, "quorum_timeout"),
            // Written, then the leader's lease lapsed before it answered (issue 25).
            broker(codes::LEADERSHIP_LOST, "leadership_lost"),
        ] {
            assert_eq!(classify(&e, true), Verdict::Ambiguous, "{e}");
            assert!(!may_retry(&e, true, false), "{e}");
            assert!(may_retry(&e, true, true), "idempotent retries {e}");
        }
    }

    #[test]
    fn request_errors_are_final_even_for_an_idempotent_producer() {
        for e in [
            broker(codes::UNKNOWN_STREAM, "unknown_stream"),
            broker(codes::RECORD_TOO_LARGE, "record_too_large"),
            broker(codes::OUT_OF_ORDER_SEQUENCE, "out_of_order_sequence"),
            // Other overloads are left to the caller, who chose how hard to push.
            broker(codes::OVERLOADED, "publish_queue_full"),
            ClientError::InvalidArgument("too big".into()),
            ClientError::Protocol("garbage".into()),
        ] {
            assert_eq!(classify(&e, false), Verdict::Final, "{e}");
            assert!(!may_retry(&e, true, true), "{e}");
        }
    }

    #[test]
    fn subscriptions_resume_after_failover_ends_but_not_after_request_errors() {
        for e in [
            broker(codes::NOT_LEADER, "not_leader"),
            broker(codes::SHARD_UNAVAILABLE, "fenced"),
            ClientError::Transport("connection lost".into()),
            ClientError::SubscriptionLagged { resume_offset: 3 },
        ] {
            assert!(resumable_end(&e), "{e}");
        }
        for e in [
            broker(codes::OFFSET_TOO_OLD, "offset_too_old"),
            broker(codes::UNKNOWN_STREAM, "unknown_stream"),
            ClientError::Protocol("garbage".into()),
        ] {
            assert!(!resumable_end(&e), "{e}");
        }
    }

    #[test]
    fn a_deadline_refuses_a_wait_that_would_cross_it() {
        let d = Deadline::after(Duration::from_secs(10));
        assert!(d.allows(Duration::from_secs(1)));
        assert!(!d.allows(Duration::from_secs(10)));
        assert!(d.remaining() <= Duration::from_secs(10));
        let passed = Deadline::after(Duration::ZERO);
        assert_eq!(passed.remaining(), Duration::ZERO);
        assert!(!passed.allows(Duration::ZERO));
    }
}
