//! HTTPS: the rustls server configuration read from `--tls-cert` and `--tls-key`.
//!
//! TLS 1.2 and 1.3 only (rustls implements nothing older), on the ring provider, with
//! rustls's default cipher suites. ALPN offers `http/1.1` (actix adds it; HTTP/2 is not
//! built in).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The server side of TLS: the certificate chain in `cert` (PEM, the server's certificate
/// first), the private key in `key` (PEM: PKCS#8, PKCS#1 or SEC1). Any problem is one line
/// naming the setting and the file.
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<ServerConfig> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(Iterator::collect)
        .with_context(|| {
            format!(
                "--tls-cert {}: not a readable PEM certificate",
                cert.display()
            )
        })?;
    if chain.is_empty() {
        anyhow::bail!("--tls-cert {}: no PEM certificate in it", cert.display());
    }
    let private_key = PrivateKeyDer::from_pem_file(key).with_context(|| {
        format!(
            "--tls-key {}: not a readable PEM private key",
            key.display()
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("TLS: no protocol version")?
        .with_no_client_auth()
        .with_single_cert(chain, private_key)
        .with_context(|| {
            format!(
                "--tls-cert {} / --tls-key {}: the key does not fit the certificate",
                cert.display(),
                key.display()
            )
        })
}
