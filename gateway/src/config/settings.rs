//! Every setting of a broker node, declared once: its name (the TOML key, and in kebab case
//! the flag), its environment variable, its type, its default and its description, which
//! is both the `--help` text and the row of docs/configuration.md.
//!
//! [`settings!`] turns the declarations into the two shapes the rest of the module needs:
//! [`Args`], one source's layer with every setting optional (the flags, the TOML file, the
//! environment), and [`BrokerConfig`], the resolved settings the broker reads. Invariant:
//! a setting added here is at once a flag, a variable, a file key, a printed key and a
//! documented row; nothing else lists the settings.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use super::cluster::{cluster_serde, listen_addr, parse_cluster};
use super::secret::{ClusterSecret, parse_secret};
use super::sources::parse_bool;
use super::{
    CONFIG_ENV, ConfigError, MIB, all_loopback, at_least_one, default_object_store,
    fault_injection_only, ip_port,
};

/// The resolved type of a setting: its declared type, or an `Option` when it has no default.
macro_rules! resolved_type {
    ($ty:ty) => { Option<$ty> };
    ($ty:ty, $default:expr) => { $ty };
}

/// A layer's value, or the setting's default when it has one.
macro_rules! or_default {
    ($value:expr) => {
        $value
    };
    ($value:expr, $default:expr) => {
        match $value {
            Some(value) => value,
            None => $default,
        }
    };
}

/// Each setting is `/// description`, `#[arg(env = "FELIX_…", …)]` (clap's attributes; the
/// flag is always `--` and the key in kebab case), optional `#[serde(…)]`, then
/// `key: Type = default` (no default: unset unless a source sets it), optionally followed by
/// `, check` (a function run on the resolved value by [`BrokerConfig::check_each`]).
/// A default may use the settings declared before it, resolved.
macro_rules! settings {
    ($(
        $(#[doc = $doc:literal])*
        #[arg($($arg:tt)*)]
        $(#[serde($($serde:tt)*)])*
        $key:ident : $ty:ty $(= $default:expr)? $(, $check:ident)?
    );* $(;)?) => {
        /// One source's settings, every one optional: the command-line flags, and the shape
        /// of the TOML file and of the environment layer. Unset fields fall through to the
        /// source below.
        #[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct Args {
            /// TOML file of settings; its keys are the setting names, and flags and FELIX_*
            /// variables override it.
            #[arg(long, value_name = "FILE", env = CONFIG_ENV)]
            #[serde(skip)]
            pub config: Option<PathBuf>,
            $(
                $(#[doc = $doc])*
                #[arg(long, $($arg)*)]
                $(#[serde($($serde)*)])*
                pub $key: Option<$ty>,
            )*
        }

        /// The effective configuration of a broker node.
        #[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct BrokerConfig {
            $(
                $(#[doc = $doc])*
                $(#[serde($($serde)*)])*
                pub $key: resolved_type!($ty $(, $default)?),
            )*
        }

        impl Args {
            /// This layer with `higher`'s settings on top.
            pub(super) fn overlaid_with(self, higher: Args) -> Args {
                Args {
                    config: higher.config.or(self.config),
                    $($key: higher.$key.or(self.$key),)*
                }
            }

            /// The settings this layer leaves unset take their defaults, in declaration order.
            pub(super) fn with_defaults(self) -> Result<BrokerConfig, ConfigError> {
                $(let $key = or_default!(self.$key $(, $default)?);)*
                Ok(BrokerConfig { $($key,)* })
            }
        }

        impl BrokerConfig {
            /// Runs each setting's own check, in declaration order.
            pub(super) fn check_each(&self) -> Result<(), ConfigError> {
                $($($check(stringify!($key), self.$key as u64)?;)?)*
                Ok(())
            }
        }
    };
}

settings! {
    /// This node's id: its broker id (in `HelloOk`) and its control-plane (Raft) member id.
    /// A new id beside a running cluster (listed in `cluster` with the running members)
    /// joins it by itself on the first start: a learner, then a voter once caught up; a
    /// restart part-way resumes the join. An id the cluster has at another address is
    /// refused at start.
    ///
    /// Default: `1`
    #[arg(env = "FELIX_NODE_ID", value_name = "ID")]
    node_id: u64 = 1;

    /// Every control-plane member's internal address, this node included:
    /// `1=HOST:PORT,2=HOST:PORT,3=HOST:PORT` (in TOML, that string or a table).
    ///
    /// Empty: a one-member group. Must contain `node_id`. To scale out, start the new broker
    /// with a new `node_id` and the running members plus itself here: it joins by itself
    /// (the running members need not be restarted). See docs/control-plane.md for how a
    /// group forms and grows.
    ///
    /// Default: empty
    #[arg(env = "FELIX_CLUSTER", value_name = "ID=HOST:PORT,...", value_parser = parse_cluster)]
    #[serde(default, with = "cluster_serde", skip_serializing_if = "BTreeMap::is_empty")]
    cluster: BTreeMap<u64, String> = BTreeMap::new();

    /// This broker's failure domain (an availability zone, a rack): a shard's replicas are
    /// placed, drained and rebalanced onto distinct zones when there are enough live
    /// brokers in distinct zones. Letters, digits, `.`, `_` and `-`, at most 64.
    ///
    /// Default: unset (each broker is its own zone)
    #[arg(env = "FELIX_ZONE", value_name = "ZONE")]
    zone: String;

    /// Where the node keeps its state: stream logs (`streams/`), the control plane (`meta/`),
    /// the generated TLS files (`tls/`), Kafka consumer-group offsets (`kafka/`).
    ///
    /// Created if missing.
    ///
    /// Default: `./felix-data`
    #[arg(env = "FELIX_DATA_DIR", value_name = "DIR")]
    data_dir: PathBuf = PathBuf::from("./felix-data");

    /// The QUIC client listener (UDP).
    ///
    /// Port 0 picks a free port; the ready line shows it.
    ///
    /// Default: `127.0.0.1:5000`
    #[arg(env = "FELIX_QUIC_ADDR", value_name = "IP:PORT")]
    quic_addr: SocketAddr = ip_port("127.0.0.1:5000");

    /// Admin HTTP (TCP): `/metrics`, `/healthz`, `/v1/...` (below).
    ///
    /// Default: `127.0.0.1:8080`
    #[arg(env = "FELIX_ADMIN_ADDR", value_name = "IP:PORT")]
    admin_addr: SocketAddr = ip_port("127.0.0.1:8080");

    /// Where the control plane's internal HTTP server listens (Raft RPCs, forwarded proposals).
    ///
    /// Set it when the cluster entry is a host name or a different interface (e.g. `cluster`
    /// says `10.0.0.1:5100`, listen on `0.0.0.0:5100`). Peers always reach the node at its
    /// `cluster` entry.
    ///
    /// Default: this node's entry in `cluster`, else `127.0.0.1:5100`
    #[arg(env = "FELIX_INTERNAL_ADDR", value_name = "IP:PORT")]
    internal_addr: SocketAddr = listen_addr(node_id, &cluster, ip_port("127.0.0.1:5100"))?;

    /// Where sealed segments are tiered: `file:///path`, `memory://` (kept in memory, lost on
    /// exit: tests), or `s3://bucket/prefix`.
    ///
    /// For S3, credentials and region come from the standard AWS chain (environment, profile,
    /// web identity, instance metadata). See docs/tiering.md.
    ///
    /// Default: `file://<data_dir>/objects`
    #[arg(env = "FELIX_OBJECT_STORE", value_name = "URL")]
    object_store: String = default_object_store(&data_dir);

    /// Endpoint of an S3-compatible server (MinIO, SeaweedFS, Ceph...), e.g.
    /// `http://127.0.0.1:8333`; `http://` is allowed.
    ///
    /// Default: unset (AWS)
    #[arg(env = "FELIX_S3_ENDPOINT", value_name = "URL")]
    s3_endpoint: String;

    /// S3 region.
    ///
    /// Default: the AWS chain's, else `us-east-1`
    #[arg(env = "FELIX_S3_REGION", value_name = "REGION")]
    s3_region: String;

    /// Path-style requests (bucket in the path, not the host name), which most S3-compatible
    /// servers need.
    ///
    /// Default: `true` with `s3_endpoint`, else `false`
    #[arg(env = "FELIX_S3_PATH_STYLE", value_name = "BOOL", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    s3_path_style: bool;

    /// Timeout of one attempt of an object-store call.
    ///
    /// Default: `30000`
    #[arg(env = "FELIX_OBJECT_STORE_TIMEOUT_MS", value_name = "MS")]
    object_store_timeout_ms: u64 = 30_000, at_least_one;

    /// Retries of a failed call (timeouts, 5xx, connection errors), with exponential backoff
    /// and jitter.
    ///
    /// Uploads are retried without end on top of this.
    ///
    /// Default: `5`
    #[arg(env = "FELIX_OBJECT_STORE_MAX_RETRIES", value_name = "N")]
    object_store_max_retries: usize = 5;

    /// Object-store calls in flight at once, uploads and cold reads together.
    ///
    /// Default: `16`
    #[arg(env = "FELIX_OBJECT_STORE_CONCURRENCY", value_name = "N")]
    object_store_concurrency: usize = 16, at_least_one;

    /// Disk tier of the cold-read cache.
    ///
    /// Safe to delete while the broker is stopped.
    ///
    /// Default: `<data_dir>/cache`
    #[arg(env = "FELIX_CACHE_DIR", value_name = "DIR")]
    cache_dir: PathBuf;

    /// Memory tier of the cold-read cache (object footers and row groups as fetched).
    ///
    /// Default: `67108864` (64 MiB)
    #[arg(env = "FELIX_CACHE_MEMORY_BYTES", value_name = "BYTES")]
    cache_memory_bytes: usize = 64 * MIB, at_least_one;

    /// Disk tier of the cold-read cache; `0` keeps it in memory only.
    ///
    /// A fixed size, never a share of free disk.
    ///
    /// Default: `1073741824` (1 GiB)
    #[arg(env = "FELIX_CACHE_DISK_BYTES", value_name = "BYTES")]
    cache_disk_bytes: u64 = 1024 * MIB as u64;

    /// Memory the in-memory caches of this broker may hold (keys and values of the shards it
    /// owns); past it a put evicts other entries of its shard, best-effort and in no
    /// guaranteed order. Log-backed caches do not count: they compact instead.
    ///
    /// Default: `268435456` (256 MiB)
    #[arg(env = "FELIX_KV_MEMORY_BYTES", value_name = "BYTES")]
    kv_memory_bytes: u64 = 256 * MIB as u64, at_least_one;

    /// Row groups a sequential cold reader fetches ahead (also across objects), at least:
    /// more when the store's measured GET time calls for it (docs/tiering.md); `0` turns
    /// read-ahead off.
    ///
    /// Default: `2`
    #[arg(env = "FELIX_COLD_PREFETCH_ROW_GROUPS", value_name = "N")]
    cold_prefetch_row_groups: usize = 2;

    /// Bytes a broker's cold readers may have fetched ahead and not yet read, together (as
    /// fetched, compressed). Read-ahead beyond it waits for readers to catch up.
    ///
    /// Default: `67108864` (64 MiB)
    #[arg(env = "FELIX_COLD_READ_AHEAD_BYTES", value_name = "BYTES")]
    cold_read_ahead_bytes: u64 = 64 * MIB as u64, at_least_one;

    /// Benchmark tool, not a production setting (refused without `FELIX_FAULT_INJECTION=1`):
    /// every GET to the object store first waits this long, as a distant store's first
    /// byte would.
    ///
    /// Default: `0` (off)
    #[arg(env = "FELIX_OBJECT_STORE_GET_LATENCY_MS", value_name = "MS")]
    object_store_get_latency_ms: u64 = 0, fault_injection_only;

    /// Benchmark tool (`FELIX_FAULT_INJECTION=1` only): up to this much more first-byte
    /// latency per GET, drawn uniformly (a tail).
    ///
    /// Default: `0` (off)
    #[arg(env = "FELIX_OBJECT_STORE_GET_JITTER_MS", value_name = "MS")]
    object_store_get_jitter_ms: u64 = 0, fault_injection_only;

    /// Benchmark tool (`FELIX_FAULT_INJECTION=1` only): the bandwidth of one GET to the
    /// object store, as a distant store caps a connection's.
    ///
    /// Default: `0` (unlimited)
    #[arg(env = "FELIX_OBJECT_STORE_GET_BYTES_PER_SEC", value_name = "BYTES")]
    object_store_get_bytes_per_sec: u64 = 0, fault_injection_only;

    /// Benchmark tool (`FELIX_FAULT_INJECTION=1` only): cold reads skip the content-digest
    /// check of rebuilt row groups, to measure what the check costs. Never in production:
    /// bytes that rotted in a way Parquet still decodes would be served.
    ///
    /// Default: `false`
    #[arg(env = "FELIX_COLD_SKIP_CONTENT_DIGESTS", value_name = "BOOL", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    cold_skip_content_digests: bool = false, fault_injection_only;

    /// Threads that decode row groups fetched from the object store, shared by every cold
    /// reader, at nice +10 so replays yield CPU to publishing; at least 1.
    ///
    /// Default: `2`
    #[arg(env = "FELIX_COLD_DECODE_THREADS", value_name = "N")]
    cold_decode_threads: usize = 2, at_least_one;

    /// Input bytes per Parquet row group of an uploaded object: the unit of a cold ranged GET.
    ///
    /// Default: `4194304` (4 MiB)
    #[arg(env = "FELIX_TIER_ROW_GROUP_BYTES", value_name = "BYTES")]
    tier_row_group_bytes: usize = 4 * MIB, at_least_one;

    /// How often each shard applies its retention settings (and at once after `stream alter`).
    ///
    /// Default: `10000`
    #[arg(env = "FELIX_RETENTION_CHECK_MS", value_name = "MS")]
    retention_check_ms: u64 = 10_000, at_least_one;

    /// How long a publish to a Quorum stream waits for a majority of its replicas before it is
    /// answered `quorum_timeout` (outcome unknown: the record may have landed).
    ///
    /// See docs/replication.md.
    ///
    /// Default: `5000`
    #[arg(env = "FELIX_PUBLISH_QUORUM_TIMEOUT_MS", value_name = "MS")]
    publish_quorum_timeout_ms: u64 = 5_000, at_least_one;

    /// Shard-leader lease in a cluster.
    ///
    /// A broker that cannot renew it for this long stops acknowledging writes and serving reads
    /// (`fenced`); once the control plane sees it lapse, the broker's Quorum shards move to an
    /// in-sync replica. Failover takes about one lease. Use the same value on every member.
    ///
    /// Default: `10000`
    #[arg(env = "FELIX_LEASE_MS", value_name = "MS")]
    lease_ms: u64 = 10_000, at_least_one;

    /// How long a publish that reaches a shard while it is handed over to another broker
    /// (a drain, a rebalance, `felixctl shard move`) is held before it is refused.
    ///
    /// Held publishes are forwarded to the new leader once it leads; only a hand-over longer
    /// than this refuses one, as `shard_unavailable` with reason `moving`, unwritten. See
    /// docs/shard-moves.md.
    ///
    /// Default: `2000`
    #[arg(env = "FELIX_SHARD_MOVE_HOLD_MS", value_name = "MS")]
    shard_move_hold_ms: u64 = 2_000, at_least_one;

    /// How long a broker's lease must have been lapsed before the control plane moves its
    /// follower replicas to live brokers, so the cluster returns to full replication.
    ///
    /// A Leader stream's shard the dead broker leads is not moved: it waits for that broker.
    /// Use the same value on every member (the control plane's leader applies its own). See
    /// docs/shard-moves.md.
    ///
    /// Default: `600000` (10 minutes)
    #[arg(env = "FELIX_REPLICA_REPLACE_AFTER_MS", value_name = "MS")]
    replica_replace_after_ms: u64 = 600_000, at_least_one;

    /// PEM certificate chain (leaf first) the QUIC listener presents.
    ///
    /// Needs `tls_key`. Without both, a CA and a certificate for `localhost`, `127.0.0.1` and
    /// `::1` are generated under `<data_dir>/tls/` on the first start and reused afterwards;
    /// clients trust `<data_dir>/tls/ca.pem`.
    ///
    /// Default: none
    #[arg(env = "FELIX_TLS_CERT", value_name = "FILE")]
    tls_cert: PathBuf;

    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `tls_cert`.
    ///
    /// Default: none
    #[arg(env = "FELIX_TLS_KEY", value_name = "FILE")]
    tls_key: PathBuf;

    /// When durable streams' logs are flushed to the device: `periodic` (every 250 ms),
    /// `periodic:MS`, or `on_commit` (before every acknowledgement).
    ///
    /// What each survives: docs/durability.md.
    ///
    /// Default: `periodic`
    #[arg(env = "FELIX_DURABLE_FSYNC_MODE", value_name = "MODE")]
    fsync: String = "periodic".to_owned();

    /// `true`: a durable publish is acknowledged once it is written under the fsync policy.
    ///
    /// `false` (`FELIX_ACK_ON_COMMIT=0`): once it is queued, before the write — faster, and
    /// lost if the broker crashes first or (in a cluster) its lease lapses before the write;
    /// near the end of the lease it waits for the write (docs/replication.md). A bare
    /// `--ack-on-commit` means `true`.
    ///
    /// Default: `true`
    #[arg(env = "FELIX_ACK_ON_COMMIT", value_name = "BOOL", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    ack_on_commit: bool = true;

    /// Buffer slots per subscriber.
    ///
    /// When a subscriber's queue is full, new events are dropped for that subscriber only (a
    /// durable subscription then ends with `subscription_lagged`, unless its client did not
    /// offer that feature: then it carries on past an offset jump). The broker logs a
    /// subscriber falling behind once per episode (see docs/operations.md).
    ///
    /// Default: `512`
    #[arg(env = "FELIX_SUBSCRIBER_QUEUE_CAPACITY", value_name = "N")]
    subscriber_queue_capacity: usize = 512, at_least_one;

    /// Payload bytes one subscriber's queue may hold (a slot can hold a whole batch); reaching
    /// it drops like a full queue.
    ///
    /// Default: `134217728` (128 MiB)
    #[arg(env = "FELIX_SUBSCRIBER_QUEUE_MAX_BYTES", value_name = "BYTES")]
    subscriber_queue_max_bytes: usize = 128 * MIB, at_least_one;

    /// Per connection: bytes taken from subscriber queues but not yet written to their QUIC
    /// streams, split equally between the connection's subscriptions.
    ///
    /// Default: `268435456` (256 MiB)
    #[arg(env = "FELIX_SUBSCRIBER_EGRESS_MAX_BYTES", value_name = "BYTES")]
    subscriber_egress_max_bytes: usize = 256 * MIB, at_least_one;

    /// Memory for recently read 128 KiB blocks of local history, shared by every catching-up
    /// subscriber of the broker: subscribers replaying the same part of a shard read and
    /// CRC-check each block once between them instead of once each.
    ///
    /// `0` turns sharing off. Hits and misses: `felix_hot_read_cache_hits_total`,
    /// `felix_hot_read_cache_misses_total`.
    ///
    /// Default: `67108864` (64 MiB)
    #[arg(env = "FELIX_HOT_READ_CACHE_BYTES", value_name = "BYTES")]
    hot_read_cache_bytes: usize = 64 * MIB;

    /// Publish-queue slots guaranteed to each tenant.
    ///
    /// A publish that finds its tenant's share full is answered `overloaded` (retryable) or
    /// waits (below).
    ///
    /// Default: `512`
    #[arg(env = "FELIX_PUB_QUEUE_DEPTH", value_name = "N")]
    pub_queue_depth: usize = 512, at_least_one;

    /// How long a commit-acknowledged publish waits for room in its tenant's share before it is
    /// answered `overloaded`.
    ///
    /// `0`: never wait. An enqueue-acknowledged publish never waits: it is answered
    /// `overloaded` at once. Apart from the slots, one connection may owe at most 1,024 answers
    /// to acknowledged publishes; the next is answered `overloaded` before it is queued (the
    /// spec counts this per stream; every request is its own QUIC stream here, so the count is
    /// per connection).
    ///
    /// Default: `2000`
    #[arg(env = "FELIX_PUBLISH_QUEUE_WAIT_TIMEOUT_MS", value_name = "MS")]
    publish_queue_wait_timeout_ms: u64 = 2000;

    /// A fire-and-forget publish (`ack: none`) that finds no room waits up to
    /// `publish_queue_wait_timeout_ms`, as a commit-acknowledged one does, instead of being
    /// shed at once; it is shed only if the wait runs out.
    ///
    /// Counted as `waited` (and `shed` if it runs out) in
    /// `felix_tenant_publish_queue_full_total`. The client's call returns once the broker has
    /// taken the publish, so a waiting publish slows its sender.
    ///
    /// Default: `false`
    #[arg(env = "FELIX_PUB_INGRESS_WAIT", value_name = "BOOL", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub_ingress_wait: bool = false;

    /// Record-batch bytes a second each tenant may publish through this broker (spec:
    /// "Quota Enforcement"): a number, or one with its unit (`1MiB/s`, `500KB/s`), or
    /// `unlimited`.
    ///
    /// A token bucket per tenant holds one second of it; an acknowledged publish over it is
    /// refused `overloaded` with reason `tenant_quota` and `retry_after_ms`, a
    /// fire-and-forget one is shed, a Kafka produce is throttled (`throttle_time_ms`). The
    /// bytes are the encoded batches as sent. Per broker. See docs/operations.md, "Quotas".
    ///
    /// Default: unset (no limit)
    #[arg(env = "FELIX_TENANT_PUBLISH_BYTES_PER_SEC", value_name = "RATE")]
    tenant_publish_bytes_per_sec: String;

    /// Records a second each tenant may publish through this broker: a number (`5000` or
    /// `5000msg/s`) or `unlimited`.
    ///
    /// Checked as `tenant_publish_bytes_per_sec` is, in a bucket of its own; a publish must
    /// fit both.
    ///
    /// Default: unset (no limit)
    #[arg(env = "FELIX_TENANT_PUBLISH_MSGS_PER_SEC", value_name = "RATE")]
    tenant_publish_msgs_per_sec: String;

    /// Per-tenant publish rates overriding the two defaults above:
    /// `TENANT=RATE,...` where `RATE` is a byte rate (`B/s`, `KB/s`, `MB/s`, `GB/s`,
    /// `KiB/s`, `MiB/s`, `GiB/s`), a record rate (`msg/s`) or `unlimited` (both kinds).
    ///
    /// A tenant takes its own rate for each kind it names and the default for the other;
    /// name it twice for both kinds, e.g. `acme=1MiB/s,acme=5000msg/s,free-tier=100KiB/s`.
    ///
    /// Default: empty
    #[arg(env = "FELIX_TENANT_PUBLISH_QUOTAS", value_name = "TENANT=RATE,...")]
    tenant_publish_quotas: String;

    /// Largest protocol frame (header + body) a client may send; larger frames are refused with
    /// `frame_too_large`.
    ///
    /// At most 4 GiB − 1.
    ///
    /// Default: `16777216` (16 MiB)
    #[arg(env = "FELIX_MAX_FRAME_BYTES", value_name = "BYTES")]
    max_frame_bytes: usize = 16 * MIB, at_least_one;

    /// Largest record batch accepted in a publish (`record_too_large` above it), counted as the
    /// batch decompresses: a compressed batch whose records decompress past it is refused too.
    ///
    /// At most `max_frame_bytes`.
    ///
    /// Default: `8388608` (8 MiB)
    #[arg(env = "FELIX_MAX_BATCH_BYTES", value_name = "BYTES")]
    max_batch_bytes: usize = 8 * MIB, at_least_one;

    /// A QUIC connection that hears nothing for this long is closed (how a partition is
    /// detected).
    ///
    /// Default: `6000`
    #[arg(env = "FELIX_QUIC_IDLE_TIMEOUT_MS", value_name = "MS")]
    quic_idle_timeout_ms: u64 = 6000, at_least_one;

    /// Connections each client listener holds at once, QUIC and Kafka counted apart (a QUIC
    /// connection counts from its handshake on); one past it is refused at once (QUIC
    /// `CONNECTION_REFUSED`, Kafka: closed), logged and counted in
    /// `felix_connections_refused_total{listener}`.
    ///
    /// Default: `4096`
    #[arg(env = "FELIX_MAX_CONNECTIONS", value_name = "N")]
    max_connections: usize = 4096, at_least_one;

    /// Bytes of Kafka requests being received or handled at once, over all connections.
    ///
    /// A request is read only once its declared size fits (its connection waits meanwhile), and
    /// a request whose bytes do not all arrive within 30 s closes its connection, so clients
    /// that send large length prefixes and stall cannot hold more than this.
    ///
    /// Default: `268435456` (256 MiB)
    #[arg(env = "FELIX_MAX_INFLIGHT_REQUEST_BYTES", value_name = "BYTES")]
    max_inflight_request_bytes: usize = 256 * MIB, at_least_one;

    /// Free bytes of the data volume that durable publishes leave for the control plane.
    ///
    /// A publish that would go below it is refused with `disk_full` (`overloaded`, 9,
    /// retryable; Kafka `KAFKA_STORAGE_ERROR`) until retention, uploads or a delete free space;
    /// free space is sampled every 250 ms (`felix_disk_free_bytes`).
    ///
    /// Default: `0` (automatic: 2% of the data volume, at most 1 GiB)
    #[arg(env = "FELIX_DISK_RESERVE_BYTES", value_name = "BYTES")]
    disk_reserve_bytes: u64 = 0;

    /// The control plane snapshots its state and compacts its Raft log every this many entries.
    ///
    /// Default: `5000`
    #[arg(env = "FELIX_META_SNAPSHOT_LOGS", value_name = "N")]
    meta_snapshot_logs: u64 = 5000, at_least_one;

    /// Segment size of a new stream that does not set `segment_bytes` itself.
    ///
    /// Default: `268435456` (256 MiB)
    #[arg(env = "FELIX_SEGMENT_BYTES", value_name = "BYTES")]
    segment_bytes: u64 = 256 * MIB as u64, at_least_one;

    /// Segment age of a new stream that does not set `segment_ms` itself.
    ///
    /// Default: `3600000` (1 h)
    #[arg(env = "FELIX_SEGMENT_MS", value_name = "MS")]
    segment_ms: u64 = 3_600_000, at_least_one;

    /// The Kafka protocol listener (TCP).
    ///
    /// Its topics are the streams of tenant `default`, namespace `default`, or with auth on of
    /// the SASL principal's tenant and namespace; see docs/kafka.md.
    /// Must differ from `admin_addr` and `internal_addr`. Port 0 picks a free port; the ready
    /// line shows it.
    ///
    /// Default: `127.0.0.1:9092`
    #[arg(env = "FELIX_KAFKA_ADDR", value_name = "IP:PORT")]
    kafka_addr: SocketAddr = ip_port("127.0.0.1:9092");

    /// Partitions (shards) of a topic the Kafka listener creates without a count: an
    /// auto-created topic, or CreateTopics with `-1`.
    ///
    /// 1 to 4096.
    ///
    /// Default: `1`
    #[arg(env = "FELIX_KAFKA_DEFAULT_PARTITIONS", value_name = "N")]
    kafka_default_partitions: u32 = 1, at_least_one;

    /// Create an unknown topic (a durable stream with default settings) when a Kafka client
    /// produces to it or asks for its metadata, as Kafka's `auto.create.topics.enable` does.
    ///
    /// `false`: such requests get `UNKNOWN_TOPIC_OR_PARTITION`.
    ///
    /// Default: `true`
    #[arg(env = "FELIX_KAFKA_AUTO_CREATE_TOPICS", value_name = "BOOL", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    kafka_auto_create_topics: bool = true;

    /// PEM certificate chain (leaf first) the Kafka listener presents: with it (and
    /// `kafka_tls_key`) the listener speaks only TLS (clients use `SSL` or `SASL_SSL`).
    ///
    /// Needs `kafka_tls_key`. Without both, the listener speaks only plaintext (`PLAINTEXT`
    /// or `SASL_PLAINTEXT`). See docs/kafka.md.
    ///
    /// Default: none
    #[arg(env = "FELIX_KAFKA_TLS_CERT", value_name = "FILE")]
    kafka_tls_cert: PathBuf;

    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `kafka_tls_cert`.
    ///
    /// Default: none
    #[arg(env = "FELIX_KAFKA_TLS_KEY", value_name = "FILE")]
    kafka_tls_key: PathBuf;

    /// Whether every door asks who is knocking: clients present a token (QUIC `hello`,
    /// Kafka SASL, admin HTTP `Authorization: Bearer`) and peers authenticate on the
    /// internal network. See docs/security.md.
    ///
    /// `off` is allowed only while every listener (QUIC, admin, internal, Kafka) is on
    /// loopback, unless `insecure_no_auth` says otherwise.
    ///
    /// Default: off when every listener is on loopback (the embedded defaults), else on
    #[arg(env = "FELIX_AUTH", value_name = "on|off", value_parser = parse_bool)]
    auth: bool = !all_loopback(&[quic_addr, admin_addr, internal_addr, kafka_addr]);

    /// Let a broker with a listener off loopback run with `auth = off`: anyone who reaches
    /// a port reads and writes every tenant's streams. For a private test network only.
    ///
    /// Default: `false`
    #[arg(env = "FELIX_INSECURE_NO_AUTH", value_name = "BOOL", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    insecure_no_auth: bool = false;

    /// File holding the cluster secret, which signs every request between brokers (Raft,
    /// replication, forwarding, leases; docs/internal-network.md); at least 32 bytes,
    /// surrounding whitespace ignored, every broker the same. Keep it mode 0600.
    ///
    /// With `auth` on and no secret: a single node generates one into
    /// `<data_dir>/cluster.secret` at its first start; a multi-node cluster refuses to start.
    /// With `auth` off, a secret given is used all the same.
    ///
    /// Default: none
    #[arg(env = "FELIX_CLUSTER_SECRET_FILE", value_name = "FILE")]
    cluster_secret_file: PathBuf;

    /// The cluster secret itself, instead of `cluster_secret_file` (not both).
    ///
    /// Never printed (`--check-config` leaves it out). Prefer the variable or the file to the
    /// flag, which other local users can see in the process list.
    ///
    /// Default: none
    #[arg(env = "FELIX_CLUSTER_SECRET", value_name = "SECRET", value_parser = parse_secret)]
    #[serde(skip_serializing)]
    cluster_secret: ClusterSecret;

    /// During a secret rotation: file holding the previous cluster secret, still accepted
    /// from peers and signed with as well, so brokers not yet given the new secret accept
    /// this one's requests.
    ///
    /// Remove it once every broker has the new secret.
    ///
    /// Default: none
    #[arg(env = "FELIX_CLUSTER_SECRET_PREVIOUS_FILE", value_name = "FILE")]
    cluster_secret_previous_file: PathBuf;
    /// With auth on, whether the admin API's `/metrics` asks for a token too (one granting
    /// `cluster.manage`). Off, Prometheus scrapes it without one; its series carry tenant
    /// names, so close it when the admin port is reachable by tenants.
    ///
    /// Default: `false`
    #[arg(env = "FELIX_METRICS_REQUIRE_AUTH", value_name = "BOOL", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    metrics_require_auth: bool = false;
}
