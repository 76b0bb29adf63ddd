//! The GraphQL gateway: where tenants, dashboards, auditors, operators and machine actors meet
//! Leasehold. An axum router over an async-graphql schema.
//!
//! Invariants: the tenant comes only from the verified token; every error a client sees has a
//! code from the fixed set of [`errors::Code`], and driver or SQL text never reaches a client;
//! every cursor handed out is signed and bound to the caller's tenant.

pub mod auth;
pub mod callbacks;
pub mod cursor;
pub mod errors;
mod http;
mod live;
mod media;
mod metrics;
mod node_agent;
mod pages;
pub mod reads;
mod schema;
mod state;
mod ws;

pub use auth::{Claims, JwtSecret, Principal, Role};
pub use http::{MIN_CURSOR_EXTENSION, app, serve};
pub use schema::projections::{RebuildRefused, Rebuilds};
pub use schema::{LeaseholdSchema, sdl};
pub use state::{
    AppState, GatewayConfig, NODE_AGENT_VERSION, ProjectionProgress, Rented, SnapshotService,
    VM_CATALOG_MAX_AGE, VmService,
};
