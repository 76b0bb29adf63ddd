//! The simulator over HTTPS, as fred's backends serve with `tls_cert_file` and `tls_key_file`,
//! and with mutual TLS when `tls_client_ca_file` is set: a client without a certificate that
//! CA signed fails the handshake and is never answered.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

/// The server's TLS settings from PEM files.
///
/// # Errors
/// A file that cannot be read or is not what it should be.
pub(super) fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let chain = certificates(cert).context("--tls-cert-file")?;
    let key = PrivateKeyDer::from_pem_file(key).context("--tls-key-file: a PEM private key")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .context("TLS versions")?;
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for certificate in certificates(ca).context("--tls-client-ca-file")? {
                roots.add(certificate).context("--tls-client-ca-file: a CA certificate")?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .context("--tls-client-ca-file")?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder.with_single_cert(chain, key).context("the certificate and its key")?;
    Ok(Arc::new(config))
}

fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let chain: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading {}", path.display()))?
        .collect();
    let chain = chain.with_context(|| format!("{}: PEM certificates", path.display()))?;
    anyhow::ensure!(!chain.is_empty(), "{}: no certificate", path.display());
    Ok(chain)
}

/// Serves `router` over TLS on `listener` until SIGINT or SIGTERM.
///
/// # Errors
/// The listener fails.
pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    config: Arc<rustls::ServerConfig>,
) -> anyhow::Result<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let stop = crate::serve::stop_signal();
    tokio::pin!(stop);
    loop {
        let (tcp, _) = tokio::select! {
            accepted = listener.accept() => accepted.context("accepting")?,
            _ = &mut stop => return Ok(()),
        };
        let (acceptor, router) = (acceptor.clone(), router.clone());
        tokio::spawn(async move {
            // A failed handshake (no client certificate, an unknown CA) ends the connection.
            let Ok(stream) = acceptor.accept(tcp).await else { return };
            let service = hyper_util::service::TowerToHyperService::new(router);
            let executor = hyper_util::rt::TokioExecutor::new();
            let served = hyper_util::server::conn::auto::Builder::new(executor)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%error, "a TLS connection ended");
            }
        });
    }
}
