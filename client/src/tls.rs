//! The client's QUIC TLS: whether and how the client verifies the broker it connects to.
//!
//! The rules (the spec's "connecting securely"):
//! * with a CA file (`--ca FILE` or `FELIX_CA`), the broker's certificate must chain to a
//!   certificate in that file and name the host the client dialled;
//! * without one, a broker on a loopback address is accepted with whatever certificate it
//!   presents (the broker's generated default is self-signed), with a note on stderr once per
//!   process;
//! * without one, a broker elsewhere is refused ([`TlsError::NeedsCa`]) unless `insecure`,
//!   which skips verification too, with a warning on stderr once per process.
//!
//! "Accepting without verification" skips only the chain and name checks: the handshake's
//! signatures are still verified with the aws-lc-rs provider's algorithms, so the broker must
//! hold the key of the certificate it presents. Nothing global is installed: the provider is
//! passed explicitly.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};
use std::time::Duration;

use rustls::DigitallySignedStruct;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// QUIC max idle timeout (the spec's default).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(6);
/// The transport bounds the client shares with the broker (felix-wire's `transport`).
pub use felix_wire::transport::{CONNECTION_WINDOW, KEEP_ALIVE, MAX_UDP_PAYLOAD, STREAM_WINDOW};

/// The name the broker's generated default certificate carries (besides the loopback
/// addresses); see [`server_name`].
const DEFAULT_CERT_NAME: &str = "localhost";

const LOOPBACK_NOTE: &str = "felix: connecting to a loopback broker without --ca: accepting its \
                             self-signed certificate (development only)";

/// Why the client cannot build a TLS configuration for this broker.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The CA file cannot be read or holds no usable certificate: fix the file or the path.
    #[error("CA file {}: {reason}", path.display())]
    CaFile { path: PathBuf, reason: String },
    /// The broker is not on loopback and no CA was given: give one, or opt out explicitly.
    #[error(
        "broker at {addr} is not on loopback: pass --ca FILE (or FELIX_CA) to verify it, or \
         --insecure to skip verification"
    )]
    NeedsCa { addr: String },
    /// rustls or quinn refused the configuration (a bug, not the caller's input).
    #[error("TLS configuration: {0}")]
    Rustls(String),
}

/// The QUIC client configuration for a broker reached as `server_host` (what the user typed:
/// a name or an address) at `server_ip`, following the module's rules: verify against `ca`
/// when given (then `insecure` does not apply); otherwise accept a loopback broker
/// unverified, and refuse any other unless `insecure`.
pub fn client_config(
    server_host: &str,
    server_ip: IpAddr,
    ca: Option<&Path>,
    insecure: bool,
) -> Result<quinn::ClientConfig, TlsError> {
    static LOOPBACK_ONCE: Once = Once::new();
    static INSECURE_ONCE: Once = Once::new();

    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match ca {
        Some(path) => {
            let roots = load_roots(path)?;
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| TlsError::Rustls(e.to_string()))?;
            Arc::new(CaVerifier { webpki })
        }
        None if server_ip.to_canonical().is_loopback() => {
            LOOPBACK_ONCE.call_once(|| eprintln!("{LOOPBACK_NOTE}"));
            Arc::new(SignaturesOnly {
                algorithms: provider.signature_verification_algorithms,
            })
        }
        None if insecure => {
            let addr = describe(server_host, server_ip);
            INSECURE_ONCE.call_once(|| {
                eprintln!(
                    "felix: --insecure: not verifying the certificate of the broker at {addr} \
                     (anyone on the path can impersonate it)"
                )
            });
            Arc::new(SignaturesOnly {
                algorithms: provider.signature_verification_algorithms,
            })
        }
        None => {
            return Err(TlsError::NeedsCa {
                addr: describe(server_host, server_ip),
            });
        }
    };

    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Rustls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    tls.alpn_protocols = vec![felix_wire::protocol::ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(transport_config()));
    Ok(config)
}

/// The server name to pass to `quinn::Endpoint::connect` for `host` as the user typed it
/// (a DNS name, an IPv4 address, or an IPv6 address with or without brackets).
///
/// A name is checked against the certificate's DNS names. An address is checked against its
/// IP addresses and, failing that, against `localhost`: the broker's generated certificate
/// carries only `localhost` and the loopback addresses, and with `--ca <data_dir>/tls/ca.pem`
/// a broker reached by address should still verify. (An address is never sent as SNI; the
/// broker presents one certificate whatever the SNI.)
pub fn server_name(host: &str) -> String {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    match bare.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => host.to_string(),
    }
}

/// A client endpoint bound to `bind`: [`quinn::Endpoint::client`] with the endpoint's
/// datagram limit raised to [`MAX_UDP_PAYLOAD`].
pub fn client_endpoint(bind: std::net::SocketAddr) -> std::io::Result<quinn::Endpoint> {
    let socket = std::net::UdpSocket::bind(bind)?;
    let runtime = quinn::default_runtime()
        .ok_or_else(|| std::io::Error::other("the QUIC client needs a tokio runtime"))?;
    let mut endpoint = quinn::EndpointConfig::default();
    endpoint
        .max_udp_payload_size(MAX_UDP_PAYLOAD)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    quinn::Endpoint::new(endpoint, None, socket, runtime)
}

/// The transport limits of the client's connection.
fn transport_config() -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    // Milliseconds; 6 000 always fits a VarInt.
    let idle = quinn::IdleTimeout::from(quinn::VarInt::from_u32(IDLE_TIMEOUT.as_millis() as u32));
    t.max_idle_timeout(Some(idle))
        .keep_alive_interval(Some(KEEP_ALIVE))
        .stream_receive_window(STREAM_WINDOW.into())
        .receive_window(CONNECTION_WINDOW.into())
        .send_window(CONNECTION_WINDOW.into());
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(MAX_UDP_PAYLOAD);
    t.mtu_discovery_config(Some(mtu));
    t
}

/// "host" for an address, "host (ip)" for a name.
fn describe(host: &str, ip: IpAddr) -> String {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<IpAddr>().is_ok() {
        host.to_string()
    } else {
        format!("{host} ({ip})")
    }
}

/// The trust anchors in a PEM file: every certificate in it.
fn load_roots(path: &Path) -> Result<Arc<rustls::RootCertStore>, TlsError> {
    let fail = |reason: String| TlsError::CaFile {
        path: path.to_path_buf(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| fail(e.to_string()))?;
    if certs.is_empty() {
        return Err(fail("no PEM CERTIFICATE section in the file".to_string()));
    }
    let mut roots = rustls::RootCertStore::empty();
    for (i, cert) in certs.into_iter().enumerate() {
        roots
            .add(cert)
            .map_err(|e| fail(format!("certificate {} is not usable as a CA: {e}", i + 1)))?;
    }
    Ok(Arc::new(roots))
}

/// Full verification against the CA file; a certificate that does not name the address the
/// client dialled may still name `localhost` (see [`server_name`]).
#[derive(Debug)]
struct CaVerifier {
    webpki: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for CaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let result = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        let wrong_name = matches!(
            result,
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                    | rustls::CertificateError::NotValidForNameContext { .. }
            ))
        );
        if wrong_name && matches!(server_name, ServerName::IpAddress(_)) {
            let localhost = ServerName::try_from(DEFAULT_CERT_NAME)
                .map_err(|e| rustls::Error::General(e.to_string()))?;
            // Report the original error (it names the address) if this fails too.
            return self
                .webpki
                .verify_server_cert(end_entity, intermediates, &localhost, ocsp_response, now)
                .or(result);
        }
        result
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// No chain or name check, but the handshake signatures are verified: the broker must hold
/// the private key of the certificate it presents.
#[derive(Debug)]
struct SignaturesOnly {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for SignaturesOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::PrivateKeyDer;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

    // Test-only fixtures (generated once with rcgen, valid 1975-4096): a CA, a broker
    // certificate it signed for `localhost`, `127.0.0.1` and `::1`, the broker's key, and an
    // unrelated key.
    const TEST_CA: &str = r#"
-----BEGIN CERTIFICATE-----
MIIBhzCCAS2gAwIBAgIUH6xtjGj5E7r8j5/nvvID7xRabUUwCgYIKoZIzj0EAwIw
HzEdMBsGA1UEAwwUZmVsaXgtY2xpZW50IHRlc3QgQ0EwIBcNNzUwMTAxMDAwMDAw
WhgPNDA5NjAxMDEwMDAwMDBaMB8xHTAbBgNVBAMMFGZlbGl4LWNsaWVudCB0ZXN0
IENBMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEizw8gLtr6O3R9yL4ZHaS47c4
F28zHdbNIzpkusNoYrIaQqd+YD5nHykwNq/BykSavYCoC0IhTgezaL2y9GXPWKNF
MEMwDgYDVR0PAQH/BAQDAgKEMB0GA1UdDgQWBBQya+lCgzEGzkEg2ATQPR/LlQtf
IDASBgNVHRMBAf8ECDAGAQH/AgEAMAoGCCqGSM49BAMCA0gAMEUCIQDSne36W5bY
T+yqHdeAijLd6bNwf3KlYmXUlYinv44hcgIga29xA93e+4beZ2J8lzYd6NQq+Qn3
KoDF3mF8j5fyfWw=
-----END CERTIFICATE-----
"#;
    const TEST_BROKER_CERT: &str = r#"
-----BEGIN CERTIFICATE-----
MIIBjDCCATGgAwIBAgIUfYLdHm0YCZ1DkyB/ie6pANR3lPAwCgYIKoZIzj0EAwIw
HzEdMBsGA1UEAwwUZmVsaXgtY2xpZW50IHRlc3QgQ0EwIBcNNzUwMTAxMDAwMDAw
WhgPNDA5NjAxMDEwMDAwMDBaMCMxITAfBgNVBAMMGGZlbGl4LWNsaWVudCB0ZXN0
IGJyb2tlcjBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABH1t7Nx83aQzT2D/QS/Q
qtxnc7WU5LZtACbf426Rq5X3UjVtoZkZ0deVkAetdD+6ZO8f2xsNtotSAK+Kp7Sa
0xqjRTBDMCwGA1UdEQQlMCOCCWxvY2FsaG9zdIcEfwAAAYcQAAAAAAAAAAAAAAAA
AAAAATATBgNVHSUEDDAKBggrBgEFBQcDATAKBggqhkjOPQQDAgNJADBGAiEA0ssP
GkXd8Mh8hbQYlUAjKCO6ss4CMUU4ngy9+fEGOMkCIQDabdQ2pGyRx8C974vaKLk9
QIhH1xj9UGLK/ZFa+zo95Q==
-----END CERTIFICATE-----
"#;
    const TEST_BROKER_KEY: &str = r#"
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg9r7NzuCSGV88VYhd
nsvsulOLyYvSJw31A5xl5behJPOhRANCAAR9bezcfN2kM09g/0Ev0KrcZ3O1lOS2
bQAm3+NukauV91I1baGZGdHXlZAHrXQ/umTvH9sbDbaLUgCviqe0mtMa
-----END PRIVATE KEY-----
"#;
    /// A key that belongs to no certificate here.
    const TEST_OTHER_KEY: &str = r#"
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgocrkn1Gth3/F4JHV
tAbKhGz4hbB3edmTITMrM89PuOOhRANCAAQmARxF7O1E8Bl6IU3BE56U5NsU0lji
DHfMT8BJWtdc4h8nXCpmZsAVKAL+fdigmq+25fi0Pctw5FCGMp24cF1p
-----END PRIVATE KEY-----
"#;

    const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
    const REMOTE: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5));

    #[test]
    fn a_loopback_broker_without_ca_is_accepted() {
        for (host, ip) in [
            ("127.0.0.1", LOCALHOST),
            ("localhost", LOCALHOST),
            ("::1", IpAddr::V6(Ipv6Addr::LOCALHOST)),
            ("127.0.0.2", IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))),
            ("mapped", "::ffff:127.0.0.1".parse().expect("ip")),
        ] {
            client_config(host, ip, None, false)
                .unwrap_or_else(|e| panic!("{host} ({ip}) refused: {e}"));
        }
    }

    #[test]
    fn a_remote_broker_without_ca_is_refused_unless_insecure() {
        let err = client_config("broker.example", REMOTE, None, false).expect_err("refused");
        assert!(matches!(&err, TlsError::NeedsCa { addr } if addr == "broker.example (10.0.0.5)"));
        assert_eq!(
            err.to_string(),
            "broker at broker.example (10.0.0.5) is not on loopback: pass --ca FILE (or \
             FELIX_CA) to verify it, or --insecure to skip verification"
        );
        let err = client_config("10.0.0.5", REMOTE, None, false).expect_err("refused");
        assert!(matches!(&err, TlsError::NeedsCa { addr } if addr == "10.0.0.5"));
        client_config("10.0.0.5", REMOTE, None, true).expect("insecure is accepted");
    }

    #[test]
    fn a_bad_ca_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing.pem");
        let err = client_config("10.0.0.5", REMOTE, Some(&missing), false).expect_err("missing");
        assert!(matches!(&err, TlsError::CaFile { path, .. } if path == &missing));
        assert!(err.to_string().contains("missing.pem"), "{err}");

        let no_cert = dir.path().join("key-only.pem");
        std::fs::write(&no_cert, TEST_BROKER_KEY).expect("write");
        let err = client_config("10.0.0.5", REMOTE, Some(&no_cert), true).expect_err("no cert");
        assert!(matches!(err, TlsError::CaFile { .. }), "{err}");
        assert!(err.to_string().contains("key-only.pem"), "{err}");

        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64!\n").expect("write");
        let err = client_config("10.0.0.5", REMOTE, Some(&garbage), false).expect_err("garbage");
        assert!(err.to_string().contains("garbage.pem"), "{err}");

        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, TEST_CA).expect("write");
        client_config("10.0.0.5", REMOTE, Some(&ca), false).expect("a good CA file");
    }

    #[test]
    fn server_names_strip_brackets_and_keep_names() {
        assert_eq!(server_name("broker.example"), "broker.example");
        assert_eq!(server_name("10.0.0.5"), "10.0.0.5");
        assert_eq!(server_name("[::1]"), "::1");
        assert_eq!(server_name("::1"), "::1");
    }

    /// A broker presenting the test certificate and signing its handshakes with `key` (the
    /// certificate's own, or not), echoing one message per stream.
    fn echo_broker(key: &str) -> (quinn::Endpoint, SocketAddr) {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let chain =
            vec![CertificateDer::from_pem_slice(TEST_BROKER_CERT.as_bytes()).expect("cert")];
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
        let key = provider
            .key_provider
            .load_private_key(key)
            .expect("signing key");
        // CertifiedKey::new skips the key/certificate consistency check on purpose.
        let certified = rustls::sign::CertifiedKey::new(chain, key);
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("tls13")
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(certified)));
        tls.alpn_protocols = vec![felix_wire::protocol::ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).expect("quic");
        let config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        let endpoint = quinn::Endpoint::server(config, (LOCALHOST, 0).into()).expect("server");
        let addr = endpoint.local_addr().expect("addr");
        let server = endpoint.clone();
        tokio::spawn(async move {
            while let Some(incoming) = server.accept().await {
                tokio::spawn(async move {
                    let Ok(conn) = incoming.await else { return };
                    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                        let Ok(msg) = recv.read_to_end(1 << 16).await else {
                            return;
                        };
                        let _ = send.write_all(&msg).await;
                        let _ = send.finish();
                    }
                });
            }
        });
        (endpoint, addr)
    }

    /// Connects with `config` under `name` and echoes one message.
    async fn echo(
        config: quinn::ClientConfig,
        addr: SocketAddr,
        name: &str,
    ) -> Result<(), quinn::ConnectionError> {
        let client = quinn::Endpoint::client((LOCALHOST, 0).into()).expect("client");
        let conn = client
            .connect_with(config, addr, name)
            .expect("connect")
            .await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(b"ping").await.expect("write");
        send.finish().expect("finish");
        assert_eq!(recv.read_to_end(16).await.expect("read"), b"ping");
        conn.close(0u32.into(), b"");
        client.wait_idle().await;
        Ok(())
    }

    #[tokio::test]
    async fn a_loopback_broker_is_reached_without_ca() {
        let (broker, addr) = echo_broker(TEST_BROKER_KEY);
        let config = client_config("127.0.0.1", LOCALHOST, None, false).expect("config");
        echo(config, addr, &server_name("127.0.0.1"))
            .await
            .expect("handshake without a CA");
        broker.close(0u32.into(), b"");
    }

    #[tokio::test]
    async fn a_ca_file_verifies_the_broker_and_its_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, TEST_CA).expect("write");
        let (broker, addr) = echo_broker(TEST_BROKER_KEY);
        let config = |host: &str| client_config(host, REMOTE, Some(&ca), false).expect("config");

        for name in ["localhost", "127.0.0.1"] {
            echo(config(name), addr, &server_name(name))
                .await
                .unwrap_or_else(|e| panic!("as {name}: {e}"));
        }
        // An address missing from the certificate falls back to `localhost`.
        echo(config("10.0.0.5"), addr, &server_name("10.0.0.5"))
            .await
            .expect("an address verifies as localhost");
        // A name the certificate does not carry is refused.
        let err = echo(config("broker.example"), addr, "broker.example")
            .await
            .expect_err("wrong name");
        assert!(err.to_string().contains("not valid for name"), "{err}");

        // A CA file that does not hold the broker's issuer is refused (the broker's own
        // certificate is not a CA).
        let other = dir.path().join("other.pem");
        std::fs::write(&other, TEST_BROKER_CERT).expect("write");
        let config = client_config("localhost", LOCALHOST, Some(&other), false).expect("config");
        let err = echo(config, addr, "localhost")
            .await
            .expect_err("unknown issuer");
        assert!(err.to_string().contains("UnknownIssuer"), "{err}");
        broker.close(0u32.into(), b"");
    }

    #[tokio::test]
    async fn without_verification_the_broker_must_still_hold_its_certificates_key() {
        let (broker, addr) = echo_broker(TEST_OTHER_KEY);
        for (host, ip, insecure) in [("127.0.0.1", LOCALHOST, false), ("10.0.0.5", REMOTE, true)] {
            let config = client_config(host, ip, None, insecure).expect("config");
            let err = echo(config, addr, &server_name(host))
                .await
                .expect_err("a handshake signed with another key");
            assert!(err.to_string().contains("BadSignature"), "{host}: {err}");
        }
        broker.close(0u32.into(), b"");
    }
}
