//! The GraphQL gateway end to end: the real `leasehold serve` over HTTP, on its own database.

mod access;
mod backend;
mod backend_reads;
mod callbacks;
mod clients;
mod dispatch;
mod fleet;
mod fleet_moves;
mod inventory;
mod leases;
mod limits;
mod node_agent;
mod operations;
mod providers;
mod rented;
mod runner_dispatch;
mod runners;
mod setup;
mod snapshots;
mod socket;
mod subscriptions;
mod support;
mod tls;
mod vm_work;
mod work;
mod workloads;
