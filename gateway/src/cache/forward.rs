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
use felix_wire::protocol::{ErrorBody, Frame, FrameKind, Request, Response};

use crate::broker::Broker;
use crate::forward::ForwardTarget;

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
    let target = ForwardTarget {
        what: "the cache operation",
        whom: "the key's owner",
        addr,
    };
    let frame = Frame::new(FrameKind::Request, &Request::Cache(request.clone()), body);
    let mut headers = hyper::HeaderMap::new();
    if let Some(t) = token {
        headers.insert(
            TOKEN_HEADER,
            hyper::header::HeaderValue::try_from(t).map_err(|e| target.unknown(e.to_string()))?,
        );
    }
    // Long enough for a Quorum acknowledgement at the owner.
    let timeout = Duration::from_millis(broker.node.config.publish_quorum_timeout_ms)
        + Duration::from_secs(5);
    let bytes = broker
        .node
        .peers
        .send(addr, ROUTE, headers, Bytes::from(frame.encode()), timeout)
        .await
        .map_err(|f| target.refusal(f))?
        .body;
    let (frame, _) = Frame::decode_shared(&bytes, usize::MAX)
        .map_err(|e| target.unknown(format!("unreadable answer: {e}")))?;
    match frame.header::<Response>() {
        Ok(Response::Cache(r)) => Ok((r, frame.body)),
        Ok(Response::Error(e)) => Err(e),
        Ok(other) => Err(target.unknown(format!("unexpected answer {other:?}"))),
        Err(e) => Err(target.unknown(format!("unreadable answer: {e}"))),
    }
}
