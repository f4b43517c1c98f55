//! felixctl: tenants, namespaces and streams; publish from stdin; subscribe to stdout.
//!
//! Exit codes: 0 success, 1 a failure (broker error, lost connection, a record not
//! published), 2 a usage error.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use base64::Engine as _;
use bytes::Bytes;
use clap::{Args, Parser, Subcommand, ValueEnum};
use felix_client::{
    AckMode, ClientConfig, ClientError, Compression, Connection, Event, Message, StartAt,
    StreamConfig, codes,
};
use felix_wire::protocol::DEFAULT_MAX_FRAME;
use serde::Serialize;
use tokio::sync::mpsc;

const ABOUT: &str =
    "Manage and use a Felix broker: tenants, namespaces, streams, publish, subscribe.";

const AFTER_HELP: &str = "\
Examples:
  felixctl tenant create acme
  felixctl namespace create acme/prod
  felixctl stream create acme/prod/orders --durable --shards 4
  felixctl stream describe acme/prod/orders
  seq 1 1000 | felixctl publish acme/prod/orders --output jsonl
  felixctl publish acme/prod/orders --count 100000 --size 1024 --compression lz4
  felixctl subscribe acme/prod/orders --from earliest --count 10 --output jsonl
  felixctl segments acme/prod/orders --output jsonl
  felixctl stream alter acme/prod/orders --retention-ms 7d --hot-retention-bytes 10GiB

Exit codes: 0 success, 1 failure, 2 usage error.";

#[derive(Parser, Debug)]
#[command(name = "felixctl", version, about = ABOUT, after_help = AFTER_HELP)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Debug)]
#[command(next_help_heading = "Connection (valid before or after the subcommand)")]
struct GlobalArgs {
    /// Broker QUIC address(es), comma-separated; the first that connects is used.
    #[arg(
        long,
        env = "FELIX_BROKER",
        default_value = "127.0.0.1:5000",
        value_name = "HOST:PORT[,HOST:PORT...]",
        global = true
    )]
    broker: String,
    /// PEM file of the CA that signed the broker's certificate (e.g. the broker's
    /// <data_dir>/tls/ca.pem). Needed for a broker that is not on loopback.
    #[arg(long, env = "FELIX_CA", value_name = "FILE", global = true)]
    ca: Option<PathBuf>,
    /// Do not verify the broker's certificate (development only).
    #[arg(long, global = true)]
    insecure: bool,
    /// Limit on connecting and on each request (e.g. 30s, 500ms, 2m).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION", global = true)]
    timeout: Duration,
}

#[derive(Subcommand, Debug)]
enum Command {
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
enum TenantCommand {
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
enum NamespaceCommand {
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
enum StreamCommand {
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

type StreamPath = (String, String, String);

/// Stream settings (each maps to the StreamConfig field of the same name).
#[derive(Args, Debug, Default)]
struct StreamSettings {
    /// Number of shards (keys are spread over them; order holds per shard).
    #[arg(long, value_name = "N")]
    shards: Option<u32>,
    /// Number of brokers holding each shard (leader included).
    #[arg(long, value_name = "N")]
    replicas: Option<u32>,
    /// When a publish is acknowledged: after the leader's write, or a majority's.
    #[arg(long, value_enum)]
    consistency: Option<Consistency>,
    /// Roll the active segment at this size (e.g. 134217728, 128MiB).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    segment_bytes: Option<u64>,
    /// Roll the active segment at this age (milliseconds, or e.g. 10m).
    #[arg(long, value_name = "MS", value_parser = parse_ms)]
    segment_ms: Option<u64>,
    /// Delete records older than this, both tiers (milliseconds or e.g. 7d; 0 = no limit).
    #[arg(long, value_name = "MS", value_parser = parse_ms)]
    retention_ms: Option<u64>,
    /// Keep at most this many bytes, both tiers (e.g. 10GiB; 0 = no limit).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    retention_bytes: Option<u64>,
    /// Keep uploaded segments locally this long (milliseconds or e.g. 1h; 0 = delete each
    /// once uploaded; none = no limit).
    #[arg(long, value_name = "MS", value_parser = parse_hot_ms)]
    hot_retention_ms: Option<u64>,
    /// Keep at most this many bytes locally, deleting only uploaded segments (e.g. 10GiB;
    /// 0 = delete each once uploaded; none = no limit).
    #[arg(long, value_name = "BYTES", value_parser = parse_hot_bytes)]
    hot_retention_bytes: Option<u64>,
    /// Upload sealed segments to the object store.
    #[arg(long, value_name = "BOOL")]
    tiered: Option<bool>,
}

impl StreamSettings {
    fn config(&self) -> StreamConfig {
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
enum Consistency {
    /// Acknowledge after the leader's write.
    Leader,
    /// Acknowledge once a majority of replicas hold the record.
    Quorum,
}

impl Consistency {
    fn as_str(self) -> &'static str {
        match self {
            Consistency::Leader => "leader",
            Consistency::Quorum => "quorum",
        }
    }
}

#[derive(Args, Debug)]
struct PublishArgs {
    /// The stream, as TENANT/NAMESPACE/STREAM.
    #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
    path: StreamPath,
    /// Key of every record (records with one key go to one shard, in order). Without it,
    /// each publish goes to the next shard in turn.
    #[arg(long, value_name = "K")]
    key: Option<String>,
    /// batch: publish up to --batch-size records per request and wait for each ack;
    /// message: one request per record, waiting for each ack; none: do not wait for the
    /// write (the broker may shed records under load).
    #[arg(long, value_enum, default_value_t = Acks::Batch)]
    acks: Acks,
    /// Records per publish with --acks batch or none.
    #[arg(long, default_value_t = 500, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    batch_size: u32,
    /// Codec of published batches: none, gzip, snappy, lz4, zstd.
    #[arg(long, default_value = "none", value_parser = parse_compression)]
    compression: Compression,
    /// text: a summary at the end; jsonl: {"shard":..,"offset":..,"line":N} per
    /// acknowledged record, in input order, as soon as it is acknowledged (the shard pairs an
    /// acknowledgement with its record on a stream of several shards).
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Publish N generated records instead of reading stdin.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Payload size of generated records, in bytes (with --count; default 100).
    #[arg(long, value_name = "BYTES", requires = "count")]
    size: Option<usize>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Acks {
    /// Fire and forget: no acknowledgement of the write.
    None,
    /// One request per record, each acknowledged before the next.
    Message,
    /// Batches of --batch-size records, each acknowledged before the next.
    Batch,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    /// Human-readable.
    Text,
    /// One JSON object per line.
    Jsonl,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum PayloadEncoding {
    /// UTF-8 text (invalid bytes replaced).
    Utf8,
    /// Standard base64.
    Base64,
}

#[derive(Args, Debug)]
struct SubscribeArgs {
    /// The stream, as TENANT/NAMESPACE/STREAM.
    #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
    path: StreamPath,
    /// Where to start: earliest, latest, an offset, or @TIME (RFC 3339, e.g.
    /// @2024-05-01T12:00:00Z, or @ and milliseconds since the epoch).
    #[arg(long, default_value = "latest", value_name = "POSITION", value_parser = start_at)]
    from: StartAt,
    /// Read only this shard (default: every shard, merged).
    #[arg(long, value_name = "N")]
    shard: Option<u32>,
    /// Exit after N records (in total).
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// text: each payload on its own line; jsonl:
    /// {"shard":..,"offset":..,"timestamp":..,"key":..,"payload":..} per record.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// How keys and payloads are printed.
    #[arg(long, value_enum, default_value_t = PayloadEncoding::Utf8)]
    payload_encoding: PayloadEncoding,
}

fn stream_path(s: &str) -> Result<StreamPath, String> {
    felix_client::parse_stream_path(s).map_err(|e| e.to_string())
}

fn namespace_path(s: &str) -> Result<(String, String), String> {
    felix_client::parse_namespace_path(s).map_err(|e| e.to_string())
}

fn start_at(s: &str) -> Result<StartAt, String> {
    felix_client::parse_start_at(s).map_err(|e| e.to_string())
}

fn parse_compression(s: &str) -> Result<Compression, String> {
    s.parse()
}

/// Bytes: a number with an optional unit (K/KB = 1000, KiB = 1024, likewise M, G, T).
fn parse_bytes(s: &str) -> Result<u64, String> {
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

/// A hot-retention size: `none` (no limit: `u64::MAX` on the wire) or a size.
fn parse_hot_bytes(s: &str) -> Result<u64, String> {
    match s.trim() {
        "none" | "unlimited" => Ok(u64::MAX),
        _ => parse_bytes(s),
    }
}

/// A hot-retention age: `none` (no limit) or milliseconds / a duration.
fn parse_hot_ms(s: &str) -> Result<u64, String> {
    match s.trim() {
        "none" | "unlimited" => Ok(u64::MAX),
        _ => parse_ms(s),
    }
}

/// Milliseconds: a plain number, or a duration such as 500ms, 10m, 7d.
fn parse_ms(s: &str) -> Result<u64, String> {
    if let Ok(n) = s.trim().parse::<u64>() {
        return Ok(n);
    }
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not milliseconds or a duration (e.g. 7d): {e}"))?;
    u64::try_from(d.as_millis()).map_err(|_| format!("{s:?} is too long"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("felixctl: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("felixctl: {e:#}");
            1
        }
    };
    // Nothing left to wait for: a stdin reader may still be blocked, so do not let the
    // runtime's shutdown wait on anything.
    runtime.shutdown_background();
    ExitCode::from(code)
}

async fn run(cli: Cli) -> anyhow::Result<u8> {
    let client = connect(&cli.global).await?;
    let code = match cli.command {
        Command::Tenant(TenantCommand::Create {
            name,
            if_not_exists,
        }) => {
            let r = client.create_tenant(&name).await;
            created(r, if_not_exists, &format!("tenant {name}"))?;
            0
        }
        Command::Namespace(NamespaceCommand::Create {
            path: (tenant, ns),
            if_not_exists,
        }) => {
            let r = client.create_namespace(&tenant, &ns).await;
            created(r, if_not_exists, &format!("namespace {tenant}/{ns}"))?;
            0
        }
        Command::Stream(cmd) => stream_command(&client, cmd).await?,
        Command::Publish(args) => publish(&client, args).await?,
        Command::Subscribe(args) => subscribe(&client, &cli.global, args).await?,
        Command::Segments {
            path: (t, ns, s),
            output,
        } => {
            let segments = client
                .list_segments(&t, &ns, &s)
                .await
                .with_context(|| format!("listing segments of {t}/{ns}/{s}"))?;
            print_segments(&segments, output)?;
            0
        }
    };
    client.close().await;
    Ok(code)
}

fn client_config(g: &GlobalArgs) -> ClientConfig {
    ClientConfig {
        ca: g.ca.clone(),
        insecure: g.insecure,
        name: format!("felixctl/{}", env!("CARGO_PKG_VERSION")),
        request_timeout: g.timeout,
        ..Default::default()
    }
}

/// Connects to the first broker of the list that answers.
async fn connect(g: &GlobalArgs) -> anyhow::Result<Connection> {
    let config = client_config(g);
    let mut errors = Vec::new();
    for addr in g.broker.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        match Connection::connect(addr, config.clone()).await {
            Ok(client) => return Ok(client),
            // A TLS setup problem (no CA for a remote broker, unreadable CA) is the same for
            // every broker: say it once.
            Err(e @ ClientError::Tls(_)) => return Err(anyhow!(e)),
            Err(e) => errors.push(format!("{addr}: {e}")),
        }
    }
    match errors.len() {
        0 => bail!("no broker address given (--broker HOST:PORT)"),
        1 => bail!("{}", errors[0]),
        _ => bail!("no broker answered: {}", errors.join("; ")),
    }
}

/// A create that may find the thing already there.
fn created(r: Result<(), ClientError>, if_not_exists: bool, what: &str) -> anyhow::Result<()> {
    match r {
        Ok(()) => println!("created {what}"),
        Err(e) if if_not_exists && e.code() == Some(codes::ALREADY_EXISTS) => {
            println!("{what} exists already")
        }
        Err(e) => return Err(anyhow!(e).context(format!("creating {what}"))),
    }
    Ok(())
}

fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).context("formatting JSON")?;
    println!("{text}");
    Ok(())
}

async fn stream_command(client: &Connection, cmd: StreamCommand) -> anyhow::Result<u8> {
    match cmd {
        StreamCommand::Create {
            path: (t, ns, s),
            durable,
            settings,
            if_not_exists,
        } => {
            let mut config = settings.config();
            // Explicit, so the stream is what felixctl says whatever the broker's default.
            config.durable = Some(durable);
            let info = match client.create_stream(&t, &ns, &s, config).await {
                Ok(info) => info,
                Err(e) if if_not_exists && e.code() == Some(codes::ALREADY_EXISTS) => client
                    .describe_stream(&t, &ns, &s)
                    .await
                    .with_context(|| format!("describing {t}/{ns}/{s}"))?,
                Err(e) => return Err(anyhow!(e).context(format!("creating stream {t}/{ns}/{s}"))),
            };
            print_json(&info)?;
        }
        StreamCommand::Alter {
            path: (t, ns, s),
            settings,
        } => {
            let config = settings.config();
            if config == StreamConfig::default() {
                eprintln!("felixctl: stream alter: no setting given (see --help)");
                return Ok(2);
            }
            let info = client
                .alter_stream(&t, &ns, &s, config)
                .await
                .with_context(|| format!("altering stream {t}/{ns}/{s}"))?;
            print_json(&info)?;
        }
        StreamCommand::Describe { path: (t, ns, s) } => {
            let info = client
                .describe_stream(&t, &ns, &s)
                .await
                .with_context(|| format!("describing stream {t}/{ns}/{s}"))?;
            print_json(&describe_json(&info)?)?;
        }
        StreamCommand::List { path: (t, ns) } => {
            let streams = client
                .list_streams(&t, &ns)
                .await
                .with_context(|| format!("listing streams of {t}/{ns}"))?;
            print_json(&streams)?;
        }
        StreamCommand::Delete { path: (t, ns, s) } => {
            client
                .delete_stream(&t, &ns, &s)
                .await
                .with_context(|| format!("deleting stream {t}/{ns}/{s}"))?;
            println!("deleted stream {t}/{ns}/{s}");
        }
    }
    Ok(0)
}

/// The stream as JSON, with the figures an operator asks for computed: per shard the
/// upload lag (records committed but not yet in recorded objects), and the broker's cold
/// cache hit rate.
fn describe_json(info: &felix_client::StreamInfo) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::to_value(info)?;
    if let Some(shards) = v.get_mut("shards").and_then(|s| s.as_array_mut()) {
        for (json, shard) in shards.iter_mut().zip(&info.shards) {
            let lag = if info.config.tiered == Some(true) {
                shard.next_offset.saturating_sub(shard.uploaded_end)
            } else {
                0
            };
            json["upload_lag_records"] = lag.into();
        }
    }
    let lookups = info.cache_hits + info.cache_misses;
    v["cache_hit_rate"] = if lookups > 0 {
        (info.cache_hits as f64 / lookups as f64).into()
    } else {
        serde_json::Value::Null
    };
    Ok(v)
}

fn print_segments(segments: &[felix_client::SegmentInfo], output: Output) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match output {
        Output::Jsonl => {
            for s in segments {
                writeln!(out, "{}", serde_json::to_string(s)?)?;
            }
        }
        Output::Text => {
            writeln!(
                out,
                "{:>5} {:>20} {:>20} {:>9} {:>12} {:<5}  OBJECT",
                "SHARD", "BASE", "LAST", "TIER", "BYTES", "LOCAL"
            )?;
            for s in segments {
                writeln!(
                    out,
                    "{:>5} {:>20} {:>20} {:>9} {:>12} {:<5}  {}",
                    s.shard,
                    s.base_offset,
                    s.last_offset,
                    s.tier,
                    s.size_bytes,
                    if s.local { "yes" } else { "no" },
                    s.object_key.as_deref().unwrap_or("-")
                )?;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// publish

/// One input record: its 1-based line (or generated record) number and payload.
struct Line {
    number: u64,
    payload: Bytes,
}

/// Strips the line terminator (`\n`, or `\r\n`) read with a line.
fn strip_newline(mut line: Vec<u8>) -> Vec<u8> {
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
    line
}

/// The payload of generated record `n`: "record-N " padded with 'x' (or cut) to `size`.
fn generated_payload(n: u64, size: usize) -> Bytes {
    let mut p = format!("record-{n} ").into_bytes();
    p.resize(size, b'x');
    Bytes::from(p)
}

/// Feeds input records into a channel from a plain thread (so a blocked stdin read never
/// holds up the exit). An input error ends the feed with `Err`.
fn spawn_source(args: &PublishArgs, capacity: usize) -> mpsc::Receiver<Result<Line, String>> {
    let (tx, rx) = mpsc::channel(capacity);
    let generated = args.count.map(|count| (count, args.size.unwrap_or(100)));
    std::thread::spawn(move || match generated {
        Some((count, size)) => {
            for number in 1..=count {
                let line = Line {
                    number,
                    payload: generated_payload(number, size),
                };
                if tx.blocking_send(Ok(line)).is_err() {
                    return;
                }
            }
        }
        None => {
            let mut stdin = std::io::stdin().lock();
            let mut number = 0;
            loop {
                let mut buf = Vec::new();
                match stdin.read_until(b'\n', &mut buf) {
                    Ok(0) => return,
                    Ok(_) => {
                        number += 1;
                        let line = Line {
                            number,
                            payload: Bytes::from(strip_newline(buf)),
                        };
                        if tx.blocking_send(Ok(line)).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        let _ = tx.blocking_send(Err(format!("reading stdin: {e}")));
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// `{"shard":..,"offset":..,"line":N}`: offsets are per shard, so a script pairing
/// acknowledgements with records needs both.
#[derive(Serialize)]
struct PublishedLine {
    shard: u32,
    offset: u64,
    line: u64,
}

fn published_json(shard: u32, offset: u64, line: u64) -> String {
    serde_json::to_string(&PublishedLine {
        shard,
        offset,
        line,
    })
    .unwrap_or_default()
}

/// Whether a failed publish should stop the run: the connection is gone, or the stream
/// itself is refused (every later record would fail the same way). Per-record refusals and
/// transient ones are reported and the run goes on.
fn stops_the_run(e: &ClientError) -> bool {
    match e {
        ClientError::Broker(b) => !matches!(
            b.code,
            codes::RECORD_TOO_LARGE
                | codes::FRAME_TOO_LARGE
                | codes::INVALID_ARGUMENT
                | codes::BAD_REQUEST
                | codes::OVERLOADED
                | codes::QUORUM_TIMEOUT
                | codes::SHARD_UNAVAILABLE
        ),
        ClientError::InvalidArgument(_) => false,
        _ => true,
    }
}

/// Room for a batch's records in one frame, leaving space for the frame and batch headers
/// and per-record overhead.
const BATCH_BYTE_BUDGET: usize = DEFAULT_MAX_FRAME / 2;
/// Per-record bytes counted on top of key and payload.
const RECORD_OVERHEAD: usize = 32;
/// How often an `overloaded` publish is retried (after the broker's `retry_after_ms`).
const OVERLOAD_RETRIES: u32 = 5;

/// Progress on stderr once a second (only when stderr is a terminal).
fn spawn_progress(published: Arc<AtomicU64>) -> Option<tokio::task::JoinHandle<()>> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        let mut last = 0;
        loop {
            tick.tick().await;
            let now = published.load(Ordering::Relaxed);
            eprintln!(
                "felixctl: {now} records published ({} records/s)",
                now - last
            );
            last = now;
        }
    }))
}

async fn publish(client: &Connection, args: PublishArgs) -> anyhow::Result<u8> {
    let (t, ns, s) = args.path.clone();
    let client = client.with_compression(args.compression);
    let (ack, batch_size) = match args.acks {
        Acks::None => (AckMode::None, args.batch_size as usize),
        Acks::Message => (AckMode::Batch, 1),
        Acks::Batch => (AckMode::Batch, args.batch_size as usize),
    };
    let key = args.key.clone().map(Bytes::from);
    let mut source = spawn_source(&args, batch_size.max(1024));
    let published = Arc::new(AtomicU64::new(0));
    let progress = spawn_progress(published.clone());
    let started = Instant::now();
    let mut failed = 0u64;
    let mut stdout = std::io::stdout();
    let mut carry: Option<Line> = None;
    let mut input_error = None;
    let mut stopped = None;

    'run: loop {
        // Gather a batch: whatever is ready now, up to the record and byte limits.
        let first = match carry.take() {
            Some(line) => line,
            None => match source.recv().await {
                Some(Ok(line)) => line,
                Some(Err(e)) => {
                    input_error = Some(e);
                    break;
                }
                None => break,
            },
        };
        let record_bytes =
            |l: &Line| l.payload.len() + key.as_ref().map_or(0, |k| k.len()) + RECORD_OVERHEAD;
        let mut bytes = record_bytes(&first);
        let mut batch = vec![first];
        while batch.len() < batch_size {
            match source.try_recv() {
                Ok(Ok(line)) => {
                    let b = record_bytes(&line);
                    if bytes + b > BATCH_BYTE_BUDGET {
                        carry = Some(line);
                        break;
                    }
                    bytes += b;
                    batch.push(line);
                }
                Ok(Err(e)) => {
                    input_error = Some(e);
                    break;
                }
                Err(_) => break,
            }
        }

        let mut attempt = 0;
        let outcomes = loop {
            let messages: Vec<Message> = batch
                .iter()
                .map(|l| Message {
                    key: key.clone(),
                    payload: l.payload.clone(),
                    headers: Vec::new(),
                    timestamp: None,
                })
                .collect();
            let outcomes = match client
                .publish_batch_detailed(&t, &ns, &s, messages, ack)
                .await
            {
                Ok(o) => o,
                Err(e) => {
                    for l in &batch {
                        eprintln!("felixctl: line {}: not published: {e}", l.number);
                    }
                    failed += batch.len() as u64;
                    stopped = Some((e, batch.last().map_or(0, |l| l.number) + 1));
                    break 'run;
                }
            };
            let overloaded = outcomes
                .iter()
                .all(|o| matches!(&o.result, Err(e) if e.code() == Some(codes::OVERLOADED)));
            if overloaded && attempt < OVERLOAD_RETRIES {
                attempt += 1;
                let wait = outcomes
                    .iter()
                    .find_map(|o| o.result.as_ref().err().and_then(ClientError::retry_after))
                    .unwrap_or(Duration::from_millis(100));
                tokio::time::sleep(wait).await;
                continue;
            }
            break outcomes;
        };

        // (line, shard, offset) of each acknowledged record.
        let mut acked: Vec<(u64, u32, u64)> = Vec::new();
        let mut fatal = None;
        for outcome in outcomes {
            match outcome.result {
                Ok(Some(p)) => {
                    for (i, &idx) in outcome.indices.iter().enumerate() {
                        acked.push((batch[idx].number, p.shard, p.offset_of(i)));
                    }
                }
                Ok(None) => {
                    published.fetch_add(outcome.indices.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    let what = if e.outcome_unknown() {
                        "outcome unknown"
                    } else {
                        "not published"
                    };
                    for &idx in &outcome.indices {
                        eprintln!("felixctl: line {}: {what}: {e}", batch[idx].number);
                    }
                    failed += outcome.indices.len() as u64;
                    if stops_the_run(&e) && fatal.is_none() {
                        fatal = Some(e);
                    }
                }
            }
        }
        acked.sort_unstable();
        published.fetch_add(acked.len() as u64, Ordering::Relaxed);
        if args.output == Output::Jsonl && !acked.is_empty() {
            let mut out = String::with_capacity(acked.len() * 32);
            for &(line, shard, offset) in &acked {
                out.push_str(&published_json(shard, offset, line));
                out.push('\n');
            }
            if let Err(e) = stdout
                .write_all(out.as_bytes())
                .and_then(|_| stdout.flush())
            {
                if e.kind() == std::io::ErrorKind::BrokenPipe {
                    return Ok(if failed > 0 { 1 } else { 0 });
                }
                return Err(anyhow!(e).context("writing stdout"));
            }
        }
        if let Some(e) = fatal {
            stopped = Some((e, batch.last().map_or(0, |l| l.number) + 1));
            break;
        }
        if input_error.is_some() {
            break;
        }
    }

    if let Some(p) = progress {
        p.abort();
    }
    let count = published.load(Ordering::Relaxed);
    let mut code = if failed > 0 { 1 } else { 0 };
    if let Some((e, next_line)) = stopped {
        eprintln!("felixctl: stopped after {e}; records from line {next_line} on were not sent");
        code = 1;
    }
    if let Some(e) = input_error {
        eprintln!("felixctl: {e}");
        code = 1;
    }
    if args.output == Output::Text {
        let secs = started.elapsed().as_secs_f64();
        let verb = if ack == AckMode::None {
            "sent (unacknowledged)"
        } else {
            "published"
        };
        println!(
            "{verb} {count} records to {t}/{ns}/{s} in {secs:.2} s ({:.0} records/s){}",
            count as f64 / secs.max(1e-9),
            if failed > 0 {
                format!("; {failed} failed")
            } else {
                String::new()
            }
        );
    }
    Ok(code)
}

// ---------------------------------------------------------------------------------------
// subscribe

/// `{"shard":..,"offset":..,"timestamp":..,"key":..,"payload":..}`.
#[derive(Serialize)]
struct EventLine<'a> {
    shard: u32,
    offset: u64,
    timestamp: i64,
    key: Option<std::borrow::Cow<'a, str>>,
    payload: std::borrow::Cow<'a, str>,
}

fn encode_bytes(b: &[u8], encoding: PayloadEncoding) -> std::borrow::Cow<'_, str> {
    match encoding {
        PayloadEncoding::Utf8 => String::from_utf8_lossy(b),
        PayloadEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(b).into(),
    }
}

fn event_json(shard: u32, event: &Event, encoding: PayloadEncoding) -> String {
    serde_json::to_string(&EventLine {
        shard,
        offset: event.offset,
        timestamp: event.timestamp,
        key: event.key.as_deref().map(|k| encode_bytes(k, encoding)),
        payload: encode_bytes(&event.payload, encoding),
    })
    .unwrap_or_default()
}

/// One printed record (text: the payload and a newline).
fn format_event(shard: u32, event: &Event, output: Output, encoding: PayloadEncoding) -> Vec<u8> {
    let mut out = match (output, encoding) {
        (Output::Jsonl, _) => event_json(shard, event, encoding).into_bytes(),
        (Output::Text, PayloadEncoding::Utf8) => event.payload.to_vec(),
        (Output::Text, PayloadEncoding::Base64) => encode_bytes(&event.payload, encoding)
            .into_owned()
            .into_bytes(),
    };
    out.push(b'\n');
    out
}

async fn subscribe(client: &Connection, g: &GlobalArgs, args: SubscribeArgs) -> anyhow::Result<u8> {
    let (t, ns, s) = args.path.clone();
    let shards: Vec<u32> = match args.shard {
        Some(shard) => vec![shard],
        None => {
            let n = client
                .shard_count(&t, &ns, &s)
                .await
                .with_context(|| format!("describing stream {t}/{ns}/{s}"))?;
            (0..n).collect()
        }
    };
    if args.count == Some(0) {
        return Ok(0);
    }
    // Open every subscription before printing anything, so a bad shard fails up front.
    let mut subs = Vec::with_capacity(shards.len());
    for &shard in &shards {
        let sub = match client.subscribe(&t, &ns, &s, shard, args.from).await {
            // In a cluster, a shard is read on its leader: follow the broker's hint once.
            Err(ClientError::Broker(e))
                if e.code == codes::NOT_LEADER && e.leader_addr.is_some() =>
            {
                let addr = e.leader_addr.unwrap_or_default();
                let leader = Connection::connect(&addr, client_config(g))
                    .await
                    .with_context(|| format!("connecting to shard {shard}'s leader at {addr}"))?;
                leader.subscribe(&t, &ns, &s, shard, args.from).await
            }
            other => other,
        }
        .with_context(|| format!("subscribing to {t}/{ns}/{s} shard {shard}"))?;
        subs.push(sub);
    }
    let (tx, mut rx) = mpsc::channel::<(u32, Result<Option<Event>, ClientError>)>(1024);
    for mut sub in subs {
        let tx = tx.clone();
        tokio::spawn(async move {
            let shard = sub.shard();
            loop {
                let next = sub.next_event().await;
                let last = !matches!(next, Ok(Some(_)));
                if tx.send((shard, next)).await.is_err() || last {
                    return;
                }
            }
        });
    }
    drop(tx);

    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut printed = 0u64;
    let mut code = 0;
    while let Some((shard, next)) = rx.recv().await {
        match next {
            Ok(Some(event)) => {
                let bytes = format_event(shard, &event, args.output, args.payload_encoding);
                let mut write = out.write_all(&bytes);
                printed += 1;
                let done = args.count.is_some_and(|n| printed >= n);
                if write.is_ok() && (done || rx.is_empty()) {
                    write = out.flush();
                }
                if let Err(e) = write {
                    if e.kind() == std::io::ErrorKind::BrokenPipe {
                        return Ok(0);
                    }
                    return Err(anyhow!(e).context("writing stdout"));
                }
                if done {
                    break;
                }
            }
            Ok(None) => {}
            Err(ClientError::SubscriptionLagged { resume_offset }) => {
                let _ = out.flush();
                eprintln!(
                    "felixctl: shard {shard} lagged: resume from offset {resume_offset} \
                     (--shard {shard} --from {resume_offset})"
                );
                code = 1;
                break;
            }
            Err(e) => {
                let _ = out.flush();
                eprintln!("felixctl: shard {shard}: {e}");
                code = 1;
                break;
            }
        }
    }
    let _ = out.flush();
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("felixctl").chain(args.iter().copied()))
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn global_options_go_before_or_after_the_subcommand() {
        let a = parse(&["--broker", "h:1", "stream", "describe", "a/b/c"]).unwrap();
        let b = parse(&[
            "stream",
            "describe",
            "a/b/c",
            "--broker",
            "h:1",
            "--insecure",
        ])
        .unwrap();
        assert_eq!(a.global.broker, "h:1");
        assert_eq!(b.global.broker, "h:1");
        assert!(b.global.insecure);
        let c = parse(&["publish", "a/b/c", "--timeout", "500ms"]).unwrap();
        assert_eq!(c.global.timeout, Duration::from_millis(500));
    }

    #[test]
    fn usage_errors_exit_with_2() {
        for bad in [
            vec!["stream", "describe", "a/b"],
            vec!["namespace", "create", "a"],
            vec!["subscribe", "a/b/c", "--from", "yesterday"],
            vec!["publish", "a/b/c", "--acks", "all"],
            vec!["publish", "a/b/c", "--size", "10"],
            vec!["publish", "a/b/c", "--batch-size", "0"],
            vec!["publish", "a/b/c", "--compression", "brotli"],
            vec!["stream", "create", "a/b/c", "--consistency", "all"],
        ] {
            let err = parse(&bad).expect_err(&format!("{bad:?} accepted"));
            assert_eq!(err.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn stream_flags_map_to_config_fields() {
        let cli = parse(&[
            "stream",
            "create",
            "t/n/s",
            "--durable",
            "--shards",
            "4",
            "--replicas",
            "3",
            "--consistency",
            "quorum",
            "--segment-bytes",
            "64MiB",
            "--segment-ms",
            "10m",
            "--retention-ms",
            "604800000",
            "--retention-bytes",
            "0",
            "--hot-retention-ms",
            "1h",
            "--hot-retention-bytes",
            "1GB",
        ])
        .unwrap();
        let Command::Stream(StreamCommand::Create {
            path,
            durable,
            settings,
            ..
        }) = cli.command
        else {
            panic!("not stream create");
        };
        assert_eq!(path, ("t".into(), "n".into(), "s".into()));
        assert!(durable);
        let c = settings.config();
        assert_eq!(c.shards, Some(4));
        assert_eq!(c.replicas, Some(3));
        assert_eq!(c.consistency.as_deref(), Some("quorum"));
        assert_eq!(c.segment_bytes, Some(64 << 20));
        assert_eq!(c.segment_ms, Some(600_000));
        assert_eq!(c.retention_ms, Some(604_800_000));
        assert_eq!(c.retention_bytes, Some(0));
        assert_eq!(c.hot_retention_ms, Some(3_600_000));
        assert_eq!(c.hot_retention_bytes, Some(1_000_000_000));
        assert_eq!(c.tiered, None);
    }

    #[test]
    fn publish_defaults_are_batch_acks_of_500_uncompressed_text() {
        let cli = parse(&["publish", "t/n/s"]).unwrap();
        let Command::Publish(p) = cli.command else {
            panic!("not publish");
        };
        assert_eq!(p.acks, Acks::Batch);
        assert_eq!(p.batch_size, 500);
        assert_eq!(p.compression, Compression::None);
        assert_eq!(p.output, Output::Text);
        assert!(p.count.is_none() && p.key.is_none());
    }

    #[test]
    fn subscribe_parses_every_start_position() {
        let from = |f: &str| {
            let cli = parse(&["subscribe", "t/n/s", "--from", f]).unwrap();
            let Command::Subscribe(s) = cli.command else {
                panic!("not subscribe");
            };
            s.from
        };
        assert_eq!(from("earliest"), StartAt::Earliest);
        assert_eq!(from("latest"), StartAt::Latest);
        assert_eq!(from("17"), StartAt::Offset(17));
        assert_eq!(
            from("@2024-05-01T12:00:00Z"),
            StartAt::Timestamp(1_714_564_800_000)
        );
        let cli = parse(&["subscribe", "t/n/s"]).unwrap();
        let Command::Subscribe(s) = cli.command else {
            panic!("not subscribe");
        };
        assert_eq!(s.from, StartAt::Latest);
        assert_eq!(s.shard, None);
    }

    #[test]
    fn sizes_and_durations_parse_with_units() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("4KiB"), Ok(4096));
        assert_eq!(parse_bytes("2MB"), Ok(2_000_000));
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("99999999999TiB").is_err());
        assert_eq!(parse_ms("250"), Ok(250));
        assert_eq!(parse_ms("7d"), Ok(7 * 86_400_000));
        assert_eq!(parse_ms("1s 500ms"), Ok(1500));
        assert!(parse_ms("soon").is_err());
    }

    #[test]
    fn published_lines_are_shard_offset_then_line() {
        assert_eq!(
            published_json(3, 41, 7),
            r#"{"shard":3,"offset":41,"line":7}"#
        );
    }

    #[test]
    fn events_print_as_jsonl_in_utf8_or_base64() {
        let event = Event {
            offset: 9,
            timestamp: 1_700_000_000_000,
            key: Some(Bytes::from_static(b"k1")),
            payload: Bytes::from_static(b"caf\xc3\xa9 \xff"),
            headers: Vec::new(),
        };
        assert_eq!(
            event_json(2, &event, PayloadEncoding::Utf8),
            "{\"shard\":2,\"offset\":9,\"timestamp\":1700000000000,\"key\":\"k1\",\"payload\":\"caf\u{e9} \u{fffd}\"}"
        );
        assert_eq!(
            event_json(2, &event, PayloadEncoding::Base64),
            r#"{"shard":2,"offset":9,"timestamp":1700000000000,"key":"azE=","payload":"Y2Fmw6kg/w=="}"#
        );
        let keyless = Event { key: None, ..event };
        let v: serde_json::Value =
            serde_json::from_str(&event_json(0, &keyless, PayloadEncoding::Utf8)).unwrap();
        assert!(v["key"].is_null());
        assert_eq!(
            format_event(0, &keyless, Output::Text, PayloadEncoding::Utf8),
            b"caf\xc3\xa9 \xff\n"
        );
        assert_eq!(
            format_event(0, &keyless, Output::Text, PayloadEncoding::Base64),
            b"Y2Fmw6kg/w==\n"
        );
    }

    #[test]
    fn input_lines_lose_their_terminator_only() {
        assert_eq!(strip_newline(b"abc\n".to_vec()), b"abc");
        assert_eq!(strip_newline(b"abc\r\n".to_vec()), b"abc");
        assert_eq!(strip_newline(b"abc".to_vec()), b"abc");
        assert_eq!(strip_newline(b"\n".to_vec()), b"");
        assert_eq!(strip_newline(b"a\rb\n".to_vec()), b"a\rb");
    }

    #[test]
    fn generated_payloads_have_the_requested_size() {
        assert_eq!(&generated_payload(3, 12)[..], b"record-3 xxx");
        assert_eq!(&generated_payload(12345, 4)[..], b"reco");
        assert_eq!(generated_payload(1, 0).len(), 0);
    }

    #[test]
    fn only_connection_and_stream_level_failures_stop_a_publish_run() {
        let broker = |code| ClientError::Broker(felix_client::ErrorBody::new(code, "r", "m"));
        assert!(stops_the_run(&ClientError::Transport("gone".into())));
        assert!(stops_the_run(&ClientError::Timeout));
        assert!(stops_the_run(&broker(codes::UNKNOWN_STREAM)));
        assert!(!stops_the_run(&broker(codes::RECORD_TOO_LARGE)));
        assert!(!stops_the_run(&broker(codes::OVERLOADED)));
        assert!(!stops_the_run(&ClientError::InvalidArgument("big".into())));
    }
}
