//! `X-Fred-Signature: t=<unix seconds>,sha256=<hex>`: HMAC-SHA256, under a secret shared with
//! the backend, of `t "\n" METHOD "\n" request-URI "\n" hex(sha256(body))`. The same on a
//! request to a backend and on a backend's callback. The URI is the path and query as sent,
//! the method as sent (never normalised). Accepted while at most 5 minutes old and at most 1
//! minute ahead (both bounds included); there is no nonce, so a callback's effect must be
//! idempotent (it is: a redelivery is a duplicate).

use std::fmt;

use chrono::{DateTime, TimeDelta, Utc};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::limits::SIGNING_SECRET_BYTES_MIN;

/// The header's name, as HTTP libraries spell it (header names are case-insensitive).
pub const SIGNATURE_HEADER: &str = "x-fred-signature";

/// Oldest a signature may be.
const AGE_MAX: TimeDelta = TimeDelta::minutes(5);

/// Furthest ahead of this clock a signature may be.
const AHEAD_MAX: TimeDelta = TimeDelta::minutes(1);

type HmacSha256 = Hmac<Sha256>;

/// Why a signature was refused. The messages name no secret and no expected value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The secret is too short to sign with.
    #[error("a signing secret must be at least {SIGNING_SECRET_BYTES_MIN} bytes")]
    WeakSecret,
    /// No signature header.
    #[error("missing signature")]
    Missing,
    /// Not `t=<timestamp>,sha256=<hex>`.
    #[error("invalid signature format: expected t=<timestamp>,sha256=<hex>")]
    Malformed,
    /// Signed more than 5 minutes ago.
    #[error("signature expired")]
    Expired,
    /// Signed more than 1 minute in the future.
    #[error("signature timestamp too far in future")]
    Ahead,
    /// The tag is not the request's.
    #[error("signature mismatch")]
    Mismatch,
}

/// A secret shared with a backend. Its `Debug` never shows it.
#[derive(Clone)]
pub struct SigningSecret(Vec<u8>);

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningSecret(..)")
    }
}

impl SigningSecret {
    /// A secret of at least 32 bytes (surrounding whitespace cut, as a secret file's final
    /// newline).
    ///
    /// # Errors
    /// [`SignatureError::WeakSecret`] when shorter.
    pub fn new(bytes: &[u8]) -> Result<Self, SignatureError> {
        let bytes = bytes.trim_ascii();
        if bytes.len() < SIGNING_SECRET_BYTES_MIN {
            return Err(SignatureError::WeakSecret);
        }
        Ok(Self(bytes.to_vec()))
    }

    fn mac(&self, timestamp: i64, method: &str, uri: &str, body: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        let body_hash = hex::encode(Sha256::digest(body));
        mac.update(format!("{timestamp}\n{method}\n{uri}\n{body_hash}").as_bytes());
        mac
    }

    /// The header's value for a request signed at `timestamp` (Unix seconds).
    pub fn sign(&self, timestamp: i64, method: &str, uri: &str, body: &[u8]) -> String {
        let tag = self.mac(timestamp, method, uri, body).finalize().into_bytes();
        format!("t={timestamp},sha256={}", hex::encode(tag))
    }

    /// Whether `header` (the header's value, if any) signs this request at `now`.
    ///
    /// # Errors
    /// The first rule the signature breaks, in fred's order: format, age, tag.
    pub fn verify(
        &self,
        header: Option<&str>,
        (method, uri, body): (&str, &str, &[u8]),
        now: DateTime<Utc>,
    ) -> Result<(), SignatureError> {
        let (timestamp, tag) = parse(header.ok_or(SignatureError::Missing)?)?;
        let signed_at =
            DateTime::<Utc>::from_timestamp(timestamp, 0).ok_or(SignatureError::Malformed)?;
        if now - signed_at > AGE_MAX {
            return Err(SignatureError::Expired);
        }
        if signed_at - now > AHEAD_MAX {
            return Err(SignatureError::Ahead);
        }
        // `verify_slice` compares in constant time.
        self.mac(timestamp, method, uri, body)
            .verify_slice(&tag)
            .map_err(|_| SignatureError::Mismatch)
    }
}

/// `t=<timestamp>,sha256=<hex>`: split at the first comma, each half trimmed, in that order;
/// the hex in either case.
fn parse(header: &str) -> Result<(i64, Vec<u8>), SignatureError> {
    let (time, tag) = header.split_once(',').ok_or(SignatureError::Malformed)?;
    let timestamp = time
        .trim()
        .strip_prefix("t=")
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or(SignatureError::Malformed)?;
    let tag = tag
        .trim()
        .strip_prefix("sha256=")
        .and_then(|hex_tag| hex::decode(hex_tag).ok())
        .ok_or(SignatureError::Malformed)?;
    Ok((timestamp, tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    const QA_SECRET: &[u8] = b"qa-eng191-secret-at-least-32-chars-padding!";
    const SECRET: &[u8] = b"test-secret-that-is-at-least-32-chars!";
    const T: i64 = 1_700_000_000;

    /// Secret, method, URI, body, and the tag fred computes for them at `T`.
    type Vector = (&'static [u8], &'static str, &'static str, &'static [u8], &'static str);

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(seconds, 0).expect("a time")
    }

    /// The inputs of fred's `TestQA_ENG191_CanonicalStringShape` and two more requests, with
    /// tags computed independently (Python's `hmac`, checked with `openssl dgst -hmac`).
    #[test]
    fn signs_as_fred_does() {
        let vectors: [Vector; 3] = [
            (
                QA_SECRET,
                "POST",
                "/provision?x=1",
                br#"{"k":"v"}"#,
                "384b5a920666c3807b460c3e957b37fa008de06575abfefe9cf3046b31ca66d3",
            ),
            (
                SECRET,
                "POST",
                "/callbacks/provision",
                br#"{"lease_uuid":"550e8400-e29b-41d4-a716-446655440000","status":"success","backend":"docker-1"}"#,
                "fc782606ecffaad8ea6516bcd6aa1ca9f7b62921239afb5165aa776842a906d2",
            ),
            (
                SECRET,
                "GET",
                "/provisions?limit=1000",
                b"",
                "704709cd5fbee906cef1636458d687a8e0a4cba758c9adf4f677cafdb62fcb50",
            ),
        ];
        for (secret, method, uri, body, tag) in vectors {
            let secret = SigningSecret::new(secret).expect("long enough");
            let header = secret.sign(T, method, uri, body);
            assert_eq!(header, format!("t={T},sha256={tag}"), "{method} {uri}");
            assert_eq!(secret.verify(Some(&header), (method, uri, body), at(T)), Ok(()));
        }
    }

    #[test]
    fn accepts_what_fred_accepts_and_refuses_the_rest() {
        let secret = SigningSecret::new(SECRET).expect("long enough");
        let request = ("POST", "/provision", &b"{}"[..]);
        let header = secret.sign(T, request.0, request.1, request.2);
        let tag = header.split_once(",sha256=").expect("two parts").1.to_string();
        let check = |header: &str, now: i64| secret.verify(Some(header), request, at(now));
        // Spaces around the halves and upper-case hex are accepted.
        assert_eq!(check(&format!("t={T}, sha256={}", tag.to_uppercase()), T), Ok(()));
        // Both bounds of the window are included.
        assert_eq!(check(&header, T + 300), Ok(()));
        assert_eq!(check(&header, T + 301), Err(SignatureError::Expired));
        assert_eq!(check(&header, T - 60), Ok(()));
        assert_eq!(check(&header, T - 61), Err(SignatureError::Ahead));
        for malformed in [
            format!("sha256={tag},t={T}"),
            format!("t={T}"),
            format!("t=soon,sha256={tag}"),
            format!("t={T},sha256=zz"),
            format!("{T}.{{}}"),
        ] {
            assert_eq!(check(&malformed, T), Err(SignatureError::Malformed), "{malformed}");
        }
        assert_eq!(secret.verify(None, request, at(T)), Err(SignatureError::Missing));
        // Method, URI (query included) and body are all bound.
        for other in [
            ("post", "/provision", &b"{}"[..]),
            ("POST", "/provision?x=1", b"{}"),
            ("POST", "/provision", b"{ }"),
        ] {
            assert_eq!(secret.verify(Some(&header), other, at(T)), Err(SignatureError::Mismatch));
        }
        assert_eq!(SigningSecret::new(b"short\n").err(), Some(SignatureError::WeakSecret));
        assert_eq!(format!("{secret:?}"), "SigningSecret(..)");
    }
}
