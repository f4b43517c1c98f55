//! The QUIC listener's TLS: which certificate the broker presents, and the transport limits
//! every client connection gets.
//!
//! With a certificate and key from the operator, the broker presents those. Without, it is
//! the embedded default: a leaf for `localhost`, `127.0.0.1` and `::1` signed by a
//! self-signed CA, kept under `<data_dir>/tls/` (`ca.pem`, `ca.key`, `broker.pem`,
//! `broker.key`). They are generated on the first start and reused on every later one, so a
//! client that trusts `ca.pem` keeps working across restarts.
//!
//! Invariants of that directory, kept across a crash at any point: a `.pem` is written only
//! after its key is on disk (each file goes through a temporary file and a rename), so
//! `ca.pem` present means `ca.key` belongs to it; the leaf is derived state, so one that no
//! longer verifies against the CA (or is missing) is regenerated from the CA key; the CA is
//! only generated when `ca.pem` or `ca.key` is missing, never replaced behind a client's back.
//!
//! Nothing global is installed: the rustls provider is aws-lc-rs, passed explicitly.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// The directory under the data directory that holds the embedded default certificate.
pub const TLS_DIR: &str = "tls";
/// The default CA's certificate: what clients on other hosts pass as `--ca`.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The default CA's private key (mode 0600).
pub const CA_KEY_FILE: &str = "ca.key";
/// The broker's default leaf certificate, signed by the CA.
pub const LEAF_CERT_FILE: &str = "broker.pem";
/// The leaf's private key (mode 0600).
pub const LEAF_KEY_FILE: &str = "broker.key";
/// The names the default leaf is valid for.
pub const LEAF_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Streams a client may have open at once on one connection (one per request/subscription).
pub const MAX_CONCURRENT_BIDI_STREAMS: u32 = 4096;
/// The transport bounds the broker shares with the client (felix-wire's `transport`).
pub use felix_wire::transport::{CONNECTION_WINDOW, KEEP_ALIVE, MAX_UDP_PAYLOAD, STREAM_WINDOW};

/// The QUIC listener's configuration.
#[derive(Debug)]
pub struct ServerTls {
    /// TLS 1.3 with ALPN `felix/1`, plus the transport limits.
    pub config: quinn::ServerConfig,
    /// With the embedded default, the CA clients must trust (`<data_dir>/tls/ca.pem`);
    /// `None` with an operator's certificate.
    pub ca_path: Option<PathBuf>,
}

/// Builds the QUIC server configuration: the operator's `cert` (PEM, leaf first, may be a
/// chain) and `key` (PEM, PKCS#8, PKCS#1 or SEC1) when given — both or neither — otherwise
/// the embedded default under `<data_dir>/tls/`, generated on the first start.
/// `idle_timeout` is the QUIC max idle timeout (the spec's default is 6 s).
pub fn server_config(
    data_dir: &Path,
    cert: Option<&Path>,
    key: Option<&Path>,
    idle_timeout: Duration,
) -> anyhow::Result<ServerTls> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let files = match (cert, key) {
        (Some(c), Some(k)) => format!("{} and {}", c.display(), k.display()),
        _ => format!("generated under {}", data_dir.join(TLS_DIR).display()),
    };
    let (chain, key, ca_path) = match (cert, key) {
        (Some(cert), Some(key)) => (load_chain(cert)?, load_key(key)?, None),
        (None, None) => {
            let dir = data_dir.join(TLS_DIR);
            let (chain, key) = ensure_default_cert(&dir, &provider)?;
            (chain, key, Some(dir.join(CA_CERT_FILE)))
        }
        (Some(cert), None) => bail!(
            "TLS certificate {} given without its private key: give both, or neither for the \
             generated default",
            cert.display()
        ),
        (None, Some(key)) => bail!(
            "TLS private key {} given without its certificate: give both, or neither for the \
             generated default",
            key.display()
        ),
    };

    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3 with the aws-lc-rs provider")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => {
                anyhow::anyhow!("the private key does not belong to the certificate")
            }
            e => anyhow::Error::new(e),
        })
        .with_context(|| format!("TLS certificate and key ({files})"))?;
    tls.alpn_protocols = vec![felix_wire::protocol::ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .context("TLS configuration unusable for QUIC")?;

    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport_config(idle_timeout)?));
    Ok(ServerTls { config, ca_path })
}

/// Opens the QUIC listener on `addr`: [`quinn::Endpoint::server`] with the endpoint's
/// datagram limit raised to [`MAX_UDP_PAYLOAD`].
pub fn quic_endpoint(
    config: quinn::ServerConfig,
    addr: std::net::SocketAddr,
) -> std::io::Result<quinn::Endpoint> {
    let socket = std::net::UdpSocket::bind(addr)?;
    let runtime = quinn::default_runtime()
        .ok_or_else(|| std::io::Error::other("the QUIC listener needs a tokio runtime"))?;
    let mut endpoint = quinn::EndpointConfig::default();
    endpoint
        .max_udp_payload_size(MAX_UDP_PAYLOAD)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    quinn::Endpoint::new(endpoint, Some(config), socket, runtime)
}

/// The transport limits of every client connection.
fn transport_config(idle_timeout: Duration) -> anyhow::Result<quinn::TransportConfig> {
    let idle = quinn::IdleTimeout::try_from(idle_timeout)
        .with_context(|| format!("QUIC idle timeout {idle_timeout:?} is too large"))?;
    let mut t = quinn::TransportConfig::default();
    t.max_idle_timeout(Some(idle))
        .keep_alive_interval(Some(KEEP_ALIVE))
        .max_concurrent_bidi_streams(MAX_CONCURRENT_BIDI_STREAMS.into())
        .stream_receive_window(STREAM_WINDOW.into())
        .receive_window(CONNECTION_WINDOW.into())
        .send_window(CONNECTION_WINDOW.into());
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(MAX_UDP_PAYLOAD);
    t.mtu_discovery_config(Some(mtu));
    Ok(t)
}

/// Reads a PEM certificate chain (leaf first).
pub(crate) fn load_chain(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let chain = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading TLS certificate {}", path.display()))?;
    if chain.is_empty() {
        bail!(
            "TLS certificate {} holds no PEM CERTIFICATE section",
            path.display()
        );
    }
    Ok(chain)
}

/// Reads a PEM private key (PKCS#8, PKCS#1 or SEC1).
pub(crate) fn load_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).with_context(|| {
        format!(
            "reading TLS private key {} (a PEM PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)",
            path.display()
        )
    })
}

/// The embedded default under `dir`: loads the CA and the leaf, generating whatever is
/// missing (see the module invariants), and returns the leaf's chain and key.
fn ensure_default_cert(
    dir: &Path,
    provider: &Arc<CryptoProvider>,
) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    if let Some(data_dir) = dir.parent() {
        fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    }
    // Only `tls/` itself is private; the data directory keeps the mode it was given.
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let ca_cert_path = dir.join(CA_CERT_FILE);
    let ca_key_path = dir.join(CA_KEY_FILE);
    let leaf_cert_path = dir.join(LEAF_CERT_FILE);
    let leaf_key_path = dir.join(LEAF_KEY_FILE);

    let (ca_cert, ca_key) = if ca_cert_path.exists() && ca_key_path.exists() {
        let ca_cert = load_chain(&ca_cert_path)?.swap_remove(0);
        let ca_key = load_key(&ca_key_path)?;
        rustls::sign::CertifiedKey::from_der(vec![ca_cert.clone()], ca_key, provider)
            .with_context(|| {
                format!(
                    "{} does not belong to {}: restore the pair, or remove {} to generate a new \
                     CA (clients must then trust the new {})",
                    ca_key_path.display(),
                    ca_cert_path.display(),
                    dir.display(),
                    ca_cert_path.display()
                )
            })?;
        let pem = fs::read_to_string(&ca_key_path)
            .with_context(|| format!("reading {}", ca_key_path.display()))?;
        let ca_key = KeyPair::from_pem(&pem)
            .with_context(|| format!("parsing the CA key {}", ca_key_path.display()))?;
        (ca_cert, ca_key)
    } else {
        if ca_cert_path.exists() || ca_key_path.exists() {
            tracing::warn!(
                dir = %dir.display(),
                "half of the TLS CA pair is missing: generating a new CA; clients that trusted \
                 the old ca.pem must be given the new one"
            );
        }
        // The leaf goes first (it will be signed by a new CA), then ca.pem (so that it only
        // exists again once its new key is on disk).
        remove_if_exists(&leaf_cert_path)?;
        remove_if_exists(&ca_cert_path)?;
        let ca_key = KeyPair::generate().context("generating the CA key")?;
        let ca_cert = ca_params()
            .self_signed(&ca_key)
            .context("signing the CA certificate")?;
        write_atomic(&ca_key_path, ca_key.serialize_pem().as_bytes(), 0o600)?;
        write_atomic(&ca_cert_path, ca_cert.pem().as_bytes(), 0o644)?;
        tracing::info!(
            ca = %ca_cert_path.display(),
            "generated a TLS CA for the broker's default certificate; clients on other hosts \
             verify the broker with it (--ca)"
        );
        (ca_cert.der().clone(), ca_key)
    };

    if leaf_cert_path.exists() && leaf_key_path.exists() {
        let chain = load_chain(&leaf_cert_path)?;
        let key = load_key(&leaf_key_path)?;
        match check_leaf(&chain, &key, &ca_cert, provider) {
            Ok(()) => return Ok((chain, key)),
            Err(e) => tracing::warn!(
                leaf = %leaf_cert_path.display(),
                error = %format!("{e:#}"),
                "the default TLS certificate is unusable: generating a new one from the CA"
            ),
        }
    }

    remove_if_exists(&leaf_cert_path)?;
    let leaf_key = KeyPair::generate().context("generating the broker's TLS key")?;
    let leaf = leaf_params()?
        .signed_by(&leaf_key, &Issuer::new(ca_params(), &ca_key))
        .context("signing the broker's TLS certificate")?;
    write_atomic(&leaf_key_path, leaf_key.serialize_pem().as_bytes(), 0o600)?;
    write_atomic(&leaf_cert_path, leaf.pem().as_bytes(), 0o644)?;
    let chain = vec![leaf.der().clone()];
    let key = PrivateKeyDer::try_from(leaf_key.serialize_der())
        .map_err(|e| anyhow::anyhow!("the generated TLS key: {e}"))?;
    check_leaf(&chain, &key, &ca_cert, provider).with_context(|| {
        format!(
            "a certificate signed with {} does not verify against {}: restore the pair, or \
             remove {} to generate a new CA (clients must then trust the new {})",
            ca_key_path.display(),
            ca_cert_path.display(),
            dir.display(),
            ca_cert_path.display()
        )
    })?;
    Ok((chain, key))
}

/// The default CA. Its distinguished name is fixed, so a leaf re-signed with the stored key
/// names the stored `ca.pem` as its issuer.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Felix");
    dn.push(DnType::CommonName, "Felix broker development CA");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// The default leaf: a server certificate for the loopback names.
fn leaf_params() -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::new(LEAF_NAMES.map(String::from).to_vec())
        .context("the default certificate's names")?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Felix");
    dn.push(DnType::CommonName, "Felix broker");
    params.distinguished_name = dn;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    Ok(params)
}

/// Whether a leaf and its key belong together and verify, as a client would check them,
/// against the CA for `localhost`.
fn check_leaf(
    chain: &[CertificateDer<'static>],
    key: &PrivateKeyDer<'static>,
    ca: &CertificateDer<'static>,
    provider: &Arc<CryptoProvider>,
) -> anyhow::Result<()> {
    rustls::sign::CertifiedKey::from_der(chain.to_vec(), key.clone_key(), provider)
        .context("the key does not belong to the certificate")?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).context("the CA certificate")?;
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .context("building a verifier")?;
    let name = ServerName::try_from(LEAF_NAMES[0]).context("the default name")?;
    verifier
        .verify_server_cert(&chain[0], &chain[1..], &name, &[], UnixTime::now())
        .context("the certificate does not verify against the CA")?;
    Ok(())
}

/// Writes `path` through a temporary file and a rename, created with `mode`, synced (file and
/// directory) before returning.
pub(crate) fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    remove_if_exists(&tmp)?;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    if let Some(dir) = path.parent() {
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("syncing {}", dir.display()))?;
    }
    Ok(())
}

fn remove_if_exists(path: &Path) -> anyhow::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const IDLE: Duration = Duration::from_secs(6);

    fn read(path: &Path) -> Vec<u8> {
        fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    }

    #[test]
    fn default_certificate_is_generated_once_and_reused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = server_config(dir.path(), None, None, IDLE).expect("first start");
        let tls = dir.path().join(TLS_DIR);
        assert_eq!(first.ca_path, Some(tls.join(CA_CERT_FILE)));
        let files = [CA_CERT_FILE, CA_KEY_FILE, LEAF_CERT_FILE, LEAF_KEY_FILE];
        let before: Vec<_> = files.iter().map(|f| read(&tls.join(f))).collect();
        for key in [CA_KEY_FILE, LEAF_KEY_FILE] {
            let mode = fs::metadata(tls.join(key))
                .expect("key")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{key}");
        }

        let second = server_config(dir.path(), None, None, IDLE).expect("second start");
        assert_eq!(second.ca_path, first.ca_path);
        let after: Vec<_> = files.iter().map(|f| read(&tls.join(f))).collect();
        assert_eq!(before, after, "a restart must reuse the CA and the leaf");
    }

    #[test]
    fn a_missing_leaf_is_reissued_by_the_same_ca() {
        let dir = tempfile::tempdir().expect("tempdir");
        server_config(dir.path(), None, None, IDLE).expect("first start");
        let tls = dir.path().join(TLS_DIR);
        let ca = read(&tls.join(CA_CERT_FILE));
        let leaf = read(&tls.join(LEAF_CERT_FILE));
        fs::remove_file(tls.join(LEAF_CERT_FILE)).expect("remove leaf");

        server_config(dir.path(), None, None, IDLE).expect("restart");
        assert_eq!(read(&tls.join(CA_CERT_FILE)), ca, "the CA is kept");
        assert_ne!(read(&tls.join(LEAF_CERT_FILE)), leaf, "a new leaf");
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let chain = load_chain(&tls.join(LEAF_CERT_FILE)).expect("leaf");
        let key = load_key(&tls.join(LEAF_KEY_FILE)).expect("key");
        let ca = load_chain(&tls.join(CA_CERT_FILE))
            .expect("ca")
            .swap_remove(0);
        check_leaf(&chain, &key, &ca, &provider).expect("the new leaf verifies");
    }

    #[test]
    fn a_ca_key_that_does_not_match_is_an_error_naming_both_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        server_config(dir.path(), None, None, IDLE).expect("first start");
        let tls = dir.path().join(TLS_DIR);
        let other = KeyPair::generate().expect("key");
        fs::write(tls.join(CA_KEY_FILE), other.serialize_pem()).expect("overwrite");
        let err = format!(
            "{:#}",
            server_config(dir.path(), None, None, IDLE).expect_err("mismatch")
        );
        assert!(err.contains("ca.key") && err.contains("ca.pem"), "{err}");
    }

    /// A CA and a leaf for `localhost` signed by it, as an operator would bring them.
    fn operator_pems(dir: &Path) -> (PathBuf, PathBuf) {
        let ca_key = KeyPair::generate().expect("ca key");
        let ca = ca_params().self_signed(&ca_key).expect("ca");
        let leaf_key = KeyPair::generate().expect("leaf key");
        let leaf = CertificateParams::new(vec!["broker.example".to_string()])
            .expect("params")
            .signed_by(&leaf_key, &Issuer::new(ca_params(), &ca_key))
            .expect("leaf");
        let cert = dir.join("chain.pem");
        let key = dir.join("key.pem");
        fs::write(&cert, format!("{}{}", leaf.pem(), ca.pem())).expect("chain");
        fs::write(&key, leaf_key.serialize_pem()).expect("key");
        (cert, key)
    }

    #[test]
    fn an_operator_certificate_chain_is_loaded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = operator_pems(dir.path());
        let tls = server_config(dir.path(), Some(&cert), Some(&key), IDLE).expect("loads");
        assert_eq!(tls.ca_path, None);
        assert!(!dir.path().join(TLS_DIR).exists(), "nothing generated");
    }

    #[test]
    fn missing_or_mismatched_files_are_errors_naming_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = operator_pems(dir.path());
        let missing = dir.path().join("nope.pem");

        let err = format!(
            "{:#}",
            server_config(dir.path(), Some(&missing), Some(&key), IDLE).expect_err("no cert")
        );
        assert!(err.contains("nope.pem"), "{err}");
        let err = format!(
            "{:#}",
            server_config(dir.path(), Some(&cert), Some(&missing), IDLE).expect_err("no key")
        );
        assert!(err.contains("nope.pem"), "{err}");
        let err = format!(
            "{:#}",
            server_config(dir.path(), Some(&cert), None, IDLE).expect_err("half")
        );
        assert!(err.contains("chain.pem"), "{err}");

        // A PEM without a certificate, and a key from another pair.
        let err = format!(
            "{:#}",
            server_config(dir.path(), Some(&key), Some(&key), IDLE).expect_err("key as cert")
        );
        assert!(err.contains("key.pem"), "{err}");
        let other = dir.path().join("other.key");
        fs::write(&other, KeyPair::generate().expect("key").serialize_pem()).expect("write");
        let err = format!(
            "{:#}",
            server_config(dir.path(), Some(&cert), Some(&other), IDLE).expect_err("mismatch")
        );
        assert!(
            err.contains("chain.pem") && err.contains("other.key"),
            "{err}"
        );
    }

    /// A client that trusts only `ca` (real chain and name verification, aws-lc-rs).
    fn verifying_client(ca: &Path) -> quinn::ClientConfig {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in load_chain(ca).expect("ca.pem") {
            roots.add(cert).expect("root");
        }
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("tls13")
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![felix_wire::protocol::ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("quic");
        quinn::ClientConfig::new(Arc::new(crypto))
    }

    #[tokio::test]
    async fn a_client_trusting_ca_pem_completes_a_handshake_and_echoes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = server_config(dir.path(), None, None, IDLE).expect("server config");
        let ca = server.ca_path.clone().expect("default CA");
        let endpoint = quinn::Endpoint::server(server.config, "127.0.0.1:0".parse().expect("addr"))
            .expect("server endpoint");
        let addr = endpoint.local_addr().expect("local addr");
        let accept = tokio::spawn(async move {
            // Two connections: one per server name below.
            for _ in 0..2 {
                let conn = endpoint
                    .accept()
                    .await
                    .expect("incoming")
                    .await
                    .expect("server side");
                let (mut send, mut recv) = conn.accept_bi().await.expect("accept_bi");
                let msg = recv.read_to_end(1 << 20).await.expect("read");
                send.write_all(&msg).await.expect("echo");
                send.finish().expect("finish");
                // Keep the connection until the client has read the echo and closed it.
                let _ = conn.closed().await;
            }
            endpoint
        });

        let mut client =
            quinn::Endpoint::client("127.0.0.1:0".parse().expect("addr")).expect("client");
        client.set_default_client_config(verifying_client(&ca));
        for name in ["localhost", "127.0.0.1"] {
            let conn = client
                .connect(addr, name)
                .expect("connect")
                .await
                .unwrap_or_else(|e| panic!("handshake as {name}: {e}"));
            let alpn = conn
                .handshake_data()
                .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
                .and_then(|d| d.protocol);
            assert_eq!(alpn.as_deref(), Some(felix_wire::protocol::ALPN));
            let (mut send, mut recv) = conn.open_bi().await.expect("open_bi");
            send.write_all(b"hello felix").await.expect("write");
            send.finish().expect("finish");
            let echo = recv.read_to_end(1 << 20).await.expect("read echo");
            assert_eq!(echo, b"hello felix");
            conn.close(0u32.into(), b"done");
        }
        client.wait_idle().await;
        let endpoint = accept.await.expect("server task");
        endpoint.close(0u32.into(), b"");
    }

    #[tokio::test]
    async fn a_client_trusting_another_ca_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = server_config(dir.path(), None, None, IDLE).expect("server config");
        let other = tempfile::tempdir().expect("tempdir");
        let other_ca = server_config(other.path(), None, None, IDLE)
            .expect("other config")
            .ca_path
            .expect("other CA");
        let endpoint = quinn::Endpoint::server(server.config, "127.0.0.1:0".parse().expect("addr"))
            .expect("server endpoint");
        let addr = endpoint.local_addr().expect("local addr");
        tokio::spawn(async move {
            if let Some(incoming) = endpoint.accept().await {
                let _ = incoming.await;
            }
        });
        let mut client =
            quinn::Endpoint::client("127.0.0.1:0".parse().expect("addr")).expect("client");
        client.set_default_client_config(verifying_client(&other_ca));
        let result = client.connect(addr, "localhost").expect("connect").await;
        assert!(result.is_err(), "an unknown CA must fail the handshake");
    }

    /// Both ends raise quinn's 1452-byte discovery bound (see [`MAX_UDP_PAYLOAD`]): on
    /// loopback, whose MTU is 64 KiB, each side's datagrams must grow to the bound.
    #[tokio::test]
    async fn loopback_connections_grow_their_datagrams_to_the_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = server_config(dir.path(), None, None, IDLE).expect("server config");
        let ca = server.ca_path.clone().expect("default CA");
        let endpoint =
            quic_endpoint(server.config, "127.0.0.1:0".parse().expect("addr")).expect("server");
        let addr = endpoint.local_addr().expect("local addr");
        let (server_mtu_tx, server_mtu_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let conn = endpoint
                .accept()
                .await
                .expect("incoming")
                .await
                .expect("handshake");
            let mtu = wait_for_mtu(&conn, MAX_UDP_PAYLOAD).await;
            let _ = server_mtu_tx.send(mtu);
            conn.closed().await;
        });
        let client = felix_client::tls::client_endpoint("127.0.0.1:0".parse().expect("addr"))
            .expect("client endpoint");
        let config = felix_client::tls::client_config(
            "127.0.0.1",
            "127.0.0.1".parse().expect("ip"),
            Some(&ca),
            false,
        )
        .expect("client config");
        let conn = client
            .connect_with(config, addr, "127.0.0.1")
            .expect("connect")
            .await
            .expect("handshake");
        assert_eq!(
            wait_for_mtu(&conn, felix_client::tls::MAX_UDP_PAYLOAD).await,
            felix_client::tls::MAX_UDP_PAYLOAD,
            "client to broker"
        );
        assert_eq!(
            server_mtu_rx.await.expect("server side"),
            MAX_UDP_PAYLOAD,
            "broker to client"
        );
        const { assert!(MAX_UDP_PAYLOAD > 1452 && felix_client::tls::MAX_UDP_PAYLOAD > 1452) };
        conn.close(0u32.into(), b"done");
        client.wait_idle().await;
    }

    /// The connection's datagram size once discovery reaches `want`, or where it stands
    /// after 10 s (discovery takes a handful of round trips).
    async fn wait_for_mtu(conn: &quinn::Connection, want: u16) -> u16 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mtu = conn.stats().path.current_mtu;
            if mtu >= want || tokio::time::Instant::now() >= deadline {
                return mtu;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
