//! The Kafka listener with auth on (docs/kafka.md, "Authentication"; docs/security.md): real
//! Kafka clients (confluent-kafka through `kafka_sasl.py`, and kcat) authenticate with SASL
//! PLAIN and OAUTHBEARER carrying Felix tokens, over plaintext and over TLS; a wrong
//! password fails cleanly, a client without SASL is refused; a principal's topics are its
//! own tenant's, so another tenant's topics are neither listed nor reached, and a token's
//! grants decide produce, consume and the admin APIs (DeleteRecords, CreatePartitions,
//! DeleteGroups through `kafka_admin.py`). A connection whose token expired is refused at its
//! next request. One auth-on broker per listener kind is shared by the cases.

use std::path::Path;
use std::time::{Duration, Instant};

use felix_client::{Connection, StreamConfig, TokenSpec, codes};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::auth::http;
use super::cluster::Cluster;
use super::common::{
    Broker, BrokerOptions, PATIENCE, free_tcp_addr, metric_lines, metric_value, run_to_exit,
};
use super::kafka::{Kcat, Librdkafka, python_script};
use super::kafka_admin::admin as kafka_admin;

async fn sasl(args: &[&str]) -> Value {
    python_script("kafka_sasl.py", args).await
}

fn auth_on() -> BrokerOptions {
    BrokerOptions::new().env("FELIX_AUTH", "on")
}

/// Creates `tenant` and its `default` namespace (either may exist).
async fn tenant(admin: &Connection, tenant: &str) {
    for r in [
        admin.create_tenant(tenant).await,
        admin.create_namespace(tenant, "default").await,
    ] {
        if let Err(e) = r {
            assert_eq!(e.code(), Some(codes::ALREADY_EXISTS), "{e}");
        }
    }
}

async fn token(admin: &Connection, tenant: &str, allow: &[&str], ttl: Option<Duration>) -> String {
    admin
        .mint_token(TokenSpec {
            tenant: tenant.into(),
            allow: allow.iter().map(|a| a.to_string()).collect(),
            ttl,
            ..TokenSpec::default()
        })
        .await
        .expect("mint a token")
        .token
}

/// `kafka_sasl.py roundtrip` of `n` records; asserts every record came back, and the group's
/// offset was committed.
async fn round_trip(bootstrap: &str, topic: &str, n: usize, security: &[&str], what: &str) {
    let count = n.to_string();
    let mut args = vec!["roundtrip", bootstrap, topic, &count];
    args.extend_from_slice(security);
    let out = sasl(&args).await;
    assert_eq!(out["delivered"], n, "{what}: every record delivered: {out}");
    let read: Vec<String> = serde_json::from_value(out["read"].clone()).unwrap();
    let expected: Vec<String> = (0..n).map(|i| format!("value-{i}")).collect();
    assert_eq!(read, expected, "{what}: read back in order: {out}");
    assert_eq!(out["committed"], n, "{what}: group offset committed: {out}");
    assert_eq!(out["errors"], serde_json::json!([]), "{what}: {out}");
}

fn error_names(out: &Value) -> Vec<String> {
    out["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["name"].as_str().map(str::to_owned))
        .collect()
}

/// Asserts a probe failed with an authentication error naming `why`, quickly.
pub(super) fn assert_authentication_failed(out: &Value, why: &str, what: &str) {
    assert!(out.get("topics").is_none(), "{what}: no metadata: {out}");
    assert!(
        error_names(out).iter().any(|n| n == "_AUTHENTICATION"),
        "{what}: the client reports an authentication failure: {out}"
    );
    let text = out.to_string();
    assert!(
        text.contains(why),
        "{what}: the reason ({why}) reaches the client: {out}"
    );
    assert!(
        out["seconds"].as_f64().unwrap() < 5.0,
        "{what}: fails at once, no hang: {out}"
    );
}

async fn refusals(broker: &Broker, reason: &str) -> f64 {
    let text = broker.metrics().await;
    metric_lines(&text, "felix_auth_refusals_total")
        .into_iter()
        .filter(|l| l.contains(&format!("reason=\"{reason}\"")))
        .map(metric_value)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_plaintext_authenticates_kafka_clients_and_keeps_tenants_apart() {
    let broker = Broker::start(auth_on()).await;
    let admin = broker.client().await;
    let bootstrap = broker.kafka_addr.to_string();
    tenant(&admin, "acme").await;
    tenant(&admin, "globex").await;
    let acme = token(&admin, "acme", &[], None).await;
    let globex = token(&admin, "globex", &[], None).await;
    let globex_writer = token(&admin, "globex", &["stream.publish:globex/default/*"], None).await;
    let globex_reader = token(
        &admin,
        "globex",
        &[
            "stream.subscribe:globex/default/*",
            "group.consume:globex/default/*",
        ],
        None,
    )
    .await;

    // PLAIN (the password is the token) and OAUTHBEARER (oauth_cb hands it over), at once.
    let plain = ["--mechanism", "PLAIN", "--token", &acme];
    let oauth = ["--mechanism", "OAUTHBEARER", "--token", &acme];
    tokio::join!(
        round_trip(&bootstrap, "orders", 50, &plain, "SASL_PLAINTEXT PLAIN"),
        round_trip(
            &bootstrap,
            "payments",
            50,
            &oauth,
            "SASL_PLAINTEXT OAUTHBEARER"
        ),
    );
    // The topics are acme's streams.
    let orders = admin
        .describe_stream("acme", "default", "orders")
        .await
        .expect("acme/default/orders exists");
    assert_eq!(orders.shards[0].next_offset, 50);

    // kcat (librdkafka 2.0) with SASL/PLAIN.
    let kcat = Kcat::new(Librdkafka::Debian).await;
    let kcat_sasl = |extra: &[&str]| {
        let mut a: Vec<String> = [
            "-b",
            &bootstrap,
            "-X",
            "security.protocol=SASL_PLAINTEXT",
            "-X",
            "sasl.mechanism=PLAIN",
            "-X",
            "sasl.username=kcat",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.push("-X".into());
        a.push(format!("sasl.password={acme}"));
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let input: String = (0..20).map(|i| format!("kcat-{i}\n")).collect();
    let args = kcat_sasl(&["-P", "-t", "kcat-orders"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out, err) = kcat.run(&args, Some(&input)).await;
    assert!(
        ok && !err.contains("Delivery failed"),
        "kcat -P: {out}{err}"
    );
    let args = kcat_sasl(&["-C", "-t", "kcat-orders", "-o", "beginning", "-e", "-q"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out, err) = kcat.run(&args, None).await;
    assert!(ok, "kcat -C: {err}");
    assert_eq!(out, input, "kcat reads back what it produced");

    // A wrong password, a token that is no token: an authentication failure, at once.
    let before = refusals(&broker, "invalid_token").await;
    let bad = sasl(&[
        "probe",
        &bootstrap,
        "--mechanism",
        "PLAIN",
        "--token",
        "not-a-token",
    ])
    .await;
    assert_authentication_failed(&bad, "invalid_token", "wrong PLAIN password");
    let bad = sasl(&[
        "probe",
        &bootstrap,
        "--mechanism",
        "OAUTHBEARER",
        "--token",
        "eyJhbGciOiJub25lIn0.e30.",
    ])
    .await;
    assert_authentication_failed(&bad, "invalid_token", "a forged OAUTHBEARER token");
    assert!(refusals(&broker, "invalid_token").await >= before + 2.0);

    // No SASL at all: the connection is closed, no metadata is served.
    let before = refusals(&broker, "missing_token").await;
    let none = sasl(&[
        "probe",
        &bootstrap,
        "--protocol",
        "PLAINTEXT",
        "--timeout",
        "3",
    ])
    .await;
    assert!(none.get("topics").is_none(), "no SASL, no metadata: {none}");
    assert!(refusals(&broker, "missing_token").await > before);

    // Another tenant sees none of acme's topics, and its names mean its own streams.
    let globex_admin = ["--mechanism", "PLAIN", "--token", &globex];
    let mut args = vec!["probe", &bootstrap];
    args.extend_from_slice(&globex_admin);
    let listed = sasl(&args).await;
    let topics: Vec<String> = serde_json::from_value(listed["topics"].clone())
        .unwrap_or_else(|_| panic!("globex lists its topics: {listed}"));
    for acme_topic in ["orders", "payments", "kcat-orders"] {
        assert!(
            !topics.iter().any(|t| t == acme_topic),
            "globex must not see acme's {acme_topic}: {topics:?}"
        );
    }
    let mut args = vec!["consume_one", &bootstrap, "orders"];
    args.extend_from_slice(&globex_admin);
    args.extend_from_slice(&["--timeout", "3"]);
    let read = sasl(&args).await;
    assert!(
        read["value"].is_null(),
        "globex reads none of acme's records: {read}"
    );
    let mut args = vec!["produce_one", &bootstrap, "orders"];
    args.extend_from_slice(&globex_admin);
    let wrote = sasl(&args).await;
    assert!(
        wrote["result"].is_null(),
        "globex writes its own orders: {wrote}"
    );
    let orders = admin
        .describe_stream("acme", "default", "orders")
        .await
        .unwrap();
    assert_eq!(
        orders.shards[0].next_offset, 50,
        "acme's orders are untouched"
    );
    let theirs = admin
        .describe_stream("globex", "default", "orders")
        .await
        .expect("globex/default/orders");
    assert_eq!(theirs.shards[0].next_offset, 1);

    // A token's grants decide: publish-only cannot consume, read-only cannot produce.
    let before = refusals(&broker, "forbidden").await;
    let writer = ["--mechanism", "OAUTHBEARER", "--token", &globex_writer];
    let reader = ["--mechanism", "PLAIN", "--token", &globex_reader];
    let mut args = vec!["consume_one", &bootstrap, "orders"];
    args.extend_from_slice(&writer);
    let denied = sasl(&args).await;
    assert_eq!(
        denied["error"], "TOPIC_AUTHORIZATION_FAILED",
        "a publish-only token cannot read: {denied}"
    );
    let mut args = vec!["produce_one", &bootstrap, "orders"];
    args.extend_from_slice(&reader);
    let denied = sasl(&args).await;
    assert_eq!(
        denied["result"], "TOPIC_AUTHORIZATION_FAILED",
        "a read-only token cannot write: {denied}"
    );
    let mut args = vec!["consume_one", &bootstrap, "orders"];
    args.extend_from_slice(&reader);
    let read = sasl(&args).await;
    assert_eq!(read["value"], "x", "the read-only token reads: {read}");
    let theirs = admin
        .describe_stream("globex", "default", "orders")
        .await
        .unwrap();
    assert_eq!(theirs.shards[0].next_offset, 1, "the refusal wrote nothing");
    assert!(refusals(&broker, "forbidden").await >= before + 2.0);

    // Without group.consume a consumer reads (assigned partitions need no group) but cannot
    // commit its group's offset. (No stream.manage either: it uses globex's existing topic.)
    let no_group = token(
        &admin,
        "globex",
        &[
            "stream.publish:globex/default/*",
            "stream.subscribe:globex/default/*",
        ],
        None,
    )
    .await;
    let out = sasl(&[
        "roundtrip",
        &bootstrap,
        "orders",
        "3",
        "--mechanism",
        "PLAIN",
        "--token",
        &no_group,
    ])
    .await;
    assert_eq!(out["read"].as_array().map(Vec::len), Some(3), "{out}");
    assert!(out["committed"].is_null(), "no offset committed: {out}");
    assert!(
        error_names(&out)
            .iter()
            .any(|n| n == "GROUP_AUTHORIZATION_FAILED"),
        "the commit is refused for the group: {out}"
    );

    // The admin APIs check their grant before any work, with confluent-kafka's AdminClient:
    // without stream.manage DeleteRecords and CreatePartitions are refused and change
    // nothing; without group.consume DeleteGroups is refused and the group's offsets stay.
    let before = admin
        .describe_stream("globex", "default", "orders")
        .await
        .unwrap();
    let as_no_group = |args: &[&str]| {
        let mut a = vec!["--token".to_owned(), no_group.clone()];
        a.extend(args.iter().map(|s| s.to_string()));
        a
    };
    for (args, what) in [
        (
            as_no_group(&["delete-records", &bootstrap, "orders", "0", "-1"]),
            "DeleteRecords",
        ),
        (
            as_no_group(&["create-partitions", &bootstrap, "orders", "2"]),
            "CreatePartitions",
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = kafka_admin(&args).await;
        assert_eq!(out["error"], "TOPIC_AUTHORIZATION_FAILED", "{what}: {out}");
    }
    let after = admin
        .describe_stream("globex", "default", "orders")
        .await
        .unwrap();
    assert_eq!(after.config.shards, Some(1), "no partition added");
    assert_eq!(
        after.shards[0].first_offset, before.shards[0].first_offset,
        "no record deleted"
    );
    let kept = kafka_admin(&[
        "--token",
        &globex_reader,
        "commit",
        &bootstrap,
        "orders",
        "kept",
        "0",
        "1",
    ])
    .await;
    assert_eq!(kept["committed"], serde_json::json!([[0, 1]]), "{kept}");
    let args = as_no_group(&["delete-groups", &bootstrap, "kept"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let refused = kafka_admin(&args).await;
    assert_eq!(refused["kept"], "GROUP_AUTHORIZATION_FAILED", "{refused}");
    let deleted = kafka_admin(&[
        "--token",
        &globex_reader,
        "delete-groups",
        &bootstrap,
        "kept",
    ])
    .await;
    assert_eq!(
        deleted["kept"],
        Value::Null,
        "the group was still there for its consumer to delete: {deleted}"
    );
}

/// A self-signed certificate for `127.0.0.1` and `localhost`, written as PEM files.
fn self_signed(dir: &Path) -> (String, String) {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("a self-signed certificate");
    let cert_path = dir.join("kafka.pem");
    let key_path = dir.join("kafka.key");
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    (
        cert_path.to_string_lossy().into_owned(),
        key_path.to_string_lossy().into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_ssl_serves_plain_and_oauthbearer_over_tls_and_refuses_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path());
    let broker = Broker::start(
        auth_on()
            .env("FELIX_KAFKA_TLS_CERT", &cert)
            .env("FELIX_KAFKA_TLS_KEY", &key),
    )
    .await;
    let admin = broker.client().await;
    let bootstrap = broker.kafka_addr.to_string();
    tenant(&admin, "acme").await;
    let acme = token(&admin, "acme", &[], None).await;
    let tls = ["--protocol", "SASL_SSL", "--ca", &cert];
    // 4 KiB values: fetch answers of megabytes, so TLS records outgrow the socket's buffer.
    let plain: Vec<&str> = tls
        .iter()
        .copied()
        .chain(["--mechanism", "PLAIN", "--token", &acme, "--pad", "4096"])
        .collect();
    let oauth: Vec<&str> = tls
        .iter()
        .copied()
        .chain(["--mechanism", "OAUTHBEARER", "--token", &acme])
        .collect();
    tokio::join!(
        round_trip(&bootstrap, "tls-orders", 3000, &plain, "SASL_SSL PLAIN"),
        round_trip(
            &bootstrap,
            "tls-payments",
            50,
            &oauth,
            "SASL_SSL OAUTHBEARER"
        ),
    );

    // A wrong password over TLS: the same clean authentication failure.
    let mut args = vec!["probe", &bootstrap];
    args.extend(tls.iter().copied());
    args.extend(["--mechanism", "PLAIN", "--token", "wrong"]);
    let bad = sasl(&args).await;
    assert_authentication_failed(&bad, "invalid_token", "wrong password over TLS");

    // A plaintext client on the TLS listener gets no answer.
    let args = [
        "probe",
        &bootstrap,
        "--mechanism",
        "PLAIN",
        "--token",
        &acme,
        "--timeout",
        "3",
    ];
    let out = sasl(&args).await;
    assert!(out.get("topics").is_none(), "plaintext on TLS: {out}");

    // A certificate that cannot be read stops the start, naming the file.
    let (admin_addr, internal_addr) = (free_tcp_addr().to_string(), free_tcp_addr().to_string());
    let missing = dir.path().join("missing.pem");
    let missing = missing.to_string_lossy();
    let (code, stderr) = run_to_exit(
        &[
            "--quic-addr",
            "127.0.0.1:0",
            "--kafka-addr",
            "127.0.0.1:0",
            "--admin-addr",
            &admin_addr,
            "--internal-addr",
            &internal_addr,
            "--kafka-tls-cert",
            &missing,
            "--kafka-tls-key",
            &key,
        ],
        &[],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("missing.pem"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_off_sasl_is_optional_and_any_credential_is_accepted() {
    let broker = Broker::start(BrokerOptions::new()).await;
    let bootstrap = broker.kafka_addr.to_string();
    round_trip(
        &bootstrap,
        "open-orders",
        10,
        &["--mechanism", "PLAIN", "--token", "anything"],
        "auth off, SASL PLAIN",
    )
    .await;
    let out = sasl(&["probe", &bootstrap, "--protocol", "PLAINTEXT"]).await;
    let topics: Vec<String> = serde_json::from_value(out["topics"].clone()).unwrap();
    assert!(topics.contains(&"open-orders".to_owned()), "{out}");
}

/// One request frame in a non-flexible version (request header v1): length, header, body.
fn frame(api: i16, version: i16, cid: i32, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&api.to_be_bytes());
    f.extend_from_slice(&version.to_be_bytes());
    f.extend_from_slice(&cid.to_be_bytes());
    f.extend_from_slice(&3i16.to_be_bytes());
    f.extend_from_slice(b"raw");
    f.extend_from_slice(body);
    let mut out = (f.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&f);
    out
}

const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
const METADATA: i16 = 3;

/// Sends a frame; the answer's bytes after the length, or `None` when the broker closed
/// the connection.
async fn ask(s: &mut TcpStream, bytes: &[u8]) -> Option<Vec<u8>> {
    s.write_all(bytes).await.ok()?;
    let mut len = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut len))
        .await
        .expect("an answer or a close within 10 s")
        .ok()?;
    let mut body = vec![0; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).await.ok()?;
    Some(body)
}

/// SaslHandshake v1 then SaslAuthenticate v0 with PLAIN: the authenticate answer's error
/// code (right after the correlation id).
async fn plain_login(s: &mut TcpStream, token: &str) -> i16 {
    let mut hs = 5i16.to_be_bytes().to_vec();
    hs.extend_from_slice(b"PLAIN");
    let answer = ask(s, &frame(SASL_HANDSHAKE, 1, 1, &hs))
        .await
        .expect("a handshake answer");
    assert_eq!(&answer[4..6], &[0, 0], "PLAIN is agreed");
    let message = format!("\0user\0{token}");
    let mut auth = (message.len() as i32).to_be_bytes().to_vec();
    auth.extend_from_slice(message.as_bytes());
    let answer = ask(s, &frame(SASL_AUTHENTICATE, 0, 2, &auth))
        .await
        .expect("an authenticate answer");
    i16::from_be_bytes([answer[4], answer[5]])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_request_before_sasl_or_after_the_token_expired_closes_the_connection() {
    let broker = Broker::start(auth_on()).await;
    let admin = broker.client().await;
    tenant(&admin, "acme").await;
    // Metadata v1 for every topic (a null topic list).
    let metadata = frame(METADATA, 1, 3, &(-1i32).to_be_bytes());

    // Before authentication: nothing but ApiVersions and SASL is served.
    let mut s = TcpStream::connect(broker.kafka_addr).await.unwrap();
    assert!(
        ask(&mut s, &metadata).await.is_none(),
        "Metadata before SASL closes the connection"
    );

    // A token that expires on a live connection: served until then, refused after.
    let short = token(&admin, "acme", &[], Some(Duration::from_secs(2))).await;
    let started = Instant::now();
    let mut s = TcpStream::connect(broker.kafka_addr).await.unwrap();
    assert_eq!(plain_login(&mut s, &short).await, 0, "authenticated");
    assert!(
        ask(&mut s, &metadata).await.is_some(),
        "served while the token lives"
    );
    let before = refusals(&broker, "token_expired").await;
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(started.elapsed())).await;
    assert!(
        ask(&mut s, &metadata).await.is_none(),
        "the next request after expiry closes the connection"
    );
    assert!(refusals(&broker, "token_expired").await > before);

    // A v0 handshake: the SASL message follows as a bare frame, answered by an empty one.
    let live = token(&admin, "acme", &[], None).await;
    let mut s = TcpStream::connect(broker.kafka_addr).await.unwrap();
    let mut hs = 5i16.to_be_bytes().to_vec();
    hs.extend_from_slice(b"PLAIN");
    let answer = ask(&mut s, &frame(SASL_HANDSHAKE, 0, 1, &hs))
        .await
        .unwrap();
    assert_eq!(&answer[4..6], &[0, 0], "PLAIN is agreed (v0)");
    let message = format!("\0user\0{live}");
    let mut raw = (message.len() as u32).to_be_bytes().to_vec();
    raw.extend_from_slice(message.as_bytes());
    assert_eq!(
        ask(&mut s, &raw).await,
        Some(Vec::new()),
        "empty SASL answer"
    );
    assert!(
        ask(&mut s, &metadata).await.is_some(),
        "served after a v0 login"
    );
    // ... and a bad bare message closes the connection.
    let mut s = TcpStream::connect(broker.kafka_addr).await.unwrap();
    ask(&mut s, &frame(SASL_HANDSHAKE, 0, 1, &hs))
        .await
        .unwrap();
    let mut raw = 4u32.to_be_bytes().to_vec();
    raw.extend_from_slice(b"junk");
    assert!(
        ask(&mut s, &raw).await.is_none(),
        "a bad v0 login is closed"
    );

    // Logging in with the expired token fails with SASL_AUTHENTICATION_FAILED (58).
    let mut s = TcpStream::connect(broker.kafka_addr).await.unwrap();
    assert_eq!(plain_login(&mut s, &short).await, 58);
    assert!(
        ask(&mut s, &metadata).await.is_none(),
        "closed after the failure"
    );
}

/// A Produce v3 (`acks=1`) of one batch to partition 0 of `topic`: the partition's error
/// code.
async fn produce_raw(s: &mut TcpStream, topic: &str, batch: &[u8]) -> i16 {
    let mut body = (-1i16).to_be_bytes().to_vec(); // no transactional id
    body.extend_from_slice(&1i16.to_be_bytes()); // acks
    body.extend_from_slice(&10_000i32.to_be_bytes()); // timeout
    body.extend_from_slice(&1i32.to_be_bytes()); // one topic
    body.extend_from_slice(&(topic.len() as i16).to_be_bytes());
    body.extend_from_slice(topic.as_bytes());
    body.extend_from_slice(&1i32.to_be_bytes()); // one partition
    body.extend_from_slice(&0i32.to_be_bytes());
    body.extend_from_slice(&(batch.len() as i32).to_be_bytes());
    body.extend_from_slice(batch);
    let answer = ask(s, &frame(PRODUCE, 3, 9, &body))
        .await
        .expect("a produce answer");
    // correlation id, topic count, topic name, partition count, partition index, error code
    let at = 4 + 4 + 2 + topic.len() + 4 + 4;
    i16::from_be_bytes([answer[at], answer[at + 1]])
}

const PRODUCE: i16 = 0;
/// Kafka's TOPIC_AUTHORIZATION_FAILED.
const TOPIC_AUTHORIZATION_FAILED: i16 = 29;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kafka_produce_forwarded_to_the_shard_owner_is_checked_again_there_with_the_callers_token()
 {
    let cluster =
        Cluster::start_authenticated(3, "kafka-sasl-test-cluster-secret-0123456789").await;
    let bootstrap = cluster.brokers[0]
        .admin_token()
        .expect("the bootstrap admin token");
    let admin = cluster.brokers[0].client().await;
    tenant(&admin, "t").await;
    let config = StreamConfig {
        durable: Some(true),
        shards: Some(1),
        ..StreamConfig::default()
    };
    admin
        .create_stream("t", "default", "fwd", config)
        .await
        .expect("create stream");
    let deadline = Instant::now() + PATIENCE;
    let leader = loop {
        if let Some((id, _)) = admin
            .topology("t", "default", "fwd")
            .await
            .ok()
            .and_then(|t| t.leader(0))
        {
            break id;
        }
        assert!(Instant::now() < deadline, "no leader for t/default/fwd");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let owner = &cluster.brokers[leader as usize - 1];
    let ingress = cluster
        .brokers
        .iter()
        .find(|b| b.kafka_addr != owner.kafka_addr)
        .unwrap();
    let next_offset = || async {
        let owner_admin = owner.client().await;
        owner_admin
            .describe_stream("t", "default", "fwd")
            .await
            .expect("describe")
            .shards[0]
            .next_offset
    };
    let before = next_offset().await;
    let reader = token(&admin, "t", &["stream.subscribe:t/*"], None).await;
    let writer = token(&admin, "t", &["stream.publish:t/*"], None).await;
    let batch = felix_wire::BatchBuilder::new(felix_wire::Compression::None)
        .with(felix_wire::Record::value(
            1_700_000_000_000,
            bytes::Bytes::from_static(b"forwarded"),
        ))
        .build()
        .expect("batch encodes");

    // Refused at the broker reached...
    let mut s = TcpStream::connect(ingress.kafka_addr).await.unwrap();
    assert_eq!(plain_login(&mut s, &reader).await, 0);
    assert_eq!(
        produce_raw(&mut s, "fwd", &batch).await,
        TOPIC_AUTHORIZATION_FAILED,
        "checked at the ingress"
    );
    // ... and, with that check switched off, at the owner the publish is forwarded to.
    let (status, body) = http(
        ingress.admin_addr,
        "POST",
        "/v1/faults/skip_ingress_publish_check",
        Some(&bootstrap),
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let forwarded = || async {
        metric_lines(&ingress.metrics().await, "felix_publishes_forwarded_total")
            .into_iter()
            .map(metric_value)
            .sum::<f64>()
    };
    let sent = forwarded().await;
    assert_eq!(
        produce_raw(&mut s, "fwd", &batch).await,
        TOPIC_AUTHORIZATION_FAILED,
        "checked again at the owner"
    );
    assert_eq!(
        forwarded().await,
        sent + 1.0,
        "the refusal came from the owner"
    );
    assert_eq!(next_offset().await, before, "nothing written");
    // The token travels with the publish: one that grants it lands through the same path.
    let mut s = TcpStream::connect(ingress.kafka_addr).await.unwrap();
    assert_eq!(plain_login(&mut s, &writer).await, 0);
    assert_eq!(
        produce_raw(&mut s, "fwd", &batch).await,
        0,
        "forwarded and written"
    );
    assert_eq!(next_offset().await, before + 1);
}
