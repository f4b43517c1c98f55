//! How brokers talk to each other: the follower's fetch request and its refusals, and the
//! one pooled HTTP client to other brokers' internal addresses (replication fetches and
//! forwarded publishes share it).
//!
//! Invariant: a broker cut off the network by fault injection sends nothing; every call has
//! a timeout, so a silent peer costs a retry, never a stuck task; with a cluster secret,
//! every request is signed (`felix_meta::network::PeerSigner`).

use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use felix_meta::model::ShardKey;
use felix_meta::network::PeerSigner;
use http_body_util::{BodyExt, Full};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A follower's fetch: the batches from `from` on, waiting up to `wait_ms` for some.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FetchRequest {
    pub shard: ShardKey,
    pub generation: u64,
    pub follower: u64,
    /// The follower holds everything below this offset.
    pub from: u64,
    pub max_bytes: usize,
    pub wait_ms: u64,
}

/// The answer's header naming the size the leader's log rolls its segments at.
pub const SEGMENT_BYTES_HEADER: &str = "x-felix-segment-bytes";

/// A fetch's answer: the batches, and the size the leader's log rolls its segments at (a
/// cache shard's follower rolls at it too: `follower.rs`). An older leader sends none.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub batches: Bytes,
    pub segment_bytes: Option<u64>,
}

impl IntoResponse for Fetched {
    fn into_response(self) -> Response {
        let mut response = self.batches.into_response();
        if let Some(n) = self.segment_bytes {
            response
                .headers_mut()
                .insert(SEGMENT_BYTES_HEADER, hyper::header::HeaderValue::from(n));
        }
        response
    }
}

/// Why a fetch was refused (the JSON body of a non-200 answer).
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum FetchError {
    #[error("this broker does not lead the shard at generation {generation:?}")]
    NotLeader { generation: Option<u64> },
    #[error("the requested offset is below the leader's local log, which starts at {first}")]
    Behind { first: u64 },
    #[error("the follower's log ends at {from}, past the leader's end {end}")]
    Ahead { from: u64, end: u64 },
    #[error("{0}")]
    Failed(String),
}

impl IntoResponse for FetchError {
    fn into_response(self) -> Response {
        let status = match self {
            FetchError::NotLeader { .. } => StatusCode::CONFLICT,
            FetchError::Behind { .. } => StatusCode::GONE,
            FetchError::Ahead { .. } => StatusCode::RANGE_NOT_SATISFIABLE,
            FetchError::Failed(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        (status, Json(self)).into_response()
    }
}

/// HTTP/1.1 client of other brokers' internal endpoints (pooled connections), signing
/// each request when the internal network is authenticated.
#[derive(Clone)]
pub struct PeerClient {
    http: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        Full<Bytes>,
    >,
    signer: Option<PeerSigner>,
}

impl PeerClient {
    /// A client signing with `signer` (`None`: the internal network is open).
    pub fn new(signer: Option<PeerSigner>) -> PeerClient {
        PeerClient {
            http: hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http(),
            signer,
        }
    }

    /// A POST of `body` to `path` at `addr` with `headers`, signed if the network is
    /// authenticated (the signature covers the `x-felix-*` headers among them).
    fn post(
        &self,
        addr: &str,
        path: &str,
        mut headers: hyper::HeaderMap,
        body: Bytes,
    ) -> Result<hyper::Request<Full<Bytes>>, hyper::http::Error> {
        if let Some(signer) = &self.signer {
            signer.sign(&mut headers, &hyper::Method::POST, path, &body);
        }
        let mut request = hyper::Request::post(format!("http://{addr}{path}"));
        if let Some(h) = request.headers_mut() {
            *h = headers;
        }
        request.body(Full::new(body))
    }

    /// POSTs `body` to `path` at `addr` and reads the whole answer, whatever its status.
    /// `timeout` bounds the wait for the answer's head and, again, for its body.
    ///
    /// The failure says whether anything can have reached the peer: forwarding callers
    /// turn [`PeerFailure::Unsent`] into a retryable refusal and [`PeerFailure::Unknown`]
    /// into "its outcome is unknown".
    pub(crate) async fn send(
        &self,
        addr: &str,
        path: &str,
        headers: hyper::HeaderMap,
        body: Bytes,
        timeout: Duration,
    ) -> Result<PeerAnswer, PeerFailure> {
        if felix_meta::faults::isolated() {
            return Err(PeerFailure::Unsent(
                "this broker is cut off the network (fault injection)".into(),
            ));
        }
        let request = self
            .post(addr, path, headers, body)
            .map_err(|e| PeerFailure::Unsent(format!("{addr}{path}: {e}")))?;
        let response = match tokio::time::timeout(timeout, self.http.request(request)).await {
            Err(_) => {
                return Err(PeerFailure::Unknown(format!(
                    "no answer from {addr} within {timeout:?}"
                )));
            }
            Ok(Err(e)) if e.is_connect() => {
                return Err(PeerFailure::Unsent(format!("{addr}: {e}")));
            }
            Ok(Err(e)) => return Err(PeerFailure::Unknown(format!("{addr}: {e}"))),
            Ok(Ok(r)) => r,
        };
        let (parts, body) = response.into_parts();
        let body = tokio::time::timeout(timeout, body.collect())
            .await
            .map_err(|_| PeerFailure::Unknown(format!("{addr}: the answer's body timed out")))?
            .map_err(|e| PeerFailure::Unknown(format!("{addr}: {e}")))?
            .to_bytes();
        Ok(PeerAnswer {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    pub async fn fetch(&self, addr: &str, req: &FetchRequest) -> Result<Fetched, FetchError> {
        let timeout = Duration::from_millis(req.wait_ms) + Duration::from_secs(5);
        let answer = self
            .call(addr, "/repl/fetch", req, timeout, FetchError::Failed)
            .await?;
        let segment_bytes = answer
            .headers
            .get(SEGMENT_BYTES_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        Ok(Fetched {
            batches: answer.body,
            segment_bytes,
        })
    }

    /// POSTs `req` as JSON to `path` at `addr`: a 200 answer, or the peer's refusal `E`
    /// (the JSON body of any other status), or `failed` with why no refusal could be read.
    pub(crate) async fn call<E: DeserializeOwned>(
        &self,
        addr: &str,
        path: &str,
        req: &impl Serialize,
        timeout: Duration,
        failed: fn(String) -> E,
    ) -> Result<PeerAnswer, E> {
        let body = serde_json::to_vec(req).map_err(|e| failed(e.to_string()))?;
        let mut headers = hyper::HeaderMap::new();
        headers.insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        let answer = self
            .send(addr, path, headers, Bytes::from(body), timeout)
            .await
            .map_err(|f| failed(f.to_string()))?;
        if answer.status.is_success() {
            return Ok(answer);
        }
        Err(
            serde_json::from_slice::<E>(&answer.body).unwrap_or_else(|_| {
                failed(format!(
                    "{addr} answered {}: {}",
                    answer.status,
                    String::from_utf8_lossy(&answer.body)
                ))
            }),
        )
    }
}

/// A peer's whole answer.
pub(crate) struct PeerAnswer {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

/// Why a POST to a peer brought no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PeerFailure {
    /// Nothing reached the peer: this broker is cut off, or no connection could be made.
    #[error("{0}")]
    Unsent(String),
    /// The request may have reached the peer, but no whole answer came back: what it
    /// asked for may or may not have happened.
    #[error("{0}")]
    Unknown(String),
}
