//! felixctl's command line: the subcommands, their flags and how each value is parsed.
//! What a flag means is decided here; what a command does with it, in its own module.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use felix_client::{Compression, StartAt, StreamConfig};

pub(crate) const ABOUT: &str =
    "Manage and use a Felix broker: tenants, namespaces, streams, publish, subscribe.";

pub(crate) const AFTER_HELP: &str = "\
Examples:
  felixctl tenant create acme
  felixctl namespace create acme/prod
  felixctl stream create acme/prod/orders --durable --shards 4
  felixctl stream describe acme/prod/orders
  seq 1 1000 | felixctl publish acme/prod/orders --output jsonl
  felixctl publish acme/prod/orders --count 100000 --size 1024 --compression lz4
  felixctl subscribe acme/prod/orders --from earliest --count 10 --output jsonl
  felixctl group create acme/prod/orders billing --visibility-timeout 30s --dead-letter acme/prod/orders-dlq
  felixctl group consume acme/prod/orders billing --count 10 --wait 5s --output jsonl
  felixctl segments acme/prod/orders --output jsonl
  felixctl stream alter acme/prod/orders --retention-ms 7d --hot-retention-bytes 10GiB
  felixctl token create --tenant acme --allow stream.publish:acme/prod/* --ttl 1h
  felixctl role create reader --allow stream.subscribe:acme/*
  felixctl role bind svc-orders reader --tenant acme
  felixctl oidc issuer add https://idp.example/ --audience felix --jwks-file jwks.json --tenant-claim org
  export FELIX_TOKEN=$(felixctl login --oidc-token id.jwt --tenant acme)

Tokens (a broker with auth on): --token, FELIX_TOKEN, --token-file or FELIX_TOKEN_FILE; with
none of them and a loopback broker, ./felix-data/admin.token if it exists.

Exit codes: 0 success, 1 failure, 2 usage error.";

#[derive(Parser, Debug)]
#[command(name = "felixctl", version, about = ABOUT, after_help = AFTER_HELP)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: GlobalArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Args, Debug)]
#[command(next_help_heading = "Connection (valid before or after the subcommand)")]
pub(crate) struct GlobalArgs {
    /// Broker QUIC address(es), comma-separated; the first that connects is used.
    #[arg(
        long,
        env = "FELIX_BROKER",
        default_value = "127.0.0.1:5000",
        value_name = "HOST:PORT[,HOST:PORT...]",
        global = true
    )]
    pub(crate) broker: String,
    /// PEM file of the CA that signed the broker's certificate (e.g. the broker's
    /// <data_dir>/tls/ca.pem). Needed for a broker that is not on loopback.
    #[arg(long, env = "FELIX_CA", value_name = "FILE", global = true)]
    pub(crate) ca: Option<PathBuf>,
    /// Do not verify the broker's certificate (development only).
    #[arg(long, global = true)]
    pub(crate) insecure: bool,
    /// Limit on connecting and on each request (e.g. 30s, 500ms, 2m).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION", global = true)]
    pub(crate) timeout: Duration,
    /// The Felix token to present (needed by a broker with auth on).
    #[arg(
        long,
        env = "FELIX_TOKEN",
        value_name = "TOKEN",
        global = true,
        hide_env_values = true,
        conflicts_with = "token_file"
    )]
    pub(crate) token: Option<String>,
    /// A file holding the token (e.g. a broker's <data_dir>/admin.token).
    #[arg(long, env = "FELIX_TOKEN_FILE", value_name = "FILE", global = true)]
    pub(crate) token_file: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Manage tenants.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Manage namespaces.
    #[command(subcommand)]
    Namespace(NamespaceCommand),
    /// Create, alter, describe, list and delete streams.
    #[command(subcommand)]
    Stream(StreamCommand),
    /// Publish records: one per line of stdin, or generated with --count.
    Publish(PublishArgs),
    /// Print a stream's records as they arrive (all shards unless --shard).
    Subscribe(SubscribeArgs),
    /// Consumer groups: create, describe, list, delete, consume (ack per record).
    #[command(subcommand)]
    Group(crate::groups::GroupCommand),
    /// Caches: create, describe, list, delete; put, get, del, incr, watch keys.
    #[command(subcommand)]
    Cache(crate::cache::CacheCommand),
    /// Mint and revoke tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Define, list, delete and bind roles.
    #[command(subcommand)]
    Role(RoleCommand),
    /// Manage the signing keys.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Trade an identity provider's (OIDC) token for a Felix token and print it alone on
    /// stdout: `export FELIX_TOKEN=$(felixctl login --oidc-token id.jwt --tenant acme)`.
    /// Presents no Felix token. The issuer must be registered (`felixctl oidc issuer add`).
    Login(LoginArgs),
    /// Manage the trusted OIDC identity providers.
    #[command(subcommand)]
    Oidc(OidcCommand),
    /// The cluster's brokers: list, drain, undrain (docs/shard-moves.md).
    #[command(subcommand)]
    Broker(crate::cluster::BrokerCommand),
    /// Even out leaders and replicas over the brokers (`rebalance`).
    #[command(subcommand)]
    Cluster(crate::cluster::ClusterCommand),
    /// Move a shard's replica (and its leadership) to another broker.
    #[command(subcommand)]
    Shard(crate::cluster::ShardCommand),
    /// List a stream's segments and objects: offsets, timestamps, size, tier and object key.
    Segments {
        /// The stream, as TENANT/NAMESPACE/STREAM.
        #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
        path: StreamPath,
        /// text: an aligned table; jsonl: one JSON object per segment.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum TokenCommand {
    /// Mint a token and print it alone on stdout (its id and expiry go to stderr). With
    /// neither --role nor --allow it carries the tenant's built-in tenant-admin role.
    Create {
        /// The tenant the token acts for ('*' for a cluster-wide token: needs
        /// cluster.manage).
        #[arg(long)]
        tenant: String,
        /// Who holds it (role bindings are per subject).
        #[arg(long)]
        subject: Option<String>,
        /// The namespace the Kafka mapping uses (default: default).
        #[arg(long)]
        namespace: Option<String>,
        /// A role to carry (repeatable), e.g. tenant-admin or one made with `role create`.
        #[arg(long = "role", value_name = "ROLE", conflicts_with = "allow")]
        roles: Vec<String>,
        /// An explicit grant ACTION:PATTERN (repeatable), e.g.
        /// stream.publish:acme/prod/orders-*. Actions: stream.publish, stream.subscribe,
        /// group.consume, cache.read, cache.write, tenant.manage, namespace.manage,
        /// stream.manage, cache.manage, rbac.manage, cluster.manage. Patterns are
        /// TENANT[/NAMESPACE[/NAME]] with * wildcards.
        #[arg(long, value_name = "ACTION:PATTERN", value_parser = grant)]
        allow: Vec<String>,
        /// Lifetime (e.g. 1h, 30m, 7d; at most 90 days).
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration, value_name = "DURATION")]
        ttl: Duration,
    },
    /// Revoke a token by its id (the jti `token create` printed): refused on every broker
    /// within a second.
    Revoke {
        /// The token's id.
        jti: String,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum RoleCommand {
    /// Create (or replace) a role granting each --allow ACTION:PATTERN.
    Create {
        name: String,
        /// A grant ACTION:PATTERN (repeatable, at least one); see `token create --help`.
        #[arg(long, value_name = "ACTION:PATTERN", value_parser = grant, required = true)]
        allow: Vec<String>,
    },
    /// List the roles this token may see, with their grants.
    List,
    /// Delete a role and every binding to it.
    Delete { name: String },
    /// Bind a subject of a tenant to a role: its tokens get the role's grants.
    Bind {
        subject: String,
        role: String,
        #[arg(long)]
        tenant: String,
    },
}

#[derive(Args, Debug)]
#[command(
    after_help = "The identity provider's JWT is verified (signature against the \
issuer's registered JWKS, issuer, audience, expiry and not-before; RS*, PS*, ES256, ES384 or \
EdDSA only) and mapped to the tenant, subject and roles the issuer's registration says; the \
Felix token lives 15 minutes unless the issuer was registered with another --ttl, and never \
past the JWT's own expiry. Its id and expiry go to stderr. A refusal names its reason \
(bad_signature, wrong_issuer, wrong_audience, expired, unknown_issuer, tenant_mismatch, ...)."
)]
pub(crate) struct LoginArgs {
    /// A file holding the identity provider's JWT ('-': stdin).
    #[arg(long, value_name = "FILE")]
    pub(crate) oidc_token: PathBuf,
    /// The tenant to act for: the JWT must map to it.
    #[arg(long)]
    pub(crate) tenant: String,
}

#[derive(Subcommand, Debug)]
pub(crate) enum OidcCommand {
    /// Register, list and remove trusted issuers (needs rbac.manage on *).
    #[command(subcommand)]
    Issuer(IssuerCommand),
}

// Parsed once per run: the size of the largest variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub(crate) enum IssuerCommand {
    /// Trust an identity provider (or replace its registration): its tokens exchange for
    /// Felix tokens. Map the tenant with --tenant or --tenant-claim.
    Add {
        /// The issuer, exactly as its tokens' iss claim says (e.g. https://idp.example/).
        issuer: String,
        /// The aud its tokens must carry to be meant for Felix.
        #[arg(long)]
        audience: String,
        /// The issuer's JSON Web Key Set, from a file (its jwks_uri document).
        #[arg(long, value_name = "FILE")]
        jwks_file: PathBuf,
        /// Every token of this issuer acts for this tenant.
        #[arg(
            long,
            conflicts_with = "tenant_claim",
            required_unless_present = "tenant_claim"
        )]
        tenant: Option<String>,
        /// The claim that names the tenant.
        #[arg(long, value_name = "CLAIM")]
        tenant_claim: Option<String>,
        /// The claim that names the subject (role bindings are per subject).
        #[arg(long, value_name = "CLAIM", default_value = "sub")]
        subject_claim: String,
        /// The claim listing the provider's groups or roles (a list, or space-separated).
        #[arg(long, value_name = "CLAIM")]
        roles_claim: Option<String>,
        /// Map a provider group to a Felix role (repeatable); unmapped groups give nothing.
        #[arg(long = "map-role", value_name = "GROUP=ROLE", value_parser = group_role)]
        map_role: Vec<(String, String)>,
        /// A Felix role every exchanged token gets (repeatable). With no role at all, an
        /// exchanged token grants only what bindings give its subject.
        #[arg(long = "role", value_name = "ROLE")]
        roles: Vec<String>,
        /// Lifetime of an exchanged Felix token (at most 12h; never past the JWT's expiry).
        #[arg(long, default_value = "15m", value_parser = humantime::parse_duration, value_name = "DURATION")]
        ttl: Duration,
    },
    /// List the trusted issuers and their mappings.
    List,
    /// Stop trusting an issuer: its tokens no longer exchange.
    Remove { issuer: String },
}

fn group_role(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((g, r)) if !g.is_empty() && !r.is_empty() => Ok((g.to_owned(), r.to_owned())),
        _ => Err("write a mapping as GROUP=ROLE, e.g. --map-role felix-writers=writer".into()),
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum KeyCommand {
    /// Add a new signing key and sign new tokens with it; tokens signed by the old keys stay
    /// valid until they expire. Prints the new key id.
    Rotate,
}

/// Checks an ACTION:PATTERN grant as the broker will, so a typo is a usage error here.
fn grant(s: &str) -> Result<String, String> {
    const ACTIONS: [&str; 11] = [
        "stream.publish",
        "stream.subscribe",
        "group.consume",
        "cache.read",
        "cache.write",
        "tenant.manage",
        "namespace.manage",
        "stream.manage",
        "cache.manage",
        "rbac.manage",
        "cluster.manage",
    ];
    let (action, pattern) = s
        .split_once(':')
        .ok_or("write a grant as ACTION:PATTERN, e.g. stream.publish:acme/prod/*")?;
    if !ACTIONS.contains(&action) {
        return Err(format!(
            "unknown action {action:?}; the actions are {}",
            ACTIONS.join(", ")
        ));
    }
    let segments: Vec<&str> = pattern.split('/').collect();
    if pattern.is_empty() || segments.len() > 3 || segments.iter().any(|p| p.is_empty()) {
        return Err(format!(
            "bad pattern {pattern:?}: TENANT[/NAMESPACE[/NAME]], each part non-empty, * as a wildcard"
        ));
    }
    if let Some(c) = pattern
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '*' | '/')))
    {
        return Err(format!("bad pattern {pattern:?}: {c:?} is not allowed"));
    }
    Ok(s.to_owned())
}

#[derive(Subcommand, Debug)]
pub(crate) enum TenantCommand {
    /// Create a tenant.
    Create {
        /// The tenant's name.
        name: String,
        /// Succeed if it exists already.
        #[arg(long)]
        if_not_exists: bool,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum NamespaceCommand {
    /// Create a namespace in a tenant.
    Create {
        /// The namespace, as TENANT/NAMESPACE.
        #[arg(value_name = "TENANT/NS", value_parser = namespace_path)]
        path: (String, String),
        /// Succeed if it exists already.
        #[arg(long)]
        if_not_exists: bool,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum StreamCommand {
    /// Create a stream (ephemeral unless --durable) and print it as JSON.
    Create {
        /// The stream, as TENANT/NAMESPACE/STREAM.
        #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
        path: StreamPath,
        /// Store records on disk and acknowledge after the write (at-least-once, replayable).
        /// Without it the stream is ephemeral: in memory, live delivery only, at-most-once.
        #[arg(long)]
        durable: bool,
        #[command(flatten)]
        settings: StreamSettings,
        /// Succeed (and print the existing stream) if it exists already.
        #[arg(long)]
        if_not_exists: bool,
    },
    /// Change a stream's settings (only those given) and print it as JSON.
    Alter {
        /// The stream, as TENANT/NAMESPACE/STREAM.
        #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
        path: StreamPath,
        #[command(flatten)]
        settings: StreamSettings,
    },
    /// Print a stream's settings and shard offsets as JSON.
    Describe {
        /// The stream, as TENANT/NAMESPACE/STREAM.
        #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
        path: StreamPath,
    },
    /// Print the streams of a namespace as a JSON array.
    List {
        /// The namespace, as TENANT/NAMESPACE.
        #[arg(value_name = "TENANT/NS", value_parser = namespace_path)]
        path: (String, String),
    },
    /// Delete a stream and its records.
    Delete {
        /// The stream, as TENANT/NAMESPACE/STREAM.
        #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
        path: StreamPath,
    },
}

pub(crate) type StreamPath = (String, String, String);

/// Stream settings (each maps to the StreamConfig field of the same name).
#[derive(Args, Debug, Default)]
pub(crate) struct StreamSettings {
    /// Number of shards (keys are spread over them; order holds per shard).
    #[arg(long, value_name = "N")]
    pub(crate) shards: Option<u32>,
    /// Number of brokers holding each shard (leader included).
    #[arg(long, value_name = "N")]
    pub(crate) replicas: Option<u32>,
    /// When a publish is acknowledged: after the leader's write, or a majority's.
    #[arg(long, value_enum)]
    pub(crate) consistency: Option<Consistency>,
    /// Roll the active segment at this size (e.g. 134217728, 128MiB).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub(crate) segment_bytes: Option<u64>,
    /// Roll the active segment at this age (milliseconds, or e.g. 10m).
    #[arg(long, value_name = "MS", value_parser = parse_ms)]
    pub(crate) segment_ms: Option<u64>,
    /// Delete records older than this, both tiers (milliseconds or e.g. 7d; 0 = no limit).
    #[arg(long, value_name = "MS", value_parser = parse_ms)]
    pub(crate) retention_ms: Option<u64>,
    /// Keep at most this many bytes, both tiers (e.g. 10GiB; 0 = no limit).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub(crate) retention_bytes: Option<u64>,
    /// Keep uploaded segments locally this long (milliseconds or e.g. 1h; 0 = delete each
    /// once uploaded; none = no limit).
    #[arg(long, value_name = "MS", value_parser = parse_hot_ms)]
    pub(crate) hot_retention_ms: Option<u64>,
    /// Keep at most this many bytes locally, deleting only uploaded segments (e.g. 10GiB;
    /// 0 = delete each once uploaded; none = no limit).
    #[arg(long, value_name = "BYTES", value_parser = parse_hot_bytes)]
    pub(crate) hot_retention_bytes: Option<u64>,
    /// Upload sealed segments to the object store.
    #[arg(long, value_name = "BOOL")]
    pub(crate) tiered: Option<bool>,
}

impl StreamSettings {
    pub(crate) fn config(&self) -> StreamConfig {
        StreamConfig {
            durable: None,
            consistency: self.consistency.map(|c| c.as_str().to_owned()),
            replicas: self.replicas,
            shards: self.shards,
            segment_bytes: self.segment_bytes,
            segment_ms: self.segment_ms,
            retention_ms: self.retention_ms,
            retention_bytes: self.retention_bytes,
            hot_retention_ms: self.hot_retention_ms,
            hot_retention_bytes: self.hot_retention_bytes,
            tiered: self.tiered,
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Consistency {
    /// Acknowledge after the leader's write.
    Leader,
    /// Acknowledge once a majority of replicas hold the record.
    Quorum,
}

impl Consistency {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Consistency::Leader => "leader",
            Consistency::Quorum => "quorum",
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct PublishArgs {
    /// The stream, as TENANT/NAMESPACE/STREAM.
    #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
    pub(crate) path: StreamPath,
    /// Key of every record (records with one key go to one shard, in order). Without it,
    /// each publish goes to the next shard in turn.
    #[arg(long, value_name = "K")]
    pub(crate) key: Option<String>,
    /// A record header for every record published, as KEY=VALUE (repeat for several; the
    /// value may be empty, and may hold `=`).
    #[arg(long = "header", value_name = "KEY=VALUE", value_parser = header_pair)]
    pub(crate) headers: Vec<(String, String)>,
    /// batch: publish up to --batch-size records per request and wait for each ack;
    /// message: one request per record, waiting for each ack; none: do not wait for the
    /// write (the broker may shed records under load).
    #[arg(long, value_enum, default_value_t = Acks::Batch)]
    pub(crate) acks: Acks,
    /// Records per publish with --acks batch or none.
    #[arg(long, default_value_t = 500, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) batch_size: u32,
    /// Codec of published batches: none, gzip, snappy, lz4, zstd.
    #[arg(long, default_value = "none", value_parser = parse_compression)]
    pub(crate) compression: Compression,
    /// text: a summary at the end; jsonl: {"shard":..,"offset":..,"line":N} per
    /// acknowledged record, in input order, as soon as it is acknowledged (the shard pairs an
    /// acknowledgement with its record on a stream of several shards).
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub(crate) output: Output,
    /// Publish N generated records instead of reading stdin.
    #[arg(long, value_name = "N")]
    pub(crate) count: Option<u64>,
    /// Payload size of generated records, in bytes (with --count; default 100).
    #[arg(long, value_name = "BYTES", requires = "count")]
    pub(crate) size: Option<usize>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acks {
    /// Fire and forget: no acknowledgement of the write.
    None,
    /// One request per record, each acknowledged before the next.
    Message,
    /// Batches of --batch-size records, each acknowledged before the next.
    Batch,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Output {
    /// Human-readable.
    Text,
    /// One JSON object per line.
    Jsonl,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PayloadEncoding {
    /// UTF-8 text (invalid bytes replaced).
    Utf8,
    /// Standard base64.
    Base64,
}

#[derive(Args, Debug)]
pub(crate) struct SubscribeArgs {
    /// The stream, as TENANT/NAMESPACE/STREAM.
    #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
    pub(crate) path: StreamPath,
    /// Where to start: earliest, latest, an offset, or @TIME (RFC 3339, e.g.
    /// @2024-05-01T12:00:00Z, or @ and milliseconds since the epoch).
    #[arg(long, default_value = "latest", value_name = "POSITION", value_parser = start_at)]
    pub(crate) from: StartAt,
    /// Read only this shard (default: every shard, merged).
    #[arg(long, value_name = "N")]
    pub(crate) shard: Option<u32>,
    /// Exit after N records (in total).
    #[arg(long, value_name = "N")]
    pub(crate) count: Option<u64>,
    /// text: each payload on its own line; jsonl:
    /// {"shard":..,"offset":..,"timestamp":..,"key":..,"payload":..} per record.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub(crate) output: Output,
    /// How keys and payloads are printed.
    #[arg(long, value_enum, default_value_t = PayloadEncoding::Utf8)]
    pub(crate) payload_encoding: PayloadEncoding,
}

pub(crate) fn stream_path(s: &str) -> Result<StreamPath, String> {
    felix_client::parse_stream_path(s).map_err(|e| e.to_string())
}

pub(crate) fn namespace_path(s: &str) -> Result<(String, String), String> {
    felix_client::parse_namespace_path(s).map_err(|e| e.to_string())
}

pub(crate) fn start_at(s: &str) -> Result<StartAt, String> {
    felix_client::parse_start_at(s).map_err(|e| e.to_string())
}

pub(crate) fn parse_compression(s: &str) -> Result<Compression, String> {
    s.parse()
}

/// Bytes: a number with an optional unit (K/KB = 1000, KiB = 1024, likewise M, G, T).
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 1048576, 64MiB, 1GB)"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" | "k" | "kB" => 1_000,
        "KiB" => 1 << 10,
        "M" | "MB" => 1_000_000,
        "MiB" => 1 << 20,
        "G" | "GB" => 1_000_000_000,
        "GiB" => 1 << 30,
        "T" | "TB" => 1_000_000_000_000,
        "TiB" => 1 << 40,
        other => return Err(format!("unknown size unit {other:?} in {s:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// `KEY=VALUE` of `--header`: the key must not be empty.
fn header_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// A hot-retention size: `none` (no limit: `u64::MAX` on the wire) or a size.
pub(crate) fn parse_hot_bytes(s: &str) -> Result<u64, String> {
    match s.trim() {
        "none" | "unlimited" => Ok(u64::MAX),
        _ => parse_bytes(s),
    }
}

/// A hot-retention age: `none` (no limit) or milliseconds / a duration.
pub(crate) fn parse_hot_ms(s: &str) -> Result<u64, String> {
    match s.trim() {
        "none" | "unlimited" => Ok(u64::MAX),
        _ => parse_ms(s),
    }
}

/// Milliseconds: a plain number, or a duration such as 500ms, 10m, 7d.
pub(crate) fn parse_ms(s: &str) -> Result<u64, String> {
    if let Ok(n) = s.trim().parse::<u64>() {
        return Ok(n);
    }
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not milliseconds or a duration (e.g. 7d): {e}"))?;
    u64::try_from(d.as_millis()).map_err(|_| format!("{s:?} is too long"))
}
