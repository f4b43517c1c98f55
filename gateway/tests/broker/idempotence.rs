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
