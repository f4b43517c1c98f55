//! The cache (spec: "Cache Semantics", "Cache Usage Patterns", the cache lines of
//! "Multi-Broker Consistency" and "Broker Failure"; docs/cache.md) on real `felix`
//! processes through the Rust client: caches live in the control plane; values carry
//! versions and TTLs; concurrent conditional puts have exactly one winner; the same key in
//! two tenants and two namespaces is four entries; a log-backed cache's watch hears the
//! expiry delete; compaction bounds the log and a restart still returns the latest
//! values; after kill -9 a log-backed cache's values are back and an in-memory cache's are
//! gone. On three brokers: counter adds through every broker are never lost, a value
//! written through one broker is read through the others, and a Quorum cache's
//! acknowledged put survives killing its owner.
//!
//! One broker serves every single-node case (each on its own caches), the kill last.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use felix_client::{
    CacheConfig, ChangeKind, Client, ClientConfig, ClientError, Condition, Connection, WatchTarget,
    codes,
};

use super::cluster::Cluster;
use super::common::{Broker, BrokerOptions, PATIENCE, metric_lines};

const T: &str = "kv";
const NS: &str = "ns";

fn code_of(e: &ClientError) -> (u16, String) {
    match e {
        ClientError::Broker(b) => (b.code, b.reason.clone()),
        other => panic!("expected a broker error, got {other}"),
    }
}

pub(super) fn durable() -> CacheConfig {
    CacheConfig {
        durable: Some(true),
        ..Default::default()
    }
}

pub(super) async fn client_of(addr: &str, token: Option<String>) -> Client {
    let config = ClientConfig {
        token,
        ..ClientConfig::default()
    };
    Client::connect([addr], config).await.expect("connect")
}

async fn ensure_namespace(conn: &Connection, tenant: &str, namespace: &str) {
    for r in [
        conn.create_tenant(tenant).await,
        conn.create_namespace(tenant, namespace).await,
    ] {
        match r {
            Ok(()) => {}
            Err(ClientError::Broker(e)) if e.code == codes::ALREADY_EXISTS => {}
            Err(e) => panic!("create tenant/namespace: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cache_on_one_broker() {
    // Fault injection: a compaction is held while puts and gets go on.
    let mut broker = Broker::start(BrokerOptions::new().env("FELIX_FAULT_INJECTION", 1)).await;
    cache_operation_counters_exist_at_zero_before_the_first_operation(&broker).await;
    let conn = broker.client().await;
    ensure_namespace(&conn, T, NS).await;
    let client = client_of(&broker.quic_addr.to_string(), broker.admin_token()).await;
    caches_live_in_the_control_plane_and_bad_input_is_refused(&conn).await;
    values_carry_versions_and_deletes_say_whether_there_was_one(&client).await;
    concurrent_put_if_absent_has_exactly_one_winner_and_a_stale_version_is_refused(&client).await;
    the_same_key_in_two_tenants_and_two_namespaces_holds_four_values(&conn, &client).await;
    a_ttl_entry_reads_back_before_and_is_absent_after_and_its_watch_hears_the_expiry(&client).await;
    super::cache_watch::a_resumed_watch_hears_every_change_made_while_it_was_closed(&conn, &client)
        .await;
    counters_add_atomically_and_refuse_what_is_not_a_number(&client).await;
    cache_metrics_count_operations_by_kind_and_result(&broker).await;
    super::cache_streams::a_reused_stream_answers_each_cache_request_in_turn_and_carries_on_past_a_malformed_frame(&broker, &client).await;
    super::cache_binary::binary_cache_headers_are_answered_in_kind_and_a_malformed_one_changes_nothing(&broker, &conn).await;
    felixctl_cache_puts_gets_counts_and_watches_and_a_refused_put_exits_1(&broker, &client).await;
    compaction_bounds_the_log_of_a_cache_overwritten_100000_times(&broker, &client).await;
    values_survive_kill_9_in_a_log_backed_cache_and_not_in_an_in_memory_one(&mut broker, &client)
        .await;
    super::cache_compaction::a_put_and_a_get_are_answered_while_a_compaction_is_held_and_no_change_is_lost_across_it_and_a_restart(&mut broker).await;
}

async fn caches_live_in_the_control_plane_and_bad_input_is_refused(conn: &Connection) {
    let info = conn
        .create_cache(
            T,
            NS,
            "sessions",
            CacheConfig {
                durable: Some(true),
                consistency: Some("leader".into()),
                shards: Some(4),
                ..Default::default()
            },
        )
        .await
        .expect("create cache");
    assert_eq!(
        (
            info.durable,
            info.consistency.as_str(),
            info.shards,
            info.replicas
        ),
        (true, "leader", 4, 1)
    );
    assert_eq!(
        conn.describe_cache(T, NS, "sessions")
            .await
            .expect("describe"),
        info
    );
    conn.create_cache(T, NS, "scratch", CacheConfig::default())
        .await
        .expect("in-memory cache");
    let names: Vec<String> = conn
        .list_caches(T, NS)
        .await
        .expect("list")
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["scratch", "sessions"]);
    // A cache is not listed as a stream, and a stream cannot take a cache's name.
    let streams = conn.list_streams(T, NS).await.expect("list streams");
    assert!(streams.is_empty(), "{streams:?}");
    let e = conn
        .create_stream(T, NS, "__cache.sessions", Default::default())
        .await
        .expect_err("reserved stream name");
    assert_eq!(code_of(&e).0, codes::INVALID_ARGUMENT);

    let e = conn
        .create_cache(T, NS, "sessions", CacheConfig::default())
        .await
        .expect_err("twice");
    assert_eq!(code_of(&e).0, codes::ALREADY_EXISTS);
    let quorum_in_memory = CacheConfig {
        consistency: Some("quorum".into()),
        ..Default::default()
    };
    let e = conn
        .create_cache(T, NS, "q", quorum_in_memory)
        .await
        .expect_err("quorum needs durable");
    assert_eq!(code_of(&e).0, codes::INVALID_ARGUMENT);
    let e = conn
        .cache_get(T, NS, "nope", "k")
        .await
        .expect_err("unknown cache");
    assert_eq!(code_of(&e), (codes::UNKNOWN_CACHE, "unknown_cache".into()));
    let big = Bytes::from(vec![7u8; 1024 * 1024 + 1]);
    let e = conn
        .cache_put(T, NS, "sessions", "big", big, None)
        .await
        .expect_err("too large");
    assert_eq!(
        code_of(&e),
        (codes::VALUE_TOO_LARGE, "value_too_large".into())
    );
    assert_eq!(
        conn.cache_get(T, NS, "sessions", "big").await.expect("get"),
        None
    );
    // Exactly 1 MiB is taken.
    let max = Bytes::from(vec![7u8; 1024 * 1024]);
    conn.cache_put(T, NS, "sessions", "max", max.clone(), None)
        .await
        .expect("1 MiB put");
    assert_eq!(
        conn.cache_get(T, NS, "sessions", "max").await.expect("get"),
        Some(max)
    );
    let e = conn
        .cache_put(T, NS, "sessions", "", Bytes::from("v"), None)
        .await
        .expect_err("empty key");
    assert_eq!(code_of(&e).0, codes::INVALID_ARGUMENT);
    let e = conn
        .cache_put(T, NS, "sessions", "k", Bytes::from("v"), Some(0))
        .await
        .expect_err("ttl 0");
    assert_eq!(code_of(&e).0, codes::INVALID_ARGUMENT);
    assert_eq!(
        conn.cache_get(T, NS, "sessions", "k").await.expect("get"),
        None
    );
    // Dropped: its entries are gone with it.
    conn.delete_cache(T, NS, "scratch").await.expect("drop");
    let e = conn
        .describe_cache(T, NS, "scratch")
        .await
        .expect_err("dropped");
    assert_eq!(code_of(&e).0, codes::UNKNOWN_CACHE);
}

async fn values_carry_versions_and_deletes_say_whether_there_was_one(client: &Client) {
    let v1 = client
        .cache_put(T, NS, "sessions", "user-1", Bytes::from("a"), None)
        .await
        .expect("put");
    let v2 = client
        .cache_put(T, NS, "sessions", "user-1", Bytes::from("b"), None)
        .await
        .expect("put again");
    assert!(v2 > v1, "versions grow: {v1} then {v2}");
    let got = client
        .cache_get_versioned(T, NS, "sessions", "user-1")
        .await
        .expect("get")
        .expect("found");
    assert_eq!(
        (got.value, got.version, got.ttl_ms),
        (Bytes::from("b"), v2, None)
    );
    assert!(
        client
            .cache_delete(T, NS, "sessions", "user-1")
            .await
            .expect("delete")
    );
    assert!(
        !client
            .cache_delete(T, NS, "sessions", "user-1")
            .await
            .expect("again")
    );
    assert_eq!(
        client
            .cache_get(T, NS, "sessions", "user-1")
            .await
            .expect("get"),
        None
    );
}

async fn concurrent_put_if_absent_has_exactly_one_winner_and_a_stale_version_is_refused(
    client: &Client,
) {
    let tries = (0..16).map(|i| {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .cache_put_if(
                    T,
                    NS,
                    "sessions",
                    "lock",
                    Bytes::from(format!("owner-{i}")),
                    None,
                    Condition::Absent,
                )
                .await
                .map(|v| (i, v))
        })
    });
    let results = futures::future::join_all(tries).await;
    let mut winners = Vec::new();
    for r in results {
        match r.expect("task") {
            Ok(w) => winners.push(w),
            Err(e) => assert_eq!(
                code_of(&e),
                (codes::VERSION_CONFLICT, "version_conflict".into())
            ),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one winner: {winners:?}");
    let (winner, version) = winners[0];
    let held = client
        .cache_get_versioned(T, NS, "sessions", "lock")
        .await
        .expect("get")
        .expect("found");
    assert_eq!(
        (held.value, held.version),
        (Bytes::from(format!("owner-{winner}")), version)
    );
    // At the version read: taken; at that version again (now stale): refused, unchanged.
    let next = client
        .cache_put_if(
            T,
            NS,
            "sessions",
            "lock",
            Bytes::from("next"),
            None,
            Condition::Version(version),
        )
        .await
        .expect("put at the version read");
    let e = client
        .cache_put_if(
            T,
            NS,
            "sessions",
            "lock",
            Bytes::from("stale"),
            None,
            Condition::Version(version),
        )
        .await
        .expect_err("stale version");
    assert_eq!(code_of(&e).0, codes::VERSION_CONFLICT);
    let e = client
        .cache_delete_if(T, NS, "sessions", "lock", Condition::Version(version))
        .await
        .expect_err("stale delete");
    assert_eq!(code_of(&e).0, codes::VERSION_CONFLICT);
    assert_eq!(
        client
            .cache_get(T, NS, "sessions", "lock")
            .await
            .expect("get"),
        Some(Bytes::from("next"))
    );
    assert!(
        client
            .cache_delete_if(T, NS, "sessions", "lock", Condition::Version(next))
            .await
            .expect("delete at the version read")
    );
}

async fn the_same_key_in_two_tenants_and_two_namespaces_holds_four_values(
    conn: &Connection,
    client: &Client,
) {
    let scopes = [
        ("kv-a", "prod"),
        ("kv-a", "staging"),
        ("kv-b", "prod"),
        ("kv-b", "staging"),
    ];
    for (t, n) in scopes {
        ensure_namespace(conn, t, n).await;
        conn.create_cache(t, n, "sessions", CacheConfig::default())
            .await
            .expect("cache");
    }
    for (t, n) in scopes {
        client
            .cache_put(
                t,
                n,
                "sessions",
                "user123",
                Bytes::from(format!("{t}/{n}")),
                None,
            )
            .await
            .expect("put");
    }
    for (t, n) in scopes {
        assert_eq!(
            client
                .cache_get(t, n, "sessions", "user123")
                .await
                .expect("get"),
            Some(Bytes::from(format!("{t}/{n}"))),
            "{t}/{n}"
        );
    }
    client
        .cache_delete("kv-a", "prod", "sessions", "user123")
        .await
        .expect("delete");
    assert_eq!(
        client
            .cache_get("kv-a", "prod", "sessions", "user123")
            .await
            .expect("get"),
        None
    );
    assert!(
        client
            .cache_get("kv-a", "staging", "sessions", "user123")
            .await
            .expect("get")
            .is_some()
    );
    assert!(
        client
            .cache_get("kv-b", "prod", "sessions", "user123")
            .await
            .expect("get")
            .is_some()
    );
}

async fn a_ttl_entry_reads_back_before_and_is_absent_after_and_its_watch_hears_the_expiry(
    client: &Client,
) {
    let mut watch = client
        .watch_cache(T, NS, "sessions", WatchTarget::Key("token".into()))
        .await
        .expect("watch");
    let version = client
        .cache_put(
            T,
            NS,
            "sessions",
            "token",
            Bytes::from("secret"),
            Some(1_000),
        )
        .await
        .expect("put with ttl");
    let put = tokio::time::Instant::now();
    let got = client
        .cache_get_versioned(T, NS, "sessions", "token")
        .await
        .expect("get")
        .expect("before its ttl");
    assert!(got.ttl_ms.is_some_and(|t| t <= 1_000), "{got:?}");
    let first = tokio::time::timeout(PATIENCE, watch.next_change())
        .await
        .expect("the put's change")
        .expect("watch");
    assert_eq!(
        (first.kind, first.version, first.value),
        (ChangeKind::Put, version, Bytes::from("secret"))
    );
    tokio::time::sleep_until(put + Duration::from_millis(1_050)).await;
    assert_eq!(
        client
            .cache_get(T, NS, "sessions", "token")
            .await
            .expect("get"),
        None
    );
    // The owner's once-a-second pass writes the delete, and the watch hears it.
    let expired = tokio::time::timeout(PATIENCE, watch.next_change())
        .await
        .expect("the expiry's change")
        .expect("watch");
    assert_eq!(
        (expired.key.as_str(), expired.kind),
        ("token", ChangeKind::Expire)
    );
    assert!(expired.version > version);
}

async fn counters_add_atomically_and_refuse_what_is_not_a_number(client: &Client) {
    let adds = (0..8).map(|_| {
        let client = client.clone();
        tokio::spawn(async move {
            for _ in 0..50 {
                client
                    .counter_add(T, NS, "sessions", "hits", 1)
                    .await
                    .expect("counter add");
            }
        })
    });
    for a in futures::future::join_all(adds).await {
        a.expect("task");
    }
    assert_eq!(
        client
            .counter_get(T, NS, "sessions", "hits")
            .await
            .expect("get"),
        400
    );
    assert_eq!(
        client
            .counter_add(T, NS, "sessions", "hits", -100)
            .await
            .expect("add"),
        300
    );
    assert_eq!(
        client
            .counter_get(T, NS, "sessions", "absent")
            .await
            .expect("get"),
        0
    );
    client
        .cache_put(T, NS, "sessions", "word", Bytes::from("hello"), None)
        .await
        .expect("put");
    let e = client
        .counter_add(T, NS, "sessions", "word", 1)
        .await
        .expect_err("not a number");
    assert_eq!(code_of(&e), (codes::NOT_A_COUNTER, "not_a_counter".into()));
    client
        .cache_put(
            T,
            NS,
            "sessions",
            "big",
            Bytes::from(i64::MAX.to_string()),
            None,
        )
        .await
        .expect("put");
    let e = client
        .counter_add(T, NS, "sessions", "big", 1)
        .await
        .expect_err("overflow");
    assert_eq!(code_of(&e).0, codes::NOT_A_COUNTER);
    assert_eq!(
        client
            .cache_get(T, NS, "sessions", "big")
            .await
            .expect("get"),
        Some(Bytes::from(i64::MAX.to_string()))
    );
}

/// So the first operation of each kind shows in `increase()`.
async fn cache_operation_counters_exist_at_zero_before_the_first_operation(broker: &Broker) {
    let text = broker.metrics().await;
    for op in [
        "put",
        "put_if",
        "get",
        "delete_if",
        "counter_add",
        "watch",
        "create",
    ] {
        let series = format!("felix_cache_operations_total{{op=\"{op}\",result=\"ok\"}} 0");
        assert!(
            text.lines().any(|l| l.starts_with(&series)),
            "no {series} on a fresh broker"
        );
    }
}

async fn cache_metrics_count_operations_by_kind_and_result(broker: &Broker) {
    let text = broker.metrics().await;
    // A cache with no expiry, eviction or compaction yet has those counters at 0.
    for family in ["felix_cache_expired_total", "felix_cache_evicted_total"] {
        let line = metric_lines(&text, family)
            .into_iter()
            .find(|l| l.contains("cache=\"resumable\""))
            .unwrap_or_else(|| panic!("no {family} series for the cache resumable"));
        assert!(line.ends_with(" 0"), "{line}");
    }
    for (op, result) in [
        ("put", "ok"),
        ("put_if", "version_conflict"),
        ("get", "unknown_cache"),
        ("counter_add", "not_a_counter"),
    ] {
        let series = format!("felix_cache_operations_total{{op=\"{op}\",result=\"{result}\"}}");
        assert!(text.contains(&series), "no {series} in /metrics");
    }
    // The ok series count too (they are kept from registration, not looked up per request).
    for op in ["put", "get"] {
        let series = format!("felix_cache_operations_total{{op=\"{op}\",result=\"ok\"}} ");
        let count: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series}in /metrics"));
        assert!(
            count > 0.0,
            "{series}is {count} after the puts and gets before"
        );
    }
    assert!(
        !metric_lines(&text, "felix_cache_entries").is_empty(),
        "no entry gauges"
    );
}

async fn felixctl_cache_puts_gets_counts_and_watches_and_a_refused_put_exits_1(
    broker: &Broker,
    client: &Client,
) {
    use super::felixctl::{run, run_status_in};
    let json = |out: &str| -> serde_json::Value {
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
    };
    run(
        broker,
        &["cache", "create", "kv/ns/cli", "--durable", "--shards", "2"],
        b"",
    )
    .await;
    let listed = run(
        broker,
        &["cache", "list", "kv/ns", "--output", "jsonl"],
        b"",
    )
    .await;
    assert!(
        listed.stdout.contains(r#""name":"cli""#),
        "{}",
        listed.stdout
    );
    let version = run(
        broker,
        &["cache", "put", "kv/ns/cli", "k", "v1", "--ttl", "60s"],
        b"",
    )
    .await;
    let version: u64 = version.stdout.trim().parse().expect("a version");
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, stderr) = run_status_in(
        broker,
        dir.path(),
        &["cache", "put", "kv/ns/cli", "k", "v2", "--if-absent"],
        b"",
    )
    .await;
    assert!(!ok && stderr.contains("version_conflict"), "{stderr}");
    let got = run(
        broker,
        &["cache", "get", "kv/ns/cli", "k", "--output", "json"],
        b"",
    )
    .await;
    let got = json(&got.stdout);
    assert_eq!(
        (got["key"].as_str(), got["value"].as_str()),
        (Some("k"), Some("v1"))
    );
    assert_eq!(got["version"].as_u64(), Some(version));
    assert!(got["ttl_ms"].as_u64().is_some_and(|t| t <= 60_000), "{got}");
    let stale = version.to_string();
    run(
        broker,
        &[
            "cache",
            "put",
            "kv/ns/cli",
            "k",
            "v2",
            "--if-version",
            &stale,
        ],
        b"",
    )
    .await;
    let (ok, stderr) = run_status_in(
        broker,
        dir.path(),
        &[
            "cache",
            "put",
            "kv/ns/cli",
            "k",
            "v3",
            "--if-version",
            &stale,
        ],
        b"",
    )
    .await;
    assert!(!ok && stderr.contains("version_conflict"), "{stderr}");
    let incr = run(
        broker,
        &["cache", "incr", "kv/ns/cli", "n", "--by", "5"],
        b"",
    )
    .await;
    assert_eq!(incr.stdout.trim(), "5");
    let counter = run(
        broker,
        &["cache", "get", "kv/ns/cli", "n", "--output", "json"],
        b"",
    )
    .await;
    assert_eq!(json(&counter.stdout)["value"].as_i64(), Some(5));
    let absent = run(
        broker,
        &["cache", "get", "kv/ns/cli", "nope", "--output", "json"],
        b"",
    )
    .await;
    assert!(json(&absent.stdout)["value"].is_null(), "{}", absent.stdout);
    // A watch prints the first change after it opens: puts keep coming until it has.
    let writer = {
        let client = client.clone();
        tokio::spawn(async move {
            for i in 0..100 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let _ = client
                    .cache_put(
                        T,
                        NS,
                        "cli",
                        "k-watched",
                        Bytes::from(format!("w{i}")),
                        None,
                    )
                    .await;
            }
        })
    };
    let watched = run(
        broker,
        &[
            "cache",
            "watch",
            "kv/ns/cli",
            "--prefix",
            "k-",
            "--count",
            "1",
            "--output",
            "jsonl",
        ],
        b"",
    )
    .await;
    writer.abort();
    let change = json(&watched.stdout);
    assert_eq!(
        (change["key"].as_str(), change["kind"].as_str()),
        (Some("k-watched"), Some("put"))
    );
    assert!(
        change["value"].as_str().is_some_and(|v| v.starts_with('w')),
        "{change}"
    );
    run(broker, &["cache", "delete", "kv/ns/cli"], b"").await;
}

/// The on-disk size of a cache's shard directories.
fn cache_dir_bytes(broker: &Broker, cache: &str) -> u64 {
    fn walk(p: &std::path::Path) -> u64 {
        let Ok(dir) = std::fs::read_dir(p) else {
            return 0;
        };
        dir.flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => walk(&e.path()),
                Ok(m) => m.len(),
                Err(_) => 0,
            })
            .sum()
    }
    walk(
        &broker
            .data_dir()
            .join("streams")
            .join(T)
            .join(NS)
            .join(format!("__cache.{cache}")),
    )
}

async fn compaction_bounds_the_log_of_a_cache_overwritten_100000_times(
    broker: &Broker,
    client: &Client,
) {
    client
        .create_cache(T, NS, "config", durable())
        .await
        .expect("cache");
    // A key written once before the overwrites: compaction's snapshots rewrite it in the
    // log, and a watch of it must hear none of that (a snapshot changes nothing).
    client
        .cache_put(T, NS, "config", "quiet", Bytes::from("once"), None)
        .await
        .expect("put");
    let mut quiet = client
        .watch_cache(T, NS, "config", WatchTarget::Key("quiet".into()))
        .await
        .expect("watch");
    const KEYS: usize = 100;
    const WRITES: usize = 100_000;
    const VALUE: usize = 1_000;
    let writers = (0..16).map(|w| {
        let client = client.clone();
        tokio::spawn(async move {
            for i in (w..WRITES).step_by(16) {
                let mut value = format!("{i:08}").into_bytes();
                value.resize(VALUE, b'.');
                client
                    .cache_put(T, NS, "config", format!("key-{}", i % KEYS), value, None)
                    .await
                    .expect("overwrite");
            }
        })
    });
    for w in futures::future::join_all(writers).await {
        w.expect("writer");
    }
    // Concurrent writers' last puts land in the owner's order, which they do not control:
    // one more round, in order, says what the latest values are.
    for k in 0..KEYS {
        let mut value = format!("{:08}", WRITES + k).into_bytes();
        value.resize(VALUE, b'.');
        client
            .cache_put(T, NS, "config", format!("key-{k}"), value, None)
            .await
            .expect("last round");
    }
    let live = (KEYS * (VALUE + 16)) as u64;
    let written = (WRITES * VALUE) as u64;
    // The once-a-second pass compacts whenever the log exceeds 4x the live data (or two
    // 256 KiB segments) plus a segment; once the writes stop it gets there and stays.
    let bound = 10 * live;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let size = loop {
        let size = cache_dir_bytes(broker, "config");
        if size < bound || tokio::time::Instant::now() > deadline {
            break size;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "cache log after {WRITES} overwrites: {size} bytes on disk, {live} live, {written} written"
    );
    assert!(
        size < bound,
        "after {WRITES} overwrites of {KEYS} keys the cache holds {size} bytes on disk for {live} \
         bytes of live data"
    );
    latest_values_are_there(client).await;
    let heard = tokio::time::timeout(Duration::from_millis(300), quiet.next_change()).await;
    assert!(
        heard.is_err(),
        "a watch of a key nobody changed heard a compaction's snapshot: {heard:?}"
    );
}

/// The last round wrote `100000 + k` to key `k`.
async fn latest_values_are_there(client: &Client) {
    for k in 0..100usize {
        let got = client
            .cache_get(T, NS, "config", format!("key-{k}"))
            .await
            .expect("get")
            .unwrap_or_else(|| panic!("key-{k} is gone"));
        let expected = format!("{:08}", 100_000 + k);
        assert_eq!(&got[..8], expected.as_bytes(), "key-{k}");
    }
}

async fn values_survive_kill_9_in_a_log_backed_cache_and_not_in_an_in_memory_one(
    broker: &mut Broker,
    client: &Client,
) {
    client
        .create_cache(T, NS, "volatile", CacheConfig::default())
        .await
        .expect("in-memory cache");
    let keys: BTreeSet<String> = (0..200).map(|i| format!("k{i}")).collect();
    for k in &keys {
        client
            .cache_put(T, NS, "sessions", k, Bytes::from(format!("v-{k}")), None)
            .await
            .expect("log-backed put");
        client
            .cache_put(T, NS, "volatile", k, Bytes::from("gone"), None)
            .await
            .expect("in-memory put");
    }
    client
        .counter_add(T, NS, "sessions", "counter", 41)
        .await
        .expect("counter");
    broker.kill();
    broker.restart().await;
    let client = client_of(&broker.quic_addr.to_string(), broker.admin_token()).await;
    for k in &keys {
        assert_eq!(
            client.cache_get(T, NS, "sessions", k).await.expect("get"),
            Some(Bytes::from(format!("v-{k}"))),
            "{k} after kill -9"
        );
        assert_eq!(
            client.cache_get(T, NS, "volatile", k).await.expect("get"),
            None,
            "{k}"
        );
    }
    assert_eq!(
        client
            .counter_add(T, NS, "sessions", "counter", 1)
            .await
            .expect("add"),
        42
    );
    // The compacted cache rebuilds from its snapshot and what followed.
    latest_values_are_there(&client).await;
    // A version is never handed out twice: the log's versions come back with it.
    let v = client
        .cache_put(T, NS, "sessions", "k0", Bytes::from("after"), None)
        .await
        .expect("put after restart");
    let e = client
        .cache_put_if(
            T,
            NS,
            "sessions",
            "k0",
            Bytes::from("x"),
            None,
            Condition::Version(v - 1),
        )
        .await
        .expect_err("an older version");
    assert_eq!(code_of(&e).0, codes::VERSION_CONFLICT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cache_on_a_three_broker_cluster() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client(Duration::from_secs(30)).await;
    for r in [
        client.create_tenant(T).await,
        client.create_namespace(T, NS).await,
    ] {
        r.expect("tenant and namespace");
    }
    counter_adds_through_every_broker_are_never_lost(&cluster, &client).await;
    super::cache_compaction::a_followers_log_rolls_at_the_segment_size_the_owner_gives_a_busy_cache(
        &cluster, &client,
    )
    .await;
    super::cache_watch::a_prefix_watch_hears_every_shard_of_a_cache_several_brokers_own(
        &mut cluster,
        &client,
        "limits",
        3,
    )
    .await;
    super::cache_staged::a_staged_put_is_seen_by_nobody_until_written_and_a_lost_one_is_forgotten(
        &mut cluster,
        &client,
    )
    .await;
    a_quorum_caches_acknowledged_put_survives_killing_its_owner(&mut cluster, &client).await;
}

/// One client per broker, each talking to that broker only (it forwards to the owner).
async fn pinned_clients(cluster: &Cluster) -> Vec<Client> {
    let mut clients = Vec::new();
    for b in &cluster.brokers {
        clients.push(client_of(&b.quic_addr.to_string(), b.admin_token()).await);
    }
    clients
}

async fn counter_adds_through_every_broker_are_never_lost(cluster: &Cluster, client: &Client) {
    client
        .create_cache(
            T,
            NS,
            "limits",
            CacheConfig {
                durable: Some(true),
                shards: Some(3),
                replicas: Some(3),
                ..Default::default()
            },
        )
        .await
        .expect("cache");
    let pinned = Arc::new(pinned_clients(cluster).await);
    let adders = (0..8).map(|i| {
        let pinned = pinned.clone();
        tokio::spawn(async move {
            let through = &pinned[i % pinned.len()];
            for _ in 0..1_000 {
                through
                    .counter_add(T, NS, "limits", "requests", 1)
                    .await
                    .expect("counter add");
            }
        })
    });
    for a in futures::future::join_all(adders).await {
        a.expect("adder");
    }
    for (i, c) in pinned.iter().enumerate() {
        assert_eq!(
            c.counter_get(T, NS, "limits", "requests")
                .await
                .expect("get"),
            8_000,
            "through broker {}",
            i + 1
        );
    }
    // A value written through one broker is read through every other.
    pinned[0]
        .cache_put(T, NS, "limits", "plan:acme", Bytes::from("gold"), None)
        .await
        .expect("put");
    for c in pinned.iter() {
        assert_eq!(
            c.cache_get(T, NS, "limits", "plan:acme")
                .await
                .expect("get"),
            Some(Bytes::from("gold"))
        );
    }
}

async fn a_quorum_caches_acknowledged_put_survives_killing_its_owner(
    cluster: &mut Cluster,
    client: &Client,
) {
    client
        .create_cache(
            T,
            NS,
            "orders",
            CacheConfig {
                durable: Some(true),
                consistency: Some("quorum".into()),
                replicas: Some(3),
                ..Default::default()
            },
        )
        .await
        .expect("quorum cache");
    let version = client
        .cache_put(T, NS, "orders", "order-42", Bytes::from("paid"), None)
        .await
        .expect("acknowledged put");
    let owner = super::common::shard_leader(client, (T, NS, "__cache.orders"), None).await;
    cluster.node(owner).kill();
    let survivor = cluster
        .brokers
        .iter()
        .enumerate()
        .find(|(i, _)| *i as u64 + 1 != owner)
        .map(|(_, b)| b.quic_addr.to_string())
        .expect("a survivor");
    let through = client_of(&survivor, cluster.brokers[0].admin_token()).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let got = loop {
        match through
            .cache_get_versioned(T, NS, "orders", "order-42")
            .await
        {
            Ok(v) => break v,
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("waiting for the new owner: {e}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("no owner answered within {PATIENCE:?}: {e}"),
        }
    };
    let got = got.expect("the acknowledged put survived its owner");
    assert_eq!((got.value, got.version), (Bytes::from("paid"), version));
    let new_owner =
        super::common::shard_leader(client, (T, NS, "__cache.orders"), Some(owner)).await;
    assert_ne!(new_owner, owner);
}
