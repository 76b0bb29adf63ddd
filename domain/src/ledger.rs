//! The idempotency ledger's entry: what an append records about the command that made it.

use std::fmt;

use crate::{OperationKey, StreamId, TenantId};

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

/// Recorded in the same transaction as a command's events: `(tenant, operation_key)` is taken
/// by the first command that commits with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    /// The commanding tenant.
    pub tenant: TenantId,
    /// The caller's key.
    pub operation_key: OperationKey,
    /// The request's hash.
    pub request_hash: RequestHash,
    /// The aggregate's stream, whose versions the entry records.
    pub stream: StreamId,
}
