//! Idempotent producers: a batch re-sent after a lost acknowledgement lands once, also
//! after the broker restarts (the sequences are rebuilt from the log).

use felix_client::{IdempotentProducer, Message, StartAt, codes};

use super::common::{Broker, BrokerOptions, durable_stream, read_until};

const T: &str = "idem";
const NS: &str = "ns";
const S: &str = "orders";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_batch_lands_once_even_after_a_restart() {
    let mut broker = Broker::start(BrokerOptions::new().fsync("on_commit")).await;
    let client = broker.client().await;
    durable_stream(&client, T, NS, S, 1).await;
    let producer: IdempotentProducer = client.idempotent_producer().await.expect("producer id");

    let first = producer
        .publish_to_shard(T, NS, S, 0, &[Message::new("a"), Message::new("b")])
        .await
        .expect("first batch");
    // The acknowledgement "was lost": the same bytes are sent again.
    let batch = producer
        .encode(T, NS, S, 0, &[Message::new("c")])
        .await
        .expect("encode");
    let sent = client
        .publish_raw(T, NS, S, 0, batch.clone(), Default::default())
        .await
        .expect("send")
        .expect("acknowledged");
    let resent = client
        .publish_raw(T, NS, S, 0, batch.clone(), Default::default())
        .await
        .expect("re-send")
        .expect("acknowledged");
    assert_eq!(
        sent, resent,
        "a re-send is answered with the original offsets"
    );
    assert_eq!(
        (first.base_offset, first.last_offset, sent.base_offset),
        (0, 1, 2)
    );

    // After a crash and restart the broker still recognises the re-send.
    broker.kill();
    broker.restart().await;
    let client = broker.client().await;
    let after_restart = client
        .publish_raw(T, NS, S, 0, batch, Default::default())
        .await
        .expect("re-send after restart")
        .expect("acknowledged");
    assert_eq!(after_restart, sent);

    // A gap in the sequence is refused with a typed error and appends nothing.
    let _skipped = producer
        .encode(T, NS, S, 0, &[Message::new("never sent")])
        .await
        .expect("encode");
    let gap = producer
        .encode(T, NS, S, 0, &[Message::new("after a gap")])
        .await
        .expect("encode");
    let refused = client
        .publish_raw(T, NS, S, 0, gap, Default::default())
        .await;
    let code = refused.as_ref().err().and_then(|e| e.code());
    assert_eq!(code, Some(codes::OUT_OF_ORDER_SEQUENCE), "{refused:?}");

    let mut sub = client
        .subscribe(T, NS, S, 0, StartAt::Earliest)
        .await
        .expect("subscribe");
    let events = read_until(&mut sub, 3, "idempotent stream").await;
    let payloads: Vec<_> = events.iter().map(|e| e.payload.clone()).collect();
    assert_eq!(
        payloads,
        vec!["a", "b", "c"],
        "each record landed exactly once"
    );
    let info = client.describe_stream(T, NS, S).await.expect("describe");
    assert_eq!(info.shards[0].next_offset, 3, "nothing else was appended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_state_outlives_the_segments_it_was_built_from() {
    use felix_client::StreamConfig;
    let mut broker = Broker::start(BrokerOptions::new().fsync("on_commit")).await;
    let client = broker.client().await;
    client.create_tenant(T).await.expect("tenant");
    client.create_namespace(T, NS).await.expect("namespace");
    // 4 KiB segments: each 3 KiB batch gets a segment of its own.
    client
        .create_stream(
            T,
            NS,
            S,
            StreamConfig {
                durable: Some(true),
                segment_bytes: Some(4096),
                ..Default::default()
            },
        )
        .await
        .expect("stream");
    let producer = client.idempotent_producer().await.expect("producer");
    let big = |c: u8| Message::new(vec![c; 3000]);
    let first = producer
        .encode(T, NS, S, 0, &[big(b'a')])
        .await
        .expect("encode");
    let acked = client
        .publish_raw(T, NS, S, 0, first.clone(), Default::default())
        .await
        .expect("publish")
        .expect("ack");
    for c in [b'b', b'c'] {
        producer
            .publish_to_shard(T, NS, S, 0, &[big(c)])
            .await
            .expect("publish");
    }
    // The first segment was sealed when the second batch arrived: its producer state is in
    // the snapshot. Wait for the snapshot, then remove that segment as tiering would.
    let shard_dir = broker
        .data_dir()
        .join("streams")
        .join(T)
        .join(NS)
        .join(S)
        .join("0");
    let snapshot = shard_dir.join("producer-state.json");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while !snapshot.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no producer snapshot at {}",
            snapshot.display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    broker.kill();
    std::fs::remove_file(shard_dir.join(format!("{:020}.log", 0)))
        .expect("remove the first segment");
    let _ = std::fs::remove_file(shard_dir.join(format!("{:020}.index", 0)));
    broker.restart().await;
    let client = broker.client().await;
    let again = client
        .publish_raw(T, NS, S, 0, first, Default::default())
        .await
        .expect("re-send of a batch whose segment is gone")
        .expect("ack");
    assert_eq!(
        again, acked,
        "answered from the snapshot with its original offsets"
    );
    let after = client.describe_stream(T, NS, S).await.expect("describe");
    // The local copy starts after the removed segment (the shard's earliest offset may
    // still be 0: the uploader may have put that segment in the object store first).
    assert_eq!(
        (
            after.shards[0].hot_first_offset,
            after.shards[0].next_offset
        ),
        (1, 3),
        "the first segment is gone and nothing was appended"
    );
}
