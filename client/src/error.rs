//! What can go wrong talking to a broker, split by what the caller should do about it.
//!
//! * [`ClientError::Broker`] — the broker refused the request: nothing was done (except for
//!   `quorum_timeout`, whose outcome is unknown); the code says why and whether to retry.
//! * [`ClientError::Transport`] / [`ClientError::Timeout`] — the connection or the request
//!   did not complete: the outcome of an in-flight publish is **unknown**; reconnect, and
//!   deduplicate on read or use an idempotent producer if re-sending.
//! * [`ClientError::SubscriptionLagged`] — a durable subscription fell behind and was ended;
//!   subscribe again from `resume_offset`.
//! * [`ClientError::Connect`] / [`ClientError::Tls`] — no connection was made.
//! * [`ClientError::Protocol`] — the broker sent something this client cannot read.
//! * [`ClientError::InvalidArgument`] — the request was refused before it was sent.

use felix_wire::protocol::{ErrorBody, codes};

use crate::tls::TlsError;

/// An error from the Felix client, split by what the caller should do about it (see the
/// variants). [`ClientError::outcome_unknown`] tells whether a failed publish may still
/// have been written.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The broker answered with an error (`ErrorBody::code` is one of
    /// [`felix_wire::protocol::codes`]).
    #[error("broker error: {0}")]
    Broker(ErrorBody),
    /// A durable subscription fell behind and the broker ended it; subscribe again from
    /// `resume_offset` to continue without a gap.
    #[error("subscription lagged: resume from offset {resume_offset}")]
    SubscriptionLagged { resume_offset: u64 },
    /// No connection could be established (resolution, handshake, unreachable broker).
    #[error("cannot connect: {0}")]
    Connect(String),
    /// The TLS configuration could not be built (bad CA file, ...).
    #[error("tls: {0}")]
    Tls(#[from] TlsError),
    /// The connection or the request's stream was lost: the outcome of an in-flight publish
    /// is unknown.
    #[error("transport: {0}")]
    Transport(String),
    /// The request did not complete within the request timeout: its outcome is unknown.
    #[error("request timed out")]
    Timeout,
    /// The broker sent a frame this client cannot understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The request was refused locally, before anything was sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl ClientError {
    /// The stable error code, for errors that carry one: the broker's code, or
    /// [`codes::SUBSCRIPTION_LAGGED`] for a lagged subscription.
    ///
    /// ```
    /// use felix_client::{ClientError, codes};
    /// let e = ClientError::SubscriptionLagged { resume_offset: 42 };
    /// assert_eq!(e.code(), Some(codes::SUBSCRIPTION_LAGGED));
    /// ```
    pub fn code(&self) -> Option<u16> {
        match self {
            ClientError::Broker(body) => Some(body.code),
            ClientError::SubscriptionLagged { .. } => Some(codes::SUBSCRIPTION_LAGGED),
            _ => None,
        }
    }

    /// For `expected_offset_mismatch` (a `publish_if` or a group `commit`): the actual
    /// offset the shard or the group is at.
    pub fn next_offset(&self) -> Option<u64> {
        match self {
            ClientError::Broker(body) => body.next_offset,
            _ => None,
        }
    }

    /// How long the broker asked the caller to wait before retrying, if it did.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            ClientError::Broker(body) => body.retry_after_ms.map(std::time::Duration::from_millis),
            _ => None,
        }
    }

    /// Whether the outcome of the request is unknown (it may or may not have been applied):
    /// the connection was lost, the request timed out, or a quorum (or the leader, past its
    /// lease) could not vouch for it.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            ClientError::Transport(_) | ClientError::Timeout => true,
            ClientError::Broker(body) => {
                matches!(body.code, codes::QUORUM_TIMEOUT | codes::LEADERSHIP_LOST)
            }
            _ => false,
        }
    }
}

pub(crate) fn connection_error(e: quinn::ConnectionError) -> ClientError {
    ClientError::Transport(format!("connection lost: {e}"))
}

pub(crate) fn write_error(e: quinn::WriteError) -> ClientError {
    match e {
        quinn::WriteError::ConnectionLost(c) => connection_error(c),
        other => ClientError::Transport(format!("request stream: {other}")),
    }
}

pub(crate) fn read_error(e: quinn::ReadError) -> ClientError {
    match e {
        quinn::ReadError::ConnectionLost(c) => connection_error(c),
        other => ClientError::Transport(format!("response stream: {other}")),
    }
}
