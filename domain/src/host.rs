//! The Host: a machine of the fleet whose agent boots and destroys VMs (DOMAIN.md §1.4).
//!
//! An operator registers a host with what it has (its **capacity**: CPUs, RAM, storage, how
//! many VMs, its architecture, whole GPUs of one model, MIG profiles and instances) and the
//! **labels** placement selects on; both are declared, never probed. Its **allocation** is the
//! sum of the reservations of the VMs bound to it, and only events change it: a VM's
//! placement reserves (in the same append as the VM's scheduling, so two VMs can never both
//! take the last room), and the VM's boot failure or confirmed removal releases.
//!
//! A command on a host that was never registered is `NotFound`; a command the table does not
//! list for a state is `InvalidState`.
//!
//! | from | command | to | events | guard |
//! |---|---|---|---|---|
//! | none, removed | Register | active | HostRegistered | GPUs, a GPU model and MIG profiles or instances only on qemu (`GpuNeedsQemu`) |
//! | active, cordoned, draining | Register (upsert) | unchanged | HostRefreshed (url, region, labels, capacity), or, when nothing changed, as Heartbeat | as above; the backend changes only while no VM is bound (`BackendChangeWithVms`) |
//! | active, cordoned, draining | Heartbeat | unchanged | HostHeartbeat, or — within 60 s of the last recorded one | — |
//! | active | Cordon | cordoned | HostCordoned | VMs bound keep running |
//! | cordoned | Cordon | cordoned | — (idempotent) | — |
//! | active, cordoned | Drain | draining | HostDraining | VMs bound keep running until evicted (eviction is not automatic yet, as upstream) |
//! | draining | Drain | draining | — (idempotent) | — |
//! | cordoned, draining | Uncordon | active | HostUncordoned | — |
//! | active | Uncordon | active | — (idempotent) | — |
//! | active, cordoned, draining | Remove | removed | HostRemoved | no VM bound, else `HostHasVms` |
//! | removed | Remove | removed | — (idempotent) | — |
//! | active | Reserve(vm, demand) | active | HostCapacityReserved (the VM's reservation, with any MIG instances bound) | every gate of [`fit`] in order, else `DoesNotFit` naming the first that failed; the VM already holding a reservation: — when it asks for the same, else `ReservationMismatch` |
//! | cordoned, draining, removed | Reserve | unchanged | refused | `DoesNotFit(host_active)` |
//! | any but none | Release(vm) | unchanged | HostCapacityReleased, or — when the VM holds none (idempotent) | — |
//! | any but none | DeadLetterOrphan | unchanged | HostOrphanDeadLettered | — (the inventory reconciler gave up destroying an orphan) |
//!
//! A registration and a refresh count as the host being seen (`last_seen`): fuse's agents
//! send no heartbeat, and are seen when their installer registers them.
//!
//! Capacity refreshed below what is allocated is recorded as reported: the headroom is then
//! negative and nothing more fits until VMs leave.

mod decide;
mod events;
mod evolve;
pub mod fit;
pub mod placement;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregate::{Aggregate, Context, Refusal, RefusalKind};
use crate::values::fleet::{
    AgentUrl, Arch, Demand, GpuKind, HostBackend, HostId, Labels, MigInstance, MigProfile, Region,
    VmId,
};

pub use events::{HostEvent, KIND};
pub use fit::Gate;

/// Where a host stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostStatus {
    /// Never registered: the stream is empty.
    None,
    /// Takes new VMs.
    Active,
    /// Takes no new VMs; those bound keep running.
    Cordoned,
    /// Takes no new VMs; those bound are to be moved off.
    Draining,
    /// Out of the fleet (it may be registered again).
    Removed,
}

impl HostStatus {
    /// Every status.
    pub const ALL: [Self; 5] =
        [Self::None, Self::Active, Self::Cordoned, Self::Draining, Self::Removed];

    /// Its name, the one spelling read models, clients and events use.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Active => "active",
            Self::Cordoned => "cordoned",
            Self::Draining => "draining",
            Self::Removed => "removed",
        }
    }

    /// Whether it is in the fleet (registered and not removed).
    pub fn is_member(self) -> bool {
        matches!(self, Self::Active | Self::Cordoned | Self::Draining)
    }
}

/// What a host has, as its operator declared it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCapacity {
    /// vCPUs.
    pub cpus: u32,
    /// RAM in MiB.
    pub ram_mb: u64,
    /// Disk in GiB.
    pub storage_gb: u64,
    /// Most VMs at once.
    pub vm_count: u32,
    /// Its CPU architecture.
    pub arch: Arch,
    /// Whole GPUs (qemu only).
    pub gpus: u32,
    /// The model of its GPUs (qemu only).
    pub gpu_kind: Option<GpuKind>,
    /// MIG instances by profile, when the host declares counts only (qemu only).
    pub mig_profiles: BTreeMap<MigProfile, u32>,
    /// Its carved MIG instances, when it reports them one by one (qemu only): then VMs are
    /// bound to concrete instances and `mig_profiles` is not used for placement.
    pub mig_instances: Vec<MigInstance>,
}

/// How a host is reached and what it offers: what Register declares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostSpec {
    /// Its agent's base URL.
    pub url: AgentUrl,
    /// Its region, if any.
    pub region: Option<Region>,
    /// What runs its VMs.
    pub backend: HostBackend,
    /// Labels placement selects on.
    pub labels: Labels,
    /// What it has.
    pub capacity: HostCapacity,
}

/// What one VM holds of its host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// vCPUs.
    pub cpus: u32,
    /// RAM in MiB.
    pub ram_mb: u64,
    /// Disk in GiB.
    pub storage_gb: u64,
    /// Whole GPUs.
    pub gpus: u32,
    /// MIG instances counted by profile (hosts declaring counts only).
    pub mig: Option<(MigProfile, u32)>,
    /// MIG instances bound by uuid (hosts reporting instances).
    pub mig_instances: Vec<String>,
}

/// The sum of a host's reservations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// vCPUs.
    pub cpus: u64,
    /// RAM in MiB.
    pub ram_mb: u64,
    /// Disk in GiB.
    pub storage_gb: u64,
    /// VMs bound.
    pub vm_count: u32,
    /// Whole GPUs.
    pub gpus: u64,
    /// MIG instances counted by profile.
    pub mig: BTreeMap<MigProfile, u64>,
}

impl Allocation {
    /// The sum of `reservations`.
    pub fn of<'a>(reservations: impl IntoIterator<Item = &'a Reservation>) -> Self {
        let mut sum = Self::default();
        for reservation in reservations {
            sum.add(reservation);
        }
        sum
    }

    pub(crate) fn add(&mut self, reservation: &Reservation) {
        self.cpus += u64::from(reservation.cpus);
        self.ram_mb += reservation.ram_mb;
        self.storage_gb += reservation.storage_gb;
        self.vm_count += 1;
        self.gpus += u64::from(reservation.gpus);
        if let Some((profile, count)) = &reservation.mig {
            *self.mig.entry(profile.clone()).or_default() += u64::from(*count);
        }
    }

    pub(crate) fn remove(&mut self, reservation: &Reservation) {
        self.cpus = self.cpus.saturating_sub(u64::from(reservation.cpus));
        self.ram_mb = self.ram_mb.saturating_sub(reservation.ram_mb);
        self.storage_gb = self.storage_gb.saturating_sub(reservation.storage_gb);
        self.vm_count = self.vm_count.saturating_sub(1);
        self.gpus = self.gpus.saturating_sub(u64::from(reservation.gpus));
        if let Some((profile, count)) = &reservation.mig {
            let left = self.mig.get(profile).copied().unwrap_or_default();
            let left = left.saturating_sub(u64::from(*count));
            if left == 0 {
                self.mig.remove(profile);
            } else {
                self.mig.insert(profile.clone(), left);
            }
        }
    }
}

/// The Host aggregate's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// Where it stands.
    pub status: HostStatus,
    /// Its id (set by its first registration).
    pub id: Option<HostId>,
    /// How it is reached and what it offers (set by registration, refreshed by upserts).
    pub spec: Option<HostSpec>,
    /// Each bound VM's reservation.
    pub reservations: BTreeMap<VmId, Reservation>,
    /// Their sum.
    pub allocated: Allocation,
    /// Its agent's last recorded heartbeat (stamped by Leasehold, never by the host).
    pub last_seen: Option<DateTime<Utc>>,
    /// When it was last changed.
    pub updated_at: Option<DateTime<Utc>>,
}

/// What can be asked of a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HostCommand {
    /// Registers it, or refreshes what it declares (an upsert).
    Register {
        /// Its id.
        id: HostId,
        /// What it declares.
        spec: HostSpec,
    },
    /// Its agent is alive.
    Heartbeat,
    /// Takes no new VMs.
    Cordon,
    /// Takes no new VMs and is to be emptied.
    Drain,
    /// Takes new VMs again.
    Uncordon,
    /// Leaves the fleet.
    Remove,
    /// Holds room for a VM being placed on it.
    Reserve {
        /// The VM.
        vm: VmId,
        /// What it asks for.
        demand: Demand,
    },
    /// Gives back what a VM held (its boot failed or its removal was confirmed).
    Release {
        /// The VM.
        vm: VmId,
    },
    /// Records that an orphan on the host could not be destroyed after `attempts` tries.
    DeadLetterOrphan {
        /// The orphan's name at the agent.
        name: String,
        /// Tries in a row.
        attempts: u32,
        /// The last failure (operators only).
        detail: crate::values::OperatorDetail,
    },
}

/// Why a host refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The host was never registered.
    #[error("no such host")]
    NotFound,
    /// Not allowed in its state.
    #[error("a host that is {status} cannot {command}")]
    InvalidState {
        /// Its status's name.
        status: &'static str,
        /// What was asked.
        command: &'static str,
    },
    /// GPUs or MIG capacity declared on a host that is not qemu.
    #[error("only qemu hosts may declare GPUs or MIG capacity")]
    GpuNeedsQemu,
    /// The backend changed while VMs are bound.
    #[error("the backend of a host with VMs bound cannot change")]
    BackendChangeWithVms,
    /// VMs are still bound.
    #[error("{count} VMs are still bound to the host")]
    HostHasVms {
        /// How many.
        count: usize,
    },
    /// The VM does not fit.
    #[error("the VM does not fit the host: {gate}")]
    DoesNotFit {
        /// The first gate that failed.
        gate: Gate,
    },
    /// The VM already holds a different reservation here.
    #[error("the VM already holds a different reservation on this host")]
    ReservationMismatch,
}

impl Refusal for HostError {
    fn kind(&self) -> RefusalKind {
        match self {
            Self::NotFound => RefusalKind::NotFound,
            Self::GpuNeedsQemu => RefusalKind::BadInput,
            Self::InvalidState { .. } | Self::HostHasVms { .. } | Self::DoesNotFit { .. } => {
                RefusalKind::InvalidState
            }
            Self::BackendChangeWithVms | Self::ReservationMismatch => RefusalKind::Conflict,
        }
    }
}

/// Facts a host's commands need: none (everything is in its own stream).
pub type HostFacts = ();

impl Aggregate for Host {
    const STREAM_TYPE: &'static str = "host";
    const STATE_SCHEMA: u32 = 1;
    type Command = HostCommand;
    type Event = HostEvent;
    type Error = HostError;
    type Facts = HostFacts;

    fn initial() -> Self {
        Self {
            status: HostStatus::None,
            id: None,
            spec: None,
            reservations: BTreeMap::new(),
            allocated: Allocation::default(),
            last_seen: None,
            updated_at: None,
        }
    }

    fn decide(
        &self,
        command: &HostCommand,
        ctx: &Context<HostFacts>,
    ) -> Result<Vec<HostEvent>, HostError> {
        decide::decide(self, command, ctx.now)
    }

    fn evolve(self, event: &HostEvent) -> Self {
        evolve::evolve(self, event)
    }

    fn is_terminal(&self) -> bool {
        false
    }

    fn is_creation(command: &HostCommand) -> bool {
        matches!(command, HostCommand::Register { .. })
    }
}

impl Host {
    /// Room left: capacity less allocation, per resource (negative when capacity was
    /// refreshed below what is allocated). `None` before registration.
    pub fn headroom(&self) -> Option<Headroom> {
        let capacity = &self.spec.as_ref()?.capacity;
        let left = |have: u64, used: u64| i64::try_from(have).unwrap_or(i64::MAX) - used as i64;
        Some(Headroom {
            cpus: left(u64::from(capacity.cpus), self.allocated.cpus),
            ram_mb: left(capacity.ram_mb, self.allocated.ram_mb),
            storage_gb: left(capacity.storage_gb, self.allocated.storage_gb),
            vm_count: left(u64::from(capacity.vm_count), u64::from(self.allocated.vm_count)),
            gpus: left(u64::from(capacity.gpus), self.allocated.gpus),
        })
    }
}

/// A host's room left, per resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Headroom {
    /// vCPUs.
    pub cpus: i64,
    /// RAM in MiB.
    pub ram_mb: i64,
    /// Disk in GiB.
    pub storage_gb: i64,
    /// VMs.
    pub vm_count: i64,
    /// Whole GPUs.
    pub gpus: i64,
}
