//! Every setting of a broker node, and where each comes from.
//!
//! Four sources, lowest to highest precedence: the embedded defaults, a TOML file
//! (`--config FILE` or `FELIX_CONFIG`), `FELIX_*` environment variables, and command-line
//! flags. Each source is read into the same all-optional [`Args`] layer; the layers are
//! merged field by field, then resolved into a [`BrokerConfig`] and validated as a whole.
//! The invariant: a [`BrokerConfig`] returned by [`BrokerConfig::load`] is valid, so the
//! broker never has to re-check a setting (docs/configuration.md lists them all).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

const MIB: usize = 1024 * 1024;

/// The embedded defaults, as `felix` with no arguments runs them.
pub mod defaults {
    use super::MIB;

    pub const NODE_ID: u64 = 1;
    pub const DATA_DIR: &str = "./felix-data";
    pub const QUIC_ADDR: &str = "127.0.0.1:5000";
    pub const ADMIN_ADDR: &str = "127.0.0.1:8080";
    pub const INTERNAL_ADDR: &str = "127.0.0.1:5100";
    pub const FSYNC: &str = "periodic";
    pub const ACK_ON_COMMIT: bool = true;
    pub const SUBSCRIBER_QUEUE_CAPACITY: usize = 512;
    pub const SUBSCRIBER_QUEUE_MAX_BYTES: usize = 128 * MIB;
    pub const SUBSCRIBER_EGRESS_MAX_BYTES: usize = 256 * MIB;
    pub const HOT_READ_CACHE_BYTES: usize = 64 * MIB;
    pub const PUB_QUEUE_DEPTH: usize = 512;
    pub const PUBLISH_QUEUE_WAIT_TIMEOUT_MS: u64 = 2000;
    pub const PUB_INGRESS_WAIT: bool = false;
    pub const MAX_FRAME_BYTES: usize = 16 * MIB;
    pub const MAX_BATCH_BYTES: usize = 8 * MIB;
    pub const QUIC_IDLE_TIMEOUT_MS: u64 = 6000;
    pub const MAX_CONNECTIONS: usize = 4096;
    pub const MAX_INFLIGHT_REQUEST_BYTES: usize = 256 * MIB;
    /// 0: automatic, 2% of the data volume and at most 1 GiB.
    pub const DISK_RESERVE_BYTES: u64 = 0;
    pub const META_SNAPSHOT_LOGS: u64 = 5000;
    pub const SEGMENT_BYTES: u64 = 256 * MIB as u64;
    pub const SEGMENT_MS: u64 = 3_600_000;
    pub const OBJECT_STORE_TIMEOUT_MS: u64 = 30_000;
    pub const OBJECT_STORE_MAX_RETRIES: usize = 5;
    pub const OBJECT_STORE_CONCURRENCY: usize = 16;
    pub const CACHE_MEMORY_BYTES: usize = 64 * MIB;
    pub const CACHE_DISK_BYTES: u64 = 1024 * MIB as u64;
    pub const COLD_PREFETCH_ROW_GROUPS: usize = 2;
    pub const COLD_DECODE_THREADS: usize = 2;
    pub const TIER_ROW_GROUP_BYTES: usize = 4 * MIB;
    pub const RETENTION_CHECK_MS: u64 = 10_000;
    pub const PUBLISH_QUORUM_TIMEOUT_MS: u64 = 5_000;
    pub const LEASE_MS: u64 = 10_000;
    pub const KAFKA_ADDR: &str = "127.0.0.1:9092";
    pub const KAFKA_DEFAULT_PARTITIONS: u32 = 1;
    pub const KAFKA_AUTO_CREATE_TOPICS: bool = true;
}

/// The effective configuration of a broker node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// This node's id: its broker id and its Raft member id.
    pub node_id: u64,
    /// Every control-plane member's internal address by node id, this node included.
    /// Empty: a one-member group (the embedded default).
    #[serde(
        default,
        with = "cluster_serde",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub cluster: BTreeMap<u64, String>,
    /// Shard logs live in `<data_dir>/...`, metadata in `<data_dir>/meta`.
    pub data_dir: PathBuf,
    /// The QUIC client listener (UDP).
    pub quic_addr: SocketAddr,
    /// Admin HTTP: `/metrics`, `/healthz`, `/v1/...`.
    pub admin_addr: SocketAddr,
    /// The control plane's internal HTTP listener (Raft RPCs).
    pub internal_addr: SocketAddr,
    /// Where sealed segments are tiered: `file:///path`, `memory://` or
    /// `s3://bucket/prefix`.
    pub object_store: String,
    /// Endpoint of an S3-compatible server (MinIO, SeaweedFS, Ceph...); unset: AWS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3_endpoint: Option<String>,
    /// S3 region; unset: from the AWS chain, else us-east-1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3_region: Option<String>,
    /// Path-style S3 requests; unset: path-style exactly when `s3_endpoint` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3_path_style: Option<bool>,
    /// Per-attempt timeout of an object-store call.
    pub object_store_timeout_ms: u64,
    /// Retries of a failed object-store call (with exponential backoff).
    pub object_store_max_retries: usize,
    /// Object-store calls in flight at once.
    pub object_store_concurrency: usize,
    /// Disk tier of the cold-read cache; unset: `<data_dir>/cache`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_dir: Option<PathBuf>,
    /// Memory tier of the cold-read cache.
    pub cache_memory_bytes: usize,
    /// Disk tier of the cold-read cache (0: memory only).
    pub cache_disk_bytes: u64,
    /// Row groups a sequential cold reader fetches ahead.
    pub cold_prefetch_row_groups: usize,
    /// Lower-priority threads that decode fetched row groups, shared by all cold readers.
    pub cold_decode_threads: usize,
    /// Input bytes per Parquet row group of an uploaded object.
    pub tier_row_group_bytes: usize,
    /// How often each shard applies its retention settings.
    pub retention_check_ms: u64,
    /// How long a Quorum publish waits for a majority before `quorum_timeout`.
    pub publish_quorum_timeout_ms: u64,
    /// Shard-leader lease granted by the control plane (a cluster's failover detection).
    pub lease_ms: u64,
    /// PEM certificate chain of the QUIC listener; without it (and `tls_key`) a CA and a
    /// certificate are generated under `<data_dir>/tls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// `periodic`, `periodic:MS` or `on_commit`; see [`BrokerConfig::fsync_policy`].
    pub fsync: String,
    /// Acknowledge a durable publish once written (true) or once queued (false).
    pub ack_on_commit: bool,
    /// Buffer slots per subscriber.
    pub subscriber_queue_capacity: usize,
    /// Payload bytes a subscriber's queue may hold.
    pub subscriber_queue_max_bytes: usize,
    /// Bytes per connection between the subscriber queues and the QUIC streams.
    pub subscriber_egress_max_bytes: usize,
    /// Recent hot history blocks kept for catching-up subscribers to share (0: none).
    pub hot_read_cache_bytes: usize,
    /// Publish-queue slots guaranteed per tenant.
    pub pub_queue_depth: usize,
    /// How long a commit-acked publish waits for room in the publish queue.
    pub publish_queue_wait_timeout_ms: u64,
    /// A fire-and-forget publish that finds no room waits like a commit-acked one instead of
    /// being shed.
    pub pub_ingress_wait: bool,
    /// Largest frame (header + body) accepted or sent.
    pub max_frame_bytes: usize,
    /// Largest record batch accepted.
    pub max_batch_bytes: usize,
    /// A QUIC connection silent this long is closed.
    pub quic_idle_timeout_ms: u64,
    /// Connections each listener (QUIC, Kafka) holds at once; more are refused.
    pub max_connections: usize,
    /// Bytes of Kafka requests being received or handled at once, over all connections.
    pub max_inflight_request_bytes: usize,
    /// Free bytes of the data volume that publishes leave for the control plane (0: auto).
    pub disk_reserve_bytes: u64,
    /// Snapshot the metadata Raft log every this many entries.
    pub meta_snapshot_logs: u64,
    /// Default segment size of new streams.
    pub segment_bytes: u64,
    /// Default segment age of new streams.
    pub segment_ms: u64,
    /// The Kafka protocol listener (TCP); see docs/kafka.md.
    pub kafka_addr: SocketAddr,
    /// Partitions (shards) of a topic the Kafka listener creates without being told how many.
    pub kafka_default_partitions: u32,
    /// Create an unknown topic when a Kafka client produces to it or asks for its metadata.
    pub kafka_auto_create_topics: bool,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        let data_dir = PathBuf::from(defaults::DATA_DIR);
        BrokerConfig {
            node_id: defaults::NODE_ID,
            cluster: BTreeMap::new(),
            object_store: default_object_store(&data_dir),
            data_dir,
            quic_addr: parse_default(defaults::QUIC_ADDR),
            admin_addr: parse_default(defaults::ADMIN_ADDR),
            internal_addr: parse_default(defaults::INTERNAL_ADDR),
            tls_cert: None,
            tls_key: None,
            fsync: defaults::FSYNC.to_owned(),
            ack_on_commit: defaults::ACK_ON_COMMIT,
            subscriber_queue_capacity: defaults::SUBSCRIBER_QUEUE_CAPACITY,
            subscriber_queue_max_bytes: defaults::SUBSCRIBER_QUEUE_MAX_BYTES,
            subscriber_egress_max_bytes: defaults::SUBSCRIBER_EGRESS_MAX_BYTES,
            hot_read_cache_bytes: defaults::HOT_READ_CACHE_BYTES,
            pub_queue_depth: defaults::PUB_QUEUE_DEPTH,
            publish_queue_wait_timeout_ms: defaults::PUBLISH_QUEUE_WAIT_TIMEOUT_MS,
            pub_ingress_wait: defaults::PUB_INGRESS_WAIT,
            max_frame_bytes: defaults::MAX_FRAME_BYTES,
            max_batch_bytes: defaults::MAX_BATCH_BYTES,
            quic_idle_timeout_ms: defaults::QUIC_IDLE_TIMEOUT_MS,
            max_connections: defaults::MAX_CONNECTIONS,
            max_inflight_request_bytes: defaults::MAX_INFLIGHT_REQUEST_BYTES,
            disk_reserve_bytes: defaults::DISK_RESERVE_BYTES,
            meta_snapshot_logs: defaults::META_SNAPSHOT_LOGS,
            segment_bytes: defaults::SEGMENT_BYTES,
            segment_ms: defaults::SEGMENT_MS,
            s3_endpoint: None,
            s3_region: None,
            s3_path_style: None,
            object_store_timeout_ms: defaults::OBJECT_STORE_TIMEOUT_MS,
            object_store_max_retries: defaults::OBJECT_STORE_MAX_RETRIES,
            object_store_concurrency: defaults::OBJECT_STORE_CONCURRENCY,
            cache_dir: None,
            cache_memory_bytes: defaults::CACHE_MEMORY_BYTES,
            cache_disk_bytes: defaults::CACHE_DISK_BYTES,
            cold_prefetch_row_groups: defaults::COLD_PREFETCH_ROW_GROUPS,
            cold_decode_threads: defaults::COLD_DECODE_THREADS,
            tier_row_group_bytes: defaults::TIER_ROW_GROUP_BYTES,
            retention_check_ms: defaults::RETENTION_CHECK_MS,
            publish_quorum_timeout_ms: defaults::PUBLISH_QUORUM_TIMEOUT_MS,
            lease_ms: defaults::LEASE_MS,
            kafka_addr: parse_default(defaults::KAFKA_ADDR),
            kafka_default_partitions: defaults::KAFKA_DEFAULT_PARTITIONS,
            kafka_auto_create_topics: defaults::KAFKA_AUTO_CREATE_TOPICS,
        }
    }
}

fn parse_default(addr: &str) -> SocketAddr {
    addr.parse()
        .expect("the embedded default addresses are valid")
}

/// `file://<data_dir>/objects`, with the directory made absolute (a file URL needs it).
fn default_object_store(data_dir: &Path) -> String {
    let dir = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    format!("file://{}", dir.join("objects").display())
}

/// Why a configuration was refused. Every variant names the setting and the source.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("environment variable {var}={value:?}: {message}")]
    Env {
        var: &'static str,
        value: String,
        message: String,
    },
    #[error("{setting}: {message}")]
    Invalid { setting: String, message: String },
}

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        setting: describe(key),
        message: message.into(),
    }
}

/// Every setting's TOML key and environment variable; the flag is the key in kebab case.
const SETTINGS: &[(&str, &str)] = &[
    ("node_id", "FELIX_NODE_ID"),
    ("cluster", "FELIX_CLUSTER"),
    ("data_dir", "FELIX_DATA_DIR"),
    ("quic_addr", "FELIX_QUIC_ADDR"),
    ("admin_addr", "FELIX_ADMIN_ADDR"),
    ("internal_addr", "FELIX_INTERNAL_ADDR"),
    ("object_store", "FELIX_OBJECT_STORE"),
    ("tls_cert", "FELIX_TLS_CERT"),
    ("tls_key", "FELIX_TLS_KEY"),
    ("fsync", "FELIX_DURABLE_FSYNC_MODE"),
    ("ack_on_commit", "FELIX_ACK_ON_COMMIT"),
    (
        "subscriber_queue_capacity",
        "FELIX_SUBSCRIBER_QUEUE_CAPACITY",
    ),
    (
        "subscriber_queue_max_bytes",
        "FELIX_SUBSCRIBER_QUEUE_MAX_BYTES",
    ),
    (
        "subscriber_egress_max_bytes",
        "FELIX_SUBSCRIBER_EGRESS_MAX_BYTES",
    ),
    ("hot_read_cache_bytes", "FELIX_HOT_READ_CACHE_BYTES"),
    ("pub_queue_depth", "FELIX_PUB_QUEUE_DEPTH"),
    (
        "publish_queue_wait_timeout_ms",
        "FELIX_PUBLISH_QUEUE_WAIT_TIMEOUT_MS",
    ),
    ("pub_ingress_wait", "FELIX_PUB_INGRESS_WAIT"),
    ("max_frame_bytes", "FELIX_MAX_FRAME_BYTES"),
    ("max_batch_bytes", "FELIX_MAX_BATCH_BYTES"),
    ("quic_idle_timeout_ms", "FELIX_QUIC_IDLE_TIMEOUT_MS"),
    ("max_connections", "FELIX_MAX_CONNECTIONS"),
    (
        "max_inflight_request_bytes",
        "FELIX_MAX_INFLIGHT_REQUEST_BYTES",
    ),
    ("disk_reserve_bytes", "FELIX_DISK_RESERVE_BYTES"),
    ("meta_snapshot_logs", "FELIX_META_SNAPSHOT_LOGS"),
    ("segment_bytes", "FELIX_SEGMENT_BYTES"),
    ("segment_ms", "FELIX_SEGMENT_MS"),
    ("s3_endpoint", "FELIX_S3_ENDPOINT"),
    ("s3_region", "FELIX_S3_REGION"),
    ("s3_path_style", "FELIX_S3_PATH_STYLE"),
    ("object_store_timeout_ms", "FELIX_OBJECT_STORE_TIMEOUT_MS"),
    ("object_store_max_retries", "FELIX_OBJECT_STORE_MAX_RETRIES"),
    ("object_store_concurrency", "FELIX_OBJECT_STORE_CONCURRENCY"),
    ("cache_dir", "FELIX_CACHE_DIR"),
    ("cache_memory_bytes", "FELIX_CACHE_MEMORY_BYTES"),
    ("cache_disk_bytes", "FELIX_CACHE_DISK_BYTES"),
    ("cold_prefetch_row_groups", "FELIX_COLD_PREFETCH_ROW_GROUPS"),
    ("cold_decode_threads", "FELIX_COLD_DECODE_THREADS"),
    ("tier_row_group_bytes", "FELIX_TIER_ROW_GROUP_BYTES"),
    ("retention_check_ms", "FELIX_RETENTION_CHECK_MS"),
    (
        "publish_quorum_timeout_ms",
        "FELIX_PUBLISH_QUORUM_TIMEOUT_MS",
    ),
    ("lease_ms", "FELIX_LEASE_MS"),
    ("kafka_addr", "FELIX_KAFKA_ADDR"),
    ("kafka_default_partitions", "FELIX_KAFKA_DEFAULT_PARTITIONS"),
    ("kafka_auto_create_topics", "FELIX_KAFKA_AUTO_CREATE_TOPICS"),
];

/// The environment variable naming the config file when `--config` is not given.
pub const CONFIG_ENV: &str = "FELIX_CONFIG";

/// `key (--flag, ENV)`: how an error names a setting, whichever source set it.
fn describe(key: &str) -> String {
    let flag = key.replace('_', "-");
    match SETTINGS.iter().find(|(k, _)| *k == key) {
        Some((_, env)) => format!("{key} (--{flag}, {env})"),
        None => format!("{key} (--{flag})"),
    }
}

/// One source's settings, every one optional: the command-line flags, and the shape of
/// the TOML file and of the environment layer. Unset fields fall through to the source
/// below.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// TOML file of settings (keys are the setting names; flags and FELIX_* variables
    /// override it). Env: FELIX_CONFIG.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// This node's id: broker id and Raft member id. Env: FELIX_NODE_ID. Default: 1.
    #[arg(long, value_name = "ID")]
    pub node_id: Option<u64>,

    /// Control-plane members' internal addresses, this node included:
    /// `1=HOST:PORT,2=HOST:PORT,3=HOST:PORT`. Empty: a one-member group.
    /// Env: FELIX_CLUSTER. Default: empty.
    #[arg(long, value_name = "ID=HOST:PORT,...", value_parser = parse_cluster)]
    #[serde(default, deserialize_with = "cluster_serde::deserialize_opt")]
    pub cluster: Option<BTreeMap<u64, String>>,

    /// Data directory (shard logs, metadata in DIR/meta, the generated certificate).
    /// Env: FELIX_DATA_DIR. Default: ./felix-data.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// QUIC client listener (UDP). Env: FELIX_QUIC_ADDR. Default: 127.0.0.1:5000.
    #[arg(long, value_name = "IP:PORT")]
    pub quic_addr: Option<SocketAddr>,

    /// Admin HTTP listener: /metrics, /healthz, /v1. Env: FELIX_ADMIN_ADDR.
    /// Default: 127.0.0.1:8080.
    #[arg(long, value_name = "IP:PORT")]
    pub admin_addr: Option<SocketAddr>,

    /// Control-plane internal HTTP listener. Env: FELIX_INTERNAL_ADDR. Default: this
    /// node's entry in --cluster, else 127.0.0.1:5100.
    #[arg(long, value_name = "IP:PORT")]
    pub internal_addr: Option<SocketAddr>,

    /// Object store for sealed segments: file:///PATH, memory:// (lost on exit; tests) or
    /// s3://BUCKET/PREFIX (credentials and region from the standard AWS chain: env,
    /// profile, web identity, instance metadata). Env: FELIX_OBJECT_STORE.
    /// Default: file://<data-dir>/objects.
    #[arg(long, value_name = "URL")]
    pub object_store: Option<String>,

    /// Endpoint of an S3-compatible server, e.g. http://127.0.0.1:8333 (MinIO, SeaweedFS,
    /// Ceph). Env: FELIX_S3_ENDPOINT. Default: AWS S3.
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,

    /// S3 region. Env: FELIX_S3_REGION. Default: the AWS chain's, else us-east-1.
    #[arg(long, value_name = "REGION")]
    pub s3_region: Option<String>,

    /// Path-style S3 requests (bucket in the path, not the host name).
    /// Env: FELIX_S3_PATH_STYLE. Default: true when --s3-endpoint is set, else false.
    #[arg(
        long,
        value_name = "BOOL",
        value_parser = parse_bool,
        num_args = 0..=1,
        default_missing_value = "true",
    )]
    pub s3_path_style: Option<bool>,

    /// Timeout of one object-store call attempt. Env: FELIX_OBJECT_STORE_TIMEOUT_MS.
    /// Default: 30000.
    #[arg(long, value_name = "MS")]
    pub object_store_timeout_ms: Option<u64>,

    /// Retries of a failed object-store call, with exponential backoff (uploads are also
    /// retried indefinitely on top of this). Env: FELIX_OBJECT_STORE_MAX_RETRIES. Default: 5.
    #[arg(long, value_name = "N")]
    pub object_store_max_retries: Option<usize>,

    /// Object-store calls in flight at once (uploads and cold reads together).
    /// Env: FELIX_OBJECT_STORE_CONCURRENCY. Default: 16.
    #[arg(long, value_name = "N")]
    pub object_store_concurrency: Option<usize>,

    /// Directory of the cold-read cache's disk tier (safe to wipe while stopped).
    /// Env: FELIX_CACHE_DIR. Default: <data-dir>/cache.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,

    /// Memory tier of the cold-read cache. Env: FELIX_CACHE_MEMORY_BYTES.
    /// Default: 67108864 (64 MiB).
    #[arg(long, value_name = "BYTES")]
    pub cache_memory_bytes: Option<usize>,

    /// Disk tier of the cold-read cache; 0 keeps it in memory only.
    /// Env: FELIX_CACHE_DISK_BYTES. Default: 1073741824 (1 GiB).
    #[arg(long, value_name = "BYTES")]
    pub cache_disk_bytes: Option<u64>,

    /// Row groups a sequential cold reader fetches ahead of the one it reads (0: none).
    /// Env: FELIX_COLD_PREFETCH_ROW_GROUPS. Default: 2.
    #[arg(long, value_name = "N")]
    pub cold_prefetch_row_groups: Option<usize>,

    /// Threads that decode row groups fetched from the object store, shared by every cold
    /// reader. They run at a lower priority (nice +10) than the rest of the broker, so a
    /// replay from the object store takes only the CPU that publishing leaves.
    /// Env: FELIX_COLD_DECODE_THREADS. Default: 2.
    #[arg(long, value_name = "N")]
    pub cold_decode_threads: Option<usize>,

    /// Input bytes per Parquet row group in uploaded objects (the unit of a cold ranged
    /// read). Env: FELIX_TIER_ROW_GROUP_BYTES. Default: 4194304 (4 MiB).
    #[arg(long, value_name = "BYTES")]
    pub tier_row_group_bytes: Option<usize>,

    /// How often each shard applies its retention settings.
    /// Env: FELIX_RETENTION_CHECK_MS. Default: 10000.
    #[arg(long, value_name = "MS")]
    pub retention_check_ms: Option<u64>,

    /// How long a publish to a Quorum stream waits for a majority of its replicas before it
    /// fails with `quorum_timeout` (outcome unknown: the record may have landed).
    /// Env: FELIX_PUBLISH_QUORUM_TIMEOUT_MS. Default: 5000.
    #[arg(long, value_name = "MS")]
    pub publish_quorum_timeout_ms: Option<u64>,

    /// Shard-leader lease in a cluster: a broker that cannot renew it for this long stops
    /// acknowledging writes (`fenced`), and the control plane may then move its Quorum
    /// shards to a replica. Every member should use the same value. Env: FELIX_LEASE_MS.
    /// Default: 10000.
    #[arg(long, value_name = "MS")]
    pub lease_ms: Option<u64>,

    /// PEM certificate chain for the QUIC listener (needs --tls-key). Without both, a CA
    /// and a certificate for localhost are generated under DATA_DIR/tls.
    /// Env: FELIX_TLS_CERT.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert. Env: FELIX_TLS_KEY.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// Shard-log fsync policy: periodic (every 250 ms), periodic:MS, or on_commit.
    /// Env: FELIX_DURABLE_FSYNC_MODE. Default: periodic.
    #[arg(long, value_name = "MODE")]
    pub fsync: Option<String>,

    /// Acknowledge durable publishes once written (true) or once queued (false).
    /// Accepts 1/0/true/false. Env: FELIX_ACK_ON_COMMIT. Default: true.
    #[arg(
        long,
        value_name = "BOOL",
        value_parser = parse_bool,
        num_args = 0..=1,
        default_missing_value = "true",
    )]
    pub ack_on_commit: Option<bool>,

    /// Buffer slots per subscriber. Env: FELIX_SUBSCRIBER_QUEUE_CAPACITY. Default: 512.
    #[arg(long, value_name = "N")]
    pub subscriber_queue_capacity: Option<usize>,

    /// Payload bytes one subscriber's queue may hold.
    /// Env: FELIX_SUBSCRIBER_QUEUE_MAX_BYTES. Default: 134217728 (128 MiB).
    #[arg(long, value_name = "BYTES")]
    pub subscriber_queue_max_bytes: Option<usize>,

    /// Bytes per connection taken from subscriber queues but not yet written to QUIC,
    /// split equally between its subscriptions. Env: FELIX_SUBSCRIBER_EGRESS_MAX_BYTES.
    /// Default: 268435456 (256 MiB).
    #[arg(long, value_name = "BYTES")]
    pub subscriber_egress_max_bytes: Option<usize>,

    /// Memory for recently read blocks of local history, shared by every subscriber of the
    /// broker that is catching up: subscribers replaying the same part of a shard read and
    /// check each block once between them instead of once each (0: every subscriber reads
    /// for itself). Env: FELIX_HOT_READ_CACHE_BYTES. Default: 67108864 (64 MiB).
    #[arg(long, value_name = "BYTES")]
    pub hot_read_cache_bytes: Option<usize>,

    /// Publish-queue slots guaranteed per tenant. Env: FELIX_PUB_QUEUE_DEPTH.
    /// Default: 512 (the spec's value).
    #[arg(long, value_name = "N")]
    pub pub_queue_depth: Option<usize>,

    /// How long a commit-acked publish waits for publish-queue room before `overloaded`.
    /// Env: FELIX_PUBLISH_QUEUE_WAIT_TIMEOUT_MS. Default: 2000.
    #[arg(long, value_name = "MS")]
    pub publish_queue_wait_timeout_ms: Option<u64>,

    /// A fire-and-forget publish that finds no room waits up to
    /// publish_queue_wait_timeout_ms instead of being shed. Env: FELIX_PUB_INGRESS_WAIT.
    /// Default: false.
    #[arg(
        long,
        value_name = "BOOL",
        value_parser = parse_bool,
        num_args = 0..=1,
        default_missing_value = "true",
    )]
    pub pub_ingress_wait: Option<bool>,

    /// Largest protocol frame (header + body). Env: FELIX_MAX_FRAME_BYTES.
    /// Default: 16777216 (16 MiB).
    #[arg(long, value_name = "BYTES")]
    pub max_frame_bytes: Option<usize>,

    /// Largest record batch accepted. Env: FELIX_MAX_BATCH_BYTES.
    /// Default: 8388608 (8 MiB).
    #[arg(long, value_name = "BYTES")]
    pub max_batch_bytes: Option<usize>,

    /// Close a QUIC connection silent this long. Env: FELIX_QUIC_IDLE_TIMEOUT_MS.
    /// Default: 6000.
    #[arg(long, value_name = "MS")]
    pub quic_idle_timeout_ms: Option<u64>,

    /// Connections each listener (QUIC and Kafka, counted apart) holds at once; a client
    /// past it is refused at once. Env: FELIX_MAX_CONNECTIONS. Default: 4096.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,

    /// Bytes of Kafka requests being received or handled at once, over all connections; a
    /// request past it waits (its connection is not read meanwhile).
    /// Env: FELIX_MAX_INFLIGHT_REQUEST_BYTES. Default: 268435456 (256 MiB).
    #[arg(long, value_name = "BYTES")]
    pub max_inflight_request_bytes: Option<usize>,

    /// Free bytes of the data volume that durable publishes leave for the control plane;
    /// a publish that would go below it is refused with `disk_full` until space is freed.
    /// 0: 2% of the volume, at most 1 GiB. Env: FELIX_DISK_RESERVE_BYTES. Default: 0.
    #[arg(long, value_name = "BYTES")]
    pub disk_reserve_bytes: Option<u64>,

    /// Snapshot and compact the metadata Raft log every this many entries.
    /// Env: FELIX_META_SNAPSHOT_LOGS. Default: 5000.
    #[arg(long, value_name = "N")]
    pub meta_snapshot_logs: Option<u64>,

    /// Segment size of new streams that do not set one. Env: FELIX_SEGMENT_BYTES.
    /// Default: 268435456 (256 MiB).
    #[arg(long, value_name = "BYTES")]
    pub segment_bytes: Option<u64>,

    /// Segment age of new streams that do not set one. Env: FELIX_SEGMENT_MS.
    /// Default: 3600000 (1 h).
    #[arg(long, value_name = "MS")]
    pub segment_ms: Option<u64>,

    /// Kafka protocol listener (TCP); topics are the streams of tenant `default`, namespace
    /// `default`. Env: FELIX_KAFKA_ADDR. Default: 127.0.0.1:9092.
    #[arg(long, value_name = "IP:PORT")]
    pub kafka_addr: Option<SocketAddr>,

    /// Partitions of a topic the Kafka listener creates without a count (auto-created, or
    /// CreateTopics with -1). Env: FELIX_KAFKA_DEFAULT_PARTITIONS. Default: 1.
    #[arg(long, value_name = "N")]
    pub kafka_default_partitions: Option<u32>,

    /// Create an unknown topic when a Kafka client produces to it or asks for its metadata,
    /// as Kafka's auto.create.topics.enable does. Accepts 1/0/true/false.
    /// Env: FELIX_KAFKA_AUTO_CREATE_TOPICS. Default: true.
    #[arg(
        long,
        value_name = "BOOL",
        value_parser = parse_bool,
        num_args = 0..=1,
        default_missing_value = "true",
    )]
    pub kafka_auto_create_topics: Option<bool>,
}

/// `higher.field.or(lower.field)` for every listed field.
macro_rules! overlay {
    ($lower:expr, $higher:expr; $($field:ident),* $(,)?) => {
        Args { $($field: $higher.$field.or($lower.$field),)* }
    };
}

impl Args {
    /// This layer with `higher`'s settings on top.
    fn overlaid_with(self, higher: Args) -> Args {
        overlay!(self, higher;
            config, node_id, cluster, data_dir, quic_addr, admin_addr, internal_addr,
            object_store, tls_cert, tls_key, fsync, ack_on_commit, subscriber_queue_capacity,
            subscriber_queue_max_bytes, subscriber_egress_max_bytes, hot_read_cache_bytes,
            pub_queue_depth,
            publish_queue_wait_timeout_ms, pub_ingress_wait, max_frame_bytes, max_batch_bytes,
            quic_idle_timeout_ms, max_connections, max_inflight_request_bytes, disk_reserve_bytes,
            meta_snapshot_logs, segment_bytes, segment_ms,
            s3_endpoint, s3_region, s3_path_style, object_store_timeout_ms,
            object_store_max_retries, object_store_concurrency, cache_dir, cache_memory_bytes,
            cache_disk_bytes, cold_prefetch_row_groups, cold_decode_threads, tier_row_group_bytes,
            retention_check_ms, publish_quorum_timeout_ms, lease_ms, kafka_addr,
            kafka_default_partitions, kafka_auto_create_topics,
        )
    }

    /// The TOML file's layer.
    fn from_file(path: &Path) -> Result<Args, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Args::from_toml(&text).map_err(|message| ConfigError::File {
            path: path.to_path_buf(),
            message,
        })
    }

    fn from_toml(text: &str) -> Result<Args, String> {
        let message = |e: toml::de::Error| e.to_string().trim_end().to_owned();
        // The spec's example keys this design has no use for are accepted (and noted at
        // start); without them the text is parsed as is, so errors keep their positions.
        let mut table: toml::Table = toml::from_str(text).map_err(message)?;
        if crate::inert_settings::strip(&mut table).is_empty() {
            return toml::from_str(text).map_err(message);
        }
        table.try_into().map_err(message)
    }

    /// The environment's layer. `lookup` returns a variable's value; an empty value counts
    /// as unset, so `FELIX_X=` cannot silently zero a setting.
    fn from_env(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Args, ConfigError> {
        let env = EnvReader(lookup);
        Ok(Args {
            config: env.get(CONFIG_ENV, |s| Ok(PathBuf::from(s)))?,
            node_id: env.parsed("FELIX_NODE_ID")?,
            cluster: env.get("FELIX_CLUSTER", parse_cluster)?,
            data_dir: env.get("FELIX_DATA_DIR", |s| Ok(PathBuf::from(s)))?,
            quic_addr: env.parsed("FELIX_QUIC_ADDR")?,
            admin_addr: env.parsed("FELIX_ADMIN_ADDR")?,
            internal_addr: env.parsed("FELIX_INTERNAL_ADDR")?,
            object_store: env.get("FELIX_OBJECT_STORE", |s| Ok(s.to_owned()))?,
            tls_cert: env.get("FELIX_TLS_CERT", |s| Ok(PathBuf::from(s)))?,
            tls_key: env.get("FELIX_TLS_KEY", |s| Ok(PathBuf::from(s)))?,
            fsync: env.get("FELIX_DURABLE_FSYNC_MODE", |s| Ok(s.to_owned()))?,
            ack_on_commit: env.get("FELIX_ACK_ON_COMMIT", parse_bool)?,
            subscriber_queue_capacity: env.parsed("FELIX_SUBSCRIBER_QUEUE_CAPACITY")?,
            subscriber_queue_max_bytes: env.parsed("FELIX_SUBSCRIBER_QUEUE_MAX_BYTES")?,
            subscriber_egress_max_bytes: env.parsed("FELIX_SUBSCRIBER_EGRESS_MAX_BYTES")?,
            hot_read_cache_bytes: env.parsed("FELIX_HOT_READ_CACHE_BYTES")?,
            pub_queue_depth: env.parsed("FELIX_PUB_QUEUE_DEPTH")?,
            publish_queue_wait_timeout_ms: env.parsed("FELIX_PUBLISH_QUEUE_WAIT_TIMEOUT_MS")?,
            pub_ingress_wait: env.get("FELIX_PUB_INGRESS_WAIT", parse_bool)?,
            max_frame_bytes: env.parsed("FELIX_MAX_FRAME_BYTES")?,
            max_batch_bytes: env.parsed("FELIX_MAX_BATCH_BYTES")?,
            quic_idle_timeout_ms: env.parsed("FELIX_QUIC_IDLE_TIMEOUT_MS")?,
            max_connections: env.parsed("FELIX_MAX_CONNECTIONS")?,
            max_inflight_request_bytes: env.parsed("FELIX_MAX_INFLIGHT_REQUEST_BYTES")?,
            disk_reserve_bytes: env.parsed("FELIX_DISK_RESERVE_BYTES")?,
            meta_snapshot_logs: env.parsed("FELIX_META_SNAPSHOT_LOGS")?,
            segment_bytes: env.parsed("FELIX_SEGMENT_BYTES")?,
            segment_ms: env.parsed("FELIX_SEGMENT_MS")?,
            s3_endpoint: env.get("FELIX_S3_ENDPOINT", |s| Ok(s.to_owned()))?,
            s3_region: env.get("FELIX_S3_REGION", |s| Ok(s.to_owned()))?,
            s3_path_style: env.get("FELIX_S3_PATH_STYLE", parse_bool)?,
            object_store_timeout_ms: env.parsed("FELIX_OBJECT_STORE_TIMEOUT_MS")?,
            object_store_max_retries: env.parsed("FELIX_OBJECT_STORE_MAX_RETRIES")?,
            object_store_concurrency: env.parsed("FELIX_OBJECT_STORE_CONCURRENCY")?,
            cache_dir: env.get("FELIX_CACHE_DIR", |s| Ok(PathBuf::from(s)))?,
            cache_memory_bytes: env.parsed("FELIX_CACHE_MEMORY_BYTES")?,
            cache_disk_bytes: env.parsed("FELIX_CACHE_DISK_BYTES")?,
            cold_prefetch_row_groups: env.parsed("FELIX_COLD_PREFETCH_ROW_GROUPS")?,
            cold_decode_threads: env.parsed("FELIX_COLD_DECODE_THREADS")?,
            tier_row_group_bytes: env.parsed("FELIX_TIER_ROW_GROUP_BYTES")?,
            retention_check_ms: env.parsed("FELIX_RETENTION_CHECK_MS")?,
            publish_quorum_timeout_ms: env.parsed("FELIX_PUBLISH_QUORUM_TIMEOUT_MS")?,
            lease_ms: env.parsed("FELIX_LEASE_MS")?,
            kafka_addr: env.parsed("FELIX_KAFKA_ADDR")?,
            kafka_default_partitions: env.parsed("FELIX_KAFKA_DEFAULT_PARTITIONS")?,
            kafka_auto_create_topics: env.get("FELIX_KAFKA_AUTO_CREATE_TOPICS", parse_bool)?,
        })
    }
}

struct EnvReader<'a>(&'a dyn Fn(&str) -> Option<String>);

impl EnvReader<'_> {
    fn get<T>(
        &self,
        var: &'static str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ConfigError> {
        match (self.0)(var) {
            Some(value) if !value.trim().is_empty() => match parse(value.trim()) {
                Ok(v) => Ok(Some(v)),
                Err(message) => Err(ConfigError::Env {
                    var,
                    value,
                    message,
                }),
            },
            _ => Ok(None),
        }
    }

    fn parsed<T: FromStr>(&self, var: &'static str) -> Result<Option<T>, ConfigError>
    where
        T::Err: fmt::Display,
    {
        self.get(var, |s| s.parse::<T>().map_err(|e| e.to_string()))
    }
}

/// Parses `1=HOST:PORT,2=HOST:PORT`; an empty string is an empty cluster (one node).
pub fn parse_cluster(s: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| format!("cluster member {part:?} is not ID=HOST:PORT"))?;
        insert_member(&mut out, id, addr)?;
    }
    Ok(out)
}

fn insert_member(out: &mut BTreeMap<u64, String>, id: &str, addr: &str) -> Result<(), String> {
    let id: u64 = id
        .trim()
        .parse()
        .map_err(|_| format!("cluster node id {:?} is not a number", id.trim()))?;
    let addr = addr.trim();
    check_host_port(addr).map_err(|e| format!("cluster member {id}: {e}"))?;
    if out.insert(id, addr.to_owned()).is_some() {
        return Err(format!("cluster node id {id} appears twice"));
    }
    Ok(())
}

/// A peer address may name a host; it needs a non-empty host and a port.
fn check_host_port(addr: &str) -> Result<(), String> {
    let bad = || format!("address {addr:?} is not HOST:PORT");
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || host.contains(char::is_whitespace) || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    Ok(())
}

/// Parses `1/0`, `true/false`, `yes/no`, `on/off` (case-insensitive).
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean (expected 1/0/true/false)")),
    }
}

/// `cluster` in TOML: a table `{ "1" = "host:port", ... }` or the flag's string form;
/// written back as a table with ids in numeric order.
mod cluster_serde {
    use std::collections::BTreeMap;
    use std::fmt;

    use serde::de::{self, MapAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        cluster: &BTreeMap<u64, String>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_map(cluster.iter().map(|(id, addr)| (id.to_string(), addr)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<u64, String>, D::Error> {
        deserializer.deserialize_any(ClusterVisitor)
    }

    pub fn deserialize_opt<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<BTreeMap<u64, String>>, D::Error> {
        deserialize(deserializer).map(Some)
    }

    struct ClusterVisitor;

    impl<'de> Visitor<'de> for ClusterVisitor {
        type Value = BTreeMap<u64, String>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(r#"a table of node id = "HOST:PORT", or "1=HOST:PORT,2=HOST:PORT""#)
        }

        fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
            super::parse_cluster(s).map_err(E::custom)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((id, addr)) = map.next_entry::<String, String>()? {
                super::insert_member(&mut out, &id, &addr).map_err(de::Error::custom)?;
            }
            Ok(out)
        }
    }
}

impl BrokerConfig {
    /// Loads the configuration from the defaults, the TOML file, the process environment
    /// and `args` (the parsed flags), in increasing precedence, and validates it.
    pub fn load(args: &Args) -> Result<BrokerConfig, ConfigError> {
        BrokerConfig::from_sources(args, &|var| std::env::var(var).ok())
    }

    /// [`BrokerConfig::load`] with the environment given as a lookup function.
    pub fn from_sources(
        args: &Args,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<BrokerConfig, ConfigError> {
        let env = Args::from_env(env)?;
        let file = match args.config.as_deref().or(env.config.as_deref()) {
            Some(path) => Args::from_file(path)?,
            None => Args::default(),
        };
        BrokerConfig::resolve(file.overlaid_with(env).overlaid_with(args.clone()))
    }

    /// Fills the unset settings with their defaults, then validates.
    fn resolve(layer: Args) -> Result<BrokerConfig, ConfigError> {
        let d = BrokerConfig::default();
        let node_id = layer.node_id.unwrap_or(d.node_id);
        let cluster = layer.cluster.unwrap_or_default();
        let internal_addr = match (layer.internal_addr, cluster.get(&node_id)) {
            (Some(addr), _) => addr,
            (None, Some(member)) => member.parse().map_err(|_| {
                invalid(
                    "internal_addr",
                    format!(
                        "this node's cluster address {member:?} is not IP:PORT, so it cannot \
                         be listened on: set internal_addr to the local IP:PORT"
                    ),
                )
            })?,
            (None, None) => d.internal_addr,
        };
        let data_dir = layer.data_dir.unwrap_or(d.data_dir);
        let config = BrokerConfig {
            node_id,
            object_store: layer
                .object_store
                .unwrap_or_else(|| default_object_store(&data_dir)),
            data_dir,
            cluster,
            quic_addr: layer.quic_addr.unwrap_or(d.quic_addr),
            admin_addr: layer.admin_addr.unwrap_or(d.admin_addr),
            internal_addr,
            tls_cert: layer.tls_cert,
            tls_key: layer.tls_key,
            fsync: layer.fsync.unwrap_or(d.fsync),
            ack_on_commit: layer.ack_on_commit.unwrap_or(d.ack_on_commit),
            subscriber_queue_capacity: layer
                .subscriber_queue_capacity
                .unwrap_or(d.subscriber_queue_capacity),
            subscriber_queue_max_bytes: layer
                .subscriber_queue_max_bytes
                .unwrap_or(d.subscriber_queue_max_bytes),
            subscriber_egress_max_bytes: layer
                .subscriber_egress_max_bytes
                .unwrap_or(d.subscriber_egress_max_bytes),
            hot_read_cache_bytes: layer.hot_read_cache_bytes.unwrap_or(d.hot_read_cache_bytes),
            pub_queue_depth: layer.pub_queue_depth.unwrap_or(d.pub_queue_depth),
            publish_queue_wait_timeout_ms: layer
                .publish_queue_wait_timeout_ms
                .unwrap_or(d.publish_queue_wait_timeout_ms),
            pub_ingress_wait: layer.pub_ingress_wait.unwrap_or(d.pub_ingress_wait),
            max_frame_bytes: layer.max_frame_bytes.unwrap_or(d.max_frame_bytes),
            max_batch_bytes: layer.max_batch_bytes.unwrap_or(d.max_batch_bytes),
            quic_idle_timeout_ms: layer.quic_idle_timeout_ms.unwrap_or(d.quic_idle_timeout_ms),
            max_connections: layer.max_connections.unwrap_or(d.max_connections),
            max_inflight_request_bytes: layer
                .max_inflight_request_bytes
                .unwrap_or(d.max_inflight_request_bytes),
            disk_reserve_bytes: layer.disk_reserve_bytes.unwrap_or(d.disk_reserve_bytes),
            meta_snapshot_logs: layer.meta_snapshot_logs.unwrap_or(d.meta_snapshot_logs),
            segment_bytes: layer.segment_bytes.unwrap_or(d.segment_bytes),
            segment_ms: layer.segment_ms.unwrap_or(d.segment_ms),
            s3_endpoint: layer.s3_endpoint,
            s3_region: layer.s3_region,
            s3_path_style: layer.s3_path_style,
            object_store_timeout_ms: layer
                .object_store_timeout_ms
                .unwrap_or(d.object_store_timeout_ms),
            object_store_max_retries: layer
                .object_store_max_retries
                .unwrap_or(d.object_store_max_retries),
            object_store_concurrency: layer
                .object_store_concurrency
                .unwrap_or(d.object_store_concurrency),
            cache_dir: layer.cache_dir,
            cache_memory_bytes: layer.cache_memory_bytes.unwrap_or(d.cache_memory_bytes),
            cache_disk_bytes: layer.cache_disk_bytes.unwrap_or(d.cache_disk_bytes),
            cold_prefetch_row_groups: layer
                .cold_prefetch_row_groups
                .unwrap_or(d.cold_prefetch_row_groups),
            cold_decode_threads: layer.cold_decode_threads.unwrap_or(d.cold_decode_threads),
            tier_row_group_bytes: layer.tier_row_group_bytes.unwrap_or(d.tier_row_group_bytes),
            retention_check_ms: layer.retention_check_ms.unwrap_or(d.retention_check_ms),
            publish_quorum_timeout_ms: layer
                .publish_quorum_timeout_ms
                .unwrap_or(d.publish_quorum_timeout_ms),
            lease_ms: layer.lease_ms.unwrap_or(d.lease_ms),
            kafka_addr: layer.kafka_addr.unwrap_or(d.kafka_addr),
            kafka_default_partitions: layer
                .kafka_default_partitions
                .unwrap_or(d.kafka_default_partitions),
            kafka_auto_create_topics: layer
                .kafka_auto_create_topics
                .unwrap_or(d.kafka_auto_create_topics),
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the settings against each other; the first problem found is the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must not be empty"));
        }
        if !self.cluster.is_empty() {
            if !self.cluster.contains_key(&self.node_id) {
                let ids: Vec<String> = self.cluster.keys().map(u64::to_string).collect();
                return Err(invalid(
                    "cluster",
                    format!(
                        "does not contain this node's id {} (members: {})",
                        self.node_id,
                        ids.join(", ")
                    ),
                ));
            }
            for (id, addr) in &self.cluster {
                check_host_port(addr)
                    .map_err(|e| invalid("cluster", format!("member {id}: {e}")))?;
            }
        }
        if self.admin_addr == self.internal_addr {
            return Err(invalid(
                "admin_addr",
                format!(
                    "{} is also internal_addr; the admin and internal HTTP listeners need \
                     different addresses",
                    self.admin_addr
                ),
            ));
        }
        felix_cold::store::validate_url(&self.object_store).map_err(|e| {
            invalid(
                "object_store",
                e.to_string()
                    .trim_start_matches("bad object store URL: ")
                    .to_owned(),
            )
        })?;
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => {
                return Err(invalid("tls_cert", "is set without tls_key (--tls-key)"));
            }
            (None, Some(_)) => {
                return Err(invalid("tls_key", "is set without tls_cert (--tls-cert)"));
            }
            _ => {}
        }
        felix_hot::FsyncPolicy::from_str(&self.fsync).map_err(|e| invalid("fsync", e))?;
        let at_least_one = [
            (
                "subscriber_queue_capacity",
                self.subscriber_queue_capacity as u64,
            ),
            (
                "subscriber_queue_max_bytes",
                self.subscriber_queue_max_bytes as u64,
            ),
            (
                "subscriber_egress_max_bytes",
                self.subscriber_egress_max_bytes as u64,
            ),
            ("pub_queue_depth", self.pub_queue_depth as u64),
            ("max_frame_bytes", self.max_frame_bytes as u64),
            ("max_batch_bytes", self.max_batch_bytes as u64),
            ("quic_idle_timeout_ms", self.quic_idle_timeout_ms),
            ("max_connections", self.max_connections as u64),
            (
                "max_inflight_request_bytes",
                self.max_inflight_request_bytes as u64,
            ),
            ("meta_snapshot_logs", self.meta_snapshot_logs),
            ("segment_bytes", self.segment_bytes),
            ("segment_ms", self.segment_ms),
            ("object_store_timeout_ms", self.object_store_timeout_ms),
            (
                "object_store_concurrency",
                self.object_store_concurrency as u64,
            ),
            ("cache_memory_bytes", self.cache_memory_bytes as u64),
            ("tier_row_group_bytes", self.tier_row_group_bytes as u64),
            ("cold_decode_threads", self.cold_decode_threads as u64),
            ("retention_check_ms", self.retention_check_ms),
            ("publish_quorum_timeout_ms", self.publish_quorum_timeout_ms),
            ("lease_ms", self.lease_ms),
            (
                "kafka_default_partitions",
                self.kafka_default_partitions as u64,
            ),
        ];
        for (key, value) in at_least_one {
            if value == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if self.kafka_default_partitions > 4096 {
            return Err(invalid(
                "kafka_default_partitions",
                "must be at most 4096 (a stream's most shards)",
            ));
        }
        for (key, addr) in [
            ("admin_addr", self.admin_addr),
            ("internal_addr", self.internal_addr),
        ] {
            if addr == self.kafka_addr && addr.port() != 0 {
                return Err(invalid(
                    "kafka_addr",
                    format!("{addr} is also {key}; the Kafka listener needs an address of its own"),
                ));
            }
        }
        if self.max_frame_bytes > u32::MAX as usize {
            return Err(invalid(
                "max_frame_bytes",
                format!("must be at most {} (a frame's length is 32 bits)", u32::MAX),
            ));
        }
        if self.max_batch_bytes > self.max_frame_bytes {
            return Err(invalid(
                "max_batch_bytes",
                format!(
                    "{} exceeds max_frame_bytes {}: a batch must fit in a frame",
                    self.max_batch_bytes, self.max_frame_bytes
                ),
            ));
        }
        Ok(())
    }

    /// The shard logs' fsync policy. `fsync` is validated on load; an invalid value set
    /// afterwards falls back to the default (periodic, 250 ms).
    pub fn fsync_policy(&self) -> felix_hot::FsyncPolicy {
        self.fsync.parse().unwrap_or_default()
    }

    /// The object store's settings.
    pub fn store_config(&self) -> felix_cold::store::StoreConfig {
        felix_cold::store::StoreConfig {
            url: self.object_store.clone(),
            s3_endpoint: self.s3_endpoint.clone(),
            s3_region: self.s3_region.clone(),
            s3_path_style: self.s3_path_style.unwrap_or(self.s3_endpoint.is_some()),
            op_timeout: std::time::Duration::from_millis(self.object_store_timeout_ms),
            max_retries: self.object_store_max_retries,
            max_concurrency: self.object_store_concurrency,
            ..felix_cold::store::StoreConfig::default()
        }
    }

    /// The cold-read cache's settings.
    pub fn cache_config(&self) -> felix_cold::cache::CacheConfig {
        felix_cold::cache::CacheConfig {
            memory_bytes: self.cache_memory_bytes,
            disk_bytes: self.cache_disk_bytes,
            prefetch_row_groups: self.cold_prefetch_row_groups,
            decode_threads: self.cold_decode_threads,
            ..felix_cold::cache::CacheConfig::new(
                self.cache_dir
                    .clone()
                    .unwrap_or_else(|| self.data_dir.join("cache")),
            )
        }
    }

    /// The configuration as a TOML file that `--config` accepts (what `--check-config`
    /// prints).
    pub fn to_toml(&self) -> String {
        // Every field is a string, number, boolean or string-keyed table.
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render as TOML: {e}\n"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use clap::Parser;
    use felix_hot::FsyncPolicy;

    use super::*;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn flags(list: &[&str]) -> Args {
        let argv = std::iter::once("felix").chain(list.iter().copied());
        Cli::try_parse_from(argv).expect("valid flags").args
    }

    fn env(vars: &[(&str, &str)]) -> HashMap<String, String> {
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn load(args: &Args, vars: &HashMap<String, String>) -> Result<BrokerConfig, ConfigError> {
        BrokerConfig::from_sources(args, &|k| vars.get(k).cloned())
    }

    fn load_ok(args: &Args, vars: &HashMap<String, String>) -> BrokerConfig {
        load(args, vars).unwrap_or_else(|e| panic!("config refused: {e}"))
    }

    fn refused(args: &Args, vars: &HashMap<String, String>) -> String {
        match load(args, vars) {
            Ok(c) => panic!("config accepted: {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn write_file(dir: &tempfile::TempDir, text: &str) -> PathBuf {
        let path = dir.path().join("felix.toml");
        std::fs::write(&path, text).expect("write the config file");
        path
    }

    fn with_file(path: &Path, more: &[&str]) -> Args {
        let mut list = vec!["--config", path.to_str().expect("utf-8 temp path")];
        list.extend_from_slice(more);
        flags(&list)
    }

    #[test]
    fn no_sources_give_the_embedded_defaults() {
        let c = load_ok(&Args::default(), &HashMap::new());
        assert_eq!(c, BrokerConfig::default());
        assert_eq!(c.node_id, 1);
        assert!(c.cluster.is_empty());
        assert_eq!(c.data_dir, PathBuf::from("./felix-data"));
        assert_eq!(c.quic_addr.to_string(), "127.0.0.1:5000");
        assert_eq!(c.admin_addr.to_string(), "127.0.0.1:8080");
        assert_eq!(c.internal_addr.to_string(), "127.0.0.1:5100");
        assert!(c.object_store.starts_with("file:///"), "{}", c.object_store);
        assert!(
            c.object_store.ends_with("felix-data/objects"),
            "{}",
            c.object_store
        );
        assert_eq!(c.fsync_policy(), FsyncPolicy::default());
        assert!(c.ack_on_commit);
        assert_eq!(c.subscriber_queue_capacity, 512);
        assert_eq!(c.subscriber_queue_max_bytes, 128 << 20);
        assert_eq!(c.subscriber_egress_max_bytes, 256 << 20);
        assert_eq!(c.pub_queue_depth, 512);
        assert_eq!(c.publish_queue_wait_timeout_ms, 2000);
        assert_eq!(c.max_frame_bytes, 16 << 20);
        assert_eq!(c.max_batch_bytes, 8 << 20);
        assert_eq!(c.quic_idle_timeout_ms, 6000);
        assert_eq!(c.meta_snapshot_logs, 5000);
        assert_eq!(c.segment_bytes, 256 << 20);
        assert_eq!(c.segment_ms, 3_600_000);
    }

    #[test]
    fn file_beats_defaults_env_beats_file_and_flags_beat_env() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = write_file(
            &dir,
            r#"
            pub_queue_depth = 10
            subscriber_queue_capacity = 20
            max_batch_bytes = 1000
            quic_addr = "127.0.0.1:6000"
            "#,
        );
        let vars = env(&[
            ("FELIX_SUBSCRIBER_QUEUE_CAPACITY", "30"),
            ("FELIX_MAX_BATCH_BYTES", "2000"),
        ]);
        let c = load_ok(&with_file(&path, &["--max-batch-bytes", "3000"]), &vars);
        assert_eq!(c.pub_queue_depth, 10, "file over default");
        assert_eq!(c.subscriber_queue_capacity, 30, "env over file");
        assert_eq!(c.max_batch_bytes, 3000, "flag over env");
        assert_eq!(c.quic_addr.to_string(), "127.0.0.1:6000");
        assert_eq!(
            c.segment_ms, 3_600_000,
            "untouched setting keeps its default"
        );
    }

    #[test]
    fn config_file_can_be_named_by_felix_config() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = write_file(&dir, "node_id = 7\n");
        let vars = env(&[(CONFIG_ENV, path.to_str().expect("utf-8"))]);
        assert_eq!(load_ok(&Args::default(), &vars).node_id, 7);
    }

    #[test]
    fn every_documented_env_var_is_read() {
        let vars = env(&[
            ("FELIX_NODE_ID", "2"),
            ("FELIX_CLUSTER", "1=127.0.0.1:7101,2=127.0.0.1:7102"),
            ("FELIX_DATA_DIR", "/tmp/felix-env"),
            ("FELIX_QUIC_ADDR", "0.0.0.0:5001"),
            ("FELIX_ADMIN_ADDR", "0.0.0.0:8081"),
            ("FELIX_OBJECT_STORE", "s3://bucket/prefix"),
            ("FELIX_TLS_CERT", "/etc/felix/cert.pem"),
            ("FELIX_TLS_KEY", "/etc/felix/key.pem"),
            ("FELIX_DURABLE_FSYNC_MODE", "on_commit"),
            ("FELIX_ACK_ON_COMMIT", "0"),
            ("FELIX_SUBSCRIBER_QUEUE_CAPACITY", "11"),
            ("FELIX_SUBSCRIBER_QUEUE_MAX_BYTES", "12"),
            ("FELIX_SUBSCRIBER_EGRESS_MAX_BYTES", "13"),
            ("FELIX_PUB_QUEUE_DEPTH", "14"),
            ("FELIX_PUBLISH_QUEUE_WAIT_TIMEOUT_MS", "15"),
            ("FELIX_MAX_FRAME_BYTES", "1600"),
            ("FELIX_MAX_BATCH_BYTES", "17"),
            ("FELIX_QUIC_IDLE_TIMEOUT_MS", "18"),
            ("FELIX_META_SNAPSHOT_LOGS", "19"),
            ("FELIX_SEGMENT_BYTES", "20"),
            ("FELIX_SEGMENT_MS", "21"),
        ]);
        let c = load_ok(&Args::default(), &vars);
        assert_eq!(c.node_id, 2);
        assert_eq!(c.cluster.len(), 2);
        assert_eq!(c.internal_addr.to_string(), "127.0.0.1:7102");
        assert_eq!(c.data_dir, PathBuf::from("/tmp/felix-env"));
        assert_eq!(c.quic_addr.to_string(), "0.0.0.0:5001");
        assert_eq!(c.admin_addr.to_string(), "0.0.0.0:8081");
        assert_eq!(c.object_store, "s3://bucket/prefix");
        assert_eq!(c.tls_cert, Some(PathBuf::from("/etc/felix/cert.pem")));
        assert_eq!(c.tls_key, Some(PathBuf::from("/etc/felix/key.pem")));
        assert_eq!(c.fsync_policy(), FsyncPolicy::OnCommit);
        assert!(!c.ack_on_commit);
        let numbers = [
            c.subscriber_queue_capacity as u64,
            c.subscriber_queue_max_bytes as u64,
            c.subscriber_egress_max_bytes as u64,
            c.pub_queue_depth as u64,
            c.publish_queue_wait_timeout_ms,
            c.max_frame_bytes as u64,
            c.max_batch_bytes as u64,
            c.quic_idle_timeout_ms,
            c.meta_snapshot_logs,
            c.segment_bytes,
            c.segment_ms,
        ];
        assert_eq!(numbers, [11, 12, 13, 14, 15, 1600, 17, 18, 19, 20, 21]);
        let internal = env(&[("FELIX_INTERNAL_ADDR", "0.0.0.0:5200")]);
        assert_eq!(
            load_ok(&Args::default(), &internal)
                .internal_addr
                .to_string(),
            "0.0.0.0:5200"
        );
    }

    #[test]
    fn every_flag_is_kebab_case_of_its_key() {
        let c = load_ok(
            &flags(&[
                "--node-id=3",
                "--cluster=1=10.0.0.1:7101,3=127.0.0.1:7103",
                "--data-dir=/tmp/felix-flags",
                "--quic-addr=127.0.0.1:1",
                "--admin-addr=127.0.0.1:2",
                "--internal-addr=127.0.0.1:3",
                "--object-store=file:///tmp/objects",
                "--tls-cert=c.pem",
                "--tls-key=k.pem",
                "--fsync=periodic:100",
                "--ack-on-commit=false",
                "--subscriber-queue-capacity=1",
                "--subscriber-queue-max-bytes=2",
                "--subscriber-egress-max-bytes=3",
                "--pub-queue-depth=4",
                "--publish-queue-wait-timeout-ms=0",
                "--max-frame-bytes=6",
                "--max-batch-bytes=6",
                "--quic-idle-timeout-ms=7",
                "--meta-snapshot-logs=8",
                "--segment-bytes=9",
                "--segment-ms=10",
            ]),
            &HashMap::new(),
        );
        assert_eq!(c.node_id, 3);
        assert_eq!(c.internal_addr.to_string(), "127.0.0.1:3");
        assert_eq!(
            c.fsync_policy(),
            FsyncPolicy::Periodic {
                interval: Duration::from_millis(100)
            }
        );
        assert!(!c.ack_on_commit);
        assert_eq!(c.publish_queue_wait_timeout_ms, 0);
        assert_eq!(c.segment_ms, 10);
    }

    #[test]
    fn ack_on_commit_accepts_0_1_true_false() {
        for (value, expected) in [("0", false), ("1", true), ("false", false), ("TRUE", true)] {
            let c = load_ok(&Args::default(), &env(&[("FELIX_ACK_ON_COMMIT", value)]));
            assert_eq!(c.ack_on_commit, expected, "FELIX_ACK_ON_COMMIT={value}");
        }
        let bare = flags(&["--ack-on-commit"]);
        let vars = env(&[("FELIX_ACK_ON_COMMIT", "0")]);
        assert!(
            load_ok(&bare, &vars).ack_on_commit,
            "a bare flag means true"
        );
        let msg = refused(&Args::default(), &env(&[("FELIX_ACK_ON_COMMIT", "maybe")]));
        assert!(msg.contains("FELIX_ACK_ON_COMMIT"), "{msg}");
    }

    #[test]
    fn an_empty_env_var_counts_as_unset() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = write_file(&dir, "pub_queue_depth = 9\n");
        let vars = env(&[("FELIX_PUB_QUEUE_DEPTH", ""), ("FELIX_CLUSTER", " ")]);
        assert_eq!(load_ok(&with_file(&path, &[]), &vars).pub_queue_depth, 9);
    }

    #[test]
    fn cluster_is_a_table_or_a_string_in_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let table = write_file(
            &dir,
            "node_id = 2\n[cluster]\n1 = \"127.0.0.1:7101\"\n2 = \"127.0.0.1:7102\"\n",
        );
        let a = load_ok(&with_file(&table, &[]), &HashMap::new());
        let string = write_file(
            &dir,
            "node_id = 2\ncluster = \"1=127.0.0.1:7101, 2=127.0.0.1:7102\"\n",
        );
        let b = load_ok(&with_file(&string, &[]), &HashMap::new());
        assert_eq!(a, b);
        assert_eq!(
            a.cluster.get(&1).map(String::as_str),
            Some("127.0.0.1:7101")
        );
        assert_eq!(a.internal_addr.to_string(), "127.0.0.1:7102");
    }

    #[test]
    fn internal_addr_follows_this_nodes_cluster_entry_unless_set() {
        let cluster = "--cluster=1=127.0.0.1:7101,2=127.0.0.1:7102";
        let c = load_ok(&flags(&["--node-id=1", cluster]), &HashMap::new());
        assert_eq!(c.internal_addr.to_string(), "127.0.0.1:7101");
        let c = load_ok(
            &flags(&["--node-id=1", cluster, "--internal-addr=0.0.0.0:7101"]),
            &HashMap::new(),
        );
        assert_eq!(c.internal_addr.to_string(), "0.0.0.0:7101");
        assert_eq!(
            c.cluster.get(&1).map(String::as_str),
            Some("127.0.0.1:7101")
        );
        let hostname = flags(&["--cluster=1=meta-1.internal:7101"]);
        let msg = refused(&hostname, &HashMap::new());
        assert!(msg.contains("internal_addr"), "{msg}");
        let mut with_listen = hostname.clone();
        with_listen.internal_addr = Some("0.0.0.0:7101".parse().expect("addr"));
        load_ok(&with_listen, &HashMap::new());
    }

    #[test]
    fn object_store_defaults_under_the_effective_data_dir() {
        let c = load_ok(&flags(&["--data-dir=/srv/felix"]), &HashMap::new());
        assert_eq!(c.object_store, "file:///srv/felix/objects");
        let c = load_ok(
            &flags(&["--data-dir=/srv/felix", "--object-store=s3://bucket/p"]),
            &HashMap::new(),
        );
        assert_eq!(c.object_store, "s3://bucket/p");
    }

    #[test]
    fn an_unknown_file_key_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = write_file(&dir, "pub_queue_depht = 10\n");
        let msg = refused(&with_file(&path, &[]), &HashMap::new());
        assert!(msg.contains("pub_queue_depht"), "{msg}");
        assert!(msg.contains("felix.toml"), "{msg}");
        let path = write_file(&dir, "config = \"other.toml\"\n");
        refused(&with_file(&path, &[]), &HashMap::new());
    }

    #[test]
    fn a_missing_config_file_is_refused() {
        let msg = refused(
            &flags(&["--config=/nonexistent/felix.toml"]),
            &HashMap::new(),
        );
        assert!(msg.contains("/nonexistent/felix.toml"), "{msg}");
    }

    #[test]
    fn a_bad_address_is_refused_from_every_source() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = write_file(&dir, "admin_addr = \"localhost\"\n");
        let msg = refused(&with_file(&path, &[]), &HashMap::new());
        assert!(msg.contains("admin_addr"), "{msg}");
        let msg = refused(&Args::default(), &env(&[("FELIX_QUIC_ADDR", "nowhere:x")]));
        assert!(msg.contains("FELIX_QUIC_ADDR"), "{msg}");
        assert!(Cli::try_parse_from(["felix", "--quic-addr", "5000"]).is_err());
        assert!(Cli::try_parse_from(["felix", "--cluster=1=127.0.0.1"]).is_err());
        let msg = refused(&Args::default(), &env(&[("FELIX_CLUSTER", "1=127.0.0.1")]));
        assert!(
            msg.contains("FELIX_CLUSTER") && msg.contains("HOST:PORT"),
            "{msg}"
        );
        let msg = refused(&flags(&["--admin-addr=127.0.0.1:5100"]), &HashMap::new());
        assert!(msg.contains("internal_addr"), "{msg}");
    }

    #[test]
    fn a_bad_fsync_mode_is_refused() {
        for mode in ["always", "periodic:0", "periodic:x"] {
            let msg = refused(&flags(&["--fsync", mode]), &HashMap::new());
            assert!(msg.contains("fsync"), "{msg}");
        }
        let msg = refused(
            &Args::default(),
            &env(&[("FELIX_DURABLE_FSYNC_MODE", "never")]),
        );
        assert!(msg.contains("FELIX_DURABLE_FSYNC_MODE"), "{msg}");
    }

    #[test]
    fn a_certificate_needs_its_key() {
        let msg = refused(&flags(&["--tls-cert=c.pem"]), &HashMap::new());
        assert!(msg.contains("tls_key"), "{msg}");
        let msg = refused(&flags(&["--tls-key=k.pem"]), &HashMap::new());
        assert!(msg.contains("tls_cert"), "{msg}");
    }

    #[test]
    fn a_cluster_must_contain_this_node() {
        let msg = refused(
            &flags(&["--node-id=4", "--cluster=1=127.0.0.1:1,2=127.0.0.1:2"]),
            &HashMap::new(),
        );
        assert!(msg.contains("node's id 4"), "{msg}");
        assert!(Cli::try_parse_from(["felix", "--cluster=1=a:1,1=b:2"]).is_err());
    }

    #[test]
    fn zero_capacities_are_refused() {
        for key in [
            "subscriber_queue_capacity",
            "subscriber_queue_max_bytes",
            "subscriber_egress_max_bytes",
            "pub_queue_depth",
            "max_frame_bytes",
            "max_batch_bytes",
            "quic_idle_timeout_ms",
            "meta_snapshot_logs",
            "segment_bytes",
            "segment_ms",
        ] {
            let flag = format!("--{}=0", key.replace('_', "-"));
            let msg = refused(&flags(&[&flag]), &HashMap::new());
            assert!(msg.starts_with(key), "{msg}");
            assert!(msg.contains("at least 1"), "{msg}");
        }
    }

    #[test]
    fn a_batch_must_fit_in_a_frame() {
        let msg = refused(
            &flags(&["--max-frame-bytes=1000", "--max-batch-bytes=1001"]),
            &HashMap::new(),
        );
        assert!(msg.contains("max_batch_bytes"), "{msg}");
    }

    #[test]
    fn the_printed_config_loads_back_unchanged() {
        let c = load_ok(
            &flags(&[
                "--node-id=2",
                "--cluster=1=127.0.0.1:7101,2=127.0.0.1:7102,10=127.0.0.1:7110",
                "--tls-cert=c.pem",
                "--tls-key=k.pem",
                "--fsync=on_commit",
            ]),
            &HashMap::new(),
        );
        let text = c.to_toml();
        assert!(text.contains("node_id = 2"), "{text}");
        let dir = tempfile::tempdir().expect("temp dir");
        let path = write_file(&dir, &text);
        assert_eq!(load_ok(&with_file(&path, &[]), &HashMap::new()), c);
        let back: BrokerConfig = toml::from_str(&text).expect("parses as a BrokerConfig");
        assert_eq!(back, c);
        let defaults = BrokerConfig::default().to_toml();
        assert!(!defaults.contains("tls_cert"), "{defaults}");
        let path = write_file(&dir, &defaults);
        assert_eq!(
            load_ok(&with_file(&path, &[]), &HashMap::new()),
            BrokerConfig::default()
        );
    }

    #[test]
    fn kafka_settings_default_and_come_from_every_source() {
        let c = load_ok(&Args::default(), &HashMap::new());
        assert_eq!(c.kafka_addr.to_string(), "127.0.0.1:9092");
        assert_eq!(c.kafka_default_partitions, 1);
        assert!(c.kafka_auto_create_topics);
        let vars = env(&[
            ("FELIX_KAFKA_ADDR", "127.0.0.1:19092"),
            ("FELIX_KAFKA_DEFAULT_PARTITIONS", "3"),
            ("FELIX_KAFKA_AUTO_CREATE_TOPICS", "0"),
        ]);
        let c = load_ok(&Args::default(), &vars);
        assert_eq!(c.kafka_addr.to_string(), "127.0.0.1:19092");
        assert_eq!(c.kafka_default_partitions, 3);
        assert!(!c.kafka_auto_create_topics);
        let c = load_ok(
            &flags(&[
                "--kafka-addr=127.0.0.1:29092",
                "--kafka-default-partitions=4",
                "--kafka-auto-create-topics",
            ]),
            &vars,
        );
        assert_eq!(c.kafka_addr.to_string(), "127.0.0.1:29092");
        assert_eq!(c.kafka_default_partitions, 4);
        assert!(c.kafka_auto_create_topics);
        let msg = refused(&flags(&["--kafka-default-partitions=0"]), &HashMap::new());
        assert!(msg.starts_with("kafka_default_partitions"), "{msg}");
        let msg = refused(&flags(&["--kafka-addr=127.0.0.1:8080"]), &HashMap::new());
        assert!(msg.contains("kafka_addr"), "{msg}");
    }
}
