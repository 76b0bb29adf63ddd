//! The VM credentials' vault: each VM's auth token (minted here, 32 random bytes) and its
//! tenant's secrets, sealed with AES-256-GCM in `vm_credentials`, one row per credentials'
//! reference. The VM service writes a reference until its VM exists, never after (a retried
//! create keeps the first token).
//! The key never enters the database; the sealed row is bound to its reference and tenant.

use std::collections::BTreeMap;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use leasehold_commands::vm_service::{CredentialVault, VmCredentials};
use leasehold_domain::vm::CredentialRef;
use leasehold_domain::{StoreError, TenantId};
use sha2::{Digest as _, Sha256};

use crate::store::{PgEventStore, from_driver};

/// The vault over the database of its store.
#[derive(Clone)]
pub struct PgCredentialVault {
    store: PgEventStore,
    cipher: Aes256Gcm,
}

impl std::fmt::Debug for PgCredentialVault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PgCredentialVault(..)")
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Sealed {
    auth_token: String,
    secrets: BTreeMap<String, String>,
}

impl PgCredentialVault {
    /// A vault whose AES-256 key is derived from `secret` (at least 32 bytes, kept outside
    /// the database).
    pub fn new(store: PgEventStore, secret: &[u8]) -> Self {
        let mut derived = Sha256::new();
        derived.update(b"leasehold vm credentials v1\n");
        derived.update(secret);
        let key: [u8; 32] = derived.finalize().into();
        Self { store, cipher: Aes256Gcm::new(&key.into()) }
    }

    /// The store whose database the vault is in.
    pub fn store(&self) -> &PgEventStore {
        &self.store
    }

    fn associated(reference: CredentialRef, tenant: &TenantId) -> Vec<u8> {
        format!("{}\n{}", reference.0, tenant.as_str()).into_bytes()
    }

    fn seal(
        &self,
        reference: CredentialRef,
        tenant: &TenantId,
        credentials: &Sealed,
    ) -> Result<([u8; 12], Vec<u8>), StoreError> {
        let mut nonce = [0u8; 12];
        getrandom::fill(&mut nonce).map_err(|error| StoreError::Database {
            reason: format!("no randomness for a nonce: {error}"),
        })?;
        let plain = serde_json::to_vec(credentials).expect("credentials serialize");
        let aad = Self::associated(reference, tenant);
        let sealed = self
            .cipher
            .encrypt(Nonce::from_slice(&nonce), Payload { msg: &plain, aad: &aad })
            .map_err(|_| StoreError::Database { reason: "sealing VM credentials failed".into() })?;
        Ok((nonce, sealed))
    }
}

impl PgCredentialVault {
    /// Keeps `token` as the bearer token of `host`'s agent (replacing any before it).
    ///
    /// # Errors
    /// A store failure.
    pub async fn keep_host_token(
        &self,
        host: &leasehold_domain::values::fleet::HostId,
        token: &str,
    ) -> Result<(), StoreError> {
        let mut nonce = [0u8; 12];
        getrandom::fill(&mut nonce).map_err(|error| StoreError::Database {
            reason: format!("no randomness for a nonce: {error}"),
        })?;
        let aad = format!("host\n{host}").into_bytes();
        let sealed = self
            .cipher
            .encrypt(Nonce::from_slice(&nonce), Payload { msg: token.as_bytes(), aad: &aad })
            .map_err(|_| StoreError::Database { reason: "sealing a host token failed".into() })?;
        let client = self.store.client().await?;
        client
            .execute(
                "INSERT INTO host_tokens (host_id, nonce, sealed) VALUES ($1, $2, $3) \
                 ON CONFLICT (host_id) DO UPDATE SET nonce = excluded.nonce, \
                 sealed = excluded.sealed, updated_at = now()",
                &[&host.as_str(), &nonce.as_slice(), &sealed],
            )
            .await
            .map_err(|error| from_driver(error, self.store.endpoint()))?;
        Ok(())
    }

    /// The bearer token of `host`'s agent, if one was registered.
    ///
    /// # Errors
    /// A store failure, or a token that does not open under this key.
    pub async fn host_token(
        &self,
        host: &leasehold_domain::values::fleet::HostId,
    ) -> Result<Option<String>, StoreError> {
        let client = self.store.client().await?;
        let row = client
            .query_opt(
                "SELECT nonce, sealed FROM host_tokens WHERE host_id = $1",
                &[&host.as_str()],
            )
            .await
            .map_err(|error| from_driver(error, self.store.endpoint()))?;
        let Some(row) = row else { return Ok(None) };
        let (nonce, sealed): (Vec<u8>, Vec<u8>) = (row.get(0), row.get(1));
        let corrupt = || StoreError::Corrupt {
            position: 0,
            reason: format!("the token of host {host} does not open under this key"),
        };
        if nonce.len() != 12 {
            return Err(corrupt());
        }
        let aad = format!("host\n{host}").into_bytes();
        let plain = self
            .cipher
            .decrypt(Nonce::from_slice(&nonce), Payload { msg: &sealed, aad: &aad })
            .map_err(|_| corrupt())?;
        String::from_utf8(plain).map(Some).map_err(|_| corrupt())
    }
}

fn token() -> Result<String, StoreError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|error| StoreError::Database {
        reason: format!("no randomness for a VM token: {error}"),
    })?;
    Ok(hex::encode(bytes))
}

/// Keeps sealed credentials (replacing those of a refused create under the same reference, of
/// the same tenant only) unless the stream `$5` exists; its own transaction's commit does not
/// wait for the WAL flush (`set_config(..., true)`: this transaction only).
const KEEP_SQL: &str = "WITH unflushed AS (SELECT set_config('synchronous_commit', 'off', true)) \
     INSERT INTO vm_credentials (reference, tenant_id, nonce, sealed) \
     SELECT $1, $2, $3, $4 FROM unflushed \
     WHERE NOT EXISTS (SELECT 1 FROM streams WHERE stream_id = $5) \
     ON CONFLICT (reference) DO UPDATE SET nonce = excluded.nonce, sealed = excluded.sealed \
     WHERE vm_credentials.tenant_id = excluded.tenant_id";

impl PgCredentialVault {
    /// Seals and keeps credentials for `reference` unless the stream `unless` exists; whether
    /// they were kept.
    ///
    /// Committed without waiting for the commit's WAL flush: the VM's creation, appended next
    /// with a flushed commit, flushes this one with it (the WAL is written in order, and this
    /// commit comes first). Should nothing follow (a refused create) a crash may lose it, and
    /// no VM refers to it. It spares a create the cost of a flush of its own.
    async fn keep_unless(
        &self,
        (reference, tenant): (CredentialRef, &TenantId),
        secrets: &BTreeMap<String, String>,
        unless: &str,
    ) -> Result<bool, StoreError> {
        let credentials = Sealed { auth_token: token()?, secrets: secrets.clone() };
        let (nonce, sealed) = self.seal(reference, tenant, &credentials)?;
        let endpoint = self.store.endpoint();
        let driver = |error| from_driver(error, endpoint);
        let client = self.store.client().await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&reference.0, &tenant.as_str(), &nonce.as_slice(), &sealed, &unless];
        // Prepared once per connection: an unprepared statement costs a round trip more.
        let statement = client.prepare_cached(KEEP_SQL).await.map_err(driver)?;
        let kept = client.execute(&statement, &params).await.map_err(driver)?;
        Ok(kept == 1)
    }
}

impl CredentialVault for PgCredentialVault {
    async fn keep(
        &self,
        reference: CredentialRef,
        tenant: &TenantId,
        secrets: &BTreeMap<String, String>,
    ) -> Result<(), StoreError> {
        // No stream has an empty id: kept whatever exists.
        self.keep_unless((reference, tenant), secrets, "").await.map(|_| ())
    }

    async fn keep_new(
        &self,
        reference: CredentialRef,
        tenant: &TenantId,
        secrets: &BTreeMap<String, String>,
        vm: &leasehold_domain::StreamId,
    ) -> Result<bool, StoreError> {
        self.keep_unless((reference, tenant), secrets, vm.as_str()).await
    }

    async fn called_hosts(
        &self,
    ) -> Result<std::collections::BTreeSet<leasehold_domain::values::fleet::HostId>, StoreError>
    {
        let client = self.store.client().await?;
        let rows = client
            .query("SELECT host_id FROM host_tokens", &[])
            .await
            .map_err(|error| from_driver(error, self.store.endpoint()))?;
        let ids = rows.iter().map(|row| row.get::<_, &str>(0));
        Ok(ids
            .filter_map(|id| leasehold_domain::values::fleet::HostId::parse("host", id).ok())
            .collect())
    }

    async fn open(
        &self,
        reference: CredentialRef,
        tenant: &TenantId,
    ) -> Result<Option<VmCredentials>, StoreError> {
        let client = self.store.client().await?;
        let row = client
            .query_opt(
                "SELECT nonce, sealed FROM vm_credentials WHERE reference = $1 AND tenant_id = $2",
                &[&reference.0, &tenant.as_str()],
            )
            .await
            .map_err(|error| from_driver(error, self.store.endpoint()))?;
        let Some(row) = row else { return Ok(None) };
        let (nonce, sealed): (Vec<u8>, Vec<u8>) = (row.get(0), row.get(1));
        let aad = Self::associated(reference, tenant);
        let corrupt = || StoreError::Corrupt {
            position: 0,
            reason: format!("the credentials of {} do not open under this key", reference.0),
        };
        if nonce.len() != 12 {
            return Err(corrupt());
        }
        let plain = self
            .cipher
            .decrypt(Nonce::from_slice(&nonce), Payload { msg: &sealed, aad: &aad })
            .map_err(|_| corrupt())?;
        let opened: Sealed = serde_json::from_slice(&plain).map_err(|_| corrupt())?;
        Ok(Some(VmCredentials { auth_token: opened.auth_token, secrets: opened.secrets }))
    }
}
