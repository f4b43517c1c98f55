//! How a failed forwarded request is told: [`ForwardError`], its HTTP status and its JSON
//! body.
//!
//! Decides what a caller may conclude from a failure. The invariant: a request that was
//! certainly not delivered is `Unreachable` (safe to retry anywhere: a proposal was not
//! applied), while a timeout or a broken exchange may have been applied; and an error
//! crosses the wire and comes back as the same [`ForwardError`].
//!
//! A [`ForwardError`] from the service is answered with [`ForwardError::http_status`] and a
//! JSON [`ErrorBody`], from which the client rebuilds the same `ForwardError`:
//! `NotLeader` → **421** Misdirected Request (the body names the leader if known),
//! `Unreachable` → **503**, `Timeout` → **504**, `Interrupted` → **502**,
//! `Remote { status, .. }` → `status`. On the client, failing to connect is `Unreachable`
//! (not delivered, safe to retry), a connection broken after sending is `Interrupted` and no
//! answer within the timeout is `Timeout` (both: a proposal may or may not be applied), and
//! an error answer without an [`ErrorBody`] is `Remote` (421 alone is `NotLeader`).

use serde::Deserialize;
use serde::Serialize;

use crate::types::NodeId;

/// Why a forwarded request (propose, read index, status) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    /// The request was not delivered: the peer could not be connected to. Safe to retry,
    /// here or elsewhere: a proposed command was not applied. A [`MetaService`](super::MetaService) returns this
    /// only when that holds.
    #[error("peer unreachable: {0}")]
    Unreachable(String),
    /// No complete answer in time. A proposed command may or may not be applied.
    #[error("request timed out")]
    Timeout,
    /// The connection broke after the request may have been sent (reset, closed, body cut
    /// short). Like `Timeout`, a proposed command may or may not be applied.
    #[error("exchange interrupted: {0}")]
    Interrupted(String),
    /// The peer answered with an error status that is none of the other variants.
    #[error("peer answered HTTP {status}: {message}")]
    Remote { status: u16, message: String },
    /// The peer is not the leader; `leader` is the leader it knows of (id, internal address).
    #[error("not the leader (leader: {})", fmt_leader(.leader))]
    NotLeader { leader: Option<(NodeId, String)> },
}

fn fmt_leader(leader: &Option<(NodeId, String)>) -> String {
    match leader {
        Some((id, addr)) => format!("{id} at {addr}"),
        None => "unknown".to_owned(),
    }
}

impl ForwardError {
    /// The HTTP status the server answers this error with.
    pub fn http_status(&self) -> u16 {
        match self {
            ForwardError::NotLeader { .. } => 421,
            ForwardError::Unreachable(_) => 503,
            ForwardError::Timeout => 504,
            ForwardError::Interrupted(_) => 502,
            ForwardError::Remote { status, .. } if (400..=599).contains(status) => *status,
            ForwardError::Remote { .. } => 500,
        }
    }

    pub(super) fn to_body(&self) -> ErrorBody {
        let (error, leader) = match self {
            ForwardError::NotLeader { leader } => ("not_leader", leader.clone()),
            ForwardError::Unreachable(_) => ("unreachable", None),
            ForwardError::Timeout => ("timeout", None),
            ForwardError::Interrupted(_) => ("interrupted", None),
            ForwardError::Remote { .. } => ("remote", None),
        };
        let message = match self {
            ForwardError::Unreachable(m)
            | ForwardError::Interrupted(m)
            | ForwardError::Remote { message: m, .. } => m.clone(),
            other => other.to_string(),
        };
        ErrorBody {
            error: error.to_owned(),
            message,
            leader,
        }
    }

    /// Rebuilds the error from a non-2xx answer.
    pub(super) fn from_response(status: u16, body: &[u8]) -> ForwardError {
        if let Ok(b) = serde_json::from_slice::<ErrorBody>(body) {
            return match b.error.as_str() {
                "not_leader" => ForwardError::NotLeader { leader: b.leader },
                "unreachable" => ForwardError::Unreachable(b.message),
                "timeout" => ForwardError::Timeout,
                "interrupted" => ForwardError::Interrupted(b.message),
                _ => ForwardError::Remote {
                    status,
                    message: b.message,
                },
            };
        }
        let text = body_snippet(body);
        match status {
            421 => ForwardError::NotLeader { leader: None },
            _ => ForwardError::Remote {
                status,
                message: text,
            },
        }
    }
}

/// The JSON body of an error answer on the `/meta/*` routes.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ErrorBody {
    /// `not_leader`, `unreachable`, `timeout`, `interrupted` or `remote`.
    pub error: String,
    pub message: String,
    /// With `not_leader`: the leader's id and internal address, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<(NodeId, String)>,
}

pub(super) fn body_snippet(body: &[u8]) -> String {
    const MAX: usize = 512;
    let s = String::from_utf8_lossy(&body[..body.len().min(MAX)]);
    let s = s.trim();
    if body.len() > MAX {
        format!("{s}…")
    } else {
        s.to_owned()
    }
}
