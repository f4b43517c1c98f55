//! The admin API's common ground: its state, its refusals, its bodies, and who is calling.
//!
//! Decides how a refusal looks over HTTP (the protocol's [`ErrorBody`] with a status from
//! [`status_for`]) and who the caller is: with auth on, `Authorization: Bearer <token>` is
//! verified here, once per request, and the routes check its grants before doing anything.
//! The invariant: a route that needs a token and got none, or a bad one, answers 401 with
//! the `unauthorized` body; one whose token lacks the grant answers 403 `forbidden`.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use felix_meta::auth::{Action, Resource};
use felix_wire::protocol::{ErrorBody, StreamConfig, codes};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::auth::{Credential, unauthorized};
use crate::broker::Broker;
use crate::metrics::Metrics;

#[derive(Clone)]
pub(super) struct AdminState {
    pub(super) broker: Arc<Broker>,
    pub(super) metrics: Arc<Metrics>,
    /// `metrics_require_auth`: `/metrics` asks for a token too.
    pub(super) metrics_require_auth: bool,
}

/// The HTTP status of a refusal with this protocol error code.
pub fn status_for(code: u16) -> StatusCode {
    match code {
        codes::UNKNOWN_TENANT
        | codes::UNKNOWN_NAMESPACE
        | codes::UNKNOWN_STREAM
        | codes::UNKNOWN_SHARD => StatusCode::NOT_FOUND,
        codes::ALREADY_EXISTS | codes::NOT_EMPTY | codes::VERSION_CONFLICT => StatusCode::CONFLICT,
        codes::INVALID_ARGUMENT | codes::BAD_REQUEST => StatusCode::BAD_REQUEST,
        codes::UNAUTHORIZED => StatusCode::UNAUTHORIZED,
        codes::FORBIDDEN => StatusCode::FORBIDDEN,
        codes::METADATA_UNAVAILABLE | codes::SHARD_UNAVAILABLE => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A refusal: the protocol's error body, with its status (and `Retry-After` when the error
/// says when to retry).
pub(super) struct ApiError {
    pub(super) status: StatusCode,
    pub(super) body: ErrorBody,
}

impl From<ErrorBody> for ApiError {
    fn from(body: ErrorBody) -> Self {
        ApiError {
            status: status_for(body.code),
            body,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry_after = self.body.retry_after_ms.map(|ms| ms.div_ceil(1000).max(1));
        let mut response = (self.status, Json(self.body)).into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// Parses a JSON request body. The content type is not checked, so `curl -d` works; a body
/// over [`BODY_LIMIT`] is refused with 413, one that is not the expected JSON with 400, both
/// with a `bad_request` error body like every other refusal.
pub(super) fn read<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> ApiResult<T> {
    let bytes = body.map_err(|rejection| ApiError {
        status: rejection.status(),
        body: ErrorBody::new(codes::BAD_REQUEST, "bad_request", rejection.body_text()),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError {
        status: StatusCode::BAD_REQUEST,
        body: ErrorBody::new(
            codes::BAD_REQUEST,
            "bad_request",
            format!("invalid JSON body: {e}"),
        ),
    })
}

pub(super) type ApiResult<T> = Result<T, ApiError>;

/// Who is calling: the verified bearer token (auth on), or nobody (auth off, or no header).
pub(super) struct Caller(Option<Arc<Credential>>);

impl Caller {
    pub(super) fn credential(&self) -> Option<&Credential> {
        self.0.as_deref()
    }
}

impl AdminState {
    /// The caller of a request: with auth on, its `Authorization: Bearer` token verified
    /// (a header that is not a valid token is refused here); with auth off, nobody.
    pub(super) fn caller(&self, headers: &HeaderMap) -> ApiResult<Caller> {
        let access = self.broker.access();
        if !access.enabled() {
            return Ok(Caller(None));
        }
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Ok(Caller(None));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .ok_or_else(|| {
                ApiError::from(unauthorized(&felix_meta::auth::TokenError::Invalid(
                    "expected Authorization: Bearer <token>".into(),
                )))
            })?;
        let credential = access
            .authenticate_cached(token)
            .map_err(|e| self.refused(e))?;
        Ok(Caller(Some(credential)))
    }

    /// Checks that `headers` carry a token granting `action` on `resource`.
    pub(super) fn require(
        &self,
        headers: &HeaderMap,
        action: Action,
        resource: &Resource,
    ) -> ApiResult<Caller> {
        let caller = self.caller(headers)?;
        self.broker
            .access()
            .authorize(caller.credential(), action, resource)
            .map_err(|e| self.refused(e))?;
        Ok(caller)
    }

    /// Checks that `headers` carry a token with any grant on `resource` (describe, list).
    pub(super) fn require_view(
        &self,
        headers: &HeaderMap,
        action_named: Action,
        resource: &Resource,
    ) -> ApiResult<Caller> {
        let caller = self.caller(headers)?;
        self.broker
            .access()
            .authorize_view(caller.credential(), action_named, resource)
            .map_err(|e| self.refused(e))?;
        Ok(caller)
    }

    /// Checks that an already verified caller holds `action` on `resource` (routes whose
    /// resource is named in the body verify the token before reading it).
    pub(super) fn require_of(
        &self,
        caller: &Caller,
        action: Action,
        resource: &Resource,
    ) -> ApiResult<()> {
        self.broker
            .access()
            .authorize(caller.credential(), action, resource)
            .map_err(|e| self.refused(e))
    }

    /// Checks that `headers` carry a live token, whatever it grants.
    pub(super) fn require_any(&self, headers: &HeaderMap) -> ApiResult<Caller> {
        let caller = self.caller(headers)?;
        self.broker
            .access()
            .authorize_any(caller.credential())
            .map_err(|e| self.refused(e))?;
        Ok(caller)
    }

    /// A refusal as an answer; authorization refusals are counted.
    pub(super) fn refused(&self, e: ErrorBody) -> ApiError {
        if e.code == codes::UNAUTHORIZED || e.code == codes::FORBIDDEN {
            self.metrics.auth_refused(&e.reason);
        }
        ApiError::from(e)
    }
}

/// Fault routes answer only on a broker started with `FELIX_FAULT_INJECTION=1`.
pub(super) fn fault_injection_enabled() -> Result<(), ApiError> {
    if std::env::var("FELIX_FAULT_INJECTION").is_ok_and(|v| v == "1") {
        return Ok(());
    }
    Err(ApiError {
        status: StatusCode::NOT_FOUND,
        body: ErrorBody::new(
            codes::BAD_REQUEST,
            "bad_request",
            "fault injection is off (start the broker with FELIX_FAULT_INJECTION=1)",
        ),
    })
}

/// Stream settings as a request body carries them: the protocol's [`StreamConfig`], except
/// that an explicit `null` for a `hot_retention_*` setting means "no limit", as the
/// responses print it (see [`felix_wire::user_json`]).
#[derive(Debug, Default)]
pub(super) struct UserStreamConfig(pub(super) StreamConfig);

impl<'de> Deserialize<'de> for UserStreamConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut value = serde_json::Value::deserialize(d)?;
        felix_wire::user_json::config_from_user(&mut value);
        serde_json::from_value(value)
            .map(UserStreamConfig)
            .map_err(serde::de::Error::custom)
    }
}

/// Streams (one, or a list) as a response body: "no limit" printed as `null` rather than
/// u64::MAX, which JavaScript and jq round.
pub(super) fn stream_json<T: Serialize>(streams: &T) -> ApiResult<Json<serde_json::Value>> {
    let mut value = serde_json::to_value(streams).map_err(|e| ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        body: ErrorBody::new(codes::INTERNAL, "internal", format!("encoding JSON: {e}")),
    })?;
    felix_wire::user_json::stream_for_user(&mut value);
    Ok(Json(value))
}
