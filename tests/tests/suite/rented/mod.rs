//! Rented capacity through its services, against PostgreSQL: rentals fenced by generation,
//! nodes by enrollment token and fencing token, runs whose first terminal fact wins, and
//! tenants kept apart.

mod dispatcher;
mod enrollment;
mod expiry;
mod fencing;
mod read_models;
pub(crate) mod runs;
pub(crate) mod support;
