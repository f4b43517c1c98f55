//! Admin HTTP: `/metrics`, `/healthz` and the `/v1` management API over the broker.
//!
//! With auth on, every route but `/healthz`, `/.well-known/jwks.json`, the OIDC token
//! exchange (`oidc.rs`) and (unless `metrics_require_auth`) `/metrics` needs `Authorization: Bearer <token>` granting the
//! route's action, checked before anything is done (`api.rs`); tokens, roles and keys have
//! their routes in `rbac.rs`.
//!
//! The `/v1` routes are a thin JSON face of the same [`Broker`] calls the QUIC protocol's
//! management requests make, so both answer alike. Every refusal is an [`ErrorBody`] (the
//! protocol's stable code and reason) with an HTTP status chosen by [`status_for`]; bodies
//! over [`BODY_LIMIT`] are refused before they are read.
//!
//! The API describes itself: `GET /v1` lists [`ROUTES`] (which a test holds to what
//! [`router`] serves); an unknown path answers `404` with reason `not_found`, a known path
//! with another method `405` with reason `method_not_allowed`, naming the methods it takes
//! (also in `Allow`). Bodies and answers are in docs/configuration.md, *Admin HTTP*.

mod api;
mod exposition;
mod faults;
mod oidc;
mod rbac;

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use felix_meta::auth::{Action, Resource};
use felix_wire::protocol::{ErrorBody, codes};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

pub use self::api::status_for;
use self::api::{
    AdminState, ApiError, ApiResult, UserStreamConfig, fault_injection_enabled, read, stream_json,
};
pub use self::exposition::PROMETHEUS_TEXT_CONTENT_TYPE;
use crate::broker::Broker;
use crate::metrics::Metrics;

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 1024 * 1024;

/// The content type of `/metrics` unless the scraper asks for the Prometheus text format
/// (`exposition.rs`).
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One route of the admin API, as `GET /v1` lists it.
#[derive(Debug, Serialize)]
pub struct AdminRoute {
    pub path: &'static str,
    pub methods: &'static [&'static str],
    pub what: &'static str,
}

/// Every route [`router`] serves.
pub const ROUTES: &[AdminRoute] = &[
    AdminRoute {
        path: "/metrics",
        methods: &["GET"],
        what: "the broker's metrics: OpenMetrics text, or the Prometheus text format \
               (0.0.4) when Accept prefers text/plain",
    },
    AdminRoute {
        path: "/healthz",
        methods: &["GET"],
        what: "200 ok when ready to serve, else 503",
    },
    AdminRoute {
        path: "/v1",
        methods: &["GET"],
        what: "this list",
    },
    AdminRoute {
        path: "/v1/tenants",
        methods: &["GET", "POST"],
        what: "tenants and their namespaces; POST {\"name\"} creates a tenant",
    },
    AdminRoute {
        path: "/v1/tenants/{tenant}/namespaces",
        methods: &["POST"],
        what: "POST {\"name\"} creates a namespace",
    },
    AdminRoute {
        path: "/v1/streams/{tenant}/{namespace}",
        methods: &["GET", "POST"],
        what: "the namespace's streams; POST {\"name\",\"config\"} creates one",
    },
    AdminRoute {
        path: "/v1/streams/{tenant}/{namespace}/{stream}",
        methods: &["GET", "PATCH", "DELETE"],
        what: "a stream: describe, alter its settings (StreamConfig), delete",
    },
    AdminRoute {
        path: "/v1/streams/{tenant}/{namespace}/{stream}/segments",
        methods: &["GET"],
        what: "a stream's hot segments and uploaded objects",
    },
    AdminRoute {
        path: "/.well-known/jwks.json",
        methods: &["GET"],
        what: "the public keys Felix tokens are signed with (JWKS; open)",
    },
    AdminRoute {
        path: "/v1/tenants/{tenant}/tokens",
        methods: &["POST"],
        what: "mint a token: {\"subject\",\"namespace\",\"roles\"|\"allow\",\"ttl_secs\"} \
               (neither roles nor allow: tenant-admin); answers {\"token\",\"jti\",\"expires_at\"}",
    },
    AdminRoute {
        path: "/v1/tokens/{jti}",
        methods: &["DELETE"],
        what: "revoke a token by its id",
    },
    AdminRoute {
        path: "/v1/roles",
        methods: &["GET", "POST"],
        what: "roles and their grants; POST {\"name\",\"allow\":[\"action:pattern\"]} creates or replaces one",
    },
    AdminRoute {
        path: "/v1/roles/{name}",
        methods: &["DELETE"],
        what: "delete a role (and its bindings)",
    },
    AdminRoute {
        path: "/v1/tenants/{tenant}/bindings",
        methods: &["POST"],
        what: "POST {\"subject\",\"role\"} binds a subject of the tenant to a role",
    },
    AdminRoute {
        path: "/v1/keys/rotate",
        methods: &["POST"],
        what: "add a new signing key; the old ones verify until their tokens expire",
    },
    AdminRoute {
        path: "/v1/tenants/{tenant}/token/exchange",
        methods: &["POST"],
        what: "trade an identity provider's JWT for a Felix token: {\"token\"} (open; \
               answers {\"token\",\"jti\",\"expires_at\"})",
    },
    AdminRoute {
        path: "/v1/oidc/issuers",
        methods: &["GET", "POST", "DELETE"],
        what: "trusted OIDC issuers; POST registers one (docs/security.md), \
               DELETE ?issuer=ISS forgets one",
    },
    AdminRoute {
        path: "/v1/faults/skip_ingress_publish_check",
        methods: &["POST", "DELETE"],
        what: "fault injection (FELIX_FAULT_INJECTION=1 only): this broker leaves a \
               publish's permission check to the shard's owner, or checks again",
    },
    AdminRoute {
        path: "/v1/faults/isolate",
        methods: &["POST", "DELETE"],
        what: "fault injection (FELIX_FAULT_INJECTION=1 only): cut this broker off the \
               internal network, or heal the cut",
    },
    AdminRoute {
        path: "/v1/faults/stall_writes",
        methods: &["POST", "DELETE"],
        what: "fault injection (FELIX_FAULT_INJECTION=1 only): hold this broker's leader \
               log writes, or let them go",
    },
    AdminRoute {
        path: "/v1/faults/hold_answers",
        methods: &["POST", "DELETE"],
        what: "fault injection (FELIX_FAULT_INJECTION=1 only): hold this broker's answers \
               to publishes after their write, or let them go",
    },
    AdminRoute {
        path: "/v1/faults/hold_handovers",
        methods: &["POST", "DELETE"],
        what: "fault injection (FELIX_FAULT_INJECTION=1 only): hold this broker's shard \
               hand-overs with their fence up, or let them go",
    },
    AdminRoute {
        path: "/v1/faults/hold_promotions",
        methods: &["POST", "DELETE"],
        what: "fault injection (FELIX_FAULT_INJECTION=1 only): refuse requests to promote \
               a joining broker to a control-plane voter, or let them through",
    },
    AdminRoute {
        path: "/v1/faults/hold_compactions",
        methods: &["POST", "DELETE"],
        what: "fault injection (FELIX_FAULT_INJECTION=1 only): hold this broker's cache \
               compactions between their floor record and their snapshot, or let them go",
    },
];

/// The admin routes over `broker` and `metrics`; with `metrics_require_auth` (and auth on)
/// `/metrics` asks for a token too.
pub fn router(broker: Arc<Broker>, metrics: Arc<Metrics>, metrics_require_auth: bool) -> Router {
    let routes = Router::new()
        .route("/v1", get(list_routes))
        .route("/metrics", get(get_metrics))
        .route("/healthz", get(healthz))
        .route("/v1/tenants", get(list_tenants).post(create_tenant))
        .route(
            "/v1/tenants/{tenant}/namespaces",
            axum::routing::post(create_namespace),
        )
        .route(
            "/v1/streams/{tenant}/{namespace}",
            get(list_streams).post(create_stream),
        )
        .route(
            "/v1/streams/{tenant}/{namespace}/{stream}",
            get(describe_stream)
                .patch(alter_stream)
                .delete(delete_stream),
        )
        .route(
            "/v1/streams/{tenant}/{namespace}/{stream}/segments",
            get(list_segments),
        )
        .route("/.well-known/jwks.json", get(rbac::jwks))
        .route("/v1/tenants/{tenant}/tokens", post(rbac::mint_token))
        .route(
            "/v1/tokens/{jti}",
            axum::routing::delete(rbac::revoke_token),
        )
        .route("/v1/roles", get(rbac::list_roles).post(rbac::put_role))
        .route("/v1/roles/{name}", axum::routing::delete(rbac::delete_role))
        .route("/v1/tenants/{tenant}/bindings", post(rbac::bind_role))
        .route("/v1/keys/rotate", post(rbac::rotate_key))
        .route("/v1/tenants/{tenant}/token/exchange", post(oidc::exchange))
        .route(
            "/v1/oidc/issuers",
            get(oidc::list_issuers)
                .post(oidc::put_issuer)
                .delete(oidc::delete_issuer),
        )
        .route(
            "/v1/faults/skip_ingress_publish_check",
            post(rbac::skip_ingress_publish_check).delete(rbac::skip_ingress_publish_check),
        );
    let routes = faults::routes(routes)
        .fallback(no_route)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(AdminState {
            broker,
            metrics,
            metrics_require_auth,
        });
    // Outside the routes: axum adds `Allow` to a 405 after a route's own layers have run.
    Router::new()
        .fallback_service(routes)
        .layer(axum::middleware::map_response(explain_method_not_allowed))
}

/// Serves `router` on `listener` until `shutdown` turns true (or its sender is dropped),
/// then lets requests in flight finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            // An error means the sender is gone: nobody can ask any more, so stop too.
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await
}

/// The answer depends on `Accept`: a cache in between must not serve one format for the other.
const VARY_ACCEPT: (header::HeaderName, &str) = (header::VARY, "accept");

async fn get_metrics(State(state): State<AdminState>, headers: HeaderMap) -> ApiResult<Response> {
    if state.metrics_require_auth {
        state.require(&headers, Action::ClusterManage, &Resource::Cluster)?;
    }
    state.broker.refresh_metrics();
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let text = state.metrics.encode();
    Ok(match exposition::negotiate(accept) {
        exposition::Exposition::OpenMetrics => (
            [
                (header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE),
                VARY_ACCEPT,
            ],
            text,
        )
            .into_response(),
        exposition::Exposition::PrometheusText => (
            [
                (header::CONTENT_TYPE, PROMETHEUS_TEXT_CONTENT_TYPE),
                VARY_ACCEPT,
            ],
            exposition::prometheus_text(&text),
        )
            .into_response(),
    })
}

async fn healthz(State(state): State<AdminState>) -> (StatusCode, &'static str) {
    if state.broker.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn list_routes(
    State(state): State<AdminState>,
    headers: HeaderMap,
) -> ApiResult<Json<serde_json::Value>> {
    state.require_any(&headers)?;
    Ok(Json(serde_json::json!({ "routes": ROUTES })))
}

async fn no_route(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        body: ErrorBody::new(
            codes::BAD_REQUEST,
            "not_found",
            format!("no route {method} {}; GET /v1 lists the routes", uri.path()),
        ),
    }
}

/// A known path asked with a method it does not take: axum answers `405` with the methods
/// in `Allow` and no body; this gives it the JSON error body every other refusal has.
async fn explain_method_not_allowed(response: Response) -> Response {
    if response.status() != StatusCode::METHOD_NOT_ALLOWED {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let methods = allow
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut explained = ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        body: ErrorBody::new(
            codes::BAD_REQUEST,
            "method_not_allowed",
            format!("this route takes {methods}"),
        ),
    }
    .into_response();
    if let Some(allow) = allow {
        explained.headers_mut().insert(header::ALLOW, allow);
    }
    explained
}

/// `{"name": "..."}`: what creating a tenant or a namespace takes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NameBody {
    name: String,
}

/// What creating a stream takes; `config` may be omitted (every setting defaulted).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateStreamBody {
    name: String,
    #[serde(default)]
    config: UserStreamConfig,
}

/// Only the tenants (and namespaces) the caller holds a grant on or below.
async fn list_tenants(State(state): State<AdminState>, headers: HeaderMap) -> ApiResult<Response> {
    let caller = state.require_any(&headers)?;
    let access = state.broker.access();
    let mut tenants = state.broker.tenants();
    tenants.retain(|t, _| access.can_view(caller.credential(), &Resource::tenant(t)));
    for (t, namespaces) in tenants.iter_mut() {
        namespaces.retain(|n| access.can_view(caller.credential(), &Resource::namespace(t, n)));
    }
    Ok(Json(tenants).into_response())
}

async fn create_tenant(
    State(state): State<AdminState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let caller = state.require_any(&headers)?;
    let NameBody { name } = read(body)?;
    state.require_of(&caller, Action::TenantManage, &Resource::tenant(&name))?;
    state.broker.create_tenant(&name).await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({ "tenant": name })),
    )
        .into_response())
}

async fn create_namespace(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let caller = state.require_any(&headers)?;
    let NameBody { name } = read(body)?;
    state.require_of(
        &caller,
        Action::NamespaceManage,
        &Resource::namespace(&tenant, &name),
    )?;
    state.broker.create_namespace(&tenant, &name).await?;
    let created = serde_json::json!({ "tenant": tenant, "namespace": name });
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

async fn list_streams(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<Response> {
    let caller = state.require_view(
        &headers,
        Action::StreamManage,
        &Resource::namespace(&tenant, &namespace),
    )?;
    let mut streams = state.broker.list_streams(&tenant, &namespace).await?;
    streams.retain(|s| {
        state.broker.access().can_view(
            caller.credential(),
            &Resource::stream(&tenant, &namespace, &s.name),
        )
    });
    Ok(stream_json(&streams)?.into_response())
}

async fn create_stream(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path((tenant, namespace)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let caller = state.require_any(&headers)?;
    let CreateStreamBody { name, config } = read(body)?;
    state.require_of(
        &caller,
        Action::StreamManage,
        &Resource::stream(&tenant, &namespace, &name),
    )?;
    let info = state
        .broker
        .create_stream(&tenant, &namespace, &name, config.0)
        .await?;
    Ok((StatusCode::CREATED, stream_json(&info)?).into_response())
}

async fn describe_stream(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path((tenant, namespace, stream)): Path<(String, String, String)>,
) -> ApiResult<Response> {
    state.require_view(
        &headers,
        Action::StreamManage,
        &Resource::stream(&tenant, &namespace, &stream),
    )?;
    let info = state
        .broker
        .describe_stream(&tenant, &namespace, &stream)
        .await?;
    Ok(stream_json(&info)?.into_response())
}

async fn list_segments(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path((tenant, namespace, stream)): Path<(String, String, String)>,
) -> ApiResult<Response> {
    state.require_view(
        &headers,
        Action::StreamSubscribe,
        &Resource::stream(&tenant, &namespace, &stream),
    )?;
    let segments = state
        .broker
        .list_segments(&tenant, &namespace, &stream)
        .await?;
    Ok(Json(segments).into_response())
}

async fn alter_stream(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path((tenant, namespace, stream)): Path<(String, String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    state.require(
        &headers,
        Action::StreamManage,
        &Resource::stream(&tenant, &namespace, &stream),
    )?;
    let UserStreamConfig(config) = read(body)?;
    let info = state
        .broker
        .alter_stream(&tenant, &namespace, &stream, config)
        .await?;
    Ok(stream_json(&info)?.into_response())
}

async fn delete_stream(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path((tenant, namespace, stream)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    state.require(
        &headers,
        Action::StreamManage,
        &Resource::stream(&tenant, &namespace, &stream),
    )?;
    state
        .broker
        .delete_stream(&tenant, &namespace, &stream)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use felix_meta::{MetaConfig, MetaNode};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::config::BrokerConfig;

    /// One HTTP/1.1 request on its own connection; returns the status, the headers (lower
    /// case) and the body.
    async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String, String) {
        let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: felix\r\nconnection: close\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        );
        // The write side stays open until the answer is read: the server drops a request
        // whose client half-closed.
        conn.write_all(request.as_bytes()).await.expect("send");
        let mut response = Vec::new();
        conn.read_to_end(&mut response).await.expect("receive");
        let response = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = response
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no whole response to {method} {path}: {response:?}"));
        let status = head[9..12].parse().expect("a status code");
        (status, head.to_ascii_lowercase(), body.to_owned())
    }

    #[tokio::test]
    async fn the_v1_api_manages_tenants_namespaces_and_streams() {
        let dir = tempfile::tempdir().expect("temp dir");
        let meta_config = MetaConfig::single(1, dir.path(), "127.0.0.1:0".parse().expect("addr"));
        let meta = MetaNode::start(meta_config).await.expect("metadata node");
        assert!(meta.handle().wait_ready(Duration::from_secs(30)).await);
        let config = BrokerConfig {
            data_dir: dir.path().to_path_buf(),
            ..BrokerConfig::default()
        };
        let metrics = Arc::new(Metrics::new());
        let broker = Broker::start(&config, meta.handle().clone(), metrics.clone())
            .await
            .expect("broker");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = watch::channel(false);
        let server = tokio::spawn(serve(
            listener,
            router(broker.clone(), metrics, false),
            stopped,
        ));

        let (status, _, body) = http(addr, "GET", "/healthz", "").await;
        assert_eq!((status, body.as_str()), (200, "ok"));
        let (status, head, _) = http(addr, "GET", "/metrics", "").await;
        assert_eq!(status, 200);
        assert!(
            head.contains("content-type: application/openmetrics-text; version=1.0.0"),
            "{head}"
        );

        let (status, _, _) = http(addr, "POST", "/v1/tenants", r#"{"name":"acme"}"#).await;
        assert_eq!(status, 201);
        let (status, _, body) = http(addr, "POST", "/v1/tenants", r#"{"name":"acme"}"#).await;
        assert_eq!(status, 409, "{body}");
        let error: ErrorBody = serde_json::from_str(&body).expect("an error body");
        assert_eq!(error.code, codes::ALREADY_EXISTS);
        let (status, _, _) = http(
            addr,
            "POST",
            "/v1/tenants/acme/namespaces",
            r#"{"name":"prod"}"#,
        )
        .await;
        assert_eq!(status, 201);
        let (status, _, body) = http(
            addr,
            "POST",
            "/v1/tenants/nobody/namespaces",
            r#"{"name":"prod"}"#,
        )
        .await;
        assert_eq!(status, 404, "{body}");
        let (status, _, body) = http(addr, "GET", "/v1/tenants", "").await;
        assert_eq!(status, 200);
        let tenants: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(tenants["acme"], serde_json::json!(["prod"]), "{body}");

        let create = r#"{"name":"orders","config":{"shards":2}}"#;
        let (status, _, body) = http(addr, "POST", "/v1/streams/acme/prod", create).await;
        assert_eq!(status, 201, "{body}");
        let info: felix_wire::protocol::StreamInfo = serde_json::from_str(&body).expect("info");
        assert_eq!((info.name.as_str(), info.version), ("orders", 1));
        let (status, _, body) = http(addr, "GET", "/v1/streams/acme/prod/orders", "").await;
        assert_eq!(status, 200, "{body}");
        let (status, _, body) = http(
            addr,
            "PATCH",
            "/v1/streams/acme/prod/orders",
            r#"{"segment_ms":60000}"#,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let info: felix_wire::protocol::StreamInfo = serde_json::from_str(&body).expect("info");
        assert_eq!(info.version, 2);
        let (status, _, body) = http(addr, "GET", "/v1/streams/acme/prod", "").await;
        assert_eq!(status, 200);
        let list: Vec<felix_wire::protocol::StreamInfo> =
            serde_json::from_str(&body).expect("a list");
        assert_eq!(list.len(), 1);
        let (status, _, _) = http(addr, "DELETE", "/v1/streams/acme/prod/orders", "").await;
        assert_eq!(status, 204);
        let (status, _, _) = http(addr, "GET", "/v1/streams/acme/prod/orders", "").await;
        assert_eq!(status, 404);

        let (status, _, body) = http(addr, "POST", "/v1/tenants", r#"{"nam":"x"}"#).await;
        assert_eq!(status, 400, "{body}");
        // The API describes itself, and says what is wrong with a route or a method.
        let (status, _, body) = http(addr, "GET", "/v2/nothing", "").await;
        assert_eq!(status, 404, "{body}");
        let error: ErrorBody = serde_json::from_str(&body).expect("an error body");
        assert_eq!(error.reason, "not_found", "{body}");
        let (status, head, body) = http(addr, "PUT", "/v1/tenants", "").await;
        assert_eq!(status, 405, "{body}");
        let error: ErrorBody = serde_json::from_str(&body).expect("an error body");
        assert_eq!(error.reason, "method_not_allowed", "{body}");
        assert!(
            error.message.contains("GET") && error.message.contains("POST"),
            "{body}"
        );
        assert!(head.contains("allow:"), "{head}");
        let (status, _, body) = http(addr, "GET", "/v1", "").await;
        assert_eq!(status, 200, "{body}");
        let listed: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(
            listed["routes"].as_array().map(Vec::len),
            Some(ROUTES.len())
        );
        // Every listed route and method is served: none is unknown or takes another method.
        for route in ROUTES {
            let path = route
                .path
                .replace("{tenant}", "t")
                .replace("{namespace}", "n")
                .replace("{stream}", "s");
            for method in route.methods {
                let (status, _, body) = http(addr, method, &path, "").await;
                assert!(
                    status != 405 && !body.contains("\"not_found\""),
                    "{method} {path} is listed but not served: {status} {body}"
                );
            }
        }

        let _ = stop.send(true);
        server.await.expect("server task").expect("server");
        broker.shutdown().await;
        meta.shutdown().await;
    }

    #[test]
    fn refusals_map_to_http_statuses_by_code() {
        let cases = [
            (codes::UNKNOWN_TENANT, 404),
            (codes::UNKNOWN_NAMESPACE, 404),
            (codes::UNKNOWN_STREAM, 404),
            (codes::UNKNOWN_SHARD, 404),
            (codes::ALREADY_EXISTS, 409),
            (codes::NOT_EMPTY, 409),
            (codes::VERSION_CONFLICT, 409),
            (codes::INVALID_ARGUMENT, 400),
            (codes::BAD_REQUEST, 400),
            (codes::METADATA_UNAVAILABLE, 503),
            (codes::SHARD_UNAVAILABLE, 503),
            (codes::INTERNAL, 500),
            (codes::OVERLOADED, 500),
        ];
        for (code, status) in cases {
            assert_eq!(status_for(code).as_u16(), status, "code {code}");
        }
    }

    #[test]
    fn a_retryable_refusal_carries_retry_after_in_whole_seconds() {
        let body = ErrorBody::new(codes::METADATA_UNAVAILABLE, "metadata_unavailable", "later")
            .retry_after(1500);
        let response = ApiError::from(body).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
    }
}
