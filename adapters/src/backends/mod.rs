//! The lease backends' HTTP protocol, as the public fred project defines it (its
//! `BACKEND_GUIDE.md`; the facts relied on are in `docs/issue-10-research.md`), so that a
//! backend written for fred works with Leasehold unchanged. `signature.rs`: `X-Fred-Signature`,
//! on requests to backends and on their callbacks.

mod signature;

pub use signature::{SIGNATURE_HEADER, SignatureError, SigningSecret};
