//! A per-test certificate authority and leaf certificates, made with rcgen.

use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A CA whose certificate is written to `ca_path` for clients to trust.
pub(crate) struct Pki {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub(crate) ca_path: PathBuf,
    pub(crate) ca_der: CertificateDer<'static>,
    _dir: tempfile::TempDir,
}

impl Pki {
    pub(crate) fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "sandgate test CA");
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca_path = dir.path().join("ca.pem");
        std::fs::write(&ca_path, issuer.pem()).unwrap();
        let ca_der = issuer.der().clone();
        Self { issuer, ca_path, ca_der, _dir: dir }
    }

    /// A rustls server config for a leaf certificate naming `names`, offering HTTP/1.1 only.
    pub(crate) fn server_config(&self, names: &[&str]) -> Arc<rustls::ServerConfig> {
        self.server_config_alpn(names, &[b"http/1.1"])
    }

    /// A rustls server config for a leaf naming `names`, offering the given ALPN protocols.
    pub(crate) fn server_config_alpn(&self, names: &[&str], alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .unwrap();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    /// A leaf naming `names` written as PEM files `(certificate, key)` under `dir`.
    pub(crate) fn leaf_files(&self, names: &[&str], dir: &std::path::Path) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (c, k) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    /// A rustls client config that trusts only this CA.
    pub(crate) fn client_config(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).unwrap();
        Arc::new(
            rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        )
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
