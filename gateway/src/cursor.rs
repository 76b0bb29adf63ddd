//! Signed cursors: every cursor the gateway hands out (page cursors, log cursors) is
//! `base64url(json) "." base64url(hmac)`, the HMAC-SHA256 taken over the cursor's kind, the
//! caller's scope (its tenant) and the JSON. A cursor edited by a client, or issued to another
//! tenant, fails the check and is refused as bad input: it can neither be forged nor reveal or
//! reach another tenant's rows.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::Sha256;

use crate::errors::ApiError;

type HmacSha256 = Hmac<Sha256>;

/// What a cursor points into; a page cursor cannot be used as a log cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorKind {
    /// A position in the log (`events`, subscriptions, command results, read-your-writes).
    Log,
    /// A position in the `leases` list.
    Leases,
    /// A position in the `workloads` list.
    Workloads,
}

impl CursorKind {
    fn tag(self) -> &'static [u8] {
        match self {
            Self::Log => b"log",
            Self::Leases => b"leases",
            Self::Workloads => b"workloads",
        }
    }
}

/// The key cursors are signed with. Its `Debug` never shows it.
#[derive(Clone)]
pub struct CursorKey(Vec<u8>);

impl fmt::Debug for CursorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CursorKey(..)")
    }
}

impl CursorKey {
    /// A key derived from `secret` for cursors only, so a cursor's MAC never doubles as
    /// anything a token or callback secret signs.
    pub fn derive(secret: &[u8]) -> Self {
        let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
        mac.update(b"leasehold cursor key v1");
        Self(mac.finalize().into_bytes().to_vec())
    }

    fn mac(&self, kind: CursorKind, scope: &str, body: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        for part in [kind.tag(), scope.as_bytes(), body] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac
    }

    /// The signed cursor for `value`, usable only in `scope`.
    pub fn seal<T: Serialize>(&self, kind: CursorKind, scope: &str, value: &T) -> String {
        let body = serde_json::to_vec(value).expect("cursor values serialize");
        let tag = self.mac(kind, scope, &body).finalize().into_bytes();
        format!("{}.{}", URL_SAFE_NO_PAD.encode(&body), URL_SAFE_NO_PAD.encode(tag))
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
        let (body, tag) = text.split_once('.').ok_or_else(refused)?;
        let body = URL_SAFE_NO_PAD.decode(body).map_err(|_| refused())?;
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| refused())?;
        // `verify_slice` compares in constant time.
        self.mac(kind, scope, &body).verify_slice(&tag).map_err(|_| refused())?;
        serde_json::from_slice(&body).map_err(|_| refused())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (body, tag) = sealed.split_once('.').expect("two parts");
        let forged = format!("{}.{tag}", URL_SAFE_NO_PAD.encode(br#"[8,"x"]"#));
        assert!(
            key.open::<(u64, String)>(CursorKind::Leases, "tenant:acme", "a", &forged).is_err()
        );
        assert!(!body.is_empty());
    }
}
