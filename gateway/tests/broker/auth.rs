//! Authorization on real brokers started with `FELIX_AUTH=on` (docs/security.md): every door
//! refuses a caller without a token and does nothing for it; a token reaches only its
//! tenant and only with the actions it grants, and a refusal names nothing of another
//! tenant's; expired, revoked and malformed tokens are refused (revocation on every broker
//! of a cluster within a second); a fresh token continues a live connection; a forwarded
//! publish is checked again at the shard's owner; felixctl mints tokens and finds the
//! bootstrap token of a loopback broker.

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use felix_client::{
    AckMode, ClientConfig, ClientError, Connection, ErrorBody, StartAt, StreamConfig, TokenSpec,
    codes,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::cluster::Cluster;
use super::common::{Broker, BrokerOptions, PATIENCE};

fn auth_on() -> BrokerOptions {
    BrokerOptions::new().env("FELIX_AUTH", "on")
}

/// The bootstrap admin token the broker wrote to its data directory.
fn admin_token(broker: &Broker) -> String {
    let path = broker.data_dir().join("admin.token");
    let meta = std::fs::metadata(&path).expect("admin.token written before ready");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "admin.token is 0600"
    );
    std::fs::read_to_string(path).unwrap().trim().to_owned()
}

async fn connect(broker: &Broker, token: Option<&str>) -> Connection {
    let config = ClientConfig {
        token: token.map(str::to_owned),
        ..ClientConfig::default()
    };
    Connection::connect(&broker.quic_addr.to_string(), config)
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", broker.quic_addr))
}

/// The broker's refusal in `r`, which must be one.
fn refusal<T: std::fmt::Debug>(r: Result<T, ClientError>, what: &str) -> ErrorBody {
    match r {
        Err(ClientError::Broker(e)) => e,
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

fn assert_refused<T: std::fmt::Debug>(
    r: Result<T, ClientError>,
    code: u16,
    reason: &str,
    what: &str,
) -> ErrorBody {
    let e = refusal(r, what);
    assert_eq!((e.code, e.reason.as_str()), (code, reason), "{what}: {e}");
    e
}

async fn mint(admin: &Connection, spec: TokenSpec) -> (String, String) {
    let issued = admin.mint_token(spec).await.expect("mint a token");
    (issued.token, issued.jti)
}

fn spec(tenant: &str, allow: &[&str]) -> TokenSpec {
    TokenSpec {
        tenant: tenant.into(),
        allow: allow.iter().map(|a| a.to_string()).collect(),
        ..TokenSpec::default()
    }
}

/// One HTTP/1.1 request with an optional bearer token and body: status and body.
pub(super) async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: &str,
) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect admin");
    let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: felix\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .expect("an HTTP answer")
        .unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

async fn durable_stream(admin: &Connection, tenant: &str, name: &str) {
    for r in [
        admin.create_tenant(tenant).await,
        admin.create_namespace(tenant, "default").await,
    ] {
        if let Err(e) = r {
            assert_eq!(e.code(), Some(codes::ALREADY_EXISTS), "{e}");
        }
    }
    let config = StreamConfig {
        durable: Some(true),
        shards: Some(1),
        ..StreamConfig::default()
    };
    admin
        .create_stream(tenant, "default", name, config)
        .await
        .expect("create stream");
}

async fn next_offset(admin: &Connection, tenant: &str, name: &str) -> u64 {
    let info = admin
        .describe_stream(tenant, "default", name)
        .await
        .expect("describe");
    info.shards[0].next_offset
}

#[tokio::test]
async fn a_caller_without_a_token_is_refused_at_every_door_and_nothing_is_written() {
    let broker = Broker::start(auth_on()).await;
    let token = admin_token(&broker);
    let admin = connect(&broker, Some(&token)).await;
    durable_stream(&admin, "a", "orders").await;
    let before = next_offset(&admin, "a", "orders").await;

    // QUIC: hello without a token is answered; every request after it is refused.
    let anon = connect(&broker, None).await;
    let miss = |what: &str| format!("no token: {what}");
    let (c, r) = (codes::UNAUTHORIZED, "missing_token");
    assert_refused(anon.create_tenant("x").await, c, r, &miss("create tenant"));
    assert_refused(
        anon.create_namespace("a", "x").await,
        c,
        r,
        &miss("create namespace"),
    );
    assert_refused(
        anon.create_stream("a", "default", "new", StreamConfig::default())
            .await,
        c,
        r,
        &miss("create stream"),
    );
    assert_refused(
        anon.alter_stream(
            "a",
            "default",
            "orders",
            StreamConfig {
                retention_ms: Some(1000),
                ..Default::default()
            },
        )
        .await,
        c,
        r,
        &miss("alter"),
    );
    assert_refused(
        anon.describe_stream("a", "default", "orders").await,
        c,
        r,
        &miss("describe"),
    );
    assert_refused(anon.list_streams("a", "default").await, c, r, &miss("list"));
    assert_refused(
        anon.list_segments("a", "default", "orders").await,
        c,
        r,
        &miss("segments"),
    );
    assert_refused(
        anon.topology("a", "default", "orders").await,
        c,
        r,
        &miss("topology"),
    );
    assert_refused(anon.producer_init().await, c, r, &miss("producer init"));
    assert_refused(
        anon.publish_raw(
            "a",
            "default",
            "orders",
            0,
            Bytes::from_static(b"not even a batch"),
            AckMode::Batch,
        )
        .await,
        c,
        r,
        &miss("publish"),
    );
    assert_refused(
        anon.subscribe("a", "default", "orders", 0, StartAt::Earliest)
            .await,
        c,
        r,
        &miss("subscribe"),
    );
    assert_refused(anon.mint_token(spec("a", &[])).await, c, r, &miss("mint"));
    assert_refused(anon.rotate_key().await, c, r, &miss("rotate key"));
    assert_refused(
        anon.put_role("r", &["stream.publish:a/*".into()]).await,
        c,
        r,
        &miss("put role"),
    );
    assert_refused(anon.list_roles().await, c, r, &miss("list roles"));
    assert_refused(anon.revoke_token("whatever").await, c, r, &miss("revoke"));
    assert_refused(
        anon.delete_stream("a", "default", "orders").await,
        c,
        r,
        &miss("delete"),
    );

    // Admin HTTP: 401 with the same body on every route but the open three.
    for (method, path, body) in [
        ("GET", "/v1", ""),
        ("GET", "/v1/tenants", ""),
        ("POST", "/v1/tenants", r#"{"name":"x"}"#),
        ("POST", "/v1/tenants/a/namespaces", r#"{"name":"x"}"#),
        ("GET", "/v1/streams/a/default", ""),
        ("POST", "/v1/streams/a/default", r#"{"name":"new"}"#),
        ("GET", "/v1/streams/a/default/orders", ""),
        (
            "PATCH",
            "/v1/streams/a/default/orders",
            r#"{"retention_ms":1000}"#,
        ),
        ("DELETE", "/v1/streams/a/default/orders", ""),
        ("GET", "/v1/streams/a/default/orders/segments", ""),
        ("POST", "/v1/tenants/a/tokens", "{}"),
        ("DELETE", "/v1/tokens/whatever", ""),
        ("GET", "/v1/roles", ""),
        (
            "POST",
            "/v1/roles",
            r#"{"name":"r","allow":["stream.publish:a/*"]}"#,
        ),
        ("POST", "/v1/keys/rotate", ""),
    ] {
        let (status, answer) = http(broker.admin_addr, method, path, None, body).await;
        assert_eq!(status, 401, "{method} {path}: {answer}");
        assert!(
            answer.contains("missing_token"),
            "{method} {path}: {answer}"
        );
        let (status, answer) = http(broker.admin_addr, method, path, Some("garbage"), body).await;
        assert_eq!(status, 401, "{method} {path} with a bad token: {answer}");
        assert!(
            answer.contains("invalid_token"),
            "{method} {path}: {answer}"
        );
    }
    assert_eq!(
        http(broker.admin_addr, "GET", "/healthz", None, "").await.0,
        200
    );
    assert_eq!(
        http(broker.admin_addr, "GET", "/metrics", None, "").await.0,
        200
    );
    let (status, jwks) = http(broker.admin_addr, "GET", "/.well-known/jwks.json", None, "").await;
    assert_eq!(status, 200);
    let jwks: serde_json::Value = serde_json::from_str(&jwks).unwrap();
    let key = &jwks["keys"][0];
    assert_eq!(
        (key["alg"].as_str(), key["crv"].as_str()),
        (Some("EdDSA"), Some("Ed25519")),
        "{jwks}"
    );
    // The admin token works over HTTP and lists the new routes.
    let (status, routes) = http(broker.admin_addr, "GET", "/v1", Some(&token), "").await;
    assert_eq!(status, 200, "{routes}");
    assert!(
        routes.contains("/v1/tenants/{tenant}/tokens") && routes.contains("/.well-known/jwks.json"),
        "{routes}"
    );

    // Nothing was written or changed.
    assert_eq!(next_offset(&admin, "a", "orders").await, before);
    let info = admin
        .describe_stream("a", "default", "orders")
        .await
        .unwrap();
    assert_eq!(info.version, 1, "not altered");
    assert!(
        admin.describe_stream("a", "default", "new").await.is_err(),
        "not created"
    );
    let (_, tenants) = http(broker.admin_addr, "GET", "/v1/tenants", Some(&token), "").await;
    assert!(!tenants.contains("\"x\""), "{tenants}");
    // A Kafka request without SASL: the connection is closed unanswered (the SASL cases
    // are in kafka_auth.rs).
    let mut kafka = tokio::net::TcpStream::connect(broker.kafka_addr)
        .await
        .expect("connect to the Kafka port");
    // Metadata v1 for every topic: length 15, key 3, version 1, correlation id 1, client id
    // "k", topics null.
    let metadata: [u8; 19] = [
        0, 0, 0, 15, 0, 3, 0, 1, 0, 0, 0, 1, 0, 1, b'k', 0xff, 0xff, 0xff, 0xff,
    ];
    kafka.write_all(&metadata).await.unwrap();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(PATIENCE, kafka.read(&mut byte))
        .await
        .expect("the Kafka connection is closed, not left open");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    let metrics = broker.metrics().await;
    assert!(
        metrics.contains("felix_auth_refusals_total{reason=\"missing_token\"}"),
        "metric seeded and counted"
    );
}

#[tokio::test]
async fn a_tenant_token_reaches_only_its_tenant_and_only_with_the_granted_action() {
    let broker = Broker::start(auth_on().env("FELIX_METRICS_REQUIRE_AUTH", "on")).await;
    let admin_tok = admin_token(&broker);
    let admin = connect(&broker, Some(&admin_tok)).await;
    durable_stream(&admin, "alpha", "orders").await;
    durable_stream(&admin, "bravo", "secret-ledger").await;
    let before = next_offset(&admin, "bravo", "secret-ledger").await;

    // tenant-admin of alpha: everything in alpha, nothing in bravo.
    let (alpha, _) = mint(&admin, spec("alpha", &[])).await;
    let a = connect(&broker, Some(&alpha)).await;
    a.publish("alpha", "default", "orders", "mine", AckMode::Batch)
        .await
        .expect("publish to its own tenant");
    let (f, r) = (codes::FORBIDDEN, "forbidden");
    let checks = [
        (
            "publish",
            refusal(
                a.publish_raw(
                    "bravo",
                    "default",
                    "secret-ledger",
                    0,
                    Bytes::from_static(b"x"),
                    AckMode::Batch,
                )
                .await,
                "publish",
            ),
        ),
        (
            "subscribe",
            refusal(
                a.subscribe("bravo", "default", "secret-ledger", 0, StartAt::Earliest)
                    .await,
                "subscribe",
            ),
        ),
        (
            "describe",
            refusal(
                a.describe_stream("bravo", "default", "secret-ledger").await,
                "describe",
            ),
        ),
        (
            "list",
            refusal(a.list_streams("bravo", "default").await, "list"),
        ),
        (
            "delete",
            refusal(
                a.delete_stream("bravo", "default", "secret-ledger").await,
                "delete",
            ),
        ),
        (
            "mint for bravo",
            refusal(a.mint_token(spec("bravo", &[])).await, "mint"),
        ),
        (
            "describe a missing stream",
            refusal(
                a.describe_stream("bravo", "default", "nothing-here").await,
                "describe missing",
            ),
        ),
    ];
    for (what, e) in &checks {
        assert_eq!((e.code, e.reason.as_str()), (f, r), "{what}: {e}");
        assert!(
            !e.message.contains("bravo") && !e.message.contains("secret-ledger"),
            "{what} names the other tenant's resource: {}",
            e.message
        );
    }
    let (status, body) = http(
        broker.admin_addr,
        "GET",
        "/v1/streams/bravo/default/secret-ledger",
        Some(&alpha),
        "",
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(!body.contains("secret-ledger"), "{body}");
    let (_, tenants) = http(broker.admin_addr, "GET", "/v1/tenants", Some(&alpha), "").await;
    assert!(
        tenants.contains("alpha") && !tenants.contains("bravo"),
        "list shows only what it may see: {tenants}"
    );

    // A publish-only token cannot subscribe, and sees only its stream in a list.
    admin
        .create_stream("alpha", "default", "other", StreamConfig::default())
        .await
        .unwrap();
    let (publisher, _) = mint(
        &admin,
        spec("alpha", &["stream.publish:alpha/default/orders"]),
    )
    .await;
    let p = connect(&broker, Some(&publisher)).await;
    p.publish("alpha", "default", "orders", "ok", AckMode::Batch)
        .await
        .expect("publish with stream.publish");
    let e = assert_refused(
        p.subscribe("alpha", "default", "orders", 0, StartAt::Earliest)
            .await,
        f,
        r,
        "publish-only subscribes",
    );
    assert!(
        e.message.contains("stream.subscribe"),
        "the refusal names the action: {e}"
    );
    let listed = p.list_streams("alpha", "default").await.unwrap();
    assert_eq!(
        listed.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["orders"]
    );
    assert_refused(
        p.create_stream("alpha", "default", "new", StreamConfig::default())
            .await,
        f,
        r,
        "publish-only creates",
    );

    assert_eq!(
        next_offset(&admin, "bravo", "secret-ledger").await,
        before,
        "bravo untouched"
    );

    // metrics_require_auth: /metrics (whose series name every tenant) needs cluster.manage.
    let at = broker.admin_addr;
    assert_eq!(http(at, "GET", "/metrics", None, "").await.0, 401);
    let tenant_admin = http(at, "GET", "/metrics", Some(&alpha), "").await.0;
    assert_eq!(tenant_admin, 403, "a tenant's admin is not the cluster's");
    assert_eq!(
        http(at, "GET", "/metrics", Some(&admin_tok), "").await.0,
        200
    );
}

#[tokio::test]
async fn expired_revoked_and_malformed_tokens_are_refused_and_a_fresh_token_continues_the_connection()
 {
    let broker = Broker::start(auth_on()).await;
    let admin_tok = admin_token(&broker);
    let admin = connect(&broker, Some(&admin_tok)).await;
    durable_stream(&admin, "t", "s").await;

    // Expired: a 5 s token (long enough to connect and subscribe on a loaded machine) works,
    // then is refused on the same connection; a fresh one presented on that connection
    // continues without reconnecting.
    let (short, _) = mint(
        &admin,
        TokenSpec {
            ttl: Some(Duration::from_secs(5)),
            ..spec("t", &[])
        },
    )
    .await;
    let conn = connect(&broker, Some(&short)).await;
    // A subscription opened with it is cut once it expires (docs/security.md, Refusals).
    let mut sub = conn
        .subscribe("t", "default", "s", 0, StartAt::Earliest)
        .await
        .expect("subscribe while valid");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let expired = loop {
        match conn.describe_stream("t", "default", "s").await {
            Ok(_) => assert!(
                tokio::time::Instant::now() < deadline,
                "the 5 s token never expired"
            ),
            Err(e) => break refusal::<()>(Err(e), "expired"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        (expired.code, expired.reason.as_str()),
        (codes::UNAUTHORIZED, "token_expired"),
        "{expired}"
    );
    let ended = tokio::time::timeout(PATIENCE, async {
        loop {
            match sub.next_event().await {
                Ok(Some(_)) => continue,
                other => break other,
            }
        }
    })
    .await
    .expect("the subscription ends once its token expired");
    assert_refused(
        ended,
        codes::UNAUTHORIZED,
        "token_expired",
        "open subscription",
    );
    let (fresh, fresh_jti) = mint(&admin, spec("t", &[])).await;
    conn.set_token(&fresh).await.expect("present a fresh token");
    conn.publish("t", "default", "s", "after refresh", AckMode::Batch)
        .await
        .expect("the same connection continues");
    // A bad token presented on a live connection is refused and the good one stays.
    assert_refused(
        conn.set_token("not.a.token").await,
        codes::UNAUTHORIZED,
        "invalid_token",
        "bad refresh",
    );
    conn.describe_stream("t", "default", "s")
        .await
        .expect("still the fresh token");

    // Revoked: refused at the next request.
    admin.revoke_token(&fresh_jti).await.expect("revoke");
    assert_refused(
        conn.describe_stream("t", "default", "s").await,
        codes::UNAUTHORIZED,
        "token_revoked",
        "revoked",
    );
    let e = Connection::connect(
        &broker.quic_addr.to_string(),
        ClientConfig {
            token: Some(fresh),
            ..Default::default()
        },
    )
    .await;
    assert_refused(
        e.map(|_| ()),
        codes::UNAUTHORIZED,
        "token_revoked",
        "hello with a revoked token",
    );

    // Malformed: random bytes, alg none, HS256 keyed with the public key, an unknown kid,
    // the right kid signed by another key. Each is `invalid_token`, and the broker lives.
    let kid = jsonwebtoken::decode_header(&admin_tok)
        .unwrap()
        .kid
        .unwrap();
    let (_, jwks) = http(broker.admin_addr, "GET", "/.well-known/jwks.json", None, "").await;
    let jwks: serde_json::Value = serde_json::from_str(&jwks).unwrap();
    let public_x = jwks["keys"][0]["x"].as_str().unwrap().to_owned();
    let now = felix_meta::auth::now_secs();
    let claims = felix_meta::auth::Claims {
        tenant: "t".into(),
        sub: "forger".into(),
        exp: now + 600,
        iat: now,
        jti: "forged".into(),
        namespace: "default".into(),
        roles: vec!["tenant-admin".into()],
        allow: vec![],
    };
    let b64 = |s: &str| URL_SAFE_NO_PAD.encode(s);
    let body = b64(&serde_json::to_string(&claims).unwrap());
    let none = format!(
        "{}.{body}.",
        b64(&format!(r#"{{"alg":"none","typ":"JWT","kid":"{kid}"}}"#))
    );
    let mut hs_header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    hs_header.kid = Some(kid.clone());
    let hs256 = jsonwebtoken::encode(
        &hs_header,
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(public_x.as_bytes()).unwrap(),
    )
    .unwrap();
    let stranger = felix_meta::auth::SigningKey::generate(now).unwrap();
    let unknown_kid = felix_meta::auth::mint(&stranger, &claims).unwrap();
    let same_kid = felix_meta::auth::mint(
        &felix_meta::auth::SigningKey {
            kid: kid.clone(),
            ..stranger.clone()
        },
        &claims,
    )
    .unwrap();
    let random: String = (0..300)
        .map(|i| char::from(b'!' + ((i * 7919 + 13) % 90) as u8))
        .collect();
    for (what, token) in [
        ("random bytes", random.as_str()),
        ("alg none", &none),
        ("HS256 with the public key", &hs256),
        ("unknown kid", &unknown_kid),
        ("kid of another key", &same_kid),
    ] {
        let r = Connection::connect(
            &broker.quic_addr.to_string(),
            ClientConfig {
                token: Some(token.to_owned()),
                ..Default::default()
            },
        )
        .await;
        assert_refused(r.map(|_| ()), codes::UNAUTHORIZED, "invalid_token", what);
        let (status, body) = http(broker.admin_addr, "GET", "/v1/tenants", Some(token), "").await;
        assert_eq!(status, 401, "{what}: {body}");
    }
    admin
        .describe_stream("t", "default", "s")
        .await
        .expect("the broker is still serving");
}

#[tokio::test]
async fn revocation_reaches_every_broker_and_a_forwarded_publish_is_checked_again_at_the_owner() {
    let cluster =
        Cluster::start_authenticated(3, "auth-test-cluster-secret-0123456789abcdef").await;
    let token = admin_token(&cluster.brokers[0]);
    for b in &cluster.brokers[1..] {
        assert_eq!(
            admin_token(b),
            token,
            "one bootstrap token, written by every broker"
        );
    }
    let admin = connect(&cluster.brokers[0], Some(&token)).await;
    for r in [
        admin.create_tenant("t").await,
        admin.create_namespace("t", "default").await,
    ] {
        r.expect("create tenant and namespace");
    }
    let config = StreamConfig {
        durable: Some(true),
        shards: Some(1),
        replicas: Some(1),
        ..StreamConfig::default()
    };
    admin
        .create_stream("t", "default", "fwd", config)
        .await
        .expect("create stream");

    // Revocation: a token verified and cached on every broker's connection is refused on
    // each once revoked through one of them.
    let (victim, jti) = mint(&admin, spec("t", &[])).await;
    let mut conns = Vec::new();
    for b in &cluster.brokers {
        let c = connect(b, Some(&victim)).await;
        c.list_streams("t", "default")
            .await
            .expect("the token works everywhere");
        conns.push(c);
    }
    admin.revoke_token(&jti).await.expect("revoke");
    for (i, c) in conns.iter().enumerate() {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match c.list_streams("t", "default").await {
                Err(ClientError::Broker(e)) if e.reason == "token_revoked" => break,
                other => assert!(
                    tokio::time::Instant::now() < deadline,
                    "broker {} still accepts a revoked token: {other:?}",
                    i + 1
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // The forwarded publish: a subscribe-only token sent to a broker that does not lead the
    // shard, whose own check is switched off, is refused by the owner, and nothing is written.
    let topology = admin
        .topology("t", "default", "fwd")
        .await
        .expect("topology");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let leader = loop {
        if let Some((id, _)) = admin
            .topology("t", "default", "fwd")
            .await
            .ok()
            .and_then(|t| t.leader(0))
        {
            break id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no leader: {topology:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let owner = &cluster.brokers[leader as usize - 1];
    let ingress = cluster
        .brokers
        .iter()
        .find(|b| b.quic_addr != owner.quic_addr)
        .unwrap();
    let owner_admin = connect(owner, Some(&token)).await;
    let before = next_offset(&owner_admin, "t", "fwd").await;
    let (reader, _) = mint(&admin, spec("t", &["stream.subscribe:t/*"])).await;
    let (writer, _) = mint(&admin, spec("t", &["stream.publish:t/*"])).await;
    let via = connect(ingress, Some(&reader)).await;
    let publish = |c: &Connection| {
        let c = c.clone();
        async move {
            c.publish_raw("t", "default", "fwd", 0, one_batch(), AckMode::Batch)
                .await
        }
    };
    assert_refused(
        publish(&via).await,
        codes::FORBIDDEN,
        "forbidden",
        "checked at the ingress",
    );
    let (status, body) = http(
        ingress.admin_addr,
        "POST",
        "/v1/faults/skip_ingress_publish_check",
        Some(&token),
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let e = assert_refused(
        publish(&via).await,
        codes::FORBIDDEN,
        "forbidden",
        "checked again at the owner",
    );
    assert!(e.message.contains("stream.publish"), "{e}");
    assert_eq!(
        next_offset(&owner_admin, "t", "fwd").await,
        before,
        "nothing written"
    );
    // The token travels with the publish: one that grants it is accepted through the same path.
    let w = connect(ingress, Some(&writer)).await;
    publish(&w)
        .await
        .expect("a forwarded publish with stream.publish");
    assert_eq!(next_offset(&owner_admin, "t", "fwd").await, before + 1);
}

/// One RecordBatch v2 with one record, as a client would encode it.
fn one_batch() -> Bytes {
    let batch = felix_wire::BatchBuilder::new(felix_wire::Compression::None)
        .with(felix_wire::Record::value(
            1_700_000_000_000,
            Bytes::from_static(b"forwarded"),
        ))
        .build()
        .expect("batch encodes");
    Bytes::from(batch)
}

#[tokio::test]
async fn felixctl_mints_a_token_that_publishes_and_finds_the_admin_token_on_loopback() {
    let broker = Broker::start(auth_on()).await;
    let token = admin_token(&broker);
    let admin = connect(&broker, Some(&token)).await;
    durable_stream(&admin, "acme", "orders").await;

    // In a temp cwd holding ./felix-data/admin.token, felixctl finds it and says so once.
    let cwd = tempfile::tempdir().unwrap();
    std::fs::create_dir(cwd.path().join("felix-data")).unwrap();
    std::fs::write(
        cwd.path().join("felix-data/admin.token"),
        format!("{token}\n"),
    )
    .unwrap();
    let out = super::felixctl::run_in(
        &broker,
        cwd.path(),
        &[
            "token",
            "create",
            "--tenant",
            "acme",
            "--allow",
            "stream.publish:acme/default/*",
            "--allow",
            "stream.subscribe:acme/default/orders",
        ],
        b"",
    )
    .await;
    assert_eq!(
        out.stderr.matches("admin.token").count(),
        1,
        "{}",
        out.stderr
    );
    let minted = out.stdout.trim().to_owned();
    assert_eq!(
        out.stdout.lines().count(),
        1,
        "the token alone on stdout: {}",
        out.stdout
    );

    // Elsewhere (no admin.token), the minted token publishes with --token; without one the
    // broker refuses.
    let elsewhere = tempfile::tempdir().unwrap();
    super::felixctl::run_in(
        &broker,
        elsewhere.path(),
        &["--token", &minted, "publish", "acme/default/orders"],
        b"hello\n",
    )
    .await;
    let refused = super::felixctl::run_status_in(
        &broker,
        elsewhere.path(),
        &["publish", "acme/default/orders"],
        b"nope\n",
    )
    .await;
    assert!(
        !refused.0 && refused.1.contains("missing_token"),
        "{}",
        refused.1
    );
    assert_eq!(
        next_offset(&admin, "acme", "orders").await,
        1,
        "one record, from the minted token"
    );

    // Bad grants are usage errors with a reason.
    let bad = super::felixctl::run_status_in(
        &broker,
        cwd.path(),
        &[
            "token",
            "create",
            "--tenant",
            "acme",
            "--allow",
            "stream.pub:acme/*",
        ],
        b"",
    )
    .await;
    assert!(!bad.0 && bad.1.contains("unknown action"), "{}", bad.1);
}
