//! A full disk is survivable (issue: never silently wrong, item 8): on a data volume that
//! fills up, durable publishes are refused with `disk_full` before the last byte goes, the
//! control plane keeps working in the reserve, and once a stream is deleted the broker takes
//! publishes again, without a restart. The volume is a real 64 MiB tmpfs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use felix_client::{AckMode, ClientError, Message, StreamConfig};
use felix_wire::protocol::codes;

use super::common::{Broker, BrokerOptions, copy_dir, http_get, metric_lines, metric_value};

const T: &str = "disk";
const NS: &str = "ns";
const MIB: u64 = 1 << 20;

/// A tmpfs mounted over a directory; lazily unmounted when dropped (after the broker).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount a tmpfs at {} (the test needs root, as CI and scripts/test.sh run)",
            at.display()
        );
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

async fn create(client: &felix_client::Connection, name: &str) {
    client
        .create_stream(
            T,
            NS,
            name,
            StreamConfig {
                durable: Some(true),
                shards: Some(1),
                ..Default::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_data_volume_refuses_publishes_keeps_the_control_plane_and_recovers() {
    let elsewhere = tempfile::tempdir().unwrap();
    let mut broker = Broker::start(
        BrokerOptions::new()
            .fsync("on_commit")
            .env("FELIX_DISK_RESERVE_BYTES", 8 * MIB)
            .env("FELIX_CACHE_DIR", elsewhere.path().join("cache").display())
            .env("FELIX_CACHE_DISK_BYTES", 16 * MIB)
            .env(
                "FELIX_OBJECT_STORE",
                format!("file://{}", elsewhere.path().join("objects").display()),
            ),
    )
    .await;
    let client = broker.client().await;
    client.create_tenant(T).await.expect("tenant");
    client.create_namespace(T, NS).await.expect("namespace");
    create(&client, "fill").await;
    drop(client);
    broker.kill();
    // Move the data dir onto a 64 MiB volume.
    let saved = tempfile::tempdir().unwrap();
    copy_dir(&broker.data_dir(), saved.path());
    let _volume = Tmpfs::mount(&broker.data_dir(), "64m");
    copy_dir(saved.path(), &broker.data_dir());
    broker.restart().await;

    let client = broker.client().await;
    let record = vec![b'z'; 256 * 1024];
    let mut acked = 0u64;
    let refusal = loop {
        match client
            .publish(T, NS, "fill", Message::new(record.clone()), AckMode::Batch)
            .await
        {
            Ok(_) => acked += 1,
            Err(e) => break e,
        }
        assert!(acked < 1000, "64 MiB cannot hold 250 MiB");
    };
    match &refusal {
        ClientError::Broker(body) => {
            assert_eq!(body.code, codes::OVERLOADED, "{body:?}");
            assert_eq!(body.reason, "disk_full", "{body:?}");
            assert!(body.retry_after_ms.is_some(), "retryable: {body:?}");
        }
        other => panic!("expected disk_full, got {other:?}"),
    }
    assert!(
        acked >= 100,
        "the volume took {acked} records before the reserve"
    );

    // The control plane works in the reserve: health, a create and a delete.
    let (status, body) = http_get(broker.admin_addr, "/healthz")
        .await
        .expect("healthz");
    assert_eq!(status, 200, "{body}");
    create(&client, "after").await;
    client.delete_stream(T, NS, "fill").await.expect("delete");

    // Space is back: publishes resume by themselves.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match client
            .publish(T, NS, "after", Message::new(record.clone()), AckMode::Batch)
            .await
        {
            Ok(_) => break,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "publishes did not resume after the delete: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let metrics = broker.metrics().await;
    let free: f64 = metric_lines(&metrics, "felix_disk_free_bytes")
        .iter()
        .map(|l| metric_value(l))
        .sum();
    assert!(free > (8 * MIB) as f64, "free space is reported: {free}");
    drop(client);
    broker.kill();
}
