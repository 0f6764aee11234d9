//! The block store over the network: a wire protocol ([`protocol`]), a
//! blocking thread-per-connection server ([`server`]), a blocking client with
//! a pool ([`client`]), and a follower that keeps a replica ([`follower`]).
//! See `docs/store-protocol.md` and `docs/store.md`.

pub mod auth;
pub mod client;
pub mod follower;
pub mod protocol;
pub mod server;

use rustls::{ClientConnection, ServerConnection, StreamOwned};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

/// Errors setting up TLS from PEM files.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {why}")]
    Pem { path: String, why: String },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("{0:?} is not a valid TLS server name")]
    ServerName(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |why: String| TlsError::Pem {
        path: path.display().to_string(),
        why,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no CERTIFICATE in the file".into()));
    }
    Ok(certs)
}

/// A server TLS configuration from a PEM certificate chain and private key.
pub fn server_tls(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs = load_certs(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Pem {
        path: key.display().to_string(),
        why: e.to_string(),
    })?;
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    Ok(Arc::new(cfg))
}

/// A client TLS configuration trusting the certificates in `ca` (PEM).
pub fn client_tls(ca: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in load_certs(ca)? {
        roots.add(c)?;
    }
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// The TLS server name for `host` (a DNS name or an IP address).
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(h.to_string()).map_err(|_| TlsError::ServerName(host.to_string()))
}

/// A connection, plain or TLS.
pub(crate) enum Stream {
    Plain(TcpStream),
    TlsServer(Box<StreamOwned<ServerConnection, TcpStream>>),
    TlsClient(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Stream {
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::TlsServer(s) => s.get_ref(),
            Stream::TlsClient(s) => s.get_ref(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::TlsServer(s) => s.read(buf),
            Stream::TlsClient(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::TlsServer(s) => s.write(buf),
            Stream::TlsClient(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::TlsServer(s) => s.flush(),
            Stream::TlsClient(s) => s.flush(),
        }
    }
}

/// Whether an I/O error is a socket timeout.
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}
