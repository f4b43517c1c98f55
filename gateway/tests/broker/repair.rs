//! A damaged local segment is rewritten from a good copy (docs/integrity.md): here from
//! another replica, on a cluster; from the object store in
//! `broker::tiering::a_damaged_local_segment_that_was_uploaded_is_served_from_the_object_store`.

use std::time::Duration;

use felix_client::{ClientError, ClusterClient, StartAt, StreamConfig, codes};

use super::cluster::{Cluster, create_stream, local_next_offset, read_all};
use super::common::PATIENCE;

const STREAM: &str = "mended";
const RECORDS: u64 = 120;

fn payload(i: u64) -> String {
    format!("mended-{i:04}-{}", "y".repeat(100))
}

/// A Leader stream of three replicas, never uploaded: the leader is killed, a batch in the
/// middle of one of its sealed segments gets another base offset (outside the CRC), and it
/// starts again (a Leader stream keeps its leader). A read across the damage is refused
/// with `corrupt_data`; the leader then rewrites the segment from a follower's copy, says
/// so, and every record reads back at its own offset.
pub(super) async fn a_damaged_segment_is_rewritten_from_another_replica(
    cluster: &mut Cluster,
    client: &ClusterClient,
) {
    create_stream(
        client,
        STREAM,
        "leader",
        StreamConfig {
            segment_bytes: Some(4096),
            tiered: Some(false),
            ..StreamConfig::default()
        },
    )
    .await;
    for i in 0..RECORDS {
        client
            .publish_batch(
                "t",
                "ns",
                STREAM,
                vec![felix_client::Message::new(payload(i))],
                felix_client::AckMode::Batch,
            )
            .await
            .expect("publish");
    }
    let leader = cluster.leader(client, STREAM, None).await;
    // Both followers hold every record before the leader's copy is damaged.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    for id in (1..=3).filter(|id| *id != leader) {
        while local_next_offset(cluster.node(id), STREAM).await < RECORDS {
            assert!(
                tokio::time::Instant::now() < deadline,
                "follower {id} did not catch up"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let node = cluster.node(leader);
    node.kill();
    let dir = node.data_dir().join("streams/t/ns").join(STREAM).join("0");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "several sealed segments: {files:?}");
    let victim = super::corruption::bump_a_base_offset(&files[1]);
    node.restart().await;
    assert_eq!(
        cluster.leader(client, STREAM, None).await,
        leader,
        "a Leader stream keeps its leader"
    );

    // The read across the damage is refused, never served misplaced.
    let mut sub = client
        .subscribe_shard("t", "ns", STREAM, 0, StartAt::Earliest)
        .await
        .expect("subscribe");
    let mut next = 0u64;
    let refusal = loop {
        match tokio::time::timeout(PATIENCE, sub.next_event())
            .await
            .expect("an event or an error")
        {
            Ok(Some(e)) => {
                assert_eq!(e.offset, next, "offsets are dense");
                assert_eq!(e.payload, payload(next).as_bytes());
                next += 1;
            }
            Ok(None) => panic!("the subscription ended at {next} without an error"),
            Err(e) => break e,
        }
    };
    assert!(
        next <= victim,
        "nothing at or after the damage was served ({next})"
    );
    match refusal {
        ClientError::Broker(body) => assert_eq!(body.code, codes::CORRUPT_DATA, "{body:?}"),
        other => panic!("expected corrupt_data, got {other:?}"),
    }
    drop(sub);

    // Rewritten from a follower's copy, and said so.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let log = std::fs::read_to_string(cluster.node(leader).log_path()).unwrap_or_default();
        if let Some(line) = log
            .lines()
            .find(|l| l.contains("rewrote a damaged local segment"))
        {
            assert!(
                line.contains("source=\"broker "),
                "names the replica: {line}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the damaged segment was not rewritten within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let records = read_all(client, STREAM, RECORDS).await;
    assert_eq!(records.len() as u64, RECORDS);
    for (i, (offset, p)) in records.iter().enumerate() {
        assert_eq!(*offset, i as u64);
        assert_eq!(p, &payload(i as u64), "offset {i} carries its own record");
    }
}
