//! The projection runtime and the lease read models against a real PostgreSQL.

pub(crate) mod every_kind;
mod lease;
mod rebuild;
mod runtime;
pub(crate) mod support;
