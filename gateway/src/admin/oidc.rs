//! The admin API's OIDC routes: the token exchange and the registry of trusted issuers.
//!
//! Decides only the HTTP shape; each route is a face of the same
//! [`AccessControl`](crate::auth::AccessControl) operation QUIC calls. The exchange is open
//! (the identity provider's JWT in the body is the credential), like `/healthz` and the
//! JWKS; managing issuers needs `rbac.manage` on `*`.

use axum::Json;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use felix_wire::protocol::{ErrorBody, OidcIssuerSpec, codes};
use serde::Deserialize;

use super::api::{AdminState, ApiError, ApiResult, read};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExchangeBody {
    /// The identity provider's JWT.
    token: String,
}

/// `POST /v1/tenants/{tenant}/token/exchange` `{"token": "<IdP JWT>"}`: answers
/// `{"token","jti","expires_at"}`, or 401 with the reason the JWT was refused.
pub(super) async fn exchange(
    State(state): State<AdminState>,
    Path(tenant): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let ExchangeBody { token } = read(body)?;
    let minted = state
        .broker
        .access()
        .exchange_oidc(&token, Some(&tenant))
        .await
        .map_err(|e| state.refused(e))?;
    Ok(Json(minted).into_response())
}

pub(super) async fn list_issuers(
    State(state): State<AdminState>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let caller = state.caller(&headers)?;
    let issuers = state
        .broker
        .access()
        .list_oidc_issuers(caller.credential())
        .map_err(|e| state.refused(e))?;
    Ok(Json(issuers).into_response())
}

/// `POST /v1/oidc/issuers` with an [`OidcIssuerSpec`]: registers or replaces the issuer.
pub(super) async fn put_issuer(
    State(state): State<AdminState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<StatusCode> {
    let caller = state.caller(&headers)?;
    let spec: OidcIssuerSpec = read(body)?;
    state
        .broker
        .access()
        .put_oidc_issuer(caller.credential(), spec)
        .await
        .map_err(|e| state.refused(e))?;
    Ok(StatusCode::CREATED)
}

#[derive(Debug, Deserialize)]
pub(super) struct IssuerQuery {
    issuer: Option<String>,
}

/// `DELETE /v1/oidc/issuers?issuer=<iss, URL-encoded>`.
pub(super) async fn delete_issuer(
    State(state): State<AdminState>,
    headers: HeaderMap,
    query: Result<Query<IssuerQuery>, QueryRejection>,
) -> ApiResult<StatusCode> {
    let caller = state.caller(&headers)?;
    let issuer = query.ok().and_then(|q| q.0.issuer).ok_or_else(|| {
        ApiError::from(ErrorBody::new(
            codes::BAD_REQUEST,
            "bad_request",
            "name the issuer: DELETE /v1/oidc/issuers?issuer=<iss, URL-encoded>",
        ))
    })?;
    state
        .broker
        .access()
        .delete_oidc_issuer(caller.credential(), &issuer)
        .await
        .map_err(|e| state.refused(e))?;
    Ok(StatusCode::NO_CONTENT)
}
