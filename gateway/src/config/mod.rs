//! Every setting of a broker node, and where each comes from.
//!
//! Four sources, lowest to highest precedence: the embedded defaults, a TOML file
//! (`--config FILE` or `FELIX_CONFIG`), `FELIX_*` environment variables, and command-line
//! flags. Each source is read into the same all-optional [`Args`] layer; the layers are
//! merged setting by setting, the unset ones take their defaults, and the result is
//! validated as a whole. The invariant: a [`BrokerConfig`] returned by
//! [`BrokerConfig::load`] is valid, so the broker never has to re-check a setting.
//!
//! Where each part lives: the settings themselves, declared once, in [`settings`]
//! (docs/configuration.md's table is their documentation, checked by a test); reading a
//! source in [`sources`]; the cluster membership in [`cluster`]; the checks across settings
//! in [`validate`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

mod cluster;
mod secret;
mod settings;
mod sources;
mod validate;

pub use cluster::parse_cluster;
pub use secret::ClusterSecret;
pub use settings::{Args, BrokerConfig};
pub use sources::{parse_bool, without_env};

const MIB: usize = 1024 * 1024;

/// The environment variable naming the config file when `--config` is not given.
pub const CONFIG_ENV: &str = "FELIX_CONFIG";

impl Default for BrokerConfig {
    /// The embedded defaults, as `felix` with no arguments runs them.
    fn default() -> Self {
        Args::default()
            .with_defaults()
            .expect("the embedded defaults resolve")
    }
}

/// Whether every one of `addrs` listens on loopback only (127.0.0.0/8 or ::1).
pub(crate) fn all_loopback(addrs: &[SocketAddr]) -> bool {
    addrs.iter().all(|a| a.ip().is_loopback())
}

/// An embedded default address.
fn ip_port(addr: &str) -> SocketAddr {
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
        var: String,
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

/// `key (--flag, ENV)`: how an error names a setting, whichever source set it.
fn describe(key: &str) -> String {
    let flag = key.replace('_', "-");
    match sources::env_var_of(key) {
        Some(env) => format!("{key} (--{flag}, {env})"),
        None => format!("{key} (--{flag})"),
    }
}

/// A setting that counts, sizes or times something: 0 would stop it working.
fn at_least_one(key: &str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        return Err(invalid(key, "must be at least 1"));
    }
    Ok(())
}

/// A benchmark tool (a simulated distant object store): accepted only on a broker started
/// with `FELIX_FAULT_INJECTION=1`, so it cannot slow a production broker by mistake.
fn fault_injection_only(key: &str, value: u64) -> Result<(), ConfigError> {
    if value == 0 || std::env::var("FELIX_FAULT_INJECTION").is_ok_and(|v| v == "1") {
        return Ok(());
    }
    Err(invalid(
        key,
        "is a benchmark tool: it is accepted only with FELIX_FAULT_INJECTION=1",
    ))
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
        let config = file
            .overlaid_with(env)
            .overlaid_with(args.clone())
            .with_defaults()?;
        config.validate()?;
        Ok(config)
    }

    /// The per-tenant publish quotas the three `tenant_publish_*` settings describe.
    pub fn quota_limits(&self) -> Result<crate::quota::QuotaLimits, ConfigError> {
        crate::quota::QuotaLimits::parse(
            self.tenant_publish_bytes_per_sec.as_deref(),
            self.tenant_publish_msgs_per_sec.as_deref(),
            self.tenant_publish_quotas.as_deref(),
        )
        .map_err(|e| invalid(e.setting, e.message))
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
            simulated: felix_cold::store::SimulatedLatency {
                first_byte: std::time::Duration::from_millis(self.object_store_get_latency_ms),
                jitter: std::time::Duration::from_millis(self.object_store_get_jitter_ms),
                bytes_per_sec: self.object_store_get_bytes_per_sec,
            },
            ..felix_cold::store::StoreConfig::default()
        }
    }

    /// The cold-read cache's settings.
    pub fn cache_config(&self) -> felix_cold::cache::CacheConfig {
        felix_cold::cache::CacheConfig {
            memory_bytes: self.cache_memory_bytes,
            disk_bytes: self.cache_disk_bytes,
            prefetch_row_groups: self.cold_prefetch_row_groups,
            read_ahead_bytes: self.cold_read_ahead_bytes,
            decode_threads: self.cold_decode_threads,
            head_bytes: felix_cold::cache::head_bytes_for(self.tier_row_group_bytes),
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
mod tests;
