//! TLS for PostgreSQL sessions, as libpq's `sslmode` and `sslrootcert` describe it.
//!
//! tokio-postgres parses `sslmode` but knows only `disable`, `prefer` and `require`, and it
//! reads no root certificate. So both parameters are taken out of `DATABASE_URL` here,
//! before the rest goes to tokio-postgres, and turned into its `SslMode` plus a rustls
//! connector that verifies the server's certificate as the mode asks:
//!
//! | `sslmode` | encrypted | certificate checked |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (default) | if the server offers TLS, else plain | no |
//! | `require` | always | no (as libpq: with `sslrootcert`, as `verify-ca`) |
//! | `verify-ca` | always | chain up to `sslrootcert` |
//! | `verify-full` | always | chain up to `sslrootcert`, and the host name |
//!
//! `verify-ca` and `verify-full` need `sslrootcert` (a PEM file of CA certificates); unlike
//! libpq there is no implicit `~/.postgresql/root.crt`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres::config::SslMode as DriverSslMode;
pub(crate) use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(text: &str) -> anyhow::Result<Self> {
        Ok(match text {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            // libpq's `allow` (plain first, TLS only if refused) has no tokio-postgres
            // counterpart.
            other => anyhow::bail!(
                "DATABASE_URL: sslmode={other:?} is not one of disable, prefer, require, verify-ca, verify-full"
            ),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

/// How sessions are encrypted: the mode and the connector built for it.
#[derive(Clone)]
pub struct PgTls {
    pub mode: SslMode,
    pub connector: MakeRustlsConnect,
}

impl PgTls {
    /// The mode for tokio-postgres, which does the `SSLRequest` negotiation itself.
    pub fn driver_mode(&self) -> DriverSslMode {
        match self.mode {
            SslMode::Disable => DriverSslMode::Disable,
            SslMode::Prefer => DriverSslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => DriverSslMode::Require,
        }
    }

    /// The connector for `mode` (the CA file is read now, so a missing or unreadable one
    /// stops start-up with one line).
    pub fn new(mode: SslMode, root_cert: Option<&Path>) -> anyhow::Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mode = match (mode, root_cert) {
            // libpq: "if a root CA file exists, sslmode=require behaves like verify-ca".
            (SslMode::Require, Some(_)) => SslMode::VerifyCa,
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => anyhow::bail!(
                "DATABASE_URL: sslmode={} needs sslrootcert=PATH (a PEM file of the CA certificates to trust)",
                mode.as_str()
            ),
            (mode, _) => mode,
        };
        let algorithms = provider.signature_verification_algorithms;
        let verifier: Arc<dyn ServerCertVerifier> = match (mode, root_cert) {
            (SslMode::VerifyFull, Some(path)) => verifier(path, &provider)?,
            (SslMode::VerifyCa, Some(path)) => Arc::new(NameUnchecked {
                chain: Some(verifier(path, &provider)?),
                algorithms,
            }),
            _ => Arc::new(NameUnchecked {
                chain: None,
                algorithms,
            }),
        };
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS for PostgreSQL: no protocol version")?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(Self {
            mode,
            connector: MakeRustlsConnect::new(config),
        })
    }
}

/// `url` without its `sslmode` and `sslrootcert` parameters (query parameters of a URL, or
/// pairs of a key-value connection string), and what they said. The other parameters stay,
/// in order, for tokio-postgres.
pub(crate) fn take_tls_parameters(url: &str) -> anyhow::Result<(String, PgTls)> {
    if super::conninfo::is_key_value(url) {
        let mut kept = Vec::new();
        let mut mode = SslMode::Prefer;
        let mut root_cert = None;
        for pair in super::conninfo::parse(url)? {
            match pair.key.as_str() {
                "sslmode" => mode = SslMode::parse(&pair.value)?,
                "sslrootcert" => root_cert = Some(PathBuf::from(&pair.value)),
                _ => kept.push(pair.written()),
            }
        }
        return Ok((kept.join(" "), PgTls::new(mode, root_cert.as_deref())?));
    }
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut kept = Vec::new();
    let mut mode = SslMode::Prefer;
    let mut root_cert = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sslmode" => mode = SslMode::parse(&percent_decode(value)?)?,
            "sslrootcert" => root_cert = Some(PathBuf::from(percent_decode(value)?)),
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, PgTls::new(mode, root_cert.as_deref())?))
}

fn percent_decode(text: &str) -> anyhow::Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = text
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .with_context(|| format!("DATABASE_URL: bad percent-encoding in {text:?}"))?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).with_context(|| format!("DATABASE_URL: {text:?} is not UTF-8"))
}

/// A verifier of the chain and the host name, trusting the CA certificates in `path`.
fn verifier(
    path: &Path,
    provider: &Arc<CryptoProvider>,
) -> anyhow::Result<Arc<WebPkiServerVerifier>> {
    let shown = path.display();
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path)
        .with_context(|| format!("DATABASE_URL: reading sslrootcert {shown}"))?
    {
        let cert = cert.with_context(|| format!("DATABASE_URL: sslrootcert {shown}"))?;
        roots
            .add(cert)
            .with_context(|| format!("DATABASE_URL: sslrootcert {shown}"))?;
    }
    if roots.is_empty() {
        anyhow::bail!("DATABASE_URL: sslrootcert {shown} holds no PEM certificate");
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .with_context(|| format!("DATABASE_URL: sslrootcert {shown}"))
}

/// The verifier of the modes that do not compare the host name: `verify-ca` (with a chain,
/// which must lead to a trusted CA; webpki checks the chain first, so a name mismatch
/// means the chain was good) and `prefer`/`require` (without one: encrypted, but any
/// certificate is taken, as libpq does). Either way the handshake's signatures are
/// checked against the certificate presented.
#[derive(Debug)]
struct NameUnchecked {
    chain: Option<Arc<WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for NameUnchecked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
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

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The TLS error under a failed connection, if the handshake itself failed (a certificate
/// not trusted, no protocol in common): a setting to fix, not an outage to wait out. A
/// connection lost during the handshake carries no TLS error and stays transient.
pub(crate) fn handshake_failure(e: &tokio_postgres::Error) -> Option<&rustls::Error> {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(tls) = cause.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(tls) = cause
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls);
        }
        source = cause.source();
    }
    None
}

/// Whether `e` is tokio-postgres giving up because the server answered its TLS request "no"
/// while `sslmode` requires TLS: the server has `ssl = off`, a setting to fix on one side or
/// the other, not an outage to wait out. The driver gives this failure no kind that can be
/// asked for (its error kinds are private): it is its TLS error whose cause is its own fixed
/// text, so that text is compared here. It is the driver's text, not the server's (which
/// may be translated); the private-cluster test with `ssl = off` fails if a driver version
/// changes it.
pub(crate) fn server_refused_tls(e: &tokio_postgres::Error) -> bool {
    const REFUSED: &str = "server does not support TLS";
    e.as_db_error().is_none()
        && std::error::Error::source(e).is_some_and(|cause| cause.to_string() == REFUSED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_taken_out_of_the_url() {
        let (url, tls) =
            take_tls_parameters("postgres://u@h/db?application_name=x&sslmode=require").unwrap();
        assert_eq!(url, "postgres://u@h/db?application_name=x");
        assert_eq!(tls.mode, SslMode::Require);
        assert_eq!(tls.driver_mode(), DriverSslMode::Require);

        let (url, tls) = take_tls_parameters("postgres://u@h/db").unwrap();
        assert_eq!(url, "postgres://u@h/db");
        assert_eq!(tls.mode, SslMode::Prefer);

        let (_, tls) = take_tls_parameters("postgres://u@h/db?sslmode=disable").unwrap();
        assert_eq!(tls.driver_mode(), DriverSslMode::Disable);
    }

    #[test]
    fn verifying_modes_need_a_readable_root_certificate() {
        let missing = take_tls_parameters("postgres://u@h/db?sslmode=verify-full")
            .err()
            .unwrap()
            .to_string();
        assert!(missing.contains("needs sslrootcert"), "{missing}");
        let unreadable = take_tls_parameters(
            "postgres://u@h/db?sslmode=verify-ca&sslrootcert=%2Fno%2Fsuch%20file.pem",
        )
        .err()
        .unwrap();
        let unreadable = format!("{unreadable:#}");
        assert!(unreadable.contains("/no/such file.pem"), "{unreadable}");
        let unknown = take_tls_parameters("postgres://u@h/db?sslmode=allow")
            .err()
            .unwrap()
            .to_string();
        assert!(unknown.contains("allow"), "{unknown}");
    }
}
