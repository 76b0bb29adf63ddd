//! `serve --demo`: Leasehold moving with nothing set up. Every outside system is simulated
//! in this process (`sims`), and a driver (`driver`) seeds a few workloads of each kind for the
//! demo tenant through the server's own GraphQL API and keeps a slow stream of lifecycle
//! events going, so the dashboard has something to show from its first minute.

pub mod driver;
pub mod sims;
