//! The object store a broker tiers to: `file://`, `memory://` or `s3://`, behind one facade,
//! [`TierStore`], whose calls say what the caller should do when they fail ([`StoreError`]).
//!
//! The store decides how every object-store call is bounded. Each call — whether made
//! through [`TierStore`]'s own methods or by Parquet / `BufWriter` through
//! [`TierStore::object_store`] — waits for one of `max_concurrency` permits, gets
//! `op_timeout` per attempt, and is retried with exponential backoff and jitter when the
//! failure is transient (a timeout, a connection error, a 5xx or 429). Answers that retrying
//! cannot change (not found, already exists, precondition failed, access denied, another 4xx)
//! are returned at once.
//!
//! Streaming calls are bounded as far as the `ObjectStore` trait allows: a listing is
//! retried until its first item arrives and then gets `op_timeout` per item; a GET of up to
//! [`BUFFERED_GET_LIMIT`] bytes is read whole inside its attempt (so the timeout and the
//! retries cover the transfer), a larger one streams with `op_timeout` per chunk; a multipart
//! part gets a permit and the timeout but no retry (the trait numbers parts as they are
//! created, so a part cannot be re-sent; object_store's own client retries it a little, and
//! the uploader retries the whole object).
//!
//! Credentials for `s3://` come from the standard AWS chain (environment, profile, web
//! identity, ECS, IMDS) through aws-config, and are cached until shortly before they expire.
//!
//! Each decision has its own file:
//! * `url` — which URLs name a store (and which are refused before anything is opened);
//! * `s3` — an S3 client from the configuration and the AWS credential chain;
//! * `guard` — the bounds themselves: permits, per-attempt timeouts, which failures are
//!   retried and after how long;
//! * `guarded` — every `ObjectStore` call (GETs, listings, multipart parts, bulk deletes)
//!   routed through the guard;
//! * `ping` — a liveness probe outside the guard, so a hung store is seen in seconds;
//! * `simulated` — GETs slowed as a distant store's would be (benchmarks and tests only).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_credential_types::provider::SharedCredentialsProvider;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutOptions};
use tokio::sync::Semaphore;

mod guard;
mod guarded;
mod ping;
mod s3;
mod simulated;
mod url;

use guard::{Guard, http_status_of, is_transient, timed_out};
use guarded::GuardedStore;
use url::{Backend, parse_url};

pub use simulated::SimulatedLatency;
pub use url::validate_url;

/// GETs up to this size are read whole inside their attempt; larger ones stream.
pub const BUFFERED_GET_LIMIT: u64 = 64 * 1024 * 1024;

/// Where the tier lives and how hard to try.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// `file:///abs/path`, `memory://`, or `s3://bucket[/prefix]`.
    pub url: String,
    /// An S3-compatible endpoint (`--s3-endpoint` / `FELIX_S3_ENDPOINT`), e.g.
    /// `http://127.0.0.1:8333`. `http://` endpoints are allowed.
    pub s3_endpoint: Option<String>,
    /// The S3 region; else the AWS chain's region; else `us-east-1`.
    pub s3_region: Option<String>,
    /// Path-style requests (`endpoint/bucket/key`) instead of virtual-hosted ones
    /// (`bucket.endpoint/key`). Path-style is always used when `s3_endpoint` is set (every
    /// S3-compatible server accepts it); this flag forces it for AWS itself too.
    pub s3_path_style: bool,
    /// Time allowed for one attempt of one call.
    pub op_timeout: Duration,
    /// Time allowed to open a connection to the store.
    pub connect_timeout: Duration,
    /// Retries after the first attempt of a call that failed transiently.
    pub max_retries: usize,
    /// The first retry's backoff; it doubles per retry up to 5 s, with jitter.
    pub retry_backoff: Duration,
    /// Object-store calls in flight at once, across everything using this store.
    pub max_concurrency: usize,
    /// GETs answered as a distant store would (benchmarks and tests only; see
    /// [`SimulatedLatency`]). Inactive by default.
    pub simulated: SimulatedLatency,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            url: String::new(),
            s3_endpoint: None,
            s3_region: None,
            s3_path_style: false,
            op_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            max_retries: 5,
            retry_backoff: Duration::from_millis(100),
            max_concurrency: 16,
            simulated: SimulatedLatency::default(),
        }
    }
}

/// Why a store call failed, split by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store URL is malformed or names an unsupported scheme: fix the configuration.
    #[error("bad object store URL: {0}")]
    BadUrl(String),
    /// The store could not be set up (bad option, unusable directory, no region…): fix the
    /// configuration.
    #[error("object store configuration: {0}")]
    Config(String),
    /// The object does not exist.
    #[error("object {key} not found")]
    NotFound { key: String },
    /// Every attempt timed out: the store is slow or unreachable; try again later.
    #[error("{op} of {key} timed out (each attempt limited to {after:?}, retries exhausted)")]
    Timeout {
        op: &'static str,
        key: String,
        after: Duration,
    },
    /// The store failed transiently on every attempt: try again later.
    #[error("object store unavailable: {op} of {key} failed after retries: {source}")]
    Unavailable {
        op: &'static str,
        key: String,
        #[source]
        source: object_store::Error,
    },
    /// The store refused the credentials or the permission: fix the credentials or the
    /// bucket policy. Not retried.
    #[error(
        "object store denied {op} of {key}: check the credentials (AWS chain) and the bucket \
         permissions: {source}"
    )]
    Denied {
        op: &'static str,
        key: String,
        #[source]
        source: object_store::Error,
    },
    /// The store rejected the request itself (already exists, precondition failed, invalid
    /// range or path, unsupported): retrying will not help.
    #[error("object store rejected {op} of {key}: {source}")]
    Rejected {
        op: &'static str,
        key: String,
        #[source]
        source: object_store::Error,
    },
}

/// Counters since the store was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// GET requests sent (each attempt counts; HEADs do not).
    pub gets: u64,
    /// Bytes received by GETs.
    pub get_bytes: u64,
    /// HEAD requests sent.
    pub heads: u64,
    /// PUT requests sent, including multipart parts and multipart starts.
    pub puts: u64,
    /// Bytes stored by successful PUTs and parts.
    pub put_bytes: u64,
    /// Objects submitted for deletion (each attempt counts).
    pub deletes: u64,
    /// Listings started (each attempt counts).
    pub lists: u64,
    /// Calls that failed for good (after retries), not counting "not found".
    pub errors: u64,
    /// Attempts repeated after a transient failure.
    pub retries: u64,
    /// Attempts that hit `op_timeout`.
    pub timeouts: u64,
}

#[derive(Debug, Default)]
struct Counters {
    gets: AtomicU64,
    get_bytes: AtomicU64,
    heads: AtomicU64,
    puts: AtomicU64,
    put_bytes: AtomicU64,
    deletes: AtomicU64,
    lists: AtomicU64,
    errors: AtomicU64,
    retries: AtomicU64,
    timeouts: AtomicU64,
}

fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    fn snapshot(&self) -> StoreStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StoreStats {
            gets: get(&self.gets),
            get_bytes: get(&self.get_bytes),
            heads: get(&self.heads),
            puts: get(&self.puts),
            put_bytes: get(&self.put_bytes),
            deletes: get(&self.deletes),
            lists: get(&self.lists),
            errors: get(&self.errors),
            retries: get(&self.retries),
            timeouts: get(&self.timeouts),
        }
    }
}

/// The tier's object store: a URL's store (or any `ObjectStore`) under a key prefix, with
/// the concurrency limit, timeouts and retries applied to every call. Cheap to clone.
#[derive(Clone)]
pub struct TierStore {
    store: Arc<GuardedStore>,
    prefix: Path,
    description: Arc<str>,
    max_concurrency: usize,
}

impl fmt::Debug for TierStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierStore")
            .field("store", &self.description)
            .finish()
    }
}

impl TierStore {
    /// Builds the store named by `cfg.url`. For `s3://`, credentials come from the standard
    /// AWS chain through aws-config. Nothing is sent over the network here (unless the region
    /// must be looked up through the AWS chain); call [`TierStore::check`] to probe the store.
    pub async fn open(cfg: &StoreConfig) -> Result<TierStore, StoreError> {
        Self::open_inner(cfg, None).await
    }

    /// Like [`TierStore::open`], with explicit credentials for `s3://` instead of the AWS
    /// chain (ignored by the other schemes).
    pub async fn open_with_credentials(
        cfg: &StoreConfig,
        credentials: SharedCredentialsProvider,
    ) -> Result<TierStore, StoreError> {
        Self::open_inner(cfg, Some(credentials)).await
    }

    async fn open_inner(
        cfg: &StoreConfig,
        credentials: Option<SharedCredentialsProvider>,
    ) -> Result<TierStore, StoreError> {
        validate_limits(cfg)?;
        let url = parse_url(&cfg.url)?;
        let (inner, description): (Arc<dyn ObjectStore>, String) = match &url.backend {
            Backend::Memory => (Arc::new(InMemory::new()), cfg.url.clone()),
            Backend::File(dir) => {
                tokio::fs::create_dir_all(dir).await.map_err(|e| {
                    StoreError::Config(format!("cannot create {}: {e}", dir.display()))
                })?;
                let fs = LocalFileSystem::new_with_prefix(dir)
                    .map_err(|e| StoreError::Config(format!("{}: {e}", dir.display())))?
                    // A tiered object is acknowledged as durable: fsync before answering.
                    .with_fsync(true);
                (Arc::new(fs), cfg.url.clone())
            }
            Backend::S3 { bucket } => s3::open_s3(cfg, bucket, &url.prefix, credentials).await?,
        };
        let (inner, description) = if cfg.simulated.is_active() {
            let slowed: Arc<dyn ObjectStore> =
                Arc::new(simulated::SimulatedStore::new(inner, cfg.simulated));
            let s = cfg.simulated;
            let note = format!(
                "{description} (simulated GETs: {} ms first byte + up to {} ms, {} bytes/s)",
                s.first_byte.as_millis(),
                s.jitter.as_millis(),
                s.bytes_per_sec
            );
            (slowed, note)
        } else {
            (inner, description)
        };
        Ok(Self::build(inner, url.prefix, cfg, description))
    }

    /// Wraps an existing store (tests, fault injection) with the same limits. `prefix` is
    /// the key prefix inside `inner` (`""` for none).
    pub fn with_store(
        inner: Arc<dyn ObjectStore>,
        prefix: &str,
        cfg: &StoreConfig,
        description: String,
    ) -> TierStore {
        Self::build(inner, Path::from(prefix), cfg, description)
    }

    fn build(
        inner: Arc<dyn ObjectStore>,
        prefix: Path,
        cfg: &StoreConfig,
        description: String,
    ) -> TierStore {
        let guard = Guard {
            permits: Arc::new(Semaphore::new(cfg.max_concurrency.max(1))),
            counters: Arc::new(Counters::default()),
            op_timeout: cfg.op_timeout,
            max_retries: cfg.max_retries,
            retry_backoff: cfg.retry_backoff,
        };
        TierStore {
            store: Arc::new(GuardedStore { inner, guard }),
            prefix,
            description: description.into(),
            max_concurrency: cfg.max_concurrency.max(1),
        }
    }

    /// Calls allowed in flight at once (`max_concurrency`).
    pub fn max_concurrency(&self) -> usize {
        self.max_concurrency
    }

    /// Where the store is, for logs: e.g. `s3://bucket/prefix (endpoint
    /// http://127.0.0.1:8333, region us-east-1)`. Never contains credentials.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The full object path of `key` (relative to the configured prefix).
    pub fn path(&self, key: &str) -> Path {
        if self.prefix.is_root() {
            Path::from(key)
        } else {
            Path::from(format!("{}/{key}", self.prefix))
        }
    }

    /// The store with the limits applied, as an `ObjectStore` for Parquet and
    /// `object_store::buffered::BufWriter`. Paths given to it are full paths
    /// ([`TierStore::path`]).
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }

    /// Stores `data` under `key`, replacing any object there.
    pub async fn put(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        let path = self.path(key);
        self.store
            .put_opts(&path, data.into(), PutOptions::default())
            .await
            .map(|_| ())
            .map_err(|e| store_error("put", key, e))
    }

    /// The bytes of `range` of the object at `key`.
    pub async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let path = self.path(key);
        self.store
            .get_range(&path, range)
            .await
            .map_err(|e| store_error("get", key, e))
    }

    /// The size of the object at `key`.
    pub async fn head(&self, key: &str) -> Result<u64, StoreError> {
        let path = self.path(key);
        self.store
            .head(&path)
            .await
            .map(|meta| meta.size)
            .map_err(|e| store_error("head", key, e))
    }

    /// The last `n` bytes of the object at `key`, whose size is `size` (from the manifest or
    /// [`TierStore::head`]); all of it when `n >= size`. Sent as a bounded range, because
    /// some servers fail a suffix range longer than the object.
    pub async fn get_tail(&self, key: &str, size: u64, n: u64) -> Result<Bytes, StoreError> {
        let n = n.min(size);
        self.get_range(key, size - n..size).await
    }

    /// Deletes the object at `key`; deleting a missing object succeeds.
    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let path = self.path(key);
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error("delete", key, e)),
        }
    }

    /// Every object under `key_prefix` (whole path segments: `a/b` matches `a/b/c`, not
    /// `a/bc`; `""` lists the whole store), as (key relative to the store prefix, size).
    pub async fn list(&self, key_prefix: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let path = self.path(key_prefix);
        let location = (!path.is_root()).then_some(&path);
        let metas: Vec<ObjectMeta> = self
            .store
            .list(location)
            .try_collect()
            .await
            .map_err(|e| store_error("list", key_prefix, e))?;
        Ok(metas
            .into_iter()
            .map(|meta| (self.relative_key(&meta.location), meta.size))
            .collect())
    }

    fn relative_key(&self, location: &Path) -> String {
        match location.prefix_match(&self.prefix) {
            Some(parts) => parts
                .map(|part| part.as_ref().to_string())
                .collect::<Vec<_>>()
                .join("/"),
            None => location.to_string(),
        }
    }

    /// A cheap reachability probe (the first page of a listing under the prefix): fails if
    /// the store is unreachable, the bucket is missing or the credentials are refused.
    pub async fn check(&self) -> Result<(), StoreError> {
        let location = (!self.prefix.is_root()).then_some(&self.prefix);
        match self.store.list(location).next().await {
            None | Some(Ok(_)) => Ok(()),
            Some(Err(e))
                if matches!(e, object_store::Error::NotFound { .. })
                    || http_status_of(&e) == Some(404) =>
            {
                Err(StoreError::Config(format!(
                    "{}: bucket or directory not found: {e}",
                    self.description
                )))
            }
            Some(Err(e)) => Err(store_error("check", "", e)),
        }
    }

    /// Counters since the store was opened.
    pub fn stats(&self) -> StoreStats {
        self.store.guard.counters.snapshot()
    }
}

fn validate_limits(cfg: &StoreConfig) -> Result<(), StoreError> {
    if cfg.max_concurrency == 0 {
        return Err(StoreError::Config(
            "max_concurrency must be at least 1".into(),
        ));
    }
    if cfg.op_timeout.is_zero() {
        return Err(StoreError::Config("op_timeout must be positive".into()));
    }
    Ok(())
}

/// Maps a call's final error to what the caller should do.
fn store_error(op: &'static str, key: &str, e: object_store::Error) -> StoreError {
    let key = key.to_string();
    if let Some(t) = timed_out(&e) {
        return StoreError::Timeout {
            op,
            key,
            after: t.after,
        };
    }
    match e {
        object_store::Error::NotFound { .. } => StoreError::NotFound { key },
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => StoreError::Denied { op, key, source: e },
        // Listings report refusals as generic errors with the status inside.
        e if matches!(http_status_of(&e), Some(401 | 403)) => {
            StoreError::Denied { op, key, source: e }
        }
        e if is_transient(&e) => StoreError::Unavailable { op, key, source: e },
        e => StoreError::Rejected { op, key, source: e },
    }
}
