//! Opaque cursors: every cursor the gateway hands out (page cursors, log cursors, command
//! results, subscription events) is `base64url(nonce || XChaCha20-Poly1305(value))`, the
//! cursor's kind and the caller's scope (its tenant) bound in as associated data. A client sees
//! only random-looking bytes: nothing about the log's positions or transactions, so the
//! distance between two of a tenant's cursors reveals nothing of other tenants' activity. A
//! cursor edited by a client, of another kind, or issued to another scope fails to open and is
//! refused as bad input.
//!
//! The nonce is synthetic (an HMAC of kind, scope and value under a second key), so the same
//! position always gives the same cursor for the same caller (a retry answers exactly the
//! first call's cursor) and distinct values never share a nonce.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{Aead as _, KeyInit as _, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::Sha256;

use crate::errors::ApiError;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of an XChaCha20 nonce.
const NONCE_BYTES: usize = 24;

/// What a cursor points into; a page cursor cannot be used as a log cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorKind {
    /// A position in the log (`events`, subscriptions, command results, read-your-writes).
    Log,
    /// A position in the `leases` list.
    Leases,
    /// A position in the `workloads` list.
    Workloads,
    /// A position in the `vms` list.
    Vms,
    /// A position in the `snapshots` list.
    Snapshots,
    /// A position in the `rentals` list.
    Rentals,
    /// A position in the `runs` list.
    Runs,
    /// A position in the `runnerLeases` list.
    RunnerLeases,
    /// A position in the `runnerJobs` list.
    RunnerJobs,
}

impl CursorKind {
    fn tag(self) -> &'static [u8] {
        match self {
            Self::Log => b"log",
            Self::Leases => b"leases",
            Self::Workloads => b"workloads",
            Self::Vms => b"vms",
            Self::Snapshots => b"snapshots",
            Self::Rentals => b"rentals",
            Self::Runs => b"runs",
            Self::RunnerLeases => b"runner-leases",
            Self::RunnerJobs => b"runner-jobs",
        }
    }
}

/// The keys cursors are sealed with. Its `Debug` never shows them.
#[derive(Clone)]
pub struct CursorKey {
    cipher: XChaCha20Poly1305,
    nonce_key: Vec<u8>,
}

impl fmt::Debug for CursorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CursorKey(..)")
    }
}

impl CursorKey {
    /// Keys derived from `secret` for cursors only, so that nothing a token or callback
    /// secret signs doubles as a cursor.
    pub fn derive(secret: &[u8]) -> Self {
        let derived = |purpose: &[u8]| {
            let mut mac =
                <HmacSha256 as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
            mac.update(purpose);
            mac.finalize().into_bytes()
        };
        let cipher = XChaCha20Poly1305::new(&derived(b"leasehold cursor key v2: cipher"));
        Self { cipher, nonce_key: derived(b"leasehold cursor key v2: nonce").to_vec() }
    }

    /// The associated data: the kind and the scope, each length-prefixed.
    fn bound(kind: CursorKind, scope: &str) -> Vec<u8> {
        let mut bound = Vec::with_capacity(32 + scope.len());
        for part in [kind.tag(), scope.as_bytes()] {
            bound.extend_from_slice(&(part.len() as u64).to_be_bytes());
            bound.extend_from_slice(part);
        }
        bound
    }

    fn nonce(&self, bound: &[u8], body: &[u8]) -> XNonce {
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.nonce_key).expect("any key length");
        mac.update(&(bound.len() as u64).to_be_bytes());
        mac.update(bound);
        mac.update(body);
        let digest = mac.finalize().into_bytes();
        *XNonce::from_slice(&digest[..NONCE_BYTES])
    }

    /// The opaque cursor for `value`, usable only in `scope`.
    pub fn seal<T: Serialize>(&self, kind: CursorKind, scope: &str, value: &T) -> String {
        let body = serde_json::to_vec(value).expect("cursor values serialize");
        let bound = Self::bound(kind, scope);
        let nonce = self.nonce(&bound, &body);
        let sealed = self
            .cipher
            .encrypt(&nonce, Payload { msg: &body, aad: &bound })
            .expect("encrypting a short cursor cannot fail");
        let mut bytes = nonce.to_vec();
        bytes.extend_from_slice(&sealed);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// The value of a cursor sealed for `scope`.
    ///
    /// # Errors
    /// `BAD_USER_INPUT` naming `field` when it is malformed, altered, of another kind or from
    /// another scope; the message does not say which.
    pub fn open<T: DeserializeOwned>(
        &self,
        kind: CursorKind,
        scope: &str,
        field: &str,
        text: &str,
    ) -> Result<T, ApiError> {
        let refused =
            || ApiError::bad_input(format!("{field}: not a cursor this caller was given"));
        let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| refused())?;
        if bytes.len() <= NONCE_BYTES {
            return Err(refused());
        }
        let (nonce, sealed) = bytes.split_at(NONCE_BYTES);
        let bound = Self::bound(kind, scope);
        let body = self
            .cipher
            .decrypt(XNonce::from_slice(nonce), Payload { msg: sealed, aad: &bound })
            .map_err(|_| refused())?;
        serde_json::from_slice(&body).map_err(|_| refused())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever a client sends as a cursor, it is refused as bad input: never a panic,
        /// never another error.
        #[test]
        fn any_text_is_refused_as_bad_input(text in ".{0,200}", base64 in "[A-Za-z0-9_-]{0,120}") {
            let key = CursorKey::derive(b"secret");
            for text in [text, base64] {
                let opened = key.open::<serde_json::Value>(CursorKind::Log, "tenant:acme", "after", &text);
                prop_assert_eq!(opened.expect_err("refused").code, crate::errors::Code::BadUserInput);
            }
        }

        /// Any one byte of a cursor changed, or the cursor cut short or made longer, and it
        /// no longer opens.
        #[test]
        fn a_cursor_altered_anywhere_does_not_open(
            position in any::<u64>(),
            at in any::<prop::sample::Index>(),
            flip in 1u8..=255,
            cut in any::<prop::sample::Index>(),
            extra in prop::collection::vec(any::<u8>(), 1..8),
        ) {
            let key = CursorKey::derive(b"secret");
            let sealed = key.seal(CursorKind::Log, "tenant:acme", &position);
            let bytes = URL_SAFE_NO_PAD.decode(&sealed).expect("base64url");
            let mut flipped = bytes.clone();
            flipped[at.index(bytes.len())] ^= flip;
            let cut = bytes[..cut.index(bytes.len())].to_vec();
            let longer = [bytes.clone(), extra].concat();
            for altered in [flipped, cut, longer] {
                let text = URL_SAFE_NO_PAD.encode(&altered);
                let opened = key.open::<u64>(CursorKind::Log, "tenant:acme", "after", &text);
                prop_assert!(opened.is_err());
            }
            prop_assert_eq!(key.open::<u64>(CursorKind::Log, "tenant:acme", "after", &sealed).ok(), Some(position));
        }
    }

    #[test]
    fn a_cursor_opens_only_in_its_scope_and_kind() {
        let key = CursorKey::derive(b"secret");
        let sealed = key.seal(CursorKind::Leases, "tenant:acme", &(7u64, "x"));
        let opened: (u64, String) =
            key.open(CursorKind::Leases, "tenant:acme", "after", &sealed).expect("opens");
        assert_eq!(opened, (7, "x".to_string()));
        let foreign =
            key.open::<(u64, String)>(CursorKind::Leases, "tenant:beta", "after", &sealed);
        assert_eq!(foreign.expect_err("refused").code, crate::errors::Code::BadUserInput);
        assert!(
            key.open::<(u64, String)>(CursorKind::Log, "tenant:acme", "after", &sealed).is_err()
        );
        let mut bytes = URL_SAFE_NO_PAD.decode(&sealed).expect("base64url");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let altered = URL_SAFE_NO_PAD.encode(&bytes);
        assert!(
            key.open::<(u64, String)>(CursorKind::Leases, "tenant:acme", "a", &altered).is_err()
        );
        let other_key = CursorKey::derive(b"another secret");
        assert!(
            other_key
                .open::<(u64, String)>(CursorKind::Leases, "tenant:acme", "a", &sealed)
                .is_err()
        );
    }

    #[test]
    fn a_cursor_reveals_nothing_of_its_position_and_is_stable_for_one_caller() {
        let key = CursorKey::derive(b"secret");
        let position = "00000001000000000000f4240000000000000063";
        let sealed = key.seal(CursorKind::Log, "tenant:acme", &position);
        // No part of it decodes to the value, in any framing a client might try.
        let decoded: Vec<Vec<u8>> = std::iter::once(sealed.as_str())
            .chain(sealed.split('.'))
            .filter_map(|part| URL_SAFE_NO_PAD.decode(part).ok())
            .collect();
        assert!(!decoded.is_empty());
        for bytes in decoded {
            let text = String::from_utf8_lossy(&bytes);
            assert!(!text.contains("f4240") && !text.contains("63\""), "{text}");
            assert!(serde_json::from_slice::<serde_json::Value>(&bytes).is_err());
        }
        // The same position is the same cursor for the same caller, another for another.
        assert_eq!(sealed, key.seal(CursorKind::Log, "tenant:acme", &position));
        assert_ne!(sealed, key.seal(CursorKind::Log, "tenant:beta", &position));
        let next =
            key.seal(CursorKind::Log, "tenant:acme", &"00000001000000000000f4240000000000000064");
        assert_ne!(sealed, next);
    }
}
