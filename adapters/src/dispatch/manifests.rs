//! Lease manifests, sealed at rest (`lease_manifests`, migration 0011), so that the dispatcher
//! can send a backend the manifest a provision or an update names. A manifest may hold the
//! tenant's secrets: it never enters the log, a read model, an error or a log line; only its
//! SHA-256 does. Each is sealed with XChaCha20-Poly1305 under a key derived from the server's
//! secret, its tenant and hash bound as associated data, so a sealed manifest moved to another
//! tenant or hash does not open. The nonce is derived from the tenant and the hash: the same
//! manifest of the same tenant always seals the same way (its hash already says they are
//! equal), and two different manifests never share a nonce.

use chacha20poly1305::aead::{Aead as _, KeyInit as _, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac as _};
use leasehold_domain::{StoreError, TenantId};
use sha2::{Digest as _, Sha256};

use crate::store::{PgEventStore, from_driver, from_pool};

type HmacSha256 = Hmac<Sha256>;

/// Bytes of an XChaCha20 nonce.
const NONCE_BYTES: usize = 24;

/// The sealed manifests, over the log's pool.
#[derive(Clone)]
pub struct ManifestVault {
    log: PgEventStore,
    cipher: XChaCha20Poly1305,
    nonce_key: Vec<u8>,
}

impl std::fmt::Debug for ManifestVault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ManifestVault(..)")
    }
}

impl ManifestVault {
    /// The vault in the database `log` is in, keyed from `secret` (the server's JWT secret:
    /// keys derived for this purpose only).
    pub fn new(log: PgEventStore, secret: &[u8]) -> Self {
        let derived = |purpose: &[u8]| {
            let mut mac = <HmacSha256 as hmac::Mac>::new_from_slice(secret)
                .expect("HMAC takes any key length");
            mac.update(purpose);
            mac.finalize().into_bytes()
        };
        let cipher = XChaCha20Poly1305::new(&derived(b"leasehold manifest key v1: cipher"));
        let nonce_key = derived(b"leasehold manifest key v1: nonce").to_vec();
        Self { log, cipher, nonce_key }
    }

    fn bound(tenant: &TenantId, hash: &str) -> Vec<u8> {
        let mut bound = Vec::new();
        for part in [tenant.as_str().as_bytes(), hash.as_bytes()] {
            bound.extend_from_slice(&(part.len() as u64).to_be_bytes());
            bound.extend_from_slice(part);
        }
        bound
    }

    fn nonce(&self, bound: &[u8]) -> XNonce {
        let mut mac =
            <HmacSha256 as hmac::Mac>::new_from_slice(&self.nonce_key).expect("any key length");
        mac.update(bound);
        *XNonce::from_slice(&mac.finalize().into_bytes()[..NONCE_BYTES])
    }

    /// Keeps `manifest`, whose SHA-256 (lower-case hex) is `hash`, for `tenant`; a manifest
    /// already kept is left as it is.
    ///
    /// # Errors
    /// A database failure.
    pub async fn put(
        &self,
        tenant: &TenantId,
        hash: &str,
        manifest: &[u8],
    ) -> Result<(), StoreError> {
        let bound = Self::bound(tenant, hash);
        let nonce = self.nonce(&bound);
        let sealed =
            self.cipher.encrypt(&nonce, Payload { msg: manifest, aad: &bound }).map_err(|_| {
                StoreError::Database { reason: "a manifest could not be sealed".into() }
            })?;
        let client = self.log.pool().get().await.map_err(|e| from_pool(e, self.log.endpoint()))?;
        client
            .execute(
                "INSERT INTO lease_manifests (tenant_id, payload_hash, sealed) VALUES ($1, $2, $3) \
                 ON CONFLICT DO NOTHING",
                &[&tenant.as_str(), &hash, &sealed],
            )
            .await
            .map_err(|e| from_driver(e, self.log.endpoint()))?;
        Ok(())
    }

    /// The manifest `tenant` keeps under `hash`, if any (one that does not open, or whose
    /// hash differs, is none).
    ///
    /// # Errors
    /// A database failure.
    pub async fn get(&self, tenant: &TenantId, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let client = self.log.pool().get().await.map_err(|e| from_pool(e, self.log.endpoint()))?;
        let row = client
            .query_opt(
                "SELECT sealed FROM lease_manifests WHERE tenant_id = $1 AND payload_hash = $2",
                &[&tenant.as_str(), &hash],
            )
            .await
            .map_err(|e| from_driver(e, self.log.endpoint()))?;
        let Some(row) = row else { return Ok(None) };
        let sealed: Vec<u8> = row.get(0);
        let bound = Self::bound(tenant, hash);
        let opened =
            self.cipher.decrypt(&self.nonce(&bound), Payload { msg: &sealed, aad: &bound });
        Ok(opened.ok().filter(|manifest| hex::encode(Sha256::digest(manifest)) == hash))
    }
}
