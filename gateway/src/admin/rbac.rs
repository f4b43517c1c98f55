//! The admin API's routes for tokens, roles, bindings and signing keys, and the JWKS.
//!
//! Decides only the HTTP shape: each route is a thin face of the same
//! [`AccessControl`](crate::auth::AccessControl) operation the QUIC requests call (who may
//! do what is decided there), so `felixctl` over QUIC and `curl` over HTTP answer alike.
//! `/.well-known/jwks.json` is open: it holds public keys only, for whoever verifies Felix
//! tokens elsewhere.

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use felix_meta::auth::{Action, Resource};
use serde::Deserialize;

use super::api::{AdminState, ApiResult, fault_injection_enabled, read};
use crate::auth::{MintRequest, set_skip_ingress_publish_check};

pub(super) async fn jwks(State(state): State<AdminState>) -> Response {
    Json(state.broker.access().jwks()).into_response()
}

/// `POST /v1/tenants/{tenant}/tokens`: the body is a [`MintRequest`] without the tenant.
pub(super) async fn mint_token(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let caller = state.caller(&headers)?;
    let mut req: MintRequest = read(body)?;
    req.tenant = tenant;
    let minted = state
        .broker
        .access()
        .mint_token(caller.credential(), req)
        .await
        .map_err(|e| state.refused(e))?;
    Ok((StatusCode::CREATED, Json(minted)).into_response())
}

pub(super) async fn revoke_token(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path(jti): Path<String>,
) -> ApiResult<StatusCode> {
    let caller = state.caller(&headers)?;
    state
        .broker
        .access()
        .revoke_token(caller.credential(), &jti)
        .await
        .map_err(|e| state.refused(e))?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RoleBody {
    name: String,
    allow: Vec<String>,
}

pub(super) async fn list_roles(
    State(state): State<AdminState>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let caller = state.caller(&headers)?;
    let roles = state
        .broker
        .access()
        .list_roles(caller.credential())
        .map_err(|e| state.refused(e))?;
    Ok(Json(roles).into_response())
}

pub(super) async fn put_role(
    State(state): State<AdminState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<StatusCode> {
    let caller = state.caller(&headers)?;
    let RoleBody { name, allow } = read(body)?;
    state
        .broker
        .access()
        .put_role(caller.credential(), &name, &allow)
        .await
        .map_err(|e| state.refused(e))?;
    Ok(StatusCode::CREATED)
}

pub(super) async fn delete_role(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    let caller = state.caller(&headers)?;
    state
        .broker
        .access()
        .delete_role(caller.credential(), &name)
        .await
        .map_err(|e| state.refused(e))?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BindingBody {
    subject: String,
    role: String,
}

pub(super) async fn bind_role(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<StatusCode> {
    let caller = state.caller(&headers)?;
    let BindingBody { subject, role } = read(body)?;
    state
        .broker
        .access()
        .bind_role(caller.credential(), &tenant, &subject, &role)
        .await
        .map_err(|e| state.refused(e))?;
    Ok(StatusCode::CREATED)
}

pub(super) async fn rotate_key(
    State(state): State<AdminState>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let caller = state.caller(&headers)?;
    let kid = state
        .broker
        .access()
        .rotate_key(caller.credential())
        .await
        .map_err(|e| state.refused(e))?;
    Ok((StatusCode::CREATED, Json(serde_json::json!({ "kid": kid }))).into_response())
}

/// Fault injection: the broker a client reached skips its own `stream.publish` check
/// (`POST`) or checks again (`DELETE`), so a test sees the owner's check of a forwarded
/// publish. Needs `cluster.manage` when auth is on.
pub(super) async fn skip_ingress_publish_check(
    State(state): State<AdminState>,
    headers: HeaderMap,
    method: axum::http::Method,
) -> ApiResult<&'static str> {
    fault_injection_enabled()?;
    state.require(&headers, Action::ClusterManage, &Resource::Cluster)?;
    let on = method == axum::http::Method::POST;
    set_skip_ingress_publish_check(on);
    Ok(if on { "skipping" } else { "checking" })
}
