//! The idempotency ledger's entry: what an append records about the command that made it.

use std::fmt;

use crate::{Actor, OperationKey, StreamId, TenantId};

/// The SHA-256 of a command's request, in a canonical form: the same request always hashes
/// the same, so a retry is told from a different request reusing the key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestHash(pub [u8; 32]);

impl fmt::Debug for RequestHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestHash(")?;
        for byte in &self.0[..4] {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "..)")
    }
}

/// Whose operation keys a key belongs to, within a tenant: each kind of caller has its own, so
/// that no caller can take a key another will use (a tenant cannot occupy the key its
/// backend's callback or its provider's agent will send).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyNamespace(String);

impl KeyNamespace {
    /// The tenant's own keys (commands from tenant tokens).
    pub fn tenant() -> Self {
        Self("tenant".into())
    }

    /// Signed backend callbacks: their keys derive from the operation the URL names.
    pub fn callback() -> Self {
        Self("callback".into())
    }

    /// The namespace of `actor`: the tenant's for a tenant, else one per role and subject
    /// (`agent:SUBJECT`, `operator:SUBJECT`).
    pub fn of_actor(actor: &Actor) -> Self {
        match actor.role.as_str() {
            "tenant" => Self::tenant(),
            role => Self(format!("{role}:{}", actor.subject)),
        }
    }

    /// The stored form.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Recorded in the same transaction as a command's events: `(tenant, namespace,
/// operation_key)` is taken by the first command that commits with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    /// The commanding tenant.
    pub tenant: TenantId,
    /// Whose keys `operation_key` is one of.
    pub namespace: KeyNamespace,
    /// The caller's key.
    pub operation_key: OperationKey,
    /// The request's hash.
    pub request_hash: RequestHash,
    /// The aggregate's stream, whose versions the entry records.
    pub stream: StreamId,
}
