//! felixctl's token, role and key commands, and where its own token comes from.
//!
//! Decides which token felixctl presents: `--token`/`FELIX_TOKEN`, else
//! `--token-file`/`FELIX_TOKEN_FILE`, else — only when every broker named is on loopback —
//! `./felix-data/admin.token` (the bootstrap token a broker started here wrote), said once on
//! stderr. A token never goes to stdout except the one `token create` minted.

use std::path::Path;

use anyhow::{Context, bail};
use felix_client::{Connection, TokenSpec};

use crate::args::{GlobalArgs, KeyCommand, RoleCommand, TokenCommand};

/// The bootstrap token a loopback broker with the default data directory wrote.
const LOCAL_ADMIN_TOKEN: &str = "felix-data/admin.token";

/// The token to present, if any.
pub(crate) fn resolve_token(g: &GlobalArgs) -> anyhow::Result<Option<String>> {
    if let Some(t) = &g.token {
        return Ok(Some(t.trim().to_owned()));
    }
    if let Some(path) = &g.token_file {
        return read_token(path).map(Some);
    }
    let local = Path::new(LOCAL_ADMIN_TOKEN);
    if all_loopback(&g.broker) && local.is_file() {
        eprintln!("felixctl: using the admin token in ./{LOCAL_ADMIN_TOKEN}");
        return read_token(local).map(Some);
    }
    Ok(None)
}

fn read_token(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the token file {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        bail!("the token file {} is empty", path.display());
    }
    Ok(token.to_owned())
}

/// Whether every address of a comma-separated broker list is on loopback.
fn all_loopback(brokers: &str) -> bool {
    let mut any = false;
    for addr in brokers.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        any = true;
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            return false;
        }
    }
    any
}

pub(crate) async fn token_command(client: &Connection, cmd: TokenCommand) -> anyhow::Result<u8> {
    match cmd {
        TokenCommand::Create {
            tenant,
            subject,
            namespace,
            roles,
            allow,
            ttl,
        } => {
            let issued = client
                .mint_token(TokenSpec {
                    tenant: tenant.clone(),
                    subject,
                    namespace,
                    roles,
                    allow,
                    ttl: Some(ttl),
                })
                .await
                .with_context(|| format!("minting a token for tenant {tenant}"))?;
            eprintln!(
                "token id (jti) {}, expires at {} (Unix seconds)",
                issued.jti, issued.expires_at
            );
            println!("{}", issued.token);
        }
        TokenCommand::Revoke { jti } => {
            client
                .revoke_token(&jti)
                .await
                .with_context(|| format!("revoking token {jti}"))?;
            println!("revoked token {jti}");
        }
    }
    Ok(0)
}

pub(crate) async fn role_command(client: &Connection, cmd: RoleCommand) -> anyhow::Result<u8> {
    match cmd {
        RoleCommand::Create { name, allow } => {
            client
                .put_role(&name, &allow)
                .await
                .with_context(|| format!("creating role {name}"))?;
            println!("created role {name}");
        }
        RoleCommand::List => {
            let roles = client.list_roles().await.context("listing roles")?;
            for r in roles {
                let kind = if r.builtin { " (built-in)" } else { "" };
                println!("{}{kind}\t{}", r.name, r.allow.join(" "));
            }
        }
        RoleCommand::Delete { name } => {
            client
                .delete_role(&name)
                .await
                .with_context(|| format!("deleting role {name}"))?;
            println!("deleted role {name}");
        }
        RoleCommand::Bind {
            subject,
            role,
            tenant,
        } => {
            client
                .bind_role(&tenant, &subject, &role)
                .await
                .with_context(|| format!("binding {subject} of {tenant} to {role}"))?;
            println!("bound {subject} of tenant {tenant} to role {role}");
        }
    }
    Ok(0)
}

pub(crate) async fn key_command(client: &Connection, cmd: KeyCommand) -> anyhow::Result<u8> {
    match cmd {
        KeyCommand::Rotate => {
            let kid = client
                .rotate_key()
                .await
                .context("rotating the signing key")?;
            println!("{kid}");
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_broker_lists_count_as_loopback() {
        assert!(all_loopback("127.0.0.1:5000"));
        assert!(all_loopback("localhost:5000,[::1]:5000"));
        assert!(!all_loopback("127.0.0.1:5000,10.0.0.1:5000"));
        assert!(!all_loopback("broker-1:5000"));
        assert!(!all_loopback(""));
    }
}
