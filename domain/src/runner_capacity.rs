//! A tenant's runner capacity (DOMAIN.md §1.9): a vector of limits (vCPUs, memory, per-tier
//! concurrency, macOS slots) and a reservation per runner lease it charges, on the stream
//! `runner-capacity-<uuid>` ([`RunnerCapacityId`], minted from the tenant by the command
//! service). A lease's assignment reserves in the same append as the assignment, with an
//! expected version on both streams, so concurrent assignments can never take more than the
//! limits allow; its end (done or failed, and only that) releases. Usage is the sum of the
//! reservations, changed only by events.
//!
//! A limit of 0 disables it; a tier without a limit is not limited. Operators set the
//! limits; a change is an event too, and a lower limit refuses new reservations without
//! touching those held.
//!
//! | from | command | to | events | guard |
//! |---|---|---|---|---|
//! | any | SetLimits(limits) | unchanged | RunnerLimitsSet, or — when unchanged | — |
//! | any | Reserve(lease, demand) | unchanged | RunnerCapacityReserved | every dimension: usage + demand ≤ limit (`CapacityExceeded(dimension)`); the same lease again: — when the same demand, else `ReservationMismatch` |
//! | any | Release(lease) | unchanged | RunnerCapacityReleased, or — when it holds none (idempotent) | — |

mod events;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregate::{Aggregate, Context, Refusal, RefusalKind};
use crate::runner::{GuestOs, RunnerLeaseId, RunnerResources, RunnerTerms, Tier};

pub use events::{KIND, RunnerCapacityEvent};

crate::values::uuid_type!(
    /// A tenant's runner capacity, one per tenant, its id minted from the tenant by the
    /// command service.
    RunnerCapacityId,
    stream = "runner-capacity"
);

/// A tenant's runner limits (0, or a tier not listed: no limit).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerLimits {
    /// Most vCPUs charged at once.
    pub vcpu: u64,
    /// Most memory charged at once, in MiB.
    pub memory_mb: u64,
    /// Most leases charged at once per tier (each tier once).
    pub tiers: Vec<TierLimit>,
    /// Most macOS runners charged at once.
    pub macos_slots: u32,
}

/// The concurrency limit of one tier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierLimit {
    /// The tier.
    pub tier: Tier,
    /// Most of its leases charged at once (0: no limit).
    pub max: u32,
}

impl RunnerLimits {
    /// The concurrency limit of `tier` (0: none).
    pub fn of_tier(&self, tier: &Tier) -> u32 {
        self.tiers.iter().find(|limit| &limit.tier == tier).map_or(0, |limit| limit.max)
    }
}

/// What one lease takes of its tenant's capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Demand {
    /// Its tier.
    pub tier: Tier,
    /// Its vCPUs and memory.
    pub resources: RunnerResources,
    /// Whether it takes a macOS slot.
    pub macos: bool,
}

impl Demand {
    /// What a lease of `terms` takes.
    pub fn of(terms: &RunnerTerms) -> Self {
        Self {
            tier: terms.tier.clone(),
            resources: terms.resources,
            macos: terms.guest_os == GuestOs::Macos,
        }
    }
}

/// What the capacity charges now: the sum of its reservations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerUsage {
    /// vCPUs.
    pub vcpu: u64,
    /// Memory in MiB.
    pub memory_mb: u64,
    /// Leases per tier (tiers with none are absent).
    pub tiers: BTreeMap<Tier, u32>,
    /// macOS runners.
    pub macos: u32,
}

impl RunnerUsage {
    /// The usage of these reservations.
    pub fn of<'a>(demands: impl IntoIterator<Item = &'a Demand>) -> Self {
        demands.into_iter().fold(Self::default(), |mut usage, demand| {
            usage.add(demand);
            usage
        })
    }

    fn add(&mut self, demand: &Demand) {
        self.vcpu += u64::from(demand.resources.vcpu);
        self.memory_mb += demand.resources.memory_mb;
        *self.tiers.entry(demand.tier.clone()).or_default() += 1;
        self.macos += u32::from(demand.macos);
    }
}

/// The tenant runner capacity aggregate's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerCapacity {
    /// Its limits.
    pub limits: RunnerLimits,
    /// Each charged lease's demand.
    pub reservations: BTreeMap<RunnerLeaseId, Demand>,
    /// Their sum.
    pub usage: RunnerUsage,
    /// When it last changed.
    pub updated_at: Option<DateTime<Utc>>,
}

/// What can be asked of a tenant's runner capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunnerCapacityCommand {
    /// Sets the limits (operators).
    SetLimits {
        /// The new limits.
        limits: RunnerLimits,
    },
    /// Charges a lease being assigned its job.
    Reserve {
        /// The lease.
        lease: RunnerLeaseId,
        /// What it takes.
        demand: Demand,
    },
    /// Stops charging a lease that ended.
    Release {
        /// The lease.
        lease: RunnerLeaseId,
    },
}

/// Which limit refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// vCPUs.
    Vcpu,
    /// Memory.
    MemoryMb,
    /// The concurrency of a tier.
    Tier(Tier),
    /// macOS slots.
    MacosSlots,
}

/// Why a tenant's runner capacity refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunnerCapacityError {
    /// A limit would be exceeded.
    #[error("runner capacity exceeded: {dimension:?} is limited to {max}")]
    CapacityExceeded {
        /// Which.
        dimension: Dimension,
        /// Its limit.
        max: u64,
    },
    /// The lease already holds another reservation.
    #[error("the runner lease already holds a different reservation")]
    ReservationMismatch,
}

impl Refusal for RunnerCapacityError {
    fn kind(&self) -> RefusalKind {
        match self {
            Self::CapacityExceeded { .. } => RefusalKind::QuotaExceeded,
            Self::ReservationMismatch => RefusalKind::Conflict,
        }
    }
}

impl Aggregate for RunnerCapacity {
    const STREAM_TYPE: &'static str = "runner-capacity";
    const STATE_SCHEMA: u32 = 1;
    type Command = RunnerCapacityCommand;
    type Event = RunnerCapacityEvent;
    type Error = RunnerCapacityError;
    type Facts = ();

    fn initial() -> Self {
        Self::default()
    }

    fn decide(
        &self,
        command: &RunnerCapacityCommand,
        ctx: &Context<()>,
    ) -> Result<Vec<RunnerCapacityEvent>, RunnerCapacityError> {
        use RunnerCapacityCommand as C;
        use RunnerCapacityEvent as E;
        let at = ctx.now;
        match command {
            C::SetLimits { limits } if *limits == self.limits => Ok(Vec::new()),
            C::SetLimits { limits } => Ok(vec![E::RunnerLimitsSet { limits: limits.clone(), at }]),
            C::Reserve { lease, demand } => match self.reservations.get(lease) {
                Some(held) if held == demand => Ok(Vec::new()),
                Some(_) => Err(RunnerCapacityError::ReservationMismatch),
                None => {
                    self.fits(demand)?;
                    Ok(vec![E::RunnerCapacityReserved {
                        lease: *lease,
                        demand: demand.clone(),
                        at,
                    }])
                }
            },
            C::Release { lease } => match self.reservations.get(lease) {
                None => Ok(Vec::new()),
                Some(demand) => Ok(vec![E::RunnerCapacityReleased {
                    lease: *lease,
                    demand: demand.clone(),
                    at,
                }]),
            },
        }
    }

    fn evolve(mut self, event: &RunnerCapacityEvent) -> Self {
        use RunnerCapacityEvent as E;
        match event {
            E::RunnerLimitsSet { limits, at } => {
                self.limits = limits.clone();
                self.updated_at = Some(*at);
            }
            E::RunnerCapacityReserved { lease, demand, at } => {
                self.reservations.insert(*lease, demand.clone());
                self.updated_at = Some(*at);
            }
            E::RunnerCapacityReleased { lease, at, .. } => {
                self.reservations.remove(lease);
                self.updated_at = Some(*at);
            }
        }
        self.usage = RunnerUsage::of(self.reservations.values());
        self
    }

    fn is_terminal(&self) -> bool {
        false
    }

    /// A tenant's capacity exists from its first assignment (or its first limits) on:
    /// before that, no limits and nothing charged.
    fn may_open(_command: &RunnerCapacityCommand) -> bool {
        true
    }
}

impl RunnerCapacity {
    /// Whether `demand` fits beside what is charged, or the first dimension it does not.
    fn fits(&self, demand: &Demand) -> Result<(), RunnerCapacityError> {
        let (limits, usage) = (&self.limits, &self.usage);
        let over = |limit: u64, used: u64, more: u64| limit > 0 && used + more > limit;
        let exceeded =
            |dimension, max| Err(RunnerCapacityError::CapacityExceeded { dimension, max });
        if over(limits.vcpu, usage.vcpu, u64::from(demand.resources.vcpu)) {
            return exceeded(Dimension::Vcpu, limits.vcpu);
        }
        if over(limits.memory_mb, usage.memory_mb, demand.resources.memory_mb) {
            return exceeded(Dimension::MemoryMb, limits.memory_mb);
        }
        let tier_limit = limits.of_tier(&demand.tier);
        let tier_used = usage.tiers.get(&demand.tier).copied().unwrap_or(0);
        if over(u64::from(tier_limit), u64::from(tier_used), 1) {
            return exceeded(Dimension::Tier(demand.tier.clone()), u64::from(tier_limit));
        }
        let macos = u64::from(demand.macos);
        if macos > 0 && over(u64::from(limits.macos_slots), u64::from(usage.macos), macos) {
            return exceeded(Dimension::MacosSlots, u64::from(limits.macos_slots));
        }
        Ok(())
    }
}

/// What a runner lease's events mean for its tenant's capacity (the service links this
/// command to the lease's, on the capacity's stream): its assignment reserves, its end
/// releases. Nothing else moves it: a quarantined or torn-down lease is still charged.
pub fn capacity_effect(
    lease: &crate::runner::RunnerLease,
    events: &[crate::runner::RunnerEvent],
) -> Option<RunnerCapacityCommand> {
    let terms = lease.terms.as_ref()?;
    let after = events.iter().fold(lease.clone(), |lease, event| lease.evolve(event));
    match (lease.is_charged(), after.is_charged()) {
        (false, true) => {
            Some(RunnerCapacityCommand::Reserve { lease: terms.lease, demand: Demand::of(terms) })
        }
        (true, false) => Some(RunnerCapacityCommand::Release { lease: terms.lease }),
        _ => None,
    }
}
