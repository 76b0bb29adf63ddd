//! The secrets of node enrollment, none of which is ever stored.
//!
//! An **enrollment token** is derived from the deployment's enrollment key and the node's id
//! (HMAC-SHA256), so the dispatcher can put it into the bootstrap it sends the provider, as
//! often as the send is retried, while the log keeps only its SHA-256 (on the node's invite).
//! A **node credential** is what an enrollment gives the node in exchange: signed with the
//! same key and scoped to its node, rental, generation and fencing token, with an expiry
//! (the session's). The gateway verifies its signature; the node's stream decides whether
//! its fencing token is still the current one, so a credential of a session that a later
//! enrollment closed is `FENCED`. A re-enrollment presents the last credential the node was
//! given, expired or not: it proves the node identity and generation, which end with the
//! generation (a retired node never enrolls again).

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use leasehold_domain::node::{NodeId, TokenHash};
use leasehold_domain::rental::{OwnershipToken, RentalId};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// Least length of the enrollment key, in bytes.
pub const ENROLLMENT_KEY_MIN_BYTES: usize = 32;

/// The deployment's enrollment key. Its `Debug` shows nothing of it.
#[derive(Clone)]
pub struct EnrollmentKey(Vec<u8>);

impl std::fmt::Debug for EnrollmentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EnrollmentKey([redacted])")
    }
}

/// Why a key or credential was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// The key is shorter than [`ENROLLMENT_KEY_MIN_BYTES`].
    #[error("the enrollment key must be at least {ENROLLMENT_KEY_MIN_BYTES} bytes")]
    KeyTooShort,
    /// The credential is not one this deployment signed (malformed, or its signature fails).
    #[error("the node credential is not valid")]
    Invalid,
}

/// What a verified node credential says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeSession {
    /// The node.
    pub node: NodeId,
    /// Its rental.
    pub rental: RentalId,
    /// Its rental's generation.
    pub generation: u64,
    /// The fencing token of the enrollment that gave it.
    pub fencing_token: u64,
    /// When the session ends unless renewed.
    pub expires_at: DateTime<Utc>,
}

const CREDENTIAL_PREFIX: &str = "lhn1";

impl EnrollmentKey {
    /// A key of at least [`ENROLLMENT_KEY_MIN_BYTES`] bytes.
    ///
    /// # Errors
    /// [`CredentialError::KeyTooShort`].
    pub fn new(secret: &[u8]) -> Result<Self, CredentialError> {
        if secret.len() < ENROLLMENT_KEY_MIN_BYTES {
            return Err(CredentialError::KeyTooShort);
        }
        Ok(Self(secret.to_vec()))
    }

    fn mac(&self, purpose: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("any key length");
        mac.update(purpose.as_bytes());
        mac.update(&[0]);
        mac
    }

    /// `node`'s single-use enrollment token: 64 hex digits.
    pub fn enrollment_token(&self, node: NodeId) -> String {
        let mut mac = self.mac("leasehold/enrollment");
        mac.update(node.0.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// `rental`'s ownership token: keyed with this deployment's secret, so that another
    /// deployment on the same provider account (or anyone who knows the rental's id) cannot
    /// make capacity look like this deployment's to its reconciler (rule 21). 32 hex digits.
    pub fn ownership_token(&self, rental: RentalId) -> OwnershipToken {
        let mut mac = self.mac("leasehold/rental-ownership");
        mac.update(rental.0.as_bytes());
        OwnershipToken(hex::encode(&mac.finalize().into_bytes()[..16]))
    }

    /// A signed credential for `session`.
    pub fn credential(&self, session: &NodeSession) -> String {
        let body = format!(
            "{CREDENTIAL_PREFIX}.{}.{}.{}.{}.{}",
            session.node.0.simple(),
            session.rental.0.simple(),
            session.generation,
            session.fencing_token,
            session.expires_at.timestamp(),
        );
        let mut mac = self.mac("leasehold/node-credential");
        mac.update(body.as_bytes());
        format!("{body}.{}", hex::encode(mac.finalize().into_bytes()))
    }

    /// What `credential` says, if this key signed it (checked in constant time). Its expiry
    /// is the caller's to judge: a re-enrollment accepts an expired one.
    ///
    /// # Errors
    /// [`CredentialError::Invalid`].
    pub fn verify(&self, credential: &str) -> Result<NodeSession, CredentialError> {
        let (body, signature) = credential.rsplit_once('.').ok_or(CredentialError::Invalid)?;
        let signature = hex::decode(signature).map_err(|_| CredentialError::Invalid)?;
        let mut mac = self.mac("leasehold/node-credential");
        mac.update(body.as_bytes());
        mac.verify_slice(&signature).map_err(|_| CredentialError::Invalid)?;
        let parts: Vec<&str> = body.split('.').collect();
        let [CREDENTIAL_PREFIX, node, rental, generation, fencing, expires] = parts[..] else {
            return Err(CredentialError::Invalid);
        };
        let uuid = |text: &str| Uuid::parse_str(text).map_err(|_| CredentialError::Invalid);
        let number = |text: &str| text.parse::<u64>().map_err(|_| CredentialError::Invalid);
        let expires = expires.parse::<i64>().map_err(|_| CredentialError::Invalid)?;
        Ok(NodeSession {
            node: NodeId(uuid(node)?),
            rental: RentalId(uuid(rental)?),
            generation: number(generation)?,
            fencing_token: number(fencing)?,
            expires_at: DateTime::from_timestamp(expires, 0).ok_or(CredentialError::Invalid)?,
        })
    }
}

/// The SHA-256 of a token a node presents: what the log keeps of it.
pub fn token_hash(token: &str) -> TokenHash {
    TokenHash(Sha256::digest(token.as_bytes()).into())
}

/// The node of `rental`'s `generation`: minted from both, so every command that needs it (the
/// provision or resume that invites it, the dispatcher, a retry) names the same node.
pub fn node_of(rental: RentalId, generation: u64) -> NodeId {
    let mut hash = Sha256::new();
    hash.update(b"leasehold/node\0");
    hash.update(rental.0.as_bytes());
    hash.update(generation.to_be_bytes());
    let digest = hash.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    NodeId(Uuid::new_v8(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> EnrollmentKey {
        EnrollmentKey::new(&[7u8; 32]).expect("long enough")
    }

    #[test]
    fn a_credential_round_trips_and_a_changed_one_fails() {
        let session = NodeSession {
            node: NodeId(Uuid::from_u128(1)),
            rental: RentalId(Uuid::from_u128(2)),
            generation: 3,
            fencing_token: 4,
            expires_at: DateTime::from_timestamp(1_800_000_000, 0).expect("valid"),
        };
        let credential = key().credential(&session);
        assert_eq!(key().verify(&credential), Ok(session));
        let raised = credential.replacen(".4.", ".5.", 1);
        assert_eq!(key().verify(&raised), Err(CredentialError::Invalid));
        let other = EnrollmentKey::new(&[8u8; 32]).expect("long enough");
        assert_eq!(other.verify(&credential), Err(CredentialError::Invalid));
        assert_eq!(key().verify("lhn1.garbage"), Err(CredentialError::Invalid));
    }

    #[test]
    fn tokens_are_per_node_and_keys_must_be_long() {
        let one = key().enrollment_token(NodeId(Uuid::from_u128(1)));
        assert_ne!(one, key().enrollment_token(NodeId(Uuid::from_u128(2))));
        assert_eq!(one.len(), 64);
        assert_ne!(token_hash(&one).0, [0; 32]);
        assert!(EnrollmentKey::new(&[1u8; 31]).is_err());
        assert!(!format!("{:?}", key()).contains('7'));
        let rental = RentalId(Uuid::from_u128(9));
        assert_ne!(node_of(rental, 1), node_of(rental, 2));
    }

    #[test]
    fn an_ownership_token_is_the_deployments_and_the_rentals() {
        let rental = RentalId(Uuid::from_u128(9));
        let ours = key().ownership_token(rental);
        assert_eq!(ours, key().ownership_token(rental), "a retry mints the same");
        assert_eq!(ours.0.len(), 32);
        assert_ne!(ours, key().ownership_token(RentalId(Uuid::from_u128(10))));
        let elsewhere = EnrollmentKey::new(&[8u8; 32]).expect("long enough");
        assert_ne!(ours, elsewhere.ownership_token(rental), "another deployment's differs");
        assert!(!ours.0.contains(&rental.0.simple().to_string()[..8]));
    }
}
