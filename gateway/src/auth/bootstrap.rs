//! The bootstrap admin token: how the first operator gets in when auth is on.
//!
//! Decides that a cluster started with auth on has exactly one bootstrap token, minted at
//! its first start, and that every broker hands it to the operator as
//! `<data_dir>/admin.token` (mode 0600) before it reports ready. The Raft leader proposes the
//! first signing key and the token; both commands are idempotent (the first one applied
//! wins), so an election in between still leaves one key and one token. The token is
//! cluster-wide (tenant `*`, role `cluster-admin`) and lives as long as any token may (90
//! days); revoke it (`felixctl token revoke JTI`) once other admins have their own.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use felix_meta::auth::{
    self, ALL_TENANTS, CLUSTER_ADMIN, Claims, DEFAULT_NAMESPACE, MAX_TOKEN_TTL_SECS,
};
use felix_meta::model::Command;
use tracing::{info, warn};

use super::access::AccessControl;

/// The file, in the data directory, the bootstrap token is written to.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";

/// Waits until the control plane holds the bootstrap token (minting it if this broker's
/// control-plane node leads), then writes it to `<data_dir>/admin.token`.
pub async fn ensure_bootstrap_token(access: &AccessControl, data_dir: &Path) -> anyhow::Result<()> {
    let meta = access.meta();
    let mut waited = 0u32;
    let bootstrap = loop {
        if let Some(b) = meta.local(|s| s.auth.bootstrap.clone()) {
            break b;
        }
        if meta.is_leader()
            && let Err(e) = mint_bootstrap(access).await
        {
            warn!(error = %e.message, "minting the bootstrap admin token failed; retrying");
        }
        waited += 1;
        if waited.is_multiple_of(50) {
            info!("waiting for the control plane's bootstrap admin token");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let path = data_dir.join(ADMIN_TOKEN_FILE);
    write_private(&path, &bootstrap.token).with_context(|| format!("write {}", path.display()))?;
    // The id, not the token: what `felixctl token revoke` needs once other admins exist.
    info!(path = %path.display(), jti = %bootstrap.jti, "bootstrap admin token written");
    Ok(())
}

async fn mint_bootstrap(access: &AccessControl) -> Result<(), felix_wire::protocol::ErrorBody> {
    let now = auth::now_secs();
    let claims = Claims {
        tenant: ALL_TENANTS.to_owned(),
        sub: "bootstrap-admin".to_owned(),
        exp: now + MAX_TOKEN_TTL_SECS,
        iat: now,
        jti: auth::random_id(16),
        namespace: DEFAULT_NAMESPACE.to_owned(),
        roles: vec![CLUSTER_ADMIN.to_owned()],
        allow: Vec::new(),
    };
    let token = access.sign(&claims).await?;
    access
        .meta()
        .propose(Command::SetBootstrapToken {
            jti: claims.jti,
            token,
        })
        .await
        .map_err(crate::errors::meta_error)?;
    Ok(())
}

/// Writes `contents` to `path` readable by the owner only, atomically (a temporary file
/// renamed over it), so a reader never sees half a token.
fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("token.tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(contents.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}
