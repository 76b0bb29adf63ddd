//! Runner providers: the backends runner nodes launch CI runner instances with (billet's
//! `Provider` interface, spoken over the HTTP protocol of `docs/billet-protocol.md` §1), and
//! the issuer of runner registrations (the JIT configs a runner registers with). `config.rs`:
//! the runner nodes file (each node's provider agent, and the issuer); `wire.rs`: the routes'
//! bodies; `client.rs`: the runner dispatcher's clients of both.

pub mod client;
pub mod config;
pub mod wire;

pub use client::{JitIssuer, RunnerProviderClient};
pub use config::{IssuerConfig, RunnerNodeConfig, RunnerNodesFile};
pub use wire::JitConfig;
