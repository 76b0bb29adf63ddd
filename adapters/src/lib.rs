//! Leasehold's adapters: the PostgreSQL event store, the migrations runner, RFC 8785 canonical
//! JSON and the hash chain.
//!
//! Everything that touches PostgreSQL lives here, behind the ports `leasehold-domain` defines,
//! and the lease backends' HTTP protocol (`backends`).

pub mod archive;
pub mod backends;
pub mod canonical;
pub mod chain;
pub mod database;
pub mod dispatch;
pub mod hosts;
mod in_a_row;
pub mod inventory;
pub mod limits;
pub mod migrations;
pub mod projections;
pub mod providers;
pub mod read_models;
pub mod relay;
pub mod rented;
pub mod replay;
pub mod retention;
pub mod runner_providers;
pub mod runners;
pub mod snapshot_gc;
pub mod snapshots;
pub mod store;
pub mod vault;
pub mod verify;
pub mod vm_inventory;
pub mod vm_reaper;

pub use database::{DatabaseUrl, DatabaseUrlError};
pub use migrations::{MigrateError, MigrationReport, migrate};
pub use projections::{PgHostCatalog, PgProjectionStore};
pub use read_models::PgReadModels;
pub use store::{PgEventStore, StoreConfig};

#[cfg(test)]
mod fleet_golden;
#[cfg(test)]
mod rented_golden;
