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
    pub(crate) fn post(
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

    /// Sends `request` on the pooled connections.
    pub(crate) fn request(
        &self,
        request: hyper::Request<Full<Bytes>>,
    ) -> hyper_util::client::legacy::ResponseFuture {
        self.http.request(request)
    }

    pub async fn fetch(&self, addr: &str, req: &FetchRequest) -> Result<Bytes, FetchError> {
        let timeout = Duration::from_millis(req.wait_ms) + Duration::from_secs(5);
        self.call(addr, "/repl/fetch", req, timeout).await
    }

    /// POSTs `req` as JSON to `path` at `addr`: the body of a 200 answer, or the peer's
    /// [`FetchError`].
    pub(crate) async fn call(
        &self,
        addr: &str,
        path: &str,
        req: &impl Serialize,
        timeout: Duration,
    ) -> Result<Bytes, FetchError> {
        if felix_meta::faults::isolated() {
            return Err(FetchError::Failed(
                "this node is cut off the network (fault injection)".into(),
            ));
        }
        let body = serde_json::to_vec(req).map_err(|e| FetchError::Failed(e.to_string()))?;
        let mut headers = hyper::HeaderMap::new();
        headers.insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        let request = self
            .post(addr, path, headers, Bytes::from(body))
            .map_err(|e| FetchError::Failed(e.to_string()))?;
        let response = tokio::time::timeout(timeout, self.http.request(request))
            .await
            .map_err(|_| FetchError::Failed(format!("no answer from {addr} within {timeout:?}")))?
            .map_err(|e| FetchError::Failed(format!("{addr}: {e}")))?;
        let status = response.status();
        let bytes = tokio::time::timeout(timeout, response.into_body().collect())
            .await
            .map_err(|_| FetchError::Failed(format!("{addr}: body timed out")))?
            .map_err(|e| FetchError::Failed(format!("{addr}: {e}")))?
            .to_bytes();
        if status.is_success() {
            return Ok(bytes);
        }
        Err(
            serde_json::from_slice::<FetchError>(&bytes).unwrap_or_else(|_| {
                FetchError::Failed(format!(
                    "{addr} answered {status}: {}",
                    String::from_utf8_lossy(&bytes)
                ))
            }),
        )
    }
}
