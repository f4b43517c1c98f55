//! The control plane's HTTP client: one pooled hyper client for every peer, and one HTTP
//! exchange at a time.
//!
//! Decides how an exchange fails before its status is looked at ([`CallError`]). The
//! invariant: every exchange ends within its timeout, and a failure says whether the
//! request may have been delivered (`Broken`, `Timeout`) or certainly was not (`Connect`),
//! which is what forwarding and the Raft RPCs each turn into their own errors. A node cut
//! off the network by fault injection (`crate::faults`) fails every exchange as `Connect`.
//! With a cluster secret, every exchange is signed (`peer_auth.rs`).

use std::error::Error as StdError;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::Full;
use http_body_util::Limited;
use hyper::Method;
use hyper::Request;
use hyper::header;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::peer_auth::PeerSigner;

/// Largest response body the client reads.
const RESPONSE_LIMIT: usize = 64 * 1024 * 1024;

/// How long idle pooled connections to a peer are kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Idle pooled connections kept per peer.
const POOL_MAX_IDLE_PER_HOST: usize = 8;

/// Why a single HTTP exchange failed, before looking at the status.
#[derive(Debug)]
pub(super) enum CallError {
    /// Not delivered: the request could not be built or the connection not made.
    Connect(String),
    /// Sending or reading the answer failed: the request may have been delivered.
    Broken(String),
    /// No complete answer within the timeout.
    Timeout,
}

/// The HTTP client of the control plane: a pooled hyper client (cheap to clone, clones share
/// the pool), the default timeout of forwarded requests, and the signer of every request
/// when the internal network is authenticated.
#[derive(Clone, Debug)]
pub struct PeerClient {
    http: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
    signer: Option<PeerSigner>,
}

impl PeerClient {
    /// A client whose forwarded requests time out after `timeout` (Raft RPCs use their own
    /// `hard_ttl`).
    pub fn new(timeout: Duration) -> PeerClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
            .build(connector);
        PeerClient {
            http,
            timeout,
            signer: None,
        }
    }

    /// The same client signing every request with `signer` (`None`: unsigned, for an
    /// internal network without a cluster secret).
    pub fn with_signer(mut self, signer: Option<PeerSigner>) -> PeerClient {
        self.signer = signer;
        self
    }

    /// The signer of this client's requests, if the internal network is authenticated.
    pub fn signer(&self) -> Option<&PeerSigner> {
        self.signer.as_ref()
    }

    /// The default timeout of forwarded requests.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The same client (same connection pool) with another default timeout.
    pub fn with_timeout(&self, timeout: Duration) -> PeerClient {
        PeerClient {
            http: self.http.clone(),
            timeout,
            signer: self.signer.clone(),
        }
    }

    /// One HTTP exchange: sends, reads the whole answer, all within `timeout`.
    pub(super) async fn call(
        &self,
        method: Method,
        addr: &str,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<(u16, Bytes), CallError> {
        if crate::faults::isolated() {
            return Err(CallError::Connect(format!(
                "{addr}{path}: this node is cut off the network (fault injection)"
            )));
        }
        let mut req = Request::builder()
            .method(method.clone())
            .uri(format!("http://{addr}{path}"));
        let body = match body {
            Some(b) => {
                req = req.header(header::CONTENT_TYPE, "application/json");
                Bytes::from(b)
            }
            None => Bytes::new(),
        };
        if let (Some(signer), Some(headers)) = (&self.signer, req.headers_mut()) {
            signer.sign(headers, &method, path, &body);
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| CallError::Connect(format!("bad request to {addr}{path}: {e}")))?;
        let exchange = async {
            let resp = self.http.request(req).await.map_err(|e| {
                let m = format!("{addr}{path}: {}", error_chain(&e));
                if e.is_connect() {
                    CallError::Connect(m)
                } else {
                    CallError::Broken(m)
                }
            })?;
            let status = resp.status().as_u16();
            let bytes = Limited::new(resp.into_body(), RESPONSE_LIMIT)
                .collect()
                .await
                .map_err(|e| CallError::Broken(format!("{addr}{path}: reading answer: {e}")))?
                .to_bytes();
            Ok((status, bytes))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or(Err(CallError::Timeout))
    }
}

/// `e` and its sources, `: `-separated (hyper's top-level errors say little by themselves).
fn error_chain(e: &(dyn StdError + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}
