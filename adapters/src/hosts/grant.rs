//! fuse's artifact grant: the capability one host's agent presents to another to read one
//! artifact (`GET /v1/artifacts/{digest}`, header `X-Fuse-Artifact-Grant`), minted by the
//! control plane with the **serving** host's token, since the fetching agent must never hold
//! it (`internal/hostwire/grant.go`, `fc-agent.py verify_artifact_grant`):
//!
//! `v1.<digest>.<expiry unix seconds>.<nonce hex>.<hex HMAC-SHA256(token,
//! "fuse-artifact-grant/v1\n" + digest + "\n" + expiry + "\n" + nonce)>`

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header a grant travels in.
pub const GRANT_HEADER: &str = "X-Fuse-Artifact-Grant";

/// How long a grant lives (fuse's `DefaultArtifactGrantTTL`).
pub const GRANT_TTL_SECONDS: i64 = 300;

const DOMAIN: &str = "fuse-artifact-grant/v1";

fn keyed(token: &str, digest: &str, expiry: &str, nonce: &str) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(token.as_bytes()).expect("any key length");
    mac.update(format!("{DOMAIN}\n{digest}\n{expiry}\n{nonce}").as_bytes());
    mac
}

fn mac(token: &str, digest: &str, expiry: &str, nonce: &str) -> String {
    hex::encode(keyed(token, digest, expiry, nonce).finalize().into_bytes())
}

/// A grant to read `digest` from the host whose agent token is `token`, until `expiry`
/// (unix seconds), with `nonce` (16 random bytes).
pub fn mint(token: &str, digest: &str, expiry: i64, nonce: [u8; 16]) -> String {
    let (expiry, nonce) = (expiry.to_string(), hex::encode(nonce));
    let mac = mac(token, digest, &expiry, &nonce);
    format!("v1.{digest}.{expiry}.{nonce}.{mac}")
}

/// Whether `grant` lets its bearer read `digest` from the host of `token` at `now` (unix
/// seconds): as fuse's agent checks it, one answer for every failure.
pub fn verify(token: &str, grant: &str, digest: &str, now: i64) -> bool {
    if grant.is_empty() || grant.len() > 512 {
        return false;
    }
    let parts: Vec<&str> = grant.split('.').collect();
    let [version, granted, expiry, nonce, given] = parts.as_slice() else { return false };
    let hex_of = |value: &str, lengths: std::ops::RangeInclusive<usize>| {
        lengths.contains(&value.len()) && value.chars().all(|c| c.is_ascii_hexdigit())
    };
    let digest_ok = *granted == digest
        && granted.len() == 64
        && granted.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
    if *version != "v1" || !digest_ok || !hex_of(nonce, 16..=64) {
        return false;
    }
    let Ok(expires) = expiry.parse::<i64>() else { return false };
    if expires <= now {
        return false;
    }
    // Constant time, as fuse's agent compares.
    let Ok(given) = hex::decode(given) else { return false };
    keyed(token, granted, expiry, nonce).verify_slice(&given).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn a_grant_is_fuses_format_with_its_mac() {
        // Computed independently: python3 -c 'import hmac,hashlib;print(hmac.new(b"tok",
        // b"fuse-artifact-grant/v1\n<digest>\n2000000000\n000102030405060708090a0b0c0d0e0f",
        // hashlib.sha256).hexdigest())'
        let grant = mint("tok", DIGEST, 2_000_000_000, std::array::from_fn(|i| i as u8));
        let expected_mac = include_str!("grant_vector.txt").trim();
        assert_eq!(
            grant,
            format!("v1.{DIGEST}.2000000000.000102030405060708090a0b0c0d0e0f.{expected_mac}")
        );
        assert!(verify("tok", &grant, DIGEST, 1_999_999_999));
    }

    #[test]
    fn every_bad_grant_is_refused() {
        let grant = mint("tok", DIGEST, 2_000_000_000, [7; 16]);
        assert!(!verify("other", &grant, DIGEST, 0), "another host's token");
        assert!(!verify("tok", &grant, DIGEST, 2_000_000_000), "expired");
        let other = DIGEST.replace('9', "8");
        assert!(!verify("tok", &grant, &other, 0), "another artifact");
        assert!(!verify("tok", &grant.replace("v1.", "v2."), DIGEST, 0), "another version");
        let last = if grant.ends_with('0') { '1' } else { '0' };
        let forged = format!("{}{last}", &grant[..grant.len() - 1]);
        assert!(!verify("tok", &forged, DIGEST, 0), "a forged mac");
        assert!(!verify("tok", "", DIGEST, 0));
    }
}
