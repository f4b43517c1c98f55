//! Dead letters across brokers with `auth` on (docs/security.md "A broker's own
//! publishes"): the broker leading a group's source shard publishes the dead letter, and
//! when another broker leads the dead-letter shard the publish is forwarded with no caller
//! token, naming its duty. The owner lets it through because the request is signed with the
//! cluster secret and the control plane says the group dead-letters to that stream; a
//! signed request naming a duty the control plane does not give is refused and writes
//! nothing.

use std::time::Duration;

use axum::http::{HeaderValue, Method};
use felix_client::{ClusterClient, GroupConfig, GroupStart, Message, StartAt, StreamConfig};
use felix_gateway::forward::{ForwardedAnswer, ForwardedPublish};
use felix_gateway::groups::duty::BrokerDuty;
use felix_wire::{BatchBuilder, Compression, Record};

use super::cluster::Cluster;
use super::common::PATIENCE;
use super::internal_auth::{InternalRequest, Signature};

async fn stream(client: &ClusterClient, name: &str, shards: u32) {
    client
        .create_stream(
            "t",
            "ns",
            name,
            StreamConfig {
                durable: Some(true),
                shards: Some(shards),
                replicas: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("create stream");
}

/// A signed forwarded publish of one record to `stream` shard `shard`, on `duty`.
fn duty_publish(stream: &str, shard: u32, duty: BrokerDuty) -> InternalRequest {
    let b = BatchBuilder::new(Compression::None).with(Record {
        offset: 0,
        timestamp: 0,
        key: None,
        value: Some(bytes::Bytes::from_static(b"forged")),
        headers: Vec::new(),
    });
    let mut req = InternalRequest::new(
        Method::POST,
        "/repl/publish",
        b.build().expect("batch encodes"),
    );
    let description = ForwardedPublish {
        tenant: "t".into(),
        namespace: "ns".into(),
        stream: stream.into(),
        shard,
        ack: felix_wire::protocol::AckMode::Batch,
        token: None,
        duty: Some(duty),
    };
    req.headers.insert(
        "x-felix-publish",
        HeaderValue::try_from(serde_json::to_string(&description).expect("encodes"))
            .expect("header"),
    );
    req
}

/// A step of `internal_auth::brokers_sharing_a_secret_work_together_and_refuse_everyone_else`
/// (its authenticated cluster, secret `secret`).
pub(super) async fn dead_letters_cross_brokers_with_auth_on(
    cluster: &mut Cluster,
    client: &ClusterClient,
    secret: &'static str,
) {
    stream(client, "dl-source", 3).await;
    stream(client, "dl-dead", 2).await;
    // A source shard whose dead-letter shard (its number modulo 2) another broker leads,
    // once every shard has a leader.
    let until = tokio::time::Instant::now() + PATIENCE;
    let (source, shard, owner) = loop {
        let source = client
            .topology("t", "ns", "dl-source")
            .await
            .expect("topology");
        let dead = client
            .topology("t", "ns", "dl-dead")
            .await
            .expect("topology");
        let found = (0..3).find_map(|s| {
            let (a, _) = source.leader(s)?;
            let (b, _) = dead.leader(s % 2)?;
            (a != b).then_some((s, b))
        });
        if let Some((shard, owner)) = found {
            break (source, shard, owner);
        }
        assert!(
            tokio::time::Instant::now() < until,
            "no source shard whose dead-letter shard another broker leads"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    client
        .publish_to_shard("t", "ns", "dl-source", shard, &[Message::new("poison")])
        .await
        .expect("publish");
    client
        .create_group(
            "t",
            "ns",
            "dl-source",
            "g",
            GroupConfig {
                visibility_timeout_ms: Some(30_000),
                max_attempts: Some(1),
                dead_letter: Some("t/ns/dl-dead".into()),
                start: Some(GroupStart::Earliest),
            },
        )
        .await
        .expect("group");
    let mut c = client.group("t", "ns", "dl-source", "g");
    let until = tokio::time::Instant::now() + PATIENCE;
    let got = loop {
        let got = c.poll(1, Duration::from_millis(500)).await.expect("poll");
        if !got.is_empty() {
            break got;
        }
        assert!(tokio::time::Instant::now() < until, "the record never came");
    };
    got[0]
        .nack(None, Some("poison"))
        .await
        .expect("nack of the last attempt");
    let mut sub = client
        .subscribe_shard("t", "ns", "dl-dead", shard % 2, StartAt::Earliest)
        .await
        .expect("subscribe");
    let event = tokio::time::timeout(PATIENCE, sub.next_event())
        .await
        .expect("the dead letter reaches the other broker's shard (auth on)")
        .expect("subscription")
        .expect("an event");
    assert_eq!(&event.payload[..], b"poison");
    let header = |k: &str| {
        event
            .headers
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(header("felix-dlq-group").as_deref(), Some("g"));
    assert_eq!(header("felix-dlq-reason").as_deref(), Some("poison"));

    // Signed, but a duty the control plane does not give: the group does not dead-letter
    // to `dl-source`, and no group `nope` exists. Refused, nothing written.
    let addr = cluster.node(owner).internal_addr();
    let duty = |group: &str| BrokerDuty::DeadLetter {
        tenant: "t".into(),
        namespace: "ns".into(),
        stream: "dl-source".into(),
        group: group.into(),
    };
    for (target, group) in [("dl-source", "g"), ("dl-dead", "nope")] {
        let target_shard = if target == "dl-dead" {
            shard % 2
        } else {
            (0..3)
                .find(|s| source.leader(*s).is_some_and(|(l, _)| l == owner))
                .unwrap_or(shard)
        };
        let (status, body) = duty_publish(target, target_shard, duty(group))
            .send(addr, Signature::With(secret))
            .await;
        assert_eq!(status, 200, "{body}");
        let answer: ForwardedAnswer = serde_json::from_str(&body).expect("a forwarded answer");
        match answer {
            ForwardedAnswer::Error { error } => {
                assert_eq!(error.reason, "duty_not_allowed", "{error:?}")
            }
            other => panic!("a duty the control plane does not give was let through: {other:?}"),
        }
    }
    // Nothing more than the one dead letter on the dead-letter shard.
    let more = tokio::time::timeout(Duration::from_millis(500), sub.next_event()).await;
    assert!(more.is_err(), "nothing else was written: {more:?}");
}
