//! Single-writer fencing (spec summary matrix: "`publish_if`, and `commit` with
//! `expected_offset`: written only at the shard's next offset, atomic with the claim";
//! docs/groups.md "Single-writer projections"): N writers racing on one expected offset,
//! exactly one wins and the others learn the actual offset with nothing written; and the
//! projection pattern survives a writer that crashes between its output and its commit,
//! with no output duplicated or lost.
//!
//! The steps run on the consumer-group test's broker (`groups::consumer_groups_on_one_broker`).

use std::time::Duration;

use bytes::Bytes;
use felix_client::{Client, ClientError, Connection, GroupConfig, Message, StartAt, codes};

const T: &str = "groups";
const NS: &str = "ns";

async fn stream(conn: &Connection, name: &str) {
    conn.create_stream(
        T,
        NS,
        name,
        felix_client::StreamConfig {
            durable: Some(true),
            shards: Some(1),
            ..Default::default()
        },
    )
    .await
    .expect("create stream");
}

fn mismatch(e: &ClientError) -> u64 {
    match e {
        ClientError::Broker(b) if b.code == codes::EXPECTED_OFFSET_MISMATCH => {
            assert_eq!(b.reason, "expected_offset_mismatch");
            b.next_offset.expect("the actual offset")
        }
        other => panic!("expected expected_offset_mismatch, got {other}"),
    }
}

async fn next_offset(conn: &Connection, name: &str) -> u64 {
    conn.describe_stream(T, NS, name)
        .await
        .expect("describe")
        .shards[0]
        .next_offset
}

pub(super) async fn publish_if_and_commit_races_have_exactly_one_winner(
    conn: &Connection,
    client: &Client,
) {
    const WRITERS: usize = 8;
    stream(conn, "fence").await;
    let first = client
        .publish_if(
            T,
            NS,
            "fence",
            0,
            0,
            vec![Message::new("a"), Message::new("b")],
        )
        .await
        .expect("publish_if at the next offset");
    assert_eq!((first.base_offset, first.last_offset), (0, 1));
    let mut racers = Vec::new();
    for w in 0..WRITERS {
        let client = client.clone();
        racers.push(tokio::spawn(async move {
            client
                .publish_if(T, NS, "fence", 0, 2, vec![Message::new(format!("w{w}"))])
                .await
        }));
    }
    let mut won = 0;
    for r in racers {
        match r.await.expect("writer") {
            Ok(p) => {
                won += 1;
                assert_eq!(p.base_offset, 2);
            }
            Err(e) => assert_eq!(mismatch(&e), 3, "the refusal names the actual next offset"),
        }
    }
    assert_eq!(won, 1, "exactly one writer at offset 2");
    assert_eq!(
        next_offset(conn, "fence").await,
        3,
        "the losers wrote nothing"
    );
    let stale = client
        .publish_if(T, NS, "fence", 0, 1, vec![Message::new("late")])
        .await
        .expect_err("a stale expected offset");
    assert_eq!(mismatch(&stale), 3);
    assert_eq!(next_offset(conn, "fence").await, 3);

    client
        .create_group(T, NS, "fence", "g", GroupConfig::default())
        .await
        .expect("group");
    let mut racers = Vec::new();
    for _ in 0..WRITERS {
        let consumer = client.group(T, NS, "fence", "g");
        racers.push(tokio::spawn(async move { consumer.commit(0, 0, 2).await }));
    }
    let mut won = 0;
    for r in racers {
        match r.await.expect("committer") {
            Ok(at) => {
                won += 1;
                assert_eq!(at, 2);
            }
            Err(e) => assert_eq!(mismatch(&e), 2),
        }
    }
    assert_eq!(won, 1, "exactly one commit from 0");
    let past = client
        .group(T, NS, "fence", "g")
        .commit(0, 2, 99)
        .await
        .expect_err("a commit past the end");
    assert_eq!(past.code(), Some(codes::OFFSET_OUT_OF_RANGE));
    let mut c = client.group(T, NS, "fence", "g");
    let rest = c.poll(10, Duration::from_millis(300)).await.expect("poll");
    assert_eq!(
        rest.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![2],
        "a commit retires everything below it"
    );
    rest[0].ack().await.expect("ack");
}

const SOURCE_RECORDS: u64 = 20;

/// One run of the projection writer of docs/groups.md: it finds where it was from the
/// output's last record, catches the group's position up with a fenced commit, then for
/// each source record writes its output with `publish_if` and commits. With `crash_at`, it
/// stops right after writing that source offset's output, before committing it.
async fn project(conn: &Connection, client: &Client, crash_at: Option<u64>) {
    let mut out_next = next_offset(conn, "proj-out").await;
    let done = if out_next == 0 {
        None
    } else {
        let mut sub = conn
            .subscribe(T, NS, "proj-out", 0, StartAt::Offset(out_next - 1))
            .await
            .expect("read the output's last record");
        let last = sub
            .next_event()
            .await
            .expect("output")
            .expect("the last record");
        let src = last
            .headers
            .iter()
            .find(|(k, _)| k == "src-offset")
            .map(|(_, v)| String::from_utf8_lossy(v).parse::<u64>().expect("a number"))
            .expect("the source offset header");
        Some(src)
    };
    let mut c = client.group(T, NS, "proj-src", "projector");
    let info = client
        .describe_group(T, NS, "proj-src", "projector")
        .await
        .expect("describe");
    let mut position = info.shards[0].acked_up_to;
    if let Some(src) = done
        && src >= position
    {
        // The output holds it but the commit never happened: commit it now, fenced.
        position = c.commit(0, position, src + 1).await.expect("catch up");
    }
    while position < SOURCE_RECORDS {
        let records = c.poll(1, Duration::from_millis(500)).await.expect("poll");
        for r in records {
            let out = Message::new(r.payload.clone())
                .with_header("src-offset", Bytes::from(r.offset.to_string()));
            client
                .publish_if(T, NS, "proj-out", 0, out_next, vec![out])
                .await
                .expect("the one writer publishes at the output's next offset");
            out_next += 1;
            if crash_at == Some(r.offset) {
                return; // crashed between the output and the commit
            }
            position = c.commit(0, position, r.offset + 1).await.expect("commit");
        }
    }
}

pub(super) async fn a_projection_writer_that_crashes_between_output_and_commit_neither_duplicates_nor_loses(
    conn: &Connection,
    client: &Client,
) {
    stream(conn, "proj-src").await;
    stream(conn, "proj-out").await;
    let messages = (0..SOURCE_RECORDS)
        .map(|i| Message::new(format!("s{i}")))
        .collect();
    client
        .publish_batch(T, NS, "proj-src", messages, felix_client::AckMode::Batch)
        .await
        .expect("publish");
    client
        .create_group(T, NS, "proj-src", "projector", GroupConfig::default())
        .await
        .expect("group");
    project(conn, client, Some(7)).await;
    project(conn, client, None).await;
    let mut sub = conn
        .subscribe(T, NS, "proj-out", 0, StartAt::Earliest)
        .await
        .expect("subscribe");
    let mut payloads = Vec::new();
    while payloads.len() < SOURCE_RECORDS as usize {
        let e = tokio::time::timeout(Duration::from_secs(30), sub.next_event())
            .await
            .expect("output within 30 s")
            .expect("subscription")
            .expect("event");
        payloads.push(String::from_utf8_lossy(&e.payload).into_owned());
    }
    let expected: Vec<String> = (0..SOURCE_RECORDS).map(|i| format!("s{i}")).collect();
    assert_eq!(
        payloads, expected,
        "each source record's output once, in order"
    );
    assert_eq!(
        next_offset(conn, "proj-out").await,
        SOURCE_RECORDS,
        "nothing more"
    );
}
