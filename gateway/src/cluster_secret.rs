//! Which cluster secret this broker signs and checks internal requests with, if any.
//!
//! Decides the secret from the settings (the rules are in docs/internal-network.md): a
//! secret given (`FELIX_CLUSTER_SECRET` or `cluster_secret_file`) is always used, even with
//! `auth` off; with `auth` on and none given, a single node generates one into
//! `<data_dir>/cluster.secret` (mode 0600) at its first start and reuses it afterwards (a
//! cluster without one was refused by `config::validate`); with `auth` off and none given,
//! the internal network stays open. The invariant: the secret's bytes are never logged, and
//! a secret file that cannot be read or is too short stops the start, changing nothing.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use felix_meta::network::{ClusterKey, generate_secret};
use tracing::{info, warn};

use crate::config::BrokerConfig;

/// The generated secret's file, under the data dir.
pub const GENERATED_FILE: &str = "cluster.secret";

/// The key to sign and check internal requests with; `None`: the internal network is open.
pub fn cluster_key(config: &BrokerConfig) -> anyhow::Result<Option<Arc<ClusterKey>>> {
    let key = if let Some(secret) = &config.cluster_secret {
        info!("internal network authenticated with the cluster secret from FELIX_CLUSTER_SECRET");
        key_of(secret.expose(), "FELIX_CLUSTER_SECRET")?
    } else if let Some(path) = &config.cluster_secret_file {
        info!(file = %path.display(), "internal network authenticated with the cluster secret");
        key_of(&read_secret(path)?, &path.display().to_string())?
    } else if config.auth {
        // validate() refused a cluster without a secret: this is a single node.
        let path = config.data_dir.join(GENERATED_FILE);
        let secret = generated_secret(&path)?;
        info!(file = %path.display(), "internal network authenticated with this node's generated secret");
        key_of(&secret, &path.display().to_string())?
    } else {
        info!("internal network open: auth is off and no cluster secret is set");
        return Ok(None);
    };
    let key = match &config.cluster_secret_previous_file {
        Some(path) => {
            info!(file = %path.display(), "also accepting the previous cluster secret (rotation)");
            key.with_previous(&read_secret(path)?)
                .with_context(|| format!("the previous cluster secret in {}", path.display()))?
        }
        None => key,
    };
    Ok(Some(Arc::new(key)))
}

fn key_of(secret: &[u8], from: &str) -> anyhow::Result<ClusterKey> {
    ClusterKey::new(secret).with_context(|| format!("the cluster secret from {from}"))
}

/// A secret file's contents, surrounding whitespace removed; warns if others may read it.
fn read_secret(path: &Path) -> anyhow::Result<Vec<u8>> {
    let bytes = fs::read(path)
        .with_context(|| format!("read the cluster secret file {}", path.display()))?;
    if let Ok(meta) = fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        warn!(
            file = %path.display(),
            mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "the cluster secret file can be read by other users; chmod 600 it"
        );
    }
    Ok(bytes.trim_ascii().to_vec())
}

/// The single node's own secret: read from `path`, or generated into it (mode 0600).
fn generated_secret(path: &Path) -> anyhow::Result<Vec<u8>> {
    if path.exists() {
        return read_secret(path);
    }
    let secret = generate_secret().context("generate a cluster secret")?;
    crate::tls::write_atomic(path, format!("{secret}\n").as_bytes(), 0o600)
        .with_context(|| format!("write the generated cluster secret to {}", path.display()))?;
    info!(file = %path.display(), "generated a cluster secret");
    Ok(secret.into_bytes())
}
