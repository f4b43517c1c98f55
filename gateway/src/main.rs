//! `felix`: runs one broker node — the embedded control plane, the broker, the QUIC
//! listener and admin HTTP — until SIGINT or SIGTERM.
//!
//! Exit codes: 0 after a clean shutdown (or a successful `--check-config`), 1 when the node
//! cannot start, 2 when the configuration is invalid.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{CommandFactory, FromArgMatches, Parser};
use felix_gateway::broker::Broker;
use felix_gateway::config::{self, BrokerConfig};
use felix_gateway::internal::{self, BrokerSlot};
use felix_gateway::kafka::{KafkaListener, KafkaSettings};
use felix_gateway::metrics::Metrics;
use felix_gateway::{admin, cluster_secret, server, tls};
use felix_meta::{Command, CommandError, MetaConfig, MetaError, MetaHandle, MetaNode};
use tokio::sync::watch;
use tracing::{info, warn};

/// The tenant and namespace a single node creates on its first start.
const DEFAULT_TENANT: &str = "default";
const DEFAULT_NAMESPACE: &str = "default";
/// How long a single node waits for its metadata group to elect itself.
const META_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long each shutdown step may take before the next one goes ahead anyway.
const SHUTDOWN_STEP_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_LOG_FILTER: &str = "info,openraft=warn,felix_meta=info";

const ABOUT: &str = "Felix: a tiered-storage streaming broker (one node)";

const LONG_ABOUT: &str = "\
Felix: a tiered-storage streaming broker. Publishers and subscribers talk to it over QUIC; \
durable streams are kept in local shard logs under an fsync policy; a Raft control plane \
records tenants, namespaces, streams and shard placement.

With no arguments, `felix` runs a single node with the embedded defaults:
  * node 1, a one-member control plane in ./felix-data/meta (internal HTTP on 127.0.0.1:5100)
  * the QUIC client listener on 127.0.0.1:5000, with a self-signed CA and certificate
    generated under ./felix-data/tls (clients trust ./felix-data/tls/ca.pem)
  * admin HTTP on 127.0.0.1:8080: /metrics, /healthz and the /v1 management API
  * the Kafka protocol listener on 127.0.0.1:9092: topics are the streams of default/default
  * tenant `default` with namespace `default`, ready to use
  * durable writes fsynced every 250 ms, publishes acknowledged once written

Every setting comes, in increasing precedence, from the defaults, a TOML file (--config), \
FELIX_* environment variables and the flags below. --check-config prints the effective \
configuration as TOML and exits. See docs/configuration.md.

Logging goes to stderr, filtered by FELIX_LOG (default: info,openraft=warn,felix_meta=info).";

#[derive(Parser, Debug)]
#[command(name = "felix", version, about = ABOUT, long_about = LONG_ABOUT)]
struct Cli {
    #[command(flatten)]
    config: config::Args,

    /// Validate the configuration, print it as TOML and exit (0 if valid, 2 if not).
    #[arg(long)]
    check_config: bool,
}

fn main() -> ExitCode {
    // The FELIX_* variables are a layer of their own (config::sources), not clap's.
    let matches = config::without_env(Cli::command()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let config = match BrokerConfig::load(&cli.config) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("felix: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.check_config {
        print!("{}", config.to_toml());
        return ExitCode::SUCCESS;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FELIX_LOG")
                .unwrap_or_else(|_| DEFAULT_LOG_FILTER.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let config_file = cli
        .config
        .config
        .clone()
        .or_else(|| std::env::var_os(config::CONFIG_ENV).map(std::path::PathBuf::from));
    felix_gateway::inert_settings::log_notes(config_file.as_deref(), &|var| {
        std::env::var(var).ok()
    });
    // Before any thread starts: cold-read decodes allocate and free MiB-sized buffers,
    // which glibc would otherwise map and unmap anew for every row group.
    if !felix_cold::malloc::keep_decode_buffers() {
        tracing::debug!("the C library's allocator does not take mallopt thresholds");
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("felix: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("felix: {}", report(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, like `{:#}`, but without a cause that the message
/// before it already ends with (errors that print their source as well as expose it).
fn report(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// Starts every part of the node, waits for a signal, then stops them in reverse.
async fn run(config: BrokerConfig) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("create the data directory {}", config.data_dir.display()))?;

    let mut meta_config =
        MetaConfig::single(config.node_id, &config.data_dir, config.internal_addr);
    meta_config.advertise = config.cluster.get(&config.node_id).cloned();
    meta_config.cluster = config.cluster.clone();
    meta_config.snapshot_after_logs = config.meta_snapshot_logs;
    meta_config.lease = Duration::from_millis(config.lease_ms);
    meta_config.replica_replace_after = Duration::from_millis(config.replica_replace_after_ms);
    // Followers fetch from shard leaders on the same internal address as Raft.
    let slot: BrokerSlot = Arc::default();
    meta_config.extra_routes = Some(internal::router(slot.clone()));
    meta_config.cluster_key =
        cluster_secret::cluster_key(&config).context("set up the internal network's secret")?;
    let meta = MetaNode::start(meta_config).await.with_context(|| {
        format!(
            "start the metadata node on {} (data in {})",
            config.internal_addr,
            config.data_dir.join("meta").display()
        )
    })?;
    info!(node = config.node_id, addr = %meta.local_addr(), "metadata node started");

    let result = serve(&config, &meta, slot).await;
    stop_step("metadata node", meta.shutdown()).await;
    result
}

/// Everything after the metadata node: on error, whatever started is stopped before the
/// error is returned.
async fn serve(config: &BrokerConfig, meta: &MetaNode, slot: BrokerSlot) -> anyhow::Result<()> {
    if config.cluster.len() <= 1 {
        if !meta.handle().wait_ready(META_READY_TIMEOUT).await {
            bail!(
                "the metadata node did not become ready within {META_READY_TIMEOUT:?} \
                 (data in {})",
                config.data_dir.join("meta").display()
            );
        }
    } else {
        // A cluster forms once a majority of its members is up: wait as long as it takes.
        while !meta.handle().wait_ready(META_READY_TIMEOUT).await {
            warn!(
                members = config.cluster.len(),
                "the control plane has no leader yet; waiting for a majority of the cluster"
            );
        }
    }
    register_broker(config, meta.handle())
        .await
        .context("register this broker with the control plane")?;
    ensure_default_namespace(meta.handle())
        .await
        .context("create the default tenant and namespace")?;

    if config.auth {
        // Before any listener: `/healthz` says ready only once admin.token is written.
        let access = felix_gateway::auth::AccessControl::new(true, meta.handle().clone());
        felix_gateway::auth::ensure_bootstrap_token(&access, &config.data_dir)
            .await
            .context("mint or fetch the bootstrap admin token")?;
    }
    let metrics = Arc::new(Metrics::new());
    let broker = Broker::start(config, meta.handle().clone(), metrics.clone())
        .await
        .context("start the broker")?;
    // A shard move carries the shard's group journal too (`moves::shard_logs`).
    felix_gateway::groups::move_logs::register(&broker);
    // Consumer groups' once-a-second pass (lapsed dead letters, compaction, gauges).
    tokio::spawn(felix_gateway::groups::sweep::run(Arc::downgrade(&broker)));
    // Caches' once-a-second pass (expiry deletes, compaction, gauges).
    tokio::spawn(felix_gateway::cache::sweep::run(Arc::downgrade(&broker)));
    let _ = slot.set(Arc::downgrade(&broker));
    let result = listen(config, &broker, metrics).await;
    if result.is_err() {
        stop_step("broker", broker.shutdown()).await;
    }
    result
}

/// The listeners: QUIC for clients, HTTP for admin, Kafka. Returns once a signal asked to stop
/// and the broker and the listeners have stopped: the broker first, so that it ends its
/// subscriptions and flushes its logs while clients are still connected to hear it.
async fn listen(
    config: &BrokerConfig,
    broker: &Arc<Broker>,
    metrics: Arc<Metrics>,
) -> anyhow::Result<()> {
    let tls = tls::server_config(
        &config.data_dir,
        config.tls_cert.as_deref(),
        config.tls_key.as_deref(),
        Duration::from_millis(config.quic_idle_timeout_ms),
    )
    .context("configure TLS for the QUIC listener")?;
    let endpoint = tls::quic_endpoint(tls.config, config.quic_addr)
        .with_context(|| format!("listen for QUIC on {}", config.quic_addr))?;
    let admin_listener = match tokio::net::TcpListener::bind(config.admin_addr).await {
        Ok(listener) => listener,
        Err(e) => {
            endpoint.close(0u32.into(), b"broker stopping");
            return Err(e)
                .with_context(|| format!("listen for admin HTTP on {}", config.admin_addr));
        }
    };
    let kafka_settings = KafkaSettings::from_config(config, DEFAULT_TENANT, DEFAULT_NAMESPACE);
    let kafka = match KafkaListener::bind(config, kafka_settings, broker.clone()).await {
        Ok(kafka) => kafka,
        Err(e) => {
            endpoint.close(0u32.into(), b"broker stopping");
            return Err(e);
        }
    };
    let quic_addr = local_or_configured(endpoint.local_addr(), config.quic_addr);
    let admin_addr = local_or_configured(admin_listener.local_addr(), config.admin_addr);
    let kafka_addr = local_or_configured(kafka.local_addr(), config.kafka_addr);
    // Which Kafka clients can connect: a listener is TLS or plaintext by configuration.
    let kafka_kind = if kafka.tls() { " (TLS)" } else { "" };
    let kafka_offsets = kafka.offsets_flusher();

    let (stop, stopped) = watch::channel(false);
    let quic_task = tokio::spawn(server::serve_quic(
        endpoint.clone(),
        broker.clone(),
        stopped.clone(),
    ));
    let kafka_task = tokio::spawn(kafka.serve(stopped.clone()));
    let admin_router = admin::router(
        broker.clone(),
        metrics,
        config.auth && config.metrics_require_auth,
    );
    let admin_task = tokio::spawn(async move {
        if let Err(e) = admin::serve(admin_listener, admin_router, stopped).await {
            warn!(error = %e, "admin HTTP server failed");
        }
    });

    let trust = match &tls.ca_path {
        Some(ca) => format!("CA: {}", ca.display()),
        None => format!(
            "certificate: {}",
            config
                .tls_cert
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        ),
    };
    eprintln!(
        "felix node {} ready: quic {}, admin {}, kafka {}{}, data {} ({})",
        config.node_id,
        quic_addr,
        admin_addr,
        kafka_addr,
        kafka_kind,
        config.data_dir.display(),
        trust
    );

    let signal = wait_for_signal().await;
    info!(signal, "stopping");
    stop_step("broker", broker.shutdown()).await;
    let _ = stop.send(true);
    endpoint.close(0u32.into(), b"broker stopping");
    stop_step("QUIC listener", async {
        let _ = quic_task.await;
        endpoint.wait_idle().await;
    })
    .await;
    stop_step("admin HTTP", async {
        let _ = admin_task.await;
    })
    .await;
    stop_step("Kafka listener", async {
        let _ = kafka_task.await;
        kafka_offsets.flush().await;
    })
    .await;
    Ok(())
}

/// Records this broker's addresses in the control plane (a restart re-registers), so
/// placement can name it and clients and peers can reach it.
async fn register_broker(config: &BrokerConfig, meta: &MetaHandle) -> anyhow::Result<()> {
    let internal_addr = config
        .cluster
        .get(&config.node_id)
        .cloned()
        .unwrap_or_else(|| config.internal_addr.to_string());
    // A listener bound to every interface is advertised at this node's cluster host (the
    // address its peers reach it at), so clients and peers get a routable address.
    let host = internal_addr
        .rsplit_once(':')
        .map_or(internal_addr.as_str(), |(h, _)| h)
        .to_owned();
    let advertised = |addr: SocketAddr| {
        if addr.ip().is_unspecified() {
            format!("{host}:{}", addr.port())
        } else {
            addr.to_string()
        }
    };
    let cmd = Command::RegisterBroker {
        broker: felix_meta::model::Broker {
            id: config.node_id,
            client_addr: advertised(config.quic_addr),
            kafka_addr: Some(advertised(config.kafka_addr)),
            internal_addr,
            zone: config.zone.clone(),
            alive: true,
            draining: false,
        },
    };
    let mut attempt = 0;
    loop {
        match meta.propose(cmd.clone()).await {
            Ok(_) => return Ok(()),
            Err(MetaError::Rejected(e)) => return Err(e.into()),
            Err(e) if attempt < 20 => {
                attempt += 1;
                warn!(error = %e, "registering with the control plane failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Creates tenant `default` and its namespace `default`, keeping them if they exist.
async fn ensure_default_namespace(meta: &MetaHandle) -> anyhow::Result<()> {
    let commands = [
        Command::CreateTenant {
            name: DEFAULT_TENANT.to_owned(),
        },
        Command::CreateNamespace {
            tenant: DEFAULT_TENANT.to_owned(),
            name: DEFAULT_NAMESPACE.to_owned(),
        },
    ];
    for cmd in commands {
        match meta.propose(cmd).await {
            Ok(_) | Err(MetaError::Rejected(CommandError::AlreadyExists { .. })) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn local_or_configured(local: std::io::Result<SocketAddr>, configured: SocketAddr) -> SocketAddr {
    local.unwrap_or(configured)
}

/// Waits for SIGINT or SIGTERM; returns the signal's name.
async fn wait_for_signal() -> &'static str {
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    match term {
        Ok(mut term) => tokio::select! {
            _ = tokio::signal::ctrl_c() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        },
        Err(e) => {
            warn!(error = %e, "cannot listen for SIGTERM; stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}

/// Runs one shutdown step, giving up on it after [`SHUTDOWN_STEP_TIMEOUT`].
async fn stop_step(what: &str, step: impl std::future::Future<Output = ()>) {
    if tokio::time::timeout(SHUTDOWN_STEP_TIMEOUT, step)
        .await
        .is_err()
    {
        warn!("{what} did not stop within {SHUTDOWN_STEP_TIMEOUT:?}; going on with the shutdown");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["felix", "--check-config", "--node-id", "3"])
            .expect("valid flags");
        assert!(cli.check_config);
        assert_eq!(cli.config.node_id, Some(3));
    }

    #[test]
    fn a_report_names_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "in use");
        let error = anyhow::Error::new(io)
            .context("bind 127.0.0.1:1: in use")
            .context("start");
        assert_eq!(report(&error), "start: bind 127.0.0.1:1: in use");
    }
}
