//! The object store a broker tiers to: `file://`, `memory://` or `s3://`.
//!
//! This module decides how every object-store call is bounded. Each call — whether made
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

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_credential_types::provider::SharedCredentialsProvider;
use bytes::Bytes;
use futures::stream::{self, BoxStream};
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AwsCredential};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, CopyOptions, CredentialProvider, GetOptions, GetResult,
    GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, RetryConfig, UploadPart,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// GETs up to this size are read whole inside their attempt; larger ones stream.
pub const BUFFERED_GET_LIMIT: u64 = 64 * 1024 * 1024;

/// Backoff between retries never exceeds this.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Paths deleted per bulk request.
const DELETE_BATCH: usize = 1000;

/// Refresh expiring AWS credentials this long before they expire.
const CREDENTIAL_REFRESH_MARGIN: Duration = Duration::from_secs(300);

const ACCEPTED_URLS: &str = "file:///absolute/path, memory:// or s3://bucket[/prefix]";

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
            Backend::S3 { bucket } => open_s3(cfg, bucket, &url.prefix, credentials).await?,
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
        }
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

// ---------------------------------------------------------------------------------------
// URLs

enum Backend {
    File(PathBuf),
    Memory,
    S3 { bucket: String },
}

struct StoreUrl {
    backend: Backend,
    prefix: Path,
}

/// Checks an object-store URL without opening anything (for configuration checks).
pub fn validate_url(url: &str) -> Result<(), StoreError> {
    parse_url(url).map(|_| ())
}

fn parse_url(url: &str) -> Result<StoreUrl, StoreError> {
    let bad = |why: String| StoreError::BadUrl(format!("`{url}`: {why}"));
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad(format!("not a URL; expected {ACCEPTED_URLS}")));
    };
    match scheme {
        "file" => {
            if !rest.starts_with('/') {
                return Err(bad(
                    "a file:// URL needs an absolute path: file:///abs/path".into(),
                ));
            }
            if rest.contains(['?', '#']) {
                return Err(bad("query strings and fragments are not supported".into()));
            }
            Ok(StoreUrl {
                backend: Backend::File(PathBuf::from(rest)),
                prefix: Path::default(),
            })
        }
        "memory" => Ok(StoreUrl {
            backend: Backend::Memory,
            prefix: parse_prefix(rest).map_err(bad)?,
        }),
        "s3" => {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("no bucket: expected s3://bucket[/prefix]".into()));
            }
            validate_bucket(bucket).map_err(bad)?;
            Ok(StoreUrl {
                backend: Backend::S3 {
                    bucket: bucket.to_string(),
                },
                prefix: parse_prefix(prefix).map_err(bad)?,
            })
        }
        other => Err(bad(format!(
            "unsupported scheme `{other}://`; expected {ACCEPTED_URLS}"
        ))),
    }
}

fn parse_prefix(prefix: &str) -> Result<Path, String> {
    if prefix.contains(['?', '#']) {
        return Err("query strings and fragments are not supported".into());
    }
    Path::parse(prefix.trim_matches('/')).map_err(|e| format!("bad key prefix: {e}"))
}

/// S3's bucket naming rules: 3–63 characters of lowercase letters, digits, `.` and `-`,
/// starting and ending with a letter or digit.
fn validate_bucket(bucket: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-';
    let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !(3..=63).contains(&bucket.len())
        || !bucket.chars().all(ok_char)
        || !ends_ok(bucket.chars().next())
        || !ends_ok(bucket.chars().last())
    {
        return Err(format!(
            "`{bucket}` is not a valid bucket name (3-63 lowercase letters, digits, `.` or `-`)"
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// S3

async fn open_s3(
    cfg: &StoreConfig,
    bucket: &str,
    prefix: &Path,
    credentials: Option<SharedCredentialsProvider>,
) -> Result<(Arc<dyn ObjectStore>, String), StoreError> {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(region) = &cfg.s3_region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some(credentials) = credentials {
        loader = loader.credentials_provider(credentials);
    }
    let sdk = loader.load().await;
    let region = sdk
        .region()
        .map(|r| r.to_string())
        .unwrap_or_else(|| "us-east-1".to_string());
    let provider = sdk.credentials_provider().ok_or_else(|| {
        StoreError::Config("the AWS configuration has no credentials provider".into())
    })?;

    let mut client = ClientOptions::new()
        .with_timeout(cfg.op_timeout)
        .with_connect_timeout(cfg.connect_timeout);
    let mut builder = AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_region(region.clone())
        .with_credentials(Arc::new(AwsChainCredentials::new(provider)))
        // The TierStore retries; object_store's client retries only a little, for what the
        // TierStore cannot retry (multipart parts, listing pages after the first).
        .with_retry(RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_millis(500),
                base: 2.0,
            },
            max_retries: 2,
            retry_timeout: cfg.op_timeout,
        });
    let mut description = if prefix.is_root() {
        format!("s3://{bucket}")
    } else {
        format!("s3://{bucket}/{prefix}")
    };
    let path_style = cfg.s3_path_style || cfg.s3_endpoint.is_some();
    match &cfg.s3_endpoint {
        Some(endpoint) => {
            let endpoint = endpoint.trim_end_matches('/');
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                return Err(StoreError::Config(format!(
                    "S3 endpoint `{endpoint}` must start with http:// or https://"
                )));
            }
            client = client.with_allow_http(endpoint.starts_with("http://"));
            builder = builder.with_endpoint(endpoint);
            description.push_str(&format!(
                " (endpoint {}, region {region})",
                without_userinfo(endpoint)
            ));
        }
        None => description.push_str(&format!(" (region {region})")),
    }
    let store = builder
        .with_client_options(client)
        .with_virtual_hosted_style_request(!path_style)
        .build()
        .map_err(|e| StoreError::Config(format!("{description}: {e}")))?;
    Ok((Arc::new(store), description))
}

/// `endpoint` without any `user:password@` (descriptions go to logs).
fn without_userinfo(endpoint: &str) -> String {
    match endpoint.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find('/').unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
                None => endpoint.to_string(),
            }
        }
        None => endpoint.to_string(),
    }
}

/// aws-config's credential chain as object_store's credential source. object_store asks for
/// credentials on every request, so they are cached until shortly before they expire.
#[derive(Debug)]
struct AwsChainCredentials {
    provider: SharedCredentialsProvider,
    cached: tokio::sync::Mutex<Option<(Arc<AwsCredential>, Option<SystemTime>)>>,
}

impl AwsChainCredentials {
    fn new(provider: SharedCredentialsProvider) -> Self {
        AwsChainCredentials {
            provider,
            cached: tokio::sync::Mutex::new(None),
        }
    }
}

#[async_trait]
impl CredentialProvider for AwsChainCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        use aws_credential_types::provider::ProvideCredentials;
        use aws_credential_types::provider::error::CredentialsError;

        let mut cached = self.cached.lock().await;
        let now = SystemTime::now();
        if let Some((credential, expiry)) = &*cached
            && expiry.is_none_or(|t| t > now + CREDENTIAL_REFRESH_MARGIN)
        {
            return Ok(credential.clone());
        }
        match self.provider.provide_credentials().await {
            Ok(c) => {
                let credential = Arc::new(AwsCredential {
                    key_id: c.access_key_id().to_string(),
                    secret_key: c.secret_access_key().to_string(),
                    token: c.session_token().map(str::to_string),
                });
                *cached = Some((credential.clone(), c.expiry()));
                Ok(credential)
            }
            // A refresh failed but the old credentials are still good: use them.
            Err(_)
                if cached
                    .as_ref()
                    .is_some_and(|(_, e)| e.is_some_and(|t| t > now)) =>
            {
                Ok(cached
                    .as_ref()
                    .map(|(c, _)| c.clone())
                    .expect("checked above"))
            }
            Err(e) => {
                let permanent = matches!(
                    e,
                    CredentialsError::CredentialsNotLoaded(_)
                        | CredentialsError::InvalidConfiguration(_)
                );
                let source = Box::new(e);
                Err(if permanent {
                    object_store::Error::Unauthenticated {
                        path: String::new(),
                        source,
                    }
                } else {
                    object_store::Error::Generic {
                        store: "S3 credentials",
                        source,
                    }
                })
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The guard: permits, timeouts, retries

/// One attempt of `op` on `location` ran longer than `after`.
#[derive(Debug, thiserror::Error)]
#[error("{op} of {location} did not complete within {after:?}")]
struct AttemptTimedOut {
    op: &'static str,
    location: String,
    after: Duration,
}

fn timeout_error(op: &'static str, location: &Path, after: Duration) -> object_store::Error {
    object_store::Error::Generic {
        store: "TierStore",
        source: Box::new(AttemptTimedOut {
            op,
            location: location.to_string(),
            after,
        }),
    }
}

fn timed_out(e: &object_store::Error) -> Option<&AttemptTimedOut> {
    match e {
        object_store::Error::Generic { source, .. } => source.downcast_ref(),
        _ => None,
    }
}

/// Whether retrying `e` might succeed: timeouts, connection errors, 5xx, 408 and 429 may;
/// "not found", conflicts, preconditions, auth failures and other 4xx will not.
fn is_transient(e: &object_store::Error) -> bool {
    let object_store::Error::Generic { source, .. } = e else {
        return false;
    };
    if source.downcast_ref::<AttemptTimedOut>().is_some() {
        return true;
    }
    match http_status_of(e) {
        Some(status) => !(400..500).contains(&status) || status == 408 || status == 429,
        None => true,
    }
}

/// The HTTP status behind a `Generic` error, if any. object_store's HTTP error type is
/// private, but its message carries the status.
fn http_status_of(e: &object_store::Error) -> Option<u16> {
    let object_store::Error::Generic { source, .. } = e else {
        return None;
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
    while let Some(c) = cause {
        let message = c.to_string();
        if let Some((_, rest)) = message.split_once("status code: ")
            && let Some(status) = rest.get(..3).and_then(|s| s.parse().ok())
        {
            return Some(status);
        }
        cause = c.source();
    }
    None
}

/// The limits every call goes through. Cheap to clone (streams and uploads carry one).
#[derive(Debug, Clone)]
struct Guard {
    permits: Arc<Semaphore>,
    counters: Arc<Counters>,
    op_timeout: Duration,
    max_retries: usize,
    retry_backoff: Duration,
}

impl Guard {
    async fn permit(&self) -> OwnedSemaphorePermit {
        self.permits
            .clone()
            .acquire_owned()
            .await
            .expect("the store's semaphore is never closed")
    }

    /// The backoff before retry number `retry` (1-based), or `None` if `e` must not be
    /// retried.
    fn retry_delay(&self, e: &object_store::Error, retry: usize) -> Option<Duration> {
        if retry > self.max_retries || !is_transient(e) {
            return None;
        }
        let exp = self
            .retry_backoff
            .saturating_mul(1u32 << (retry - 1).min(20))
            .min(MAX_BACKOFF);
        // Equal jitter: half fixed, half random, so concurrent retries spread out.
        let half = exp / 2;
        Some(half + half.mul_f64(jitter()))
    }

    fn count_failure(&self, e: &object_store::Error) {
        if !matches!(e, object_store::Error::NotFound { .. }) {
            bump(&self.counters.errors, 1);
        }
    }

    fn note_timeout(&self, e: &object_store::Error) {
        if timed_out(e).is_some() {
            bump(&self.counters.timeouts, 1);
        }
    }

    /// Runs `attempt` under a permit and `op_timeout`, retrying transient failures. The
    /// attempt owns its permit (a streaming GET keeps it for the stream's life).
    async fn call_owned<T, F, Fut>(
        &self,
        op: &'static str,
        location: &Path,
        mut attempt: F,
    ) -> object_store::Result<T>
    where
        F: FnMut(OwnedSemaphorePermit) -> Fut,
        Fut: Future<Output = object_store::Result<T>>,
    {
        let mut retry = 0;
        loop {
            let permit = self.permit().await;
            let outcome = match tokio::time::timeout(self.op_timeout, attempt(permit)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(timeout_error(op, location, self.op_timeout)),
            };
            let e = match outcome {
                Ok(value) => return Ok(value),
                Err(e) => e,
            };
            self.note_timeout(&e);
            retry += 1;
            match self.retry_delay(&e, retry) {
                Some(delay) => {
                    bump(&self.counters.retries, 1);
                    tracing::debug!(op, %location, retry, ?delay, error = %e, "object store call failed; retrying");
                    tokio::time::sleep(delay).await;
                }
                None => {
                    self.count_failure(&e);
                    if !matches!(e, object_store::Error::NotFound { .. }) {
                        tracing::warn!(op, %location, attempts = retry, error = %e, "object store call failed");
                    }
                    return Err(e);
                }
            }
        }
    }

    /// [`Guard::call_owned`] for attempts that need the permit only while they run.
    async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        location: &Path,
        mut attempt: F,
    ) -> object_store::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = object_store::Result<T>>,
    {
        self.call_owned(op, location, |permit| {
            let run = attempt();
            async move {
                let outcome = run.await;
                drop(permit);
                outcome
            }
        })
        .await
    }

    /// One attempt, no retry: a permit and the timeout.
    async fn once<T>(
        &self,
        op: &'static str,
        location: &Path,
        run: impl Future<Output = object_store::Result<T>>,
    ) -> object_store::Result<T> {
        let _permit = self.permit().await;
        let outcome = match tokio::time::timeout(self.op_timeout, run).await {
            Ok(outcome) => outcome,
            Err(_) => Err(timeout_error(op, location, self.op_timeout)),
        };
        if let Err(e) = &outcome {
            self.note_timeout(e);
            self.count_failure(e);
        }
        outcome
    }

    /// A stream whose items must each arrive within `op_timeout`; ends after the first
    /// error. Holds `permit` until it ends or is dropped.
    fn bounded_stream<T: Send + 'static>(
        &self,
        op: &'static str,
        location: Path,
        stream: BoxStream<'static, object_store::Result<T>>,
        permit: OwnedSemaphorePermit,
    ) -> BoxStream<'static, object_store::Result<T>> {
        let guard = self.clone();
        stream::unfold(Some((stream, permit)), move |state| {
            let guard = guard.clone();
            let location = location.clone();
            async move {
                let (mut stream, permit) = state?;
                match tokio::time::timeout(guard.op_timeout, stream.next()).await {
                    Ok(None) => None,
                    Ok(Some(Ok(item))) => Some((Ok(item), Some((stream, permit)))),
                    Ok(Some(Err(e))) => {
                        guard.count_failure(&e);
                        Some((Err(e), None))
                    }
                    Err(_) => {
                        let e = timeout_error(op, &location, guard.op_timeout);
                        guard.note_timeout(&e);
                        guard.count_failure(&e);
                        Some((Err(e), None))
                    }
                }
            }
        })
        .boxed()
    }

    /// A listing: retried until its first item (or its end) arrives, then bounded per item.
    fn list_stream(
        &self,
        location: Option<Path>,
        start: impl Fn() -> BoxStream<'static, object_store::Result<ObjectMeta>> + Send + 'static,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let guard = self.clone();
        let first = async move {
            let location = location.unwrap_or_default();
            let mut retry = 0;
            loop {
                let permit = guard.permit().await;
                bump(&guard.counters.lists, 1);
                let mut listing = start();
                let e = match tokio::time::timeout(guard.op_timeout, listing.next()).await {
                    Ok(None) => return stream::empty().boxed(),
                    Ok(Some(Ok(first))) => {
                        let rest = guard.bounded_stream("list", location, listing, permit);
                        return stream::once(async move { Ok(first) }).chain(rest).boxed();
                    }
                    Ok(Some(Err(e))) => e,
                    Err(_) => timeout_error("list", &location, guard.op_timeout),
                };
                drop(permit);
                guard.note_timeout(&e);
                retry += 1;
                match guard.retry_delay(&e, retry) {
                    Some(delay) => {
                        bump(&guard.counters.retries, 1);
                        tracing::debug!(%location, retry, ?delay, error = %e, "object store listing failed; retrying");
                        tokio::time::sleep(delay).await;
                    }
                    None => {
                        guard.count_failure(&e);
                        return stream::once(async move { Err(e) }).boxed();
                    }
                }
            }
        };
        stream::once(first).flatten().boxed()
    }
}

/// Uniform in [0, 1), from a per-thread xorshift seeded by the clock; good enough to spread
/// retries.
fn jitter() -> f64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0x9E37_79B9_7F4A_7C15)
                | 1,
        );
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        (x >> 11) as f64 / (1u64 << 53) as f64
    })
}

/// The inner store with the [`Guard`] applied to every call.
#[derive(Debug)]
struct GuardedStore {
    inner: Arc<dyn ObjectStore>,
    guard: Guard,
}

impl fmt::Display for GuardedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TierStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for GuardedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let len = payload.content_length() as u64;
        let counters = &self.guard.counters;
        let result = self
            .guard
            .call("put", location, || {
                bump(&counters.puts, 1);
                self.inner.put_opts(location, payload.clone(), opts.clone())
            })
            .await?;
        bump(&counters.put_bytes, len);
        Ok(result)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let counters = &self.guard.counters;
        let upload = self
            .guard
            .call("put_multipart", location, || {
                bump(&counters.puts, 1);
                self.inner.put_multipart_opts(location, opts.clone())
            })
            .await?;
        Ok(Box::new(GuardedUpload {
            inner: upload,
            guard: self.guard.clone(),
            location: location.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let counters = &self.guard.counters;
        if options.head {
            return self
                .guard
                .call("head", location, || {
                    bump(&counters.heads, 1);
                    self.inner.get_opts(location, options.clone())
                })
                .await;
        }
        self.guard
            .call_owned("get", location, |permit| {
                let options = options.clone();
                async move {
                    bump(&counters.gets, 1);
                    let result = self.inner.get_opts(location, options).await?;
                    let len = result.range.end.saturating_sub(result.range.start);
                    match result.payload {
                        GetResultPayload::Stream(body) if len <= BUFFERED_GET_LIMIT => {
                            let bytes = object_store::collect_bytes(body, Some(len)).await?;
                            bump(&counters.get_bytes, bytes.len() as u64);
                            Ok(GetResult {
                                payload: GetResultPayload::Stream(
                                    stream::once(async move { Ok(bytes) }).boxed(),
                                ),
                                ..result
                            })
                        }
                        GetResultPayload::Stream(body) => {
                            let counters = self.guard.counters.clone();
                            let body = body.inspect_ok(move |chunk| {
                                bump(&counters.get_bytes, chunk.len() as u64)
                            });
                            let body = self.guard.bounded_stream(
                                "get",
                                location.clone(),
                                body.boxed(),
                                permit,
                            );
                            Ok(GetResult {
                                payload: GetResultPayload::Stream(body),
                                ..result
                            })
                        }
                        // A local file is read later, by the caller.
                        payload @ GetResultPayload::File(..) => {
                            bump(&counters.get_bytes, len);
                            Ok(GetResult { payload, ..result })
                        }
                    }
                }
            })
            .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let inner = self.inner.clone();
        let guard = self.guard.clone();
        locations
            .ready_chunks(DELETE_BATCH)
            .then(move |batch| {
                let inner = inner.clone();
                let guard = guard.clone();
                async move { delete_batch(&inner, &guard, batch).await }
            })
            .flat_map(stream::iter)
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = self.inner.clone();
        let prefix = prefix.cloned();
        let start_prefix = prefix.clone();
        self.guard
            .list_stream(prefix, move || inner.list(start_prefix.as_ref()))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = self.inner.clone();
        let prefix = prefix.cloned();
        let start_prefix = prefix.clone();
        let offset = offset.clone();
        self.guard.list_stream(prefix, move || {
            inner.list_with_offset(start_prefix.as_ref(), &offset)
        })
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let location = prefix.cloned().unwrap_or_default();
        let counters = &self.guard.counters;
        self.guard
            .call("list", &location, || {
                bump(&counters.lists, 1);
                self.inner.list_with_delimiter(prefix)
            })
            .await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.guard
            .call("copy", from, || {
                self.inner.copy_opts(from, to, options.clone())
            })
            .await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.guard
            .call("rename", from, || {
                self.inner.rename_opts(from, to, options.clone())
            })
            .await
    }
}

/// Deletes one batch (one bulk request on S3), retrying it whole while it fails
/// transiently (deleting is idempotent). A missing object counts as deleted. A batch that
/// still fails after the retries yields its error once.
async fn delete_batch(
    inner: &Arc<dyn ObjectStore>,
    guard: &Guard,
    batch: Vec<object_store::Result<Path>>,
) -> Vec<object_store::Result<Path>> {
    let mut out = Vec::with_capacity(batch.len());
    let mut paths = Vec::with_capacity(batch.len());
    for item in batch {
        match item {
            Ok(path) => paths.push(path),
            Err(e) => out.push(Err(e)),
        }
    }
    let Some(first) = paths.first().cloned() else {
        return out;
    };
    let attempt = guard
        .call("delete", &first, || {
            bump(&guard.counters.deletes, paths.len() as u64);
            let request = stream::iter(paths.clone().into_iter().map(Ok)).boxed();
            let results = inner.delete_stream(request);
            async move {
                let results: Vec<object_store::Result<Path>> = results.collect().await;
                let mut done = Vec::with_capacity(results.len());
                for result in results {
                    match result {
                        Ok(path) => done.push(Ok(path)),
                        Err(object_store::Error::NotFound { path, .. }) => {
                            done.push(Ok(Path::from(path)))
                        }
                        // Retry the whole batch (the attempt fails) on a transient error.
                        Err(e) if is_transient(&e) => return Err(e),
                        Err(e) => done.push(Err(e)),
                    }
                }
                Ok(done)
            }
        })
        .await;
    match attempt {
        Ok(done) => out.extend(done),
        Err(e) => out.push(Err(e)),
    }
    out
}

/// A multipart upload whose parts, completion and abort each get a permit and the timeout.
#[derive(Debug)]
struct GuardedUpload {
    inner: Box<dyn MultipartUpload>,
    guard: Guard,
    location: Path,
}

#[async_trait]
impl MultipartUpload for GuardedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let len = data.content_length() as u64;
        let part = self.inner.put_part(data);
        let guard = self.guard.clone();
        let location = self.location.clone();
        Box::pin(async move {
            bump(&guard.counters.puts, 1);
            guard.once("put_part", &location, part).await?;
            bump(&guard.counters.put_bytes, len);
            Ok(())
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let location = self.location.clone();
        self.guard
            .once("complete_multipart", &location, self.inner.complete())
            .await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        let location = self.location.clone();
        self.guard
            .once("abort_multipart", &location, self.inner.abort())
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_strictly() {
        assert!(matches!(parse_url("ftp://x"), Err(StoreError::BadUrl(m)) if m.contains("s3://")));
        assert!(matches!(parse_url("s3://"), Err(StoreError::BadUrl(_))));
        assert!(matches!(
            parse_url("s3:///prefix"),
            Err(StoreError::BadUrl(_))
        ));
        assert!(matches!(
            parse_url("file://relative"),
            Err(StoreError::BadUrl(_))
        ));
        assert!(matches!(
            parse_url("/just/a/path"),
            Err(StoreError::BadUrl(_))
        ));
        assert!(matches!(
            parse_url("s3://Bad_Bucket"),
            Err(StoreError::BadUrl(_))
        ));
        let u = parse_url("s3://bucket/a/b/").unwrap();
        assert!(matches!(&u.backend, Backend::S3 { bucket } if bucket == "bucket"));
        assert_eq!(u.prefix.as_ref(), "a/b");
        let u = parse_url("file:///var/lib/felix").unwrap();
        assert!(
            matches!(&u.backend, Backend::File(p) if p == std::path::Path::new("/var/lib/felix"))
        );
        assert!(u.prefix.is_root());
        assert!(matches!(
            parse_url("memory://").unwrap().backend,
            Backend::Memory
        ));
    }

    #[test]
    fn descriptions_drop_endpoint_userinfo() {
        assert_eq!(
            without_userinfo("http://user:pw@127.0.0.1:8333/x"),
            "http://127.0.0.1:8333/x"
        );
        assert_eq!(
            without_userinfo("http://127.0.0.1:8333"),
            "http://127.0.0.1:8333"
        );
    }

    #[test]
    fn only_transient_failures_are_retried() {
        let generic = |msg: &str| object_store::Error::Generic {
            store: "S3",
            source: msg.to_string().into(),
        };
        assert!(is_transient(&generic(
            "Server returned non-2xx status code: 503 Service Unavailable: "
        )));
        assert!(is_transient(&generic(
            "Server returned non-2xx status code: 429 Too Many Requests: "
        )));
        assert!(!is_transient(&generic(
            "Server returned non-2xx status code: 400 Bad Request: "
        )));
        assert!(is_transient(&generic("connection refused")));
        assert!(is_transient(&timeout_error(
            "get",
            &Path::from("k"),
            Duration::from_secs(1)
        )));
        assert!(!is_transient(&object_store::Error::NotFound {
            path: "k".into(),
            source: "gone".into()
        }));
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        let guard = Guard {
            permits: Arc::new(Semaphore::new(1)),
            counters: Arc::default(),
            op_timeout: Duration::from_secs(1),
            max_retries: 30,
            retry_backoff: Duration::from_millis(100),
        };
        let e = timeout_error("get", &Path::from("k"), Duration::from_secs(1));
        for retry in 1..=30 {
            let d = guard.retry_delay(&e, retry).unwrap();
            let full = Duration::from_millis(100)
                .saturating_mul(1 << (retry - 1).min(20))
                .min(MAX_BACKOFF);
            assert!(
                d >= full / 2 && d <= full,
                "retry {retry}: {d:?} vs {full:?}"
            );
        }
        assert!(guard.retry_delay(&e, 31).is_none());
    }
}
