//! Rental providers: the agents Leasehold rents capacity through (the protocol Leasehold
//! defines for them is in `docs/mercator-protocol.md` §1). `config.rs`: the providers file,
//! each connection's URL, token file, timeout and declared capabilities.

pub mod config;

pub use config::{ProviderConfig, ProviderToken};
