//! SASL on the Kafka listener: SaslHandshake (v0-1) and SaslAuthenticate (v0-2), with the
//! mechanisms PLAIN (the password is a Felix token) and OAUTHBEARER (the bearer token is).
//!
//! Decides when a connection is someone. With auth on, a connection serves nothing but
//! ApiVersions, SaslHandshake and SaslAuthenticate until its token verified (once, here;
//! the connection keeps the credential), and every later request re-checks only that the
//! token is still live: one that expired or was revoked closes the connection at its next
//! request, and the client connects and authenticates again. A failed authentication is
//! answered `SASL_AUTHENTICATION_FAILED` with the reason, then the connection is closed. A
//! re-authentication (KIP-368: the answer's `session_lifetime_ms` is the token's remaining
//! life) must keep the principal's tenant and namespace. With auth off SASL is optional and
//! any credential is accepted without changing anything, so a client configured for SASL
//! still works against the embedded default.

use std::net::SocketAddr;

use bytes::Bytes;
use felix_meta::auth::{self, SaslMechanism};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use tracing::{debug, warn};

use super::Kafka;
use super::scope::Scope;

/// One connection's SASL state.
#[derive(Debug)]
pub struct SaslState {
    /// The mechanism SaslHandshake agreed, awaiting SaslAuthenticate.
    mechanism: Option<SaslMechanism>,
    /// A token verified (auth on) or any credential accepted (auth off).
    authenticated: bool,
    /// A v0 handshake was agreed: the next frame is the bare SASL message.
    raw_next: bool,
}

impl SaslState {
    pub fn new() -> SaslState {
        SaslState {
            mechanism: None,
            authenticated: false,
            raw_next: false,
        }
    }

    pub fn authenticated(&self) -> bool {
        self.authenticated
    }
}

fn mechanisms() -> Vec<StrBytes> {
    SaslMechanism::ALL
        .iter()
        .map(|m| StrBytes::from_static_str(m.as_str()))
        .collect()
}

/// SaslHandshake: agrees the mechanism. An unknown one is answered
/// `UNSUPPORTED_SASL_MECHANISM` with the list; the caller then closes the connection. After
/// a v0 handshake the client sends its SASL message as a bare frame, not a SaslAuthenticate
/// request ([`raw_authenticate`]).
pub fn handshake(
    state: &mut SaslState,
    request: &SaslHandshakeRequest,
    version: i16,
) -> (SaslHandshakeResponse, bool) {
    let response = SaslHandshakeResponse::default().with_mechanisms(mechanisms());
    match SaslMechanism::parse(&request.mechanism) {
        Some(m) => {
            state.mechanism = Some(m);
            state.raw_next = version == 0;
            (response, true)
        }
        None => (
            response.with_error_code(ResponseError::UnsupportedSaslMechanism.code()),
            false,
        ),
    }
}

/// SaslAuthenticate: verifies the token the agreed mechanism carries and, on success, sets
/// the connection's scope. Returns the answer and whether the connection goes on.
pub async fn authenticate(
    kafka: &Kafka,
    state: &mut SaslState,
    scope: &mut Scope,
    request: &SaslAuthenticateRequest,
    peer: &SocketAddr,
) -> (SaslAuthenticateResponse, bool) {
    match verify(kafka, state, scope, &request.auth_bytes, peer).await {
        Ok(lifetime_ms) => (
            SaslAuthenticateResponse::default().with_session_lifetime_ms(lifetime_ms),
            true,
        ),
        Err((error, message)) => (
            SaslAuthenticateResponse::default()
                .with_error_code(error.code())
                .with_error_message(Some(StrBytes::from_string(message)))
                .with_auth_bytes(Bytes::new()),
            false,
        ),
    }
}

/// Whether the next frame is a bare SASL message (after a v0 handshake).
pub fn expects_raw(state: &SaslState) -> bool {
    state.raw_next
}

/// A bare SASL message after a v0 handshake: on success the answer is an empty SASL
/// response (a zero length); on failure there is no way to say why, so the connection is
/// closed, as Kafka does.
pub async fn raw_authenticate(
    kafka: &Kafka,
    state: &mut SaslState,
    scope: &mut Scope,
    message: &[u8],
    peer: &SocketAddr,
) -> anyhow::Result<Bytes> {
    state.raw_next = false;
    match verify(kafka, state, scope, message, peer).await {
        Ok(_) => Ok(Bytes::from_static(&[0, 0, 0, 0])),
        Err((_, message)) => anyhow::bail!("SASL authentication failed: {message}"),
    }
}

/// The exchange's one check: the agreed mechanism's token, verified. `Ok` with the
/// session's lifetime in milliseconds (the token's remaining life; 0 with auth off).
async fn verify(
    kafka: &Kafka,
    state: &mut SaslState,
    scope: &mut Scope,
    message: &[u8],
    peer: &SocketAddr,
) -> Result<i64, (ResponseError, String)> {
    let fail = |error: ResponseError, reason: &str, message: String| {
        kafka.broker.metrics().auth_refused(reason);
        warn!(%peer, reason, "Kafka SASL authentication failed: {message}");
        Err((error, message))
    };
    // One exchange per handshake: a second SaslAuthenticate needs a new handshake.
    let Some(mechanism) = state.mechanism.take() else {
        return fail(
            ResponseError::IllegalSaslState,
            "sasl_state",
            "SaslAuthenticate before SaslHandshake".to_owned(),
        );
    };
    let token = match mechanism.token(message) {
        Ok(t) => t,
        Err(e) => {
            return fail(
                ResponseError::SaslAuthenticationFailed,
                "invalid_sasl",
                format!("{}: {e}", mechanism.as_str()),
            );
        }
    };
    let access = kafka.broker.access();
    if !access.enabled() {
        // Auth off: nothing is checked, so the credential decides nothing.
        state.authenticated = true;
        debug!(%peer, mechanism = mechanism.as_str(), "Kafka SASL accepted (auth is off)");
        return Ok(0);
    }
    let verified = match mechanism {
        SaslMechanism::OAuthBearer => access.authenticate_bearer(token).await,
        SaslMechanism::Plain => access.authenticate(token),
    };
    let credential = match verified {
        Ok(c) => c,
        Err(e) => {
            return fail(
                ResponseError::SaslAuthenticationFailed,
                &e.reason,
                format!("{}: {} ({})", mechanism.as_str(), e.message, e.reason),
            );
        }
    };
    let next = Scope::of(kafka, credential);
    if state.authenticated && (next.tenant != scope.tenant || next.namespace != scope.namespace) {
        return fail(
            ResponseError::SaslAuthenticationFailed,
            "principal_changed",
            "a re-authentication must present a token of the same tenant and namespace".to_owned(),
        );
    }
    let remaining_ms = next.credential.as_ref().map_or(0, |c| {
        c.claims().exp.saturating_sub(auth::now_secs()) * 1000
    });
    debug!(%peer, mechanism = mechanism.as_str(), tenant = next.tenant,
        namespace = next.namespace, "Kafka SASL authenticated");
    *scope = next;
    state.authenticated = true;
    Ok(i64::try_from(remaining_ms).unwrap_or(i64::MAX))
}
