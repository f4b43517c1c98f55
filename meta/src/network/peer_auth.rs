//! Who may talk on the internal network: every request between brokers (Raft RPCs, forwarded
//! proposals, lease renewals, status and dump reads, replication fetches, forwarded
//! publishes) carries an HMAC-SHA256 made with the cluster secret, and the server refuses
//! any request whose signature does not verify.
//!
//! Decides what is signed and what a valid signature is. The invariant: a request reaches a
//! route handler only if it was signed, within [`REPLAY_WINDOW`] of this node's clock, with
//! a key this node holds, over its method, path (with query), sender node id, timestamp,
//! its other `x-felix-*` headers and the SHA-256 of its exact body; anything else is answered 401 with a short JSON body
//! before the handler runs, so it changes nothing. `/healthz` alone stays open (load
//! balancers and the harness probe it).
//!
//! What it does not do: hide traffic (there is no TLS on the internal network), or stop an
//! eavesdropper from replaying a captured request within the window. See
//! docs/internal-network.md.
//!
//! Cost: the key is prepared once ([`ClusterKey::new`]); a request costs one SHA-256 of its
//! body and one HMAC of a short string on each side (two while a previous secret is still
//! accepted during a rotation).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::{digest, hmac};
use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::messages::RAFT_BODY_LIMIT;
use crate::types::NodeId;

/// The sender's node id.
pub const NODE_HEADER: &str = "x-felix-node";
/// The sender's clock when it signed, in seconds since the Unix epoch.
pub const TIME_HEADER: &str = "x-felix-time";
/// The signatures, lowercase hex, comma-separated (one per key the sender holds).
pub const AUTH_HEADER: &str = "x-felix-auth";

/// How far a request's timestamp may be from the receiver's clock, either way. Brokers'
/// clocks must agree to within this (NTP keeps them far closer).
pub const REPLAY_WINDOW: Duration = Duration::from_secs(30);

/// The shortest secret accepted: 32 bytes, the HMAC-SHA256 block's worth of guessing.
pub const MIN_SECRET_BYTES: usize = 32;

/// Domain separation: a signature made for this scheme means nothing anywhere else.
const SCHEME: &str = "felix-internal-v1";

/// The route that stays open: readiness probes carry no secret.
const OPEN_PATH: &str = "/healthz";

/// Why a secret was refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error(
        "the cluster secret is {len} bytes; it must be at least {MIN_SECRET_BYTES} \
         (generate one with `openssl rand -hex 32`)"
    )]
    TooShort { len: usize },
    #[error("the system's random number generator failed")]
    Random,
}

/// A new random secret: [`MIN_SECRET_BYTES`] bytes from the system's generator, as lowercase
/// hex (so it can be copied into a file or a variable as text).
pub fn generate_secret() -> Result<String, SecretError> {
    let mut bytes = [0u8; MIN_SECRET_BYTES];
    aws_lc_rs::rand::fill(&mut bytes).map_err(|_| SecretError::Random)?;
    let mut out = String::with_capacity(2 * MIN_SECRET_BYTES);
    hex_into(&bytes, &mut out);
    Ok(out)
}

/// The cluster secret, prepared as HMAC keys: the current one, which signs, and optionally
/// a previous one, which is still accepted (and also signed with, so peers that do not know
/// the current one yet accept this node's requests) while a rotation rolls through.
pub struct ClusterKey {
    keys: Vec<hmac::Key>,
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key material.
        write!(f, "ClusterKey({} key(s), redacted)", self.keys.len())
    }
}

impl ClusterKey {
    /// The key of `secret` (at least [`MIN_SECRET_BYTES`] bytes).
    pub fn new(secret: &[u8]) -> Result<ClusterKey, SecretError> {
        Ok(ClusterKey {
            keys: vec![prepare(secret)?],
        })
    }

    /// This key, still accepting (and signing with) `previous` during a rotation.
    pub fn with_previous(mut self, previous: &[u8]) -> Result<ClusterKey, SecretError> {
        self.keys.truncate(1);
        self.keys.push(prepare(previous)?);
        Ok(self)
    }

    fn signatures(&self, message: &[u8]) -> String {
        let mut out = String::with_capacity(self.keys.len() * 65);
        for key in &self.keys {
            if !out.is_empty() {
                out.push(',');
            }
            hex_into(hmac::sign(key, message).as_ref(), &mut out);
        }
        out
    }

    /// Whether one of `signatures` (the header's value) is a valid tag of `message` under
    /// one of the keys. Each comparison is constant-time (`hmac::verify`).
    fn accepts(&self, message: &[u8], signatures: &str) -> bool {
        signatures.split(',').take(2).any(|sig| {
            let Some(tag) = unhex(sig.trim()) else {
                return false;
            };
            self.keys
                .iter()
                .any(|key| hmac::verify(key, message, &tag).is_ok())
        })
    }
}

fn prepare(secret: &[u8]) -> Result<hmac::Key, SecretError> {
    if secret.len() < MIN_SECRET_BYTES {
        return Err(SecretError::TooShort { len: secret.len() });
    }
    Ok(hmac::Key::new(hmac::HMAC_SHA256, secret))
}

/// What is signed: the scheme, method, path with query, sender, timestamp, every other
/// `x-felix-*` header (they carry meaning, e.g. a forwarded publish's target stream),
/// sorted by name, and the body's SHA-256 — newline-separated (no field can hold a
/// newline) with the digest last, at a fixed length.
fn signed_message(
    method: &str,
    path: &str,
    node: NodeId,
    time: i64,
    headers: &HeaderMap,
    body: &[u8],
) -> Vec<u8> {
    let mut message = format!("{SCHEME}\n{method}\n{path}\n{node}\n{time}\n").into_bytes();
    let mut extra: Vec<(&str, &[u8])> = headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_bytes()))
        .filter(|(name, _)| {
            name.starts_with("x-felix-") && ![NODE_HEADER, TIME_HEADER, AUTH_HEADER].contains(name)
        })
        .collect();
    extra.sort_by(|a, b| a.0.cmp(b.0));
    for (name, value) in extra {
        message.extend_from_slice(name.as_bytes());
        message.push(b':');
        message.extend_from_slice(value);
        message.push(b'\n');
    }
    message.extend_from_slice(digest::digest(&digest::SHA256, body).as_ref());
    message
}

/// Signs this node's internal requests. Cheap to clone (the key is shared).
#[derive(Clone, Debug)]
pub struct PeerSigner {
    key: Arc<ClusterKey>,
    node: NodeId,
}

impl PeerSigner {
    /// Signs as node `node` with `key`.
    pub fn new(key: Arc<ClusterKey>, node: NodeId) -> PeerSigner {
        PeerSigner { key, node }
    }

    /// The key, to verify requests with the same secret.
    pub fn key(&self) -> &Arc<ClusterKey> {
        &self.key
    }

    /// Signs a request of `method` to `path` with `body` and the `x-felix-*` headers
    /// already in `headers`: adds the node, time and signature headers. Call it last.
    pub fn sign(&self, headers: &mut HeaderMap, method: &Method, path: &str, body: &[u8]) {
        self.sign_at(headers, method, path, body, unix_now());
    }

    /// [`PeerSigner::sign`] as if at `time` (seconds since the epoch).
    pub fn sign_at(
        &self,
        headers: &mut HeaderMap,
        method: &Method,
        path: &str,
        body: &[u8],
        time: i64,
    ) {
        headers.remove(AUTH_HEADER);
        let message = signed_message(method.as_str(), path, self.node, time, headers, body);
        let signatures =
            HeaderValue::try_from(self.key.signatures(&message)).expect("hex digits and commas");
        headers.insert(NODE_HEADER, HeaderValue::from(self.node));
        headers.insert(TIME_HEADER, HeaderValue::from(time));
        headers.insert(AUTH_HEADER, signatures);
    }
}

/// Why a request was refused: the short reason in its 401 body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing {0} header: internal requests must be signed with the cluster secret")]
    Missing(&'static str),
    #[error("malformed {0} header")]
    Malformed(&'static str),
    #[error("timestamp {skew_secs} s away from this node's clock (the window is ±30 s)")]
    Stale { skew_secs: i64 },
    #[error("signature does not verify: the sender holds a different cluster secret")]
    BadSignature,
}

/// Checks a request's signature against `key` at `now` (seconds since the epoch) and
/// returns the sender's node id.
pub fn verify(
    key: &ClusterKey,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<NodeId, AuthError> {
    let (node, time, signatures) = signed_fields(headers)?;
    check_time(time, now)?;
    let message = signed_message(method.as_str(), path, node, time, headers, body);
    if key.accepts(&message, signatures) {
        Ok(node)
    } else {
        Err(AuthError::BadSignature)
    }
}

/// The node, time and signature headers, parsed (refusing before the body is read).
fn signed_fields(headers: &HeaderMap) -> Result<(NodeId, i64, &str), AuthError> {
    let text = |name: &'static str| -> Result<&str, AuthError> {
        headers
            .get(name)
            .ok_or(AuthError::Missing(name))?
            .to_str()
            .map_err(|_| AuthError::Malformed(name))
    };
    let node = text(NODE_HEADER)?
        .parse()
        .map_err(|_| AuthError::Malformed(NODE_HEADER))?;
    let time = text(TIME_HEADER)?
        .parse()
        .map_err(|_| AuthError::Malformed(TIME_HEADER))?;
    Ok((node, time, text(AUTH_HEADER)?))
}

fn check_time(time: i64, now: i64) -> Result<(), AuthError> {
    let skew = time.saturating_sub(now);
    if skew.unsigned_abs() > REPLAY_WINDOW.as_secs() {
        return Err(AuthError::Stale { skew_secs: skew });
    }
    Ok(())
}

/// Seconds since the Unix epoch on this node's clock.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// `router` with every route but `/healthz` refusing requests not signed with `key` (the
/// axum middleware of this module). Apply it after merging every internal route.
pub fn require_signed(router: axum::Router, key: Arc<ClusterKey>) -> axum::Router {
    router.layer(axum::middleware::from_fn_with_state(key, check_signed))
}

async fn check_signed(State(key): State<Arc<ClusterKey>>, req: Request, next: Next) -> Response {
    if req.uri().path() == OPEN_PATH {
        return next.run(req).await;
    }
    // Headers and clock first: an unsigned request is refused without reading its body.
    if let Err(e) = signed_fields(req.headers()).and_then(|(_, t, _)| check_time(t, unix_now())) {
        return refuse(&req, e);
    }
    let (parts, body) = req.into_parts();
    // The largest body any internal route takes; each route's own limit still applies
    // when its handler reads the buffered body.
    let bytes = match axum::body::to_bytes(body, RAFT_BODY_LIMIT).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return (StatusCode::PAYLOAD_TOO_LARGE, "request body too large").into_response();
        }
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |p| p.as_str());
    match verify(
        &key,
        &parts.method,
        path,
        &parts.headers,
        &bytes,
        unix_now(),
    ) {
        Ok(_) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(e) => refuse(&Request::from_parts(parts, Body::empty()), e),
    }
}

/// Second (since the epoch) of the last refusal logged: a peer with the wrong secret
/// retries many times a second, and one line every 10 s says enough.
static LAST_LOGGED: AtomicU64 = AtomicU64::new(0);

fn refuse(req: &Request, e: AuthError) -> Response {
    let now = unix_now() as u64;
    let last = LAST_LOGGED.load(Ordering::Relaxed);
    if now >= last + 10
        && LAST_LOGGED
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            method = %req.method(),
            path = req.uri().path(),
            node = req.headers().get(NODE_HEADER).and_then(|v| v.to_str().ok()),
            error = %e,
            "refused an unauthenticated internal request (further refusals for 10 s not logged)"
        );
    }
    (
        StatusCode::UNAUTHORIZED,
        Json(serde_json::json!({"error": "unauthenticated", "message": e.to_string()})),
    )
        .into_response()
}

fn hex_into(bytes: &[u8], out: &mut String) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
}

/// Lowercase or uppercase hex of an HMAC-SHA256 tag (32 bytes); `None` otherwise.
fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() != 64 {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes()
        .chunks(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
    const OTHER: &[u8] = b"fedcba9876543210fedcba9876543210";
    const NOW: i64 = 1_800_000_000;

    fn signer(secret: &[u8], node: NodeId) -> PeerSigner {
        PeerSigner::new(Arc::new(ClusterKey::new(secret).expect("key")), node)
    }

    fn signed(signer: &PeerSigner, path: &str, body: &[u8], time: i64) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-felix-publish",
            HeaderValue::from_static(r#"{"stream":"a"}"#),
        );
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        signer.sign_at(&mut headers, &Method::POST, path, body, time);
        headers
    }

    fn key(secret: &[u8]) -> ClusterKey {
        ClusterKey::new(secret).expect("key")
    }

    #[test]
    fn a_signed_request_verifies_and_names_its_sender() {
        let headers = signed(&signer(SECRET, 3), "/meta/propose", b"{}", NOW);
        let node = verify(
            &key(SECRET),
            &Method::POST,
            "/meta/propose",
            &headers,
            b"{}",
            NOW,
        );
        assert_eq!(node, Ok(3));
    }

    #[test]
    fn tampering_with_any_signed_field_is_refused() {
        let k = key(SECRET);
        let body = br#"{"CreateTenant":{"name":"x"}}"#;
        let headers = signed(&signer(SECRET, 3), "/meta/propose", body, NOW);
        let check = |method: &Method, path: &str, headers: &HeaderMap, body: &[u8]| {
            verify(&k, method, path, headers, body, NOW)
        };
        assert_eq!(
            check(&Method::GET, "/meta/propose", &headers, body),
            Err(AuthError::BadSignature),
            "method"
        );
        assert_eq!(
            check(&Method::POST, "/meta/lease", &headers, body),
            Err(AuthError::BadSignature),
            "path"
        );
        assert_eq!(
            check(&Method::POST, "/meta/propose?x=1", &headers, body),
            Err(AuthError::BadSignature),
            "query"
        );
        assert_eq!(
            check(
                &Method::POST,
                "/meta/propose",
                &headers,
                br#"{"CreateTenant":{"name":"y"}}"#
            ),
            Err(AuthError::BadSignature),
            "body"
        );
        let mut h = headers.clone();
        h.insert(NODE_HEADER, HeaderValue::from(4u64));
        assert_eq!(
            check(&Method::POST, "/meta/propose", &h, body),
            Err(AuthError::BadSignature),
            "node"
        );
        let mut h = headers.clone();
        h.insert(TIME_HEADER, HeaderValue::from(NOW + 1));
        assert_eq!(
            check(&Method::POST, "/meta/propose", &h, body),
            Err(AuthError::BadSignature),
            "time"
        );
        let mut h = headers.clone();
        h.insert(
            "x-felix-publish",
            HeaderValue::from_static(r#"{"stream":"b"}"#),
        );
        assert_eq!(
            check(&Method::POST, "/meta/propose", &h, body),
            Err(AuthError::BadSignature),
            "a meaningful header"
        );
        let mut h = headers.clone();
        h.insert("x-felix-added", HeaderValue::from_static("1"));
        assert_eq!(
            check(&Method::POST, "/meta/propose", &h, body),
            Err(AuthError::BadSignature),
            "an added x-felix header"
        );
        let mut h = headers.clone();
        h.insert("content-type", HeaderValue::from_static("text/plain"));
        assert_eq!(
            check(&Method::POST, "/meta/propose", &h, body),
            Ok(3),
            "other headers are not signed"
        );
        let mut h = headers.clone();
        let mut sig = h[AUTH_HEADER].to_str().expect("ascii").to_owned();
        let flipped = if sig.starts_with('0') { "1" } else { "0" };
        sig.replace_range(0..1, flipped);
        h.insert(AUTH_HEADER, HeaderValue::try_from(sig).expect("hex"));
        assert_eq!(
            check(&Method::POST, "/meta/propose", &h, body),
            Err(AuthError::BadSignature),
            "signature"
        );
        assert_eq!(
            check(&Method::POST, "/meta/propose", &headers, body),
            Ok(3),
            "untouched"
        );
    }

    #[test]
    fn a_wrong_secret_or_a_missing_header_is_refused() {
        let headers = signed(&signer(OTHER, 1), "/repl/fetch", b"", NOW);
        let k = key(SECRET);
        let check = |h: &HeaderMap| verify(&k, &Method::POST, "/repl/fetch", h, b"", NOW);
        assert_eq!(check(&headers), Err(AuthError::BadSignature));
        for name in [NODE_HEADER, TIME_HEADER, AUTH_HEADER] {
            let mut h = signed(&signer(SECRET, 1), "/repl/fetch", b"", NOW);
            h.remove(name);
            assert_eq!(check(&h), Err(AuthError::Missing(name)));
        }
        let mut h = signed(&signer(SECRET, 1), "/repl/fetch", b"", NOW);
        h.insert(AUTH_HEADER, HeaderValue::from_static("not hex"));
        assert_eq!(check(&h), Err(AuthError::BadSignature));
        h.insert(TIME_HEADER, HeaderValue::from_static("soon"));
        assert_eq!(check(&h), Err(AuthError::Malformed(TIME_HEADER)));
    }

    #[test]
    fn timestamps_outside_the_window_are_refused_either_way() {
        let s = signer(SECRET, 1);
        let k = key(SECRET);
        let window = REPLAY_WINDOW.as_secs() as i64;
        for (time, ok) in [
            (NOW - window, true),
            (NOW + window, true),
            (NOW - window - 1, false),
            (NOW + window + 1, false),
            (NOW - 300, false),
        ] {
            let h = signed(&s, "/raft/vote", b"v", time);
            let got = verify(&k, &Method::POST, "/raft/vote", &h, b"v", NOW);
            assert_eq!(got.is_ok(), ok, "signed at now{:+}: {got:?}", time - NOW);
        }
    }

    #[test]
    fn during_a_rotation_both_secrets_are_accepted_and_old_peers_accept_new_senders() {
        let rotating = Arc::new(
            ClusterKey::new(OTHER)
                .and_then(|k| k.with_previous(SECRET))
                .expect("keys"),
        );
        // A node still on the old secret accepts a rotated node's requests...
        let h = signed(
            &PeerSigner::new(rotating.clone(), 2),
            "/raft/append",
            b"",
            NOW,
        );
        assert_eq!(
            verify(&key(SECRET), &Method::POST, "/raft/append", &h, b"", NOW),
            Ok(2)
        );
        // ...and a rotated node accepts both old and new senders.
        for secret in [SECRET, OTHER] {
            let h = signed(&signer(secret, 1), "/raft/append", b"", NOW);
            assert_eq!(
                verify(&rotating, &Method::POST, "/raft/append", &h, b"", NOW),
                Ok(1)
            );
        }
    }

    #[test]
    fn generated_secrets_are_long_enough_and_differ() {
        let a = generate_secret().expect("random");
        let b = generate_secret().expect("random");
        assert_eq!(a.len(), 2 * MIN_SECRET_BYTES);
        assert_ne!(a, b);
        ClusterKey::new(a.as_bytes()).expect("a generated secret is accepted");
    }

    #[test]
    fn short_secrets_are_refused_and_keys_never_print() {
        assert!(matches!(
            ClusterKey::new(b"short"),
            Err(SecretError::TooShort { len: 5 })
        ));
        let printed = format!("{:?}", key(SECRET));
        assert!(!printed.contains("0123"), "{printed}");
    }
}
