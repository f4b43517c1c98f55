//! felixctl's OIDC commands: `login` (an identity provider's JWT traded for a Felix token)
//! and `oidc issuer add|list|remove` (which providers the cluster trusts).
//!
//! Decides what reaches stdout: `login` prints the Felix token alone, so
//! `export FELIX_TOKEN=$(felixctl login ...)` works; its id and expiry go to stderr.

use std::io::Read as _;

use anyhow::{Context, bail};
use felix_client::{Connection, OidcIssuerSpec};

use crate::args::{IssuerCommand, LoginArgs, OidcCommand};

pub(crate) async fn login(client: &Connection, args: &LoginArgs) -> anyhow::Result<u8> {
    let mut jwt = String::new();
    if args.oidc_token.as_os_str() == "-" {
        std::io::stdin()
            .read_to_string(&mut jwt)
            .context("reading the identity provider's token from stdin")?;
    } else {
        jwt = std::fs::read_to_string(&args.oidc_token)
            .with_context(|| format!("reading the token file {}", args.oidc_token.display()))?;
    }
    if jwt.trim().is_empty() {
        bail!("the identity provider's token is empty");
    }
    let issued = client
        .exchange_oidc_token(&args.tenant, &jwt)
        .await
        .with_context(|| format!("exchanging the OIDC token for tenant {}", args.tenant))?;
    eprintln!(
        "token id (jti) {}, expires at {} (Unix seconds)",
        issued.jti, issued.expires_at
    );
    println!("{}", issued.token);
    Ok(0)
}

pub(crate) async fn oidc_command(client: &Connection, cmd: OidcCommand) -> anyhow::Result<u8> {
    let OidcCommand::Issuer(cmd) = cmd;
    match cmd {
        IssuerCommand::Add {
            issuer,
            audience,
            jwks_file,
            tenant,
            tenant_claim,
            subject_claim,
            roles_claim,
            map_role,
            roles,
            ttl,
        } => {
            let jwks = std::fs::read_to_string(&jwks_file)
                .with_context(|| format!("reading the JWKS file {}", jwks_file.display()))?;
            let spec = OidcIssuerSpec {
                issuer: issuer.clone(),
                audience,
                jwks,
                tenant,
                tenant_claim,
                subject_claim: Some(subject_claim),
                roles_claim,
                role_map: map_role.into_iter().collect(),
                default_roles: roles,
                ttl_secs: Some(ttl.as_secs().max(1)),
            };
            client
                .put_oidc_issuer(spec)
                .await
                .with_context(|| format!("registering the issuer {issuer}"))?;
            println!("trusting issuer {issuer}");
        }
        IssuerCommand::List => {
            let issuers = client
                .list_oidc_issuers()
                .await
                .context("listing the issuers")?;
            for i in issuers {
                let tenant = match (&i.tenant, &i.tenant_claim) {
                    (Some(t), _) => format!("tenant={t}"),
                    (None, Some(c)) => format!("tenant_claim={c}"),
                    (None, None) => String::new(),
                };
                let map: Vec<String> = i.role_map.iter().map(|(g, r)| format!("{g}={r}")).collect();
                println!(
                    "{}\taudience={}\t{tenant}\tsubject_claim={}\troles={}\tmap={}\tttl={}s",
                    i.issuer,
                    i.audience,
                    i.subject_claim.as_deref().unwrap_or("sub"),
                    i.default_roles.join(","),
                    map.join(","),
                    i.ttl_secs.unwrap_or_default(),
                );
            }
        }
        IssuerCommand::Remove { issuer } => {
            client
                .delete_oidc_issuer(&issuer)
                .await
                .with_context(|| format!("removing the issuer {issuer}"))?;
            println!("no longer trusting issuer {issuer}");
        }
    }
    Ok(0)
}
