//! Forwarding an operation on a key to the broker that owns its shard, over the internal
//! network (`POST /repl/cache`; `requests.rs` serves one forwarded here).
//!
//! Decides the transport: the request travels as the client protocol's own request frame
//! (the value as its body) and the owner answers with a response frame, so nothing is
//! re-encoded and both sides read it with the same codec. The caller's token travels in
//! the `x-felix-token` header and the owner checks it again, so forwarding does not launder
//! a credential.
//!
//! Invariant: an operation is forwarded at most once (the owner never forwards it again);
//! a failure to connect is a refusal (nothing was sent), a failure after sending leaves the
//! outcome unknown and says so.

use std::time::Duration;

use bytes::Bytes;
use felix_wire::cache::{CacheRequest, CacheResponse};
use felix_wire::protocol::{ErrorBody, Frame, FrameKind, Request, Response, codes};
use http_body_util::BodyExt;

use crate::broker::Broker;

/// Carries the caller's token to the owner.
pub(crate) const TOKEN_HEADER: &str = "x-felix-token";
/// The internal route.
pub const ROUTE: &str = "/repl/cache";

/// Sends `request` to the owner at `addr` and returns its answer.
pub(crate) async fn forward(
    broker: &Broker,
    addr: &str,
    request: &CacheRequest,
    body: Bytes,
    token: Option<&str>,
) -> Result<(CacheResponse, Bytes), ErrorBody> {
    let unknown = |m: String| {
        ErrorBody::new(
            codes::INTERNAL,
            "forward_failed",
            format!(
                "forwarding the cache operation to the key's owner at {addr}: {m}; its outcome is unknown"
            ),
        )
    };
    if felix_meta::faults::isolated() {
        return Err(ErrorBody::new(
            codes::SHARD_UNAVAILABLE,
            "leader_unreachable",
            "this broker is cut off the network (fault injection)",
        )
        .retry_after(500));
    }
    let frame = Frame::new(FrameKind::Request, &Request::Cache(request.clone()), body);
    let mut headers = hyper::HeaderMap::new();
    if let Some(t) = token {
        headers.insert(
            TOKEN_HEADER,
            hyper::header::HeaderValue::try_from(t).map_err(|e| unknown(e.to_string()))?,
        );
    }
    let peers = &broker.node.peers;
    let http = peers
        .post(addr, ROUTE, headers, Bytes::from(frame.encode()))
        .map_err(|e| unknown(e.to_string()))?;
    // Long enough for a Quorum acknowledgement at the owner.
    let timeout = Duration::from_millis(broker.node.config.publish_quorum_timeout_ms)
        + Duration::from_secs(5);
    let response = match tokio::time::timeout(timeout, peers.request(http)).await {
        Err(_) => return Err(unknown(format!("no answer within {timeout:?}"))),
        Ok(Err(e)) if e.is_connect() => {
            return Err(ErrorBody::new(
                codes::SHARD_UNAVAILABLE,
                "leader_unreachable",
                format!("cannot reach the key's owner at {addr}: {e}"),
            )
            .retry_after(500));
        }
        Ok(Err(e)) => return Err(unknown(e.to_string())),
        Ok(Ok(r)) => r,
    };
    let bytes = tokio::time::timeout(timeout, response.into_body().collect())
        .await
        .map_err(|_| unknown("the answer timed out".into()))?
        .map_err(|e| unknown(e.to_string()))?
        .to_bytes();
    let (frame, _) = Frame::decode_shared(&bytes, usize::MAX)
        .map_err(|e| unknown(format!("unreadable answer: {e}")))?;
    match frame.header::<Response>() {
        Ok(Response::Cache(r)) => Ok((r, frame.body)),
        Ok(Response::Error(e)) => Err(e),
        Ok(other) => Err(unknown(format!("unexpected answer {other:?}"))),
        Err(e) => Err(unknown(format!("unreadable answer: {e}"))),
    }
}
