//! The OIDC exchange on a real broker with auth on (docs/security.md, *OIDC exchange*): a
//! test identity provider (RSA and EC P-256 key pairs and a JWKS file made here; no real
//! IdP) is registered with `felixctl oidc issuer add`; its RS256 and ES256 JWTs exchange
//! (admin HTTP and `felixctl login`) for short-lived Felix tokens with the mapped tenant,
//! subject and roles, which publish where the role allows and are refused where it does
//! not; a wrong audience, issuer, signature, an expired JWT, `none`/HS256 and a tenant
//! mismatch are each refused with their reason, counted, and mint nothing. One broker
//! serves every case.

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::rsa::{KeyPair as RsaKeyPair, KeySize};
use aws_lc_rs::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _, RSA_PKCS1_SHA256,
};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use felix_client::{AckMode, ClientConfig, ClientError, Connection, StartAt, codes};
use serde_json::{Value, json};

use super::common::{Broker, BrokerOptions, durable_stream, metric_lines, metric_value};

const ISS: &str = "https://idp.test/realms/felix";

/// The test identity provider's signing keys.
enum Signer {
    Rsa(RsaKeyPair),
    Ec(EcdsaKeyPair),
}

impl Signer {
    fn rsa() -> Signer {
        Signer::Rsa(RsaKeyPair::generate(KeySize::Rsa2048).expect("an RSA key"))
    }

    fn ec() -> Signer {
        let rng = SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        Signer::Ec(
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, doc.as_ref()).unwrap(),
        )
    }

    /// The public key as a JWK with `kid`.
    fn jwk(&self, kid: &str) -> Value {
        let b64 = |b: &[u8]| URL_SAFE_NO_PAD.encode(b);
        match self {
            Signer::Rsa(pair) => {
                let (n, e) = rsa_public_components(pair.public_key().as_ref());
                json!({"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256",
                       "n": b64(n), "e": b64(e)})
            }
            Signer::Ec(pair) => {
                let point = pair.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
                       "x": b64(&point[1..33]), "y": b64(&point[33..65])})
            }
        }
    }

    /// A compact JWS of `claims` with header `{"alg": RS256|ES256, "kid": kid}`.
    fn sign(&self, kid: &str, claims: &Value) -> String {
        let alg = match self {
            Signer::Rsa(_) => "RS256",
            Signer::Ec(_) => "ES256",
        };
        let message = format!(
            "{}.{}",
            b64_json(&json!({"alg": alg, "kid": kid, "typ": "JWT"})),
            b64_json(claims)
        );
        let rng = SystemRandom::new();
        let signature = match self {
            Signer::Rsa(pair) => {
                let mut sig = vec![0; pair.public_modulus_len()];
                pair.sign(&RSA_PKCS1_SHA256, &rng, message.as_bytes(), &mut sig)
                    .unwrap();
                sig
            }
            Signer::Ec(pair) => pair
                .sign(&rng, message.as_bytes())
                .unwrap()
                .as_ref()
                .to_vec(),
        };
        format!("{message}.{}", URL_SAFE_NO_PAD.encode(signature))
    }
}

fn b64_json(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
}

/// `n` and `e` of a DER `RSAPublicKey` (SEQUENCE { INTEGER n, INTEGER e }), without the
/// sign byte a DER integer may lead with.
fn rsa_public_components(der: &[u8]) -> (&[u8], &[u8]) {
    fn tlv(b: &[u8]) -> (u8, &[u8], &[u8]) {
        let (len, head) = match b[1] {
            l if l < 0x80 => (l as usize, 2),
            0x81 => (b[2] as usize, 3),
            0x82 => (((b[2] as usize) << 8) | b[3] as usize, 4),
            other => panic!("unexpected DER length byte {other:#x}"),
        };
        (b[0], &b[head..head + len], &b[head + len..])
    }
    let (tag, seq, _) = tlv(der);
    assert_eq!(tag, 0x30, "an RSAPublicKey is a SEQUENCE");
    let (_, n, rest) = tlv(seq);
    let (_, e, _) = tlv(rest);
    let n = n.strip_prefix(&[0]).unwrap_or(n);
    (n, e)
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An IdP token's claims for Felix: tenant `acme`, subject `ana`, group `writers`.
fn claims() -> Value {
    json!({
        "iss": ISS, "aud": ["account", "felix"], "sub": "ana", "org": "acme",
        "groups": ["writers", "unrelated"], "iat": now(), "nbf": now() - 5, "exp": now() + 3600,
    })
}

fn with(key: &str, value: Value) -> Value {
    let mut c = claims();
    c[key] = value;
    c
}

/// The claims of a Felix token (its middle part), unverified: what it says it grants.
fn felix_claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("a JWT");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

/// One HTTP/1.1 request on the admin port (`auth::http`): status and the body as JSON.
async fn http(
    broker: &Broker,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let (status, body) = super::auth::http(broker.admin_addr, method, path, bearer, body).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

async fn exchange(broker: &Broker, tenant: &str, jwt: &str) -> (u16, Value) {
    let body = json!({ "token": jwt }).to_string();
    http(
        broker,
        "POST",
        &format!("/v1/tenants/{tenant}/token/exchange"),
        None,
        &body,
    )
    .await
}

async fn connect(broker: &Broker, token: &str) -> Connection {
    let config = ClientConfig {
        token: Some(token.to_owned()),
        ..ClientConfig::default()
    };
    Connection::connect(&broker.quic_addr.to_string(), config)
        .await
        .expect("connect with the exchanged token")
}

fn refused_as<T: std::fmt::Debug>(r: Result<T, ClientError>, code: u16, what: &str) {
    match r {
        Err(ClientError::Broker(e)) => assert_eq!(e.code, code, "{what}: {e}"),
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

async fn refusals(broker: &Broker, reason: &str) -> f64 {
    let text = broker.metrics().await;
    let label = format!("reason=\"{reason}\"");
    metric_lines(&text, "felix_auth_refusals_total")
        .into_iter()
        .find(|l| l.contains(&label))
        .map_or(0.0, metric_value)
}

#[tokio::test]
async fn idp_tokens_exchange_for_felix_tokens_with_the_mapped_grants_and_every_defect_is_refused() {
    let broker = Broker::start(BrokerOptions::new().env("FELIX_AUTH", "on")).await;
    let admin_token = broker.admin_token().expect("admin.token");
    let admin = broker.client().await;
    durable_stream(&admin, "acme", "default", "orders", 1).await;
    admin
        .create_stream("acme", "default", "audit", Default::default())
        .await
        .unwrap();
    admin.create_tenant("globex").await.unwrap();
    admin
        .put_role(
            "orders-writer",
            &["stream.publish:acme/default/orders".to_owned()],
        )
        .await
        .unwrap();

    // The identity provider: an RSA and an EC key in one JWKS file.
    let (rsa, ec) = (Signer::rsa(), Signer::ec());
    let dir = tempfile::tempdir().unwrap();
    let jwks = json!({ "keys": [rsa.jwk("rsa-1"), ec.jwk("ec-1")] });
    let jwks_file = dir.path().join("jwks.json");
    std::fs::write(&jwks_file, jwks.to_string()).unwrap();
    let jwks_path = jwks_file.to_str().unwrap();

    // Registering an issuer needs rbac.manage on *: no token and a tenant's admin are refused.
    let spec = json!({"issuer": ISS, "audience": "felix", "jwks": jwks.to_string(), "tenant_claim": "org"});
    let (status, body) = http(&broker, "POST", "/v1/oidc/issuers", None, &spec.to_string()).await;
    assert_eq!(
        (status, &body["reason"]),
        (401, &json!("missing_token")),
        "{body}"
    );
    let tenant_admin = admin
        .mint_token(felix_client::TokenSpec {
            tenant: "acme".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let (status, body) = http(
        &broker,
        "POST",
        "/v1/oidc/issuers",
        Some(&tenant_admin.token),
        &spec.to_string(),
    )
    .await;
    assert_eq!(
        (status, &body["reason"]),
        (403, &json!("forbidden")),
        "{body}"
    );
    // A bad registration is refused with its reason and changes nothing.
    let bad =
        json!({"issuer": ISS, "audience": "felix", "jwks": "{\"keys\":[]}", "tenant_claim": "org"});
    let (status, body) = http(
        &broker,
        "POST",
        "/v1/oidc/issuers",
        Some(&admin_token),
        &bad.to_string(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = http(&broker, "GET", "/v1/oidc/issuers", Some(&admin_token), "").await;
    assert_eq!(
        (status, body),
        (200, json!([])),
        "a refused registration registers nothing"
    );

    // The operator registers the IdP with felixctl.
    let add = [
        "oidc",
        "issuer",
        "add",
        ISS,
        "--audience",
        "felix",
        "--jwks-file",
        jwks_path,
        "--tenant-claim",
        "org",
        "--roles-claim",
        "groups",
        "--map-role",
        "writers=orders-writer",
        "--ttl",
        "10m",
    ];
    let as_admin = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["--token".to_owned(), admin_token.clone()];
        all.extend(args.iter().map(|a| a.to_string()));
        all
    };
    let args = as_admin(&add);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    super::felixctl::run(&broker, &args, b"").await;
    let args = as_admin(&["oidc", "issuer", "list"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let listed = super::felixctl::run(&broker, &args, b"").await.stdout;
    assert!(
        listed.contains(ISS)
            && listed.contains("tenant_claim=org")
            && listed.contains("writers=orders-writer"),
        "{listed}"
    );

    // RS256 over admin HTTP: a Felix token of acme for ana with the mapped role, 10 minutes.
    let before = now();
    let (status, body) = exchange(&broker, "acme", &rsa.sign("rsa-1", &claims())).await;
    assert_eq!(status, 200, "{body}");
    let felix = body["token"].as_str().expect("a token").to_owned();
    let c = felix_claims(&felix);
    assert_eq!(
        (&c["tenant"], &c["sub"]),
        (&json!("acme"), &json!("ana")),
        "{c}"
    );
    assert_eq!(
        c["roles"],
        json!(["orders-writer"]),
        "only the mapped group gives a role"
    );
    let exp = body["expires_at"].as_u64().unwrap();
    assert!(
        exp >= before + 600 && exp <= now() + 600,
        "10 minutes: {exp}"
    );
    // It publishes where the role allows, and is refused where it does not.
    let user = connect(&broker, &felix).await;
    user.publish("acme", "default", "orders", "by ana", AckMode::Batch)
        .await
        .expect("allowed");
    refused_as(
        user.publish("acme", "default", "audit", "no", AckMode::Batch)
            .await,
        codes::FORBIDDEN,
        "publish to a stream the role does not cover",
    );
    refused_as(
        user.subscribe("acme", "default", "orders", 0, StartAt::Earliest)
            .await,
        codes::FORBIDDEN,
        "subscribe with a publish-only role",
    );

    // ES256 through `felixctl login`: the Felix token alone on stdout, and never outliving
    // the IdP token (which expires in 2 minutes here).
    // The JWT on stdin; a stale Felix token in the environment is not presented (a hello
    // with an expired token would be refused), so it does not stand in the way.
    let es = ec.sign("ec-1", &with("exp", json!(now() + 120)));
    let out = super::felixctl::run(
        &broker,
        &[
            "--token",
            "stale.felix.token",
            "login",
            "--oidc-token",
            "-",
            "--tenant",
            "acme",
        ],
        format!("{es}\n").as_bytes(),
    )
    .await;
    assert_eq!(
        out.stdout.lines().count(),
        1,
        "the token alone: {}",
        out.stdout
    );
    let from_login = out.stdout.trim();
    let c = felix_claims(from_login);
    assert_eq!(
        (&c["tenant"], &c["sub"]),
        (&json!("acme"), &json!("ana")),
        "{c}"
    );
    assert!(
        c["exp"].as_u64().unwrap() <= now() + 120,
        "capped by the IdP token: {c}"
    );
    super::felixctl::run(
        &broker,
        &["--token", from_login, "publish", "acme/default/orders"],
        b"by felixctl\n",
    )
    .await;
    // Kafka: SASL/OAUTHBEARER takes the IdP token itself and exchanges it at the listener
    // (confluent-kafka's oauth_cb hands it over, as an application fetching it would).
    let bootstrap = broker.kafka_addr.to_string();
    let jwt = rsa.sign("rsa-1", &claims());
    let bearer = ["--mechanism", "OAUTHBEARER", "--token", jwt.as_str()];
    let mut args = vec!["produce_one", bootstrap.as_str(), "orders"];
    args.extend_from_slice(&bearer);
    let wrote = super::kafka::python_script("kafka_sasl.py", &args).await;
    assert!(
        wrote["result"].is_null(),
        "an IdP token over OAUTHBEARER publishes where its role allows: {wrote}"
    );
    let wrong_audience = rsa.sign("rsa-1", &with("aud", json!("someone-else")));
    let probe = super::kafka::python_script(
        "kafka_sasl.py",
        &[
            "probe",
            bootstrap.as_str(),
            "--mechanism",
            "OAUTHBEARER",
            "--token",
            wrong_audience.as_str(),
        ],
    )
    .await;
    super::kafka_auth::assert_authentication_failed(
        &probe,
        "wrong_audience",
        "an IdP token for another audience over OAUTHBEARER",
    );
    let info = admin
        .describe_stream("acme", "default", "orders")
        .await
        .unwrap();
    assert_eq!(
        info.shards[0].next_offset, 3,
        "three records, all by exchanged tokens"
    );

    // Every defect is refused with its reason, counted, and mints nothing.
    let stranger = Signer::rsa();
    let b64 = |v: &Value| b64_json(v);
    let hs256 = {
        let message = format!(
            "{}.{}",
            b64(&json!({"alg": "HS256", "kid": "rsa-1"})),
            b64(&claims())
        );
        let key =
            aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, jwks.to_string().as_bytes());
        let tag = aws_lc_rs::hmac::sign(&key, message.as_bytes());
        format!("{message}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    };
    let cases = [
        (
            "acme",
            rsa.sign("rsa-1", &with("aud", json!("someone-else"))),
            "wrong_audience",
        ),
        (
            "acme",
            rsa.sign("rsa-1", &with("iss", json!("https://evil.test"))),
            "wrong_issuer",
        ),
        (
            "acme",
            stranger.sign("other", &with("iss", json!("https://evil.test"))),
            "unknown_issuer",
        ),
        ("acme", stranger.sign("rsa-1", &claims()), "bad_signature"),
        (
            "acme",
            ec.sign("ec-1", &with("exp", json!(now() - 10))),
            "expired",
        ),
        (
            "acme",
            format!("{}.{}.", b64(&json!({"alg": "none"})), b64(&claims())),
            "unsupported_algorithm",
        ),
        ("acme", hs256, "unsupported_algorithm"),
        ("globex", rsa.sign("rsa-1", &claims()), "tenant_mismatch"),
        (
            "acme",
            rsa.sign("rsa-1", &with("org", json!("globex"))),
            "tenant_mismatch",
        ),
    ];
    for (tenant, jwt, reason) in &cases {
        let counted = refusals(&broker, reason).await;
        let (status, body) = exchange(&broker, tenant, jwt).await;
        assert_eq!(
            (status, &body["reason"]),
            (401, &json!(reason)),
            "{reason}: {body}"
        );
        assert!(
            body.get("token").is_none(),
            "{reason}: nothing minted: {body}"
        );
        let message = body["message"].as_str().unwrap_or_default();
        assert!(
            !message.contains("idp.test") && !message.contains("globex"),
            "{reason}: the refusal names nothing registered: {message}"
        );
        assert_eq!(
            refusals(&broker, reason).await,
            counted + 1.0,
            "{reason} counted"
        );
    }
    // felixctl login says why, and prints no token.
    let expired = dir.path().join("expired.jwt");
    std::fs::write(&expired, ec.sign("ec-1", &with("exp", json!(now() - 10)))).unwrap();
    let (ok, stderr) = super::felixctl::run_status_in(
        &broker,
        dir.path(),
        &[
            "login",
            "--oidc-token",
            expired.to_str().unwrap(),
            "--tenant",
            "acme",
        ],
        b"",
    )
    .await;
    assert!(!ok && stderr.contains("expired"), "{stderr}");

    // Removed, the issuer is trusted no more; the Felix token already exchanged lives out
    // its short life.
    let args = as_admin(&["oidc", "issuer", "remove", ISS]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    super::felixctl::run(&broker, &args, b"").await;
    let (status, body) = exchange(&broker, "acme", &rsa.sign("rsa-1", &claims())).await;
    assert_eq!(
        (status, &body["reason"]),
        (401, &json!("unknown_issuer")),
        "{body}"
    );
    let info = admin
        .describe_stream("acme", "default", "orders")
        .await
        .unwrap();
    assert_eq!(
        info.shards[0].next_offset, 3,
        "no refused caller wrote anything"
    );
}
