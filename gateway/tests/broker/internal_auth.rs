//! The authenticated internal network (docs/internal-network.md): brokers that share a
//! cluster secret elect, replicate and forward to each other, and every internal route but
//! `/healthz` refuses with 401 — changing nothing — a request that is unsigned, signed with
//! another secret, or signed too long ago. A cluster with `auth` on and no secret refuses to
//! start; a single node makes its own secret once and keeps it.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, Method};
use bytes::Bytes;
use felix_client::{AckMode, Message, StreamConfig};
use felix_gateway::forward::{ForwardedAnswer, ForwardedPublish};
use felix_gateway::replication::transport::FetchRequest;
use felix_meta::model::ShardKey;
use felix_meta::network::{ClusterKey, PeerSigner, unix_now};
use felix_wire::{BatchBuilder, Compression, Record};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::cluster::{Cluster, create_stream, read_all};
use super::common::{Broker, BrokerOptions, free_tcp_addr, http_get, run_to_exit};

const SECRET: &str = "felix-test-cluster-secret-0123456789abcdef";
const OTHER_SECRET: &str = "not-the-cluster-secret-0123456789abcdef-x";
const STREAM: &str = "guarded";

/// How a test request is signed.
#[derive(Clone, Copy)]
pub(super) enum Signature {
    None,
    With(&'static str),
    /// With the right secret, as if `secs` seconds ago.
    Aged(&'static str, i64),
}

/// One internal request: method, path, `x-felix-*` headers and body.
pub(super) struct InternalRequest {
    method: Method,
    path: &'static str,
    pub(super) headers: HeaderMap,
    body: Vec<u8>,
}

impl InternalRequest {
    pub(super) fn new(method: Method, path: &'static str, body: Vec<u8>) -> InternalRequest {
        InternalRequest {
            method,
            path,
            headers: HeaderMap::new(),
            body,
        }
    }

    /// Sends it to `addr`, signed as `signature` says (as node 1): the status and body.
    pub(super) async fn send(&self, addr: SocketAddr, signature: Signature) -> (u16, String) {
        let mut headers = self.headers.clone();
        let sign = |secret: &str, time: i64, headers: &mut HeaderMap| {
            let key = Arc::new(ClusterKey::new(secret.as_bytes()).expect("a long secret"));
            PeerSigner::new(key, 1).sign_at(headers, &self.method, self.path, &self.body, time);
        };
        match signature {
            Signature::None => {}
            Signature::With(secret) => sign(secret, unix_now(), &mut headers),
            Signature::Aged(secret, secs) => sign(secret, unix_now() - secs, &mut headers),
        }
        let mut head = format!(
            "{} {} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n",
            self.method,
            self.path,
            self.body.len()
        );
        for (name, value) in &headers {
            head.push_str(&format!(
                "{name}: {}\r\n",
                value.to_str().expect("ascii header")
            ));
        }
        head.push_str("\r\n");
        let exchange = async {
            let mut s = tokio::net::TcpStream::connect(addr).await?;
            s.write_all(head.as_bytes()).await?;
            s.write_all(&self.body).await?;
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).await?;
            std::io::Result::Ok(String::from_utf8_lossy(&buf).into_owned())
        };
        let text = tokio::time::timeout(Duration::from_secs(30), exchange)
            .await
            .expect("an answer within 30 s")
            .unwrap_or_else(|e| panic!("{} {}: {e}", self.method, self.path));
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }
}

fn json(value: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(value).expect("encodes")
}

fn shard() -> ShardKey {
    ShardKey {
        tenant: "t".into(),
        namespace: "ns".into(),
        stream: STREAM.into(),
        shard: 0,
    }
}

/// A forwarded publish of one record `payload` to the guarded stream, on behalf of the
/// caller who presented `token`.
fn forwarded_publish(payload: &str, token: Option<String>) -> InternalRequest {
    let mut b = BatchBuilder::new(Compression::None);
    b.push(Record::value(
        1_700_000_000_000,
        Bytes::from(payload.to_owned()),
    ));
    let mut req = InternalRequest::new(
        Method::POST,
        "/repl/publish",
        b.build().expect("batch encodes"),
    );
    let description = ForwardedPublish {
        tenant: "t".into(),
        namespace: "ns".into(),
        stream: STREAM.into(),
        shard: 0,
        ack: felix_wire::protocol::AckMode::Batch,
        token,
        duty: None,
    };
    req.headers.insert(
        "x-felix-publish",
        HeaderValue::try_from(serde_json::to_string(&description).expect("encodes"))
            .expect("header"),
    );
    req
}

/// Every internal route, each with a request that would read or change something.
fn every_route() -> Vec<InternalRequest> {
    let propose = felix_meta::Command::CreateTenant {
        name: "intruder".into(),
    };
    let fetch = FetchRequest {
        shard: shard(),
        generation: 1,
        follower: 2,
        from: 0,
        max_bytes: 1 << 20,
        wait_ms: 0,
    };
    let post = |path, body| InternalRequest::new(Method::POST, path, body);
    vec![
        post("/meta/propose", json(&propose)),
        post("/repl/fetch", json(&fetch)),
        forwarded_publish("unsigned", None),
        post("/meta/lease", json(&serde_json::json!({"broker": 1}))),
        post("/meta/read_index", Vec::new()),
        post(
            "/meta/membership",
            json(&serde_json::json!({"RemoveNodes": [3]})),
        ),
        post("/raft/vote", json(&serde_json::json!({}))),
        post("/raft/append", json(&serde_json::json!({}))),
        post("/raft/snapshot", json(&serde_json::json!({}))),
        InternalRequest::new(Method::GET, "/meta/dump", Vec::new()),
        InternalRequest::new(Method::GET, "/meta/status", Vec::new()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn brokers_sharing_a_secret_work_together_and_refuse_everyone_else() {
    let mut cluster = Cluster::start_authenticated(3, SECRET).await;
    let client = cluster.client(Duration::from_secs(30)).await;
    // Creating a Quorum stream and publishing to it through every broker needs Raft,
    // leases, forwarded publishes and replication fetches between the brokers, all signed.
    create_stream(&client, STREAM, "quorum", StreamConfig::default()).await;
    let leader = cluster.leader(&client, STREAM, None).await;
    for id in 1..=3 {
        let plain = cluster.node(id).client().await;
        let published = plain
            .publish_batch(
                "t",
                "ns",
                STREAM,
                vec![Message::new(format!("via-{id}"))],
                AckMode::Batch,
            )
            .await
            .unwrap_or_else(|e| panic!("a Quorum publish through broker {id}: {e}"));
        assert_eq!(published[0].base_offset, id - 1);
    }

    let leader_addr = cluster.node(leader).internal_addr();
    let follower_addr = cluster.node(leader % 3 + 1).internal_addr();
    for addr in [leader_addr, follower_addr] {
        for req in every_route() {
            for signature in [
                Signature::None,
                Signature::With(OTHER_SECRET),
                Signature::Aged(SECRET, 300),
            ] {
                let (status, body) = req.send(addr, signature).await;
                assert_eq!(
                    status, 401,
                    "{} {} on {addr} answered {status}: {body}",
                    req.method, req.path
                );
                assert!(body.contains("unauthenticated"), "{body}");
            }
        }
        let (status, body) = http_get(addr, "/healthz").await.expect("GET /healthz");
        assert_eq!((status, body.as_str()), (200, "ok"), "/healthz stays open");
    }

    // Signed with the secret, the same requests are served: the refusals above were the
    // signature's doing, and they changed nothing.
    let dump = InternalRequest::new(Method::GET, "/meta/dump", Vec::new());
    for id in 1..=3 {
        let (status, body) = dump
            .send(cluster.node(id).internal_addr(), Signature::With(SECRET))
            .await;
        assert_eq!(status, 200, "a signed dump on broker {id}: {body}");
        assert!(body.contains(STREAM), "the dump shows the state: {body}");
        assert!(
            !body.contains("intruder"),
            "a refused proposal applied: {body}"
        );
    }
    // A signed forwarded publish still carries its caller's token (auth is on).
    let token = cluster.node(1).admin_token();
    let (status, body) = forwarded_publish("signed", token)
        .send(leader_addr, Signature::With(SECRET))
        .await;
    assert_eq!(status, 200, "{body}");
    let answer: ForwardedAnswer = serde_json::from_str(&body).expect("a forwarded answer");
    assert!(
        matches!(answer, ForwardedAnswer::Published { base_offset: 3, .. }),
        "no refused publish was written before the signed one: {answer:?}"
    );
    let records = read_all(&client, STREAM, 4).await;
    let payloads: Vec<&str> = records.iter().map(|(_, p)| p.as_str()).collect();
    assert_eq!(payloads, ["via-1", "via-2", "via-3", "signed"]);
    super::groups_auth::dead_letters_cross_brokers_with_auth_on(&mut cluster, &client, SECRET)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_single_node_makes_its_secret_once_and_a_cluster_without_one_refuses_to_start() {
    // Two members named, auth on, no secret: refused before anything starts.
    let cluster = format!("1={},2={}", free_tcp_addr(), free_tcp_addr());
    let (code, stderr) = run_to_exit(
        &["--node-id", "1", "--cluster", &cluster],
        &[("FELIX_AUTH", "on")],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("cluster_secret_file")
            && stderr.contains("give every broker the same cluster secret"),
        "{stderr}"
    );

    let mut broker = Broker::start(BrokerOptions::new().env("FELIX_AUTH", "on")).await;
    let path = broker.data_dir().join("cluster.secret");
    let secret = std::fs::read_to_string(&path).expect("the generated secret");
    let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{path:?} has mode {mode:o}");
    assert_eq!(secret.trim().len(), 64, "32 random bytes, in hex");
    let status = InternalRequest::new(Method::GET, "/meta/status", Vec::new());
    let secret: &'static str = Box::leak(secret.trim().to_owned().into_boxed_str());
    let addr = broker.internal_addr();
    assert_eq!(status.send(addr, Signature::None).await.0, 401);
    assert_eq!(status.send(addr, Signature::With(secret)).await.0, 200);

    broker.restart().await;
    let again = std::fs::read_to_string(&path).expect("the secret after a restart");
    assert_eq!(again.trim(), secret, "the secret is reused, not made again");
    assert_eq!(status.send(addr, Signature::With(secret)).await.0, 200);
    assert_eq!(status.send(addr, Signature::None).await.0, 401);
}
