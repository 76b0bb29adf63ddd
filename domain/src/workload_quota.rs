//! A tenant's workload quota for one kind of workload (DOMAIN.md §1.9): the limits operators
//! set as events, and a reservation per workload of the kind that holds resources, on the
//! stream `workload-quota-<uuid>` ([`WorkloadQuotaId`], minted from the tenant and the kind
//! by the command pipeline). Leases, VMs, rentals and runs are charged here; snapshots and
//! runner leases keep their own quotas (`quota.rs`, `runner_capacity.rs`), whose rules differ.
//!
//! What a workload holds is its aggregate's [`Aggregate::charge`](crate::Aggregate::charge):
//! `count` (1) and the kind's own resources ([`WorkloadKind::resources`]). The command
//! pipeline links one [`Apply`](WorkloadQuotaCommand::Apply) to every append that changes a
//! workload's charge, with every change of the append together (a migration's copy starts
//! holding as its source stops), in the same atomic append with an expected version on both
//! streams: concurrent creations can never take more than the limits allow. Each change
//! says what the workload held before and holds now, as its own stream (checked in the same
//! append) says: the quota keeps only its limits and the usage by resource, so its state
//! stays as small with a million workloads as with one.
//!
//! A limit of 0 (or none) does not limit. Limits guard **admissions** only (an append that
//! creates a workload: a lease's request or restore, a VM's creation or fork, a rental's
//! provision, a run's submission): one that would grow usage past a limit is refused. What
//! only records facts (a migration's copy reported booted, a VM found missing) is never
//! refused, whatever it comes to, as the snapshot quota's settlement is not: refusing a fact
//! would leave the log contradicting the world. A lower limit refuses new admissions without
//! touching what is held; a release, a move or a change that only shrinks always passes.
//!
//! | from | command | to | events | guard |
//! |---|---|---|---|---|
//! | any | SetLimits(kind, limits) | unchanged | WorkloadLimitsSet, or — when unchanged | every resource is the kind's (`UnknownResource`) |
//! | any | Apply(changes, admission) | unchanged | WorkloadReserved per workload that holds something new, WorkloadReleased per workload that stops holding (with what it held); — when nothing changes | an admission: every resource whose usage the changes grow, usage after ≤ its limit (`QuotaExceeded(resource)`); anything else never refused |

mod events;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregate::{Aggregate, Context, Refusal, RefusalKind};

pub use events::{KIND, WorkloadQuotaEvent};

crate::values::uuid_type!(
    /// A tenant's quota for one workload kind, its id minted from the tenant and the kind.
    WorkloadQuotaId,
    stream = "workload-quota"
);

/// The kinds of workload whose quota this aggregate keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadKind {
    /// Leases.
    Lease,
    /// VMs.
    Vm,
    /// Rentals.
    Rental,
    /// Runs.
    Run,
}

impl WorkloadKind {
    /// Every kind.
    pub const ALL: [Self; 4] = [Self::Lease, Self::Vm, Self::Rental, Self::Run];

    /// Its name, as workload lists and resource names spell it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Lease => "lease",
            Self::Vm => "vm",
            Self::Rental => "rental",
            Self::Run => "run",
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// The resources its workloads hold besides `count`. A lease holds `sku.<SKU>` for each
    /// SKU it rents (an open set), the others a fixed list.
    pub fn resources(self) -> &'static [&'static str] {
        match self {
            Self::Lease => &[],
            Self::Vm => &["cpus", "gpus", "ram_mb"],
            Self::Rental => &["cpu_millis", "disk_gb", "gpus", "memory_mb"],
            Self::Run => &["max_runtime_seconds"],
        }
    }

    /// Whether its workloads may hold `resource`.
    pub fn holds(self, resource: &str) -> bool {
        if resource == COUNT || self.resources().contains(&resource) {
            return true;
        }
        match (self, resource.strip_prefix("sku.")) {
            (Self::Lease, Some(sku)) => crate::values::Sku::parse("resource", sku).is_ok(),
            _ => false,
        }
    }
}

/// The resource every workload holds one of.
pub const COUNT: &str = "count";

/// What one workload holds: `count` 1 and its kind's resources, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// Quantities by resource (sorted, each once).
    pub held: Vec<Held>,
}

/// A quantity of one resource.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Held {
    /// The resource (`count`, `cpus`, `sku.gpu-a100`).
    pub resource: String,
    /// How much.
    pub quantity: u64,
}

impl Charge {
    /// One workload holding `resources` (summed by name) and `count` 1.
    pub fn of(resources: impl IntoIterator<Item = (String, u64)>) -> Self {
        let mut summed = BTreeMap::from([(COUNT.to_owned(), 1u64)]);
        for (resource, quantity) in resources {
            let entry = summed.entry(resource).or_default();
            *entry = entry.saturating_add(quantity);
        }
        Self {
            held: summed
                .into_iter()
                .map(|(resource, quantity)| Held { resource, quantity })
                .collect(),
        }
    }

    /// Its quantities by resource, `count` left out.
    pub fn resources(&self) -> impl Iterator<Item = (&str, u64)> {
        self.held
            .iter()
            .filter(|held| held.resource != COUNT)
            .map(|held| (held.resource.as_str(), held.quantity))
    }
}

/// One workload's charge changing, as its own stream says: what it held before and holds
/// from now on (`None`: nothing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeChange {
    /// The workload's stream.
    pub workload: String,
    /// What it held before.
    pub before: Option<Charge>,
    /// What it holds now.
    pub charge: Option<Charge>,
}

/// A limit on one resource.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Limit {
    /// The resource.
    pub resource: String,
    /// The most its workloads may hold together (0: no limit).
    pub max: u64,
}

/// The workload quota aggregate's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadQuota {
    /// Its kind, once anything happened.
    pub kind: Option<WorkloadKind>,
    /// Its limits by resource (none: no limit).
    pub limits: BTreeMap<String, u64>,
    /// What its workloads hold together, by resource.
    pub usage: BTreeMap<String, u64>,
    /// When it last changed.
    pub updated_at: Option<DateTime<Utc>>,
}

/// What can be asked of a workload quota.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkloadQuotaCommand {
    /// Sets every limit of the kind (operators); a resource left out is not limited.
    SetLimits {
        /// The kind.
        kind: WorkloadKind,
        /// The limits.
        limits: Vec<Limit>,
    },
    /// Records the charges one append changes (the command pipeline).
    Apply {
        /// The kind.
        kind: WorkloadKind,
        /// The changes.
        changes: Vec<ChargeChange>,
        /// Whether the append admits new work (a creation among its commands): only then do
        /// the limits refuse.
        admission: bool,
    },
}

/// Why a workload quota refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadQuotaError {
    /// A limit would be exceeded.
    #[error("{kind} quota exceeded: at most {max} of {kind}.{resource}", kind = kind.name())]
    QuotaExceeded {
        /// The kind.
        kind: WorkloadKind,
        /// The resource.
        resource: String,
        /// Its limit.
        max: u64,
    },
    /// A limit names a resource the kind's workloads never hold.
    #[error("{kind} workloads hold no resource {resource}", kind = kind.name())]
    UnknownResource {
        /// The kind.
        kind: WorkloadKind,
        /// The resource.
        resource: String,
    },
}

impl Refusal for WorkloadQuotaError {
    fn kind(&self) -> RefusalKind {
        match self {
            Self::QuotaExceeded { .. } => RefusalKind::QuotaExceeded,
            Self::UnknownResource { .. } => RefusalKind::BadInput,
        }
    }
}

impl Aggregate for WorkloadQuota {
    const STREAM_TYPE: &'static str = "workload-quota";
    const STATE_SCHEMA: u32 = 2;
    type Command = WorkloadQuotaCommand;
    type Event = WorkloadQuotaEvent;
    type Error = WorkloadQuotaError;
    type Facts = ();

    fn initial() -> Self {
        Self::default()
    }

    fn decide(
        &self,
        command: &WorkloadQuotaCommand,
        ctx: &Context<()>,
    ) -> Result<Vec<WorkloadQuotaEvent>, WorkloadQuotaError> {
        match command {
            WorkloadQuotaCommand::SetLimits { kind, limits } => {
                self.set_limits(*kind, limits, ctx.now)
            }
            WorkloadQuotaCommand::Apply { kind, changes, admission } => {
                let events = events_of(*kind, changes, ctx.now);
                match admission {
                    true => self.admit(*kind, events),
                    false => Ok(events),
                }
            }
        }
    }

    fn evolve(mut self, event: &WorkloadQuotaEvent) -> Self {
        match event {
            WorkloadQuotaEvent::WorkloadLimitsSet { kind, limits, at } => {
                self.kind = Some(*kind);
                self.limits =
                    limits.iter().map(|limit| (limit.resource.clone(), limit.max)).collect();
                self.updated_at = Some(*at);
            }
            WorkloadQuotaEvent::WorkloadReserved { kind, held, replaced, at, .. } => {
                self.kind = Some(*kind);
                uncount(&mut self.usage, replaced);
                count(&mut self.usage, held);
                self.updated_at = Some(*at);
            }
            WorkloadQuotaEvent::WorkloadReleased { kind, held, at, .. } => {
                self.kind = Some(*kind);
                uncount(&mut self.usage, held);
                self.updated_at = Some(*at);
            }
        }
        self
    }

    fn is_terminal(&self) -> bool {
        false
    }

    /// A tenant's quota exists from its first charged workload (or its first limits) on:
    /// before that, no limits and nothing held.
    fn may_open(_command: &WorkloadQuotaCommand) -> bool {
        true
    }
}

impl WorkloadQuota {
    fn set_limits(
        &self,
        kind: WorkloadKind,
        limits: &[Limit],
        at: DateTime<Utc>,
    ) -> Result<Vec<WorkloadQuotaEvent>, WorkloadQuotaError> {
        let mut set = BTreeMap::new();
        for limit in limits {
            if !kind.holds(&limit.resource) {
                let resource = limit.resource.clone();
                return Err(WorkloadQuotaError::UnknownResource { kind, resource });
            }
            if limit.max > 0 {
                set.insert(limit.resource.clone(), limit.max);
            }
        }
        if set == self.limits && self.kind == Some(kind) {
            return Ok(Vec::new());
        }
        let limits = set.into_iter().map(|(resource, max)| Limit { resource, max }).collect();
        Ok(vec![WorkloadQuotaEvent::WorkloadLimitsSet { kind, limits, at }])
    }

    /// `events`, unless they grow a resource past its limit.
    fn admit(
        &self,
        kind: WorkloadKind,
        events: Vec<WorkloadQuotaEvent>,
    ) -> Result<Vec<WorkloadQuotaEvent>, WorkloadQuotaError> {
        // Small: the state is the limits and the usage by resource.
        let after = events.iter().fold(self.clone(), |quota, event| quota.evolve(event));
        for (resource, max) in &self.limits {
            let used = |quota: &WorkloadQuota| quota.usage.get(resource).copied().unwrap_or(0);
            let (before, now) = (used(self), used(&after));
            if now > before && now > *max {
                let (resource, max) = (resource.clone(), *max);
                return Err(WorkloadQuotaError::QuotaExceeded { kind, resource, max });
            }
        }
        Ok(events)
    }
}

/// The events of `changes`, whatever they come to.
fn events_of(
    kind: WorkloadKind,
    changes: &[ChargeChange],
    at: DateTime<Utc>,
) -> Vec<WorkloadQuotaEvent> {
    let mut events = Vec::new();
    for ChargeChange { workload, before, charge } in changes {
        let event = match (before, charge) {
            (before, charge) if before == charge => continue,
            (before, Some(charge)) => WorkloadQuotaEvent::WorkloadReserved {
                kind,
                workload: workload.clone(),
                held: charge.held.clone(),
                replaced: before.as_ref().map(|before| before.held.clone()).unwrap_or_default(),
                at,
            },
            (Some(before), None) => WorkloadQuotaEvent::WorkloadReleased {
                kind,
                workload: workload.clone(),
                held: before.held.clone(),
                at,
            },
            (None, None) => continue,
        };
        events.push(event);
    }
    events
}

fn count(usage: &mut BTreeMap<String, u64>, held: &[Held]) {
    for Held { resource, quantity } in held.iter().filter(|held| held.quantity > 0) {
        let entry = usage.entry(resource.clone()).or_default();
        *entry = entry.saturating_add(*quantity);
    }
}

fn uncount(usage: &mut BTreeMap<String, u64>, held: &[Held]) {
    for Held { resource, quantity } in held {
        if let Some(entry) = usage.get_mut(resource) {
            *entry = entry.saturating_sub(*quantity);
            if *entry == 0 {
                usage.remove(resource);
            }
        }
    }
}
