//! Rental providers: the agents Leasehold rents capacity through (the protocol Leasehold
//! defines for them is in `docs/mercator-protocol.md` §1). `config.rs`: the providers file,
//! each connection's URL, token file, timeout and declared capabilities; `wire.rs`: the
//! protocol's routes and bodies; `client.rs`: the dispatcher's client of one connection.

pub mod client;
pub mod config;
pub mod wire;

pub use client::{ProviderClient, ProviderError};
pub use config::{ProviderConfig, ProviderToken};
