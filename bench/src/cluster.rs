//! A benchmark stream on a cluster, ready for a timed load: the `ClusterClient`s that reach
//! it, the stream created with all its replicas placed and a leader, and the first publish.
//!
//! Decides when a cluster stream counts as ready: its shard has a leader and as many
//! replicas as asked (a stream placed while a broker was marked dead is deleted and created
//! again), and each publisher's first publish has been acknowledged (a leader told of a
//! stream a moment ago may not know it yet). Neither wait is part of what is timed.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use felix_client::{ClientConfig, ClientError, ClusterClient, StreamConfig};

use crate::common::{TENANT, exists_ok, unique_name};

/// A `ClusterClient` on `seeds` with this benchmark's settings.
pub(crate) async fn cluster_client(
    seeds: &[String],
    ca: Option<std::path::PathBuf>,
    request_timeout: Duration,
) -> anyhow::Result<ClusterClient> {
    let config = ClientConfig {
        ca,
        name: "felix-bench".into(),
        request_timeout,
        ..ClientConfig::default()
    };
    ClusterClient::connect(seeds, config)
        .await
        .with_context(|| format!("connect to the cluster at {}", seeds.join(",")))
}

/// Creates tenant `bench`, `namespace` and a fresh durable 1-shard stream with
/// `replicas` and `consistency`, and waits until its shard has a leader and all `replicas`
/// placed (a stream created while a broker is still marked dead gets fewer: it is deleted
/// and created again, within `patience`). Returns the stream's name, replicas and leader.
pub(crate) async fn create_cluster_stream(
    admin: &ClusterClient,
    namespace: &str,
    prefix: &str,
    consistency: &str,
    replicas: u32,
    patience: Duration,
    tiered: Option<bool>,
) -> anyhow::Result<(String, Vec<u64>, u64)> {
    exists_ok(admin.create_tenant(TENANT).await).context("create tenant bench")?;
    exists_ok(admin.create_namespace(TENANT, namespace).await)
        .with_context(|| format!("create namespace bench/{namespace}"))?;
    let deadline = Instant::now() + patience;
    let mut last = String::new();
    while Instant::now() < deadline {
        let stream = unique_name(prefix);
        let config = StreamConfig {
            durable: Some(true),
            shards: Some(1),
            replicas: Some(replicas),
            consistency: Some(consistency.to_owned()),
            tiered,
            ..Default::default()
        };
        if let Err(e) = admin
            .create_stream(TENANT, namespace, &stream, config)
            .await
        {
            // e.g. fewer live brokers than replicas, while a restarted one rejoins.
            last = format!("create stream bench/{namespace}/{stream}: {e}");
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        // Placement and the first leader may take a controller tick.
        let placed = Instant::now() + Duration::from_secs(10).min(patience);
        while Instant::now() < placed {
            match admin.topology(TENANT, namespace, &stream).await {
                Ok(t) => {
                    let route = t.shard(0).map(|r| r.replicas.clone()).unwrap_or_default();
                    let leader = t.leader(0).map(|l| l.0);
                    let alive = t.brokers.iter().filter(|b| b.alive).count();
                    last = format!(
                        "leader {leader:?}, replicas {route:?}, {alive} of {} brokers alive",
                        t.brokers.len()
                    );
                    if let Some(leader) = leader
                        && route.len() as u32 >= replicas
                    {
                        return Ok((stream, route, leader));
                    }
                    if !route.is_empty() && (route.len() as u32) < replicas {
                        break; // placed on too few brokers: try a new stream
                    }
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = admin.delete_stream(TENANT, namespace, &stream).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!("no stream with {replicas} replicas and a leader within {patience:?} (last: {last})")
}

/// Runs `publish` until it succeeds, for at most 10 s: a broker that leads a stream created a
/// moment ago (told so by another broker) may not know the stream yet and answer
/// `unknown_stream`, and a `ClusterClient` does not retry that on a publish.
pub(crate) async fn first_publish<F, Fut>(publish: F) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), ClientError>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match publish().await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                eprintln!("first publish: {e}; trying again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).context("first publish"),
        }
    }
}
