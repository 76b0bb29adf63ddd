//! The lease backends' HTTP protocol, as the public fred project defines it (its
//! `BACKEND_GUIDE.md`; the facts relied on are in `docs/issue-10-research.md`), so that a
//! backend written for fred works with Leasehold unchanged. `signature.rs`: `X-Fred-Signature`,
//! on requests to backends and on their callbacks. `refusal.rs`: what an answer means, by
//! route and status, and the error envelope. `wire.rs`: the JSON bodies, field for field.
//! `breaker.rs`: each backend's circuit breaker. `client.rs`: one backend over HTTP.
//! `config.rs`: the backends file (each backend's URL, secret file, timeout, routing).
//! `routing.rs`: where a new lease goes (SKU lists, a default, least-loaded, never fenced).
//! `health.rs`: health probes; `status.rs`: what operators see of each backend (its last
//! probe and inventory sweep).

mod breaker;
mod client;
pub mod config;
pub mod health;
mod refusal;
mod routing;
mod signature;
pub mod status;
pub mod wire;

pub use breaker::{
    Admission, BREAKER_FAILURES_MAX, BREAKER_OPEN, Breaker, BreakerState, CircuitOpen,
};
pub use client::{BackendClient, BackendConfig, CallError, TlsSettings};
pub use refusal::{
    BackendError, Route, TENANT_DETAIL_BYTES_MAX, ValidationCode, classify, tenant_detail,
};
pub use routing::Router;
pub use signature::{SIGNATURE_HEADER, SignatureError, SigningSecret};
