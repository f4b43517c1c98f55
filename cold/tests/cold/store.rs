//! The tier's object store: the same round trip against a real S3 server (SeaweedFS),
//! `file://` and `memory://`; multipart uploads through `BufWriter`; and, through
//! `FaultyStore`, the promises about timeouts, retries, lost acknowledgements and the
//! concurrency limit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use bytes::Bytes;
use felix_cold::store::{StoreConfig, StoreError, TierStore};
use felix_testkit::faults::{Faults, FaultyStore};
use felix_testkit::s3server::S3Server;
use object_store::ObjectStoreExt;
use object_store::buffered::BufWriter;
use object_store::memory::InMemory;
use tokio::io::AsyncWriteExt;

/// Deterministic bytes that differ at every offset of interest.
fn pattern(len: usize, seed: u32) -> Bytes {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

/// put / get_range / head / get_tail / list / delete, and the GET counters.
async fn round_trip(store: &TierStore) {
    store.check().await.expect("check on a healthy store");
    let a = pattern(100_000, 1);
    store.put("t/p0/a.bin", a.clone()).await.unwrap();
    store
        .put("t/p0/b.bin", Bytes::from_static(b"0123456789"))
        .await
        .unwrap();
    store
        .put("t/p1/c.bin", Bytes::from_static(b"c"))
        .await
        .unwrap();

    let before = store.stats();
    assert_eq!(
        store.get_range("t/p0/a.bin", 1000..1100).await.unwrap(),
        a.slice(1000..1100)
    );
    let after = store.stats();
    assert_eq!(after.gets - before.gets, 1, "one GET per get_range");
    assert_eq!(after.get_bytes - before.get_bytes, 100, "GET bytes counted");

    assert_eq!(store.head("t/p0/a.bin").await.unwrap(), 100_000);
    assert_eq!(store.get_tail("t/p0/b.bin", 10, 4).await.unwrap(), "6789");
    assert_eq!(
        store.get_tail("t/p0/b.bin", 10, 1_000).await.unwrap(),
        "0123456789",
        "a tail longer than the object is the whole object"
    );

    let mut listed = store.list("t/p0").await.unwrap();
    listed.sort();
    assert_eq!(
        listed,
        vec![
            ("t/p0/a.bin".to_string(), 100_000),
            ("t/p0/b.bin".to_string(), 10)
        ]
    );
    assert_eq!(store.list("").await.unwrap().len(), 3);
    assert!(
        store.list("t/p").await.unwrap().is_empty(),
        "prefixes match whole segments"
    );

    assert!(matches!(
        store.head("t/p0/missing").await,
        Err(StoreError::NotFound { key }) if key == "t/p0/missing"
    ));
    assert!(matches!(
        store.get_range("t/p0/missing", 0..1).await,
        Err(StoreError::NotFound { .. })
    ));

    store.delete("t/p0/a.bin").await.unwrap();
    store
        .delete("t/p0/a.bin")
        .await
        .expect("deleting a missing object is Ok");
    assert!(matches!(
        store.head("t/p0/a.bin").await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(
        store.list("t/p0").await.unwrap(),
        vec![("t/p0/b.bin".to_string(), 10)]
    );
    assert_eq!(store.stats().errors, 0, "not-found answers are not errors");
}

/// Writes `data` through `object_store::buffered::BufWriter` on the guarded store.
async fn upload(store: &TierStore, key: &str, data: &Bytes) -> std::io::Result<()> {
    let mut writer = BufWriter::new(store.object_store(), store.path(key));
    for chunk in data.chunks(1 << 20) {
        writer.write_all(chunk).await?;
    }
    writer.shutdown().await?;
    Ok(())
}

// ---- a real S3 server (SeaweedFS) ----

#[tokio::test]
async fn s3_store_round_trip() {
    let server = S3Server::shared();
    let bucket = server.bucket("round-trip").await;
    let store = TierStore::open(&server.store_config(&bucket, "pre/fix"))
        .await
        .unwrap();
    assert!(
        store
            .description()
            .starts_with(&format!("s3://{bucket}/pre/fix"))
    );
    assert!(!store.description().contains(&server.secret_key));
    round_trip(&store).await;
}

#[tokio::test]
async fn s3_multipart_upload_through_bufwriter_reads_back_identical() {
    let server = S3Server::shared();
    let bucket = server.bucket("multipart").await;
    let store = TierStore::open(&server.store_config(&bucket, "mp"))
        .await
        .unwrap();
    let data = pattern(11 * 1024 * 1024 + 123, 7);
    upload(&store, "big.bin", &data).await.unwrap();
    assert!(
        store.stats().puts >= 3,
        "a multipart upload (start + 2 parts): {:?}",
        store.stats()
    );
    assert_eq!(store.head("big.bin").await.unwrap(), data.len() as u64);
    let back = store
        .get_range("big.bin", 0..data.len() as u64)
        .await
        .unwrap();
    assert!(back == data, "the object read back differs");
    let back = store
        .object_store()
        .get(&store.path("big.bin"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(back == data, "a whole-object GET differs");
}

#[tokio::test]
async fn s3_wrong_credentials_fail_fast_with_denied() {
    let server = S3Server::shared();
    let bucket = server.bucket("wrong-creds").await;
    let cfg = server.store_config(&bucket, "");
    let wrong = SharedCredentialsProvider::new(Credentials::new(
        server.access_key.clone(),
        "not-the-secret",
        None,
        None,
        "test",
    ));
    let store = TierStore::open_with_credentials(&cfg, wrong).await.unwrap();
    let started = Instant::now();
    let err = store
        .put("x", Bytes::from_static(b"x"))
        .await
        .expect_err("a wrong secret must be refused");
    assert!(matches!(err, StoreError::Denied { .. }), "{err}");
    assert!(err.to_string().contains("credentials"), "{err}");
    assert!(matches!(
        store.check().await,
        Err(StoreError::Denied { .. })
    ));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "not retried into a hang"
    );
    assert_eq!(store.stats().retries, 0, "a refusal is not retried");
}

#[tokio::test]
async fn s3_check_reports_a_missing_bucket() {
    let server = S3Server::shared();
    let store = TierStore::open(&server.store_config("felix-no-such-bucket", ""))
        .await
        .unwrap();
    let err = store.check().await.expect_err("the bucket does not exist");
    assert!(matches!(err, StoreError::Config(_)), "{err}");
}

// ---- file:// and memory:// ----

#[tokio::test]
async fn file_store_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/tier", dir.path().display());
    let store = TierStore::open(&StoreConfig {
        url: url.clone(),
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    assert_eq!(store.description(), url);
    round_trip(&store).await;
    assert!(dir.path().join("tier/t/p0/b.bin").is_file());
}

#[tokio::test]
async fn memory_store_round_trip() {
    let store = TierStore::open(&StoreConfig {
        url: "memory://".into(),
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    round_trip(&store).await;
}

#[tokio::test]
async fn memory_store_multipart_upload_reads_back_identical() {
    let store = TierStore::open(&StoreConfig {
        url: "memory://some/prefix".into(),
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    let data = pattern(11 * 1024 * 1024, 3);
    upload(&store, "big.bin", &data).await.unwrap();
    assert_eq!(
        store.list("").await.unwrap(),
        vec![("big.bin".to_string(), data.len() as u64)]
    );
    assert!(
        store
            .get_range("big.bin", 0..data.len() as u64)
            .await
            .unwrap()
            == data
    );
}

#[tokio::test]
async fn bad_store_urls_are_rejected_with_bad_url() {
    for url in [
        "ftp://x",
        "s3://",
        "s3:///prefix",
        "s3://Not_A_Bucket/x",
        "file://relative/path",
        "/no/scheme",
        "",
    ] {
        let cfg = StoreConfig {
            url: url.into(),
            ..StoreConfig::default()
        };
        match TierStore::open(&cfg).await {
            Err(StoreError::BadUrl(message)) => {
                if url == "ftp://x" {
                    assert!(
                        message.contains("file://")
                            && message.contains("memory://")
                            && message.contains("s3://"),
                        "names the accepted schemes: {message}"
                    );
                }
            }
            Err(other) => panic!("{url:?}: expected BadUrl, got {other}"),
            Ok(_) => panic!("{url:?}: expected BadUrl, got a store"),
        }
    }
}

// ---- fault injection ----

fn fast_config() -> StoreConfig {
    StoreConfig {
        url: "memory://".into(),
        op_timeout: Duration::from_millis(200),
        retry_backoff: Duration::from_millis(10),
        max_retries: 3,
        ..StoreConfig::default()
    }
}

fn faulty_store(cfg: &StoreConfig) -> (TierStore, Faults) {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    let faults = faulty.faults();
    let store = TierStore::with_store(Arc::new(faulty), "tier", cfg, "faulty memory".into());
    (store, faults)
}

#[tokio::test]
async fn hanging_store_times_out_after_op_timeout() {
    let cfg = StoreConfig {
        max_retries: 1,
        ..fast_config()
    };
    let (store, faults) = faulty_store(&cfg);
    store.put("k", Bytes::from_static(b"v")).await.unwrap();
    faults.set_hang(true);
    let started = Instant::now();
    let err = store.get_range("k", 0..1).await.expect_err("hangs");
    let elapsed = started.elapsed();
    assert!(
        matches!(&err, StoreError::Timeout { op: "get", key, after } if key == "k" && *after == cfg.op_timeout),
        "{err}"
    );
    assert!(elapsed >= 2 * cfg.op_timeout, "two attempts: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    let stats = store.stats();
    assert_eq!((stats.timeouts, stats.retries, stats.errors), (2, 1, 1));
    faults.set_hang(false);
    assert_eq!(store.get_range("k", 0..1).await.unwrap(), "v");
}

#[tokio::test]
async fn store_down_for_a_while_then_up_succeeds_after_retries() {
    let cfg = StoreConfig {
        max_retries: 8,
        retry_backoff: Duration::from_millis(20),
        ..fast_config()
    };
    let (store, faults) = faulty_store(&cfg);
    store.put("k", Bytes::from_static(b"v")).await.unwrap();
    faults.set_down(true);
    let healer = faults.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        healer.set_down(false);
    });
    assert_eq!(store.get_range("k", 0..1).await.unwrap(), "v");
    assert!(store.stats().retries > 0, "{:?}", store.stats());
    assert!(faults.injected_failures() > 0);
    assert_eq!(store.stats().errors, 0);
}

#[tokio::test]
async fn store_down_longer_than_the_retries_is_unavailable() {
    let (store, faults) = faulty_store(&fast_config());
    faults.set_down(true);
    let err = store
        .put("k", Bytes::from_static(b"v"))
        .await
        .expect_err("down");
    assert!(
        matches!(err, StoreError::Unavailable { op: "put", .. }),
        "{err}"
    );
    assert_eq!(faults.puts(), 4, "first attempt + 3 retries");
    assert_eq!(store.stats().retries, 3);
}

#[tokio::test]
async fn two_failed_gets_are_retried_away() {
    let (store, faults) = faulty_store(&fast_config());
    store.put("k", Bytes::from_static(b"value")).await.unwrap();
    faults.fail_next_gets(2);
    assert_eq!(store.get_range("k", 1..4).await.unwrap(), "alu");
    assert_eq!(faults.gets(), 3);
    let stats = store.stats();
    assert_eq!((stats.gets, stats.retries, stats.get_bytes), (3, 2, 3));
}

#[tokio::test]
async fn lost_put_acknowledgement_returns_an_error_but_the_object_exists() {
    let cfg = StoreConfig {
        max_retries: 0,
        ..fast_config()
    };
    let (store, faults) = faulty_store(&cfg);
    faults.ack_lost_next_puts(1);
    let err = store
        .put("k", Bytes::from_static(b"stored"))
        .await
        .expect_err("the answer was lost");
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err}");
    assert_eq!(store.head("k").await.unwrap(), 6);
    assert_eq!(store.get_range("k", 0..6).await.unwrap(), "stored");

    // With retries the repeated PUT overwrites the same object and succeeds.
    let (store, faults) = faulty_store(&fast_config());
    faults.ack_lost_next_puts(1);
    store.put("k", Bytes::from_static(b"stored")).await.unwrap();
    assert_eq!(store.stats().retries, 1);
}

#[tokio::test]
async fn concurrency_limit_bounds_calls_in_flight() {
    let cfg = StoreConfig {
        max_concurrency: 4,
        op_timeout: Duration::from_secs(5),
        ..fast_config()
    };
    let (store, faults) = faulty_store(&cfg);
    store.put("k", Bytes::from_static(b"value")).await.unwrap();
    faults.set_latency(Duration::from_millis(30));
    let raw = store.object_store();
    let path = store.path("k");
    let calls = (0..24).map(|i| {
        let store = store.clone();
        let raw = raw.clone();
        let path = path.clone();
        tokio::spawn(async move {
            // Half through TierStore, half through the ObjectStore Parquet would use.
            if i % 2 == 0 {
                store.get_range("k", 0..5).await.unwrap();
            } else {
                raw.get_range(&path, 0..5).await.unwrap();
            }
        })
    });
    for call in futures::future::join_all(calls).await {
        call.unwrap();
    }
    assert_eq!(
        faults.max_in_flight(),
        4,
        "the limit is reached and never exceeded"
    );
    assert_eq!(store.stats().gets, 24);
}

#[tokio::test]
async fn multipart_uploads_go_through_the_fault_switches() {
    let (store, faults) = faulty_store(&StoreConfig {
        op_timeout: Duration::from_secs(5),
        ..fast_config()
    });
    let data = pattern(11 * 1024 * 1024, 5);

    faults.fail_next_puts(1);
    upload(&store, "big.bin", &data)
        .await
        .expect_err("a failed part fails the upload");
    assert!(matches!(
        store.head("big.bin").await,
        Err(StoreError::NotFound { .. })
    ));

    let parts_before = faults.parts();
    upload(&store, "big.bin", &data).await.unwrap();
    assert_eq!(faults.parts() - parts_before, 2);
    assert!(
        store
            .get_range("big.bin", 0..data.len() as u64)
            .await
            .unwrap()
            == data
    );

    faults.ack_lost_next_puts(1);
    upload(&store, "again.bin", &data)
        .await
        .expect_err("the completion's answer was lost");
    assert_eq!(store.head("again.bin").await.unwrap(), data.len() as u64);
}
