//! The runner leases' reconcilers: `reaper.rs` reaps expired leases (failed without
//! compute, quarantined with), `inventory.rs` reads each runner node's reported inventory
//! and settles what it proves: the leases of a re-registered node fenced by a new epoch, the
//! quarantined leases it lacks released; `orphans.rs` destroys the runner instances nodes
//! still run for leases that ended or never were.

pub mod inventory;
pub mod orphans;
pub mod reaper;

pub use inventory::RunnerInventory;
pub use orphans::RunnerOrphans;
pub use reaper::RunnerReaper;

use leasehold_commands::lease_service::Caller;
use leasehold_domain::Actor;

/// The reconcilers' caller: the system, under its reconciler's name.
fn system(name: &str) -> Caller {
    Caller {
        actor: Actor { subject: name.into(), role: "system".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}
