//! TLS on the Kafka listener (SASL_SSL and SSL clients).
//!
//! Decides how a client tells TLS from plaintext: it does not have to guess, because a
//! listener is one or the other by configuration. With `kafka_tls_cert` and `kafka_tls_key`
//! set the listener speaks only TLS (1.2 or 1.3, aws-lc-rs, the one crypto provider);
//! without, only plaintext. A handshake that fails or does not finish within
//! [`HANDSHAKE_TIMEOUT`] closes the connection before any Kafka request is read.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_rustls::TlsAcceptor;

/// How long a client has to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The acceptor for the operator's certificate chain (PEM, leaf first) and key.
pub fn acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let chain = crate::tls::load_chain(cert)?;
    let key_der = crate::tls::load_key(key)?;
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS 1.2 and 1.3 with the aws-lc-rs provider")?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => {
                anyhow::anyhow!("the private key does not belong to the certificate")
            }
            e => anyhow::Error::new(e),
        })
        .with_context(|| {
            format!(
                "Kafka TLS certificate {} and key {}",
                cert.display(),
                key.display()
            )
        })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
