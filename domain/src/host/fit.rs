//! Placement's gates: whether a VM's demand fits a host, checked in a fixed order so that a
//! refusal names the first gate that failed. Placement runs them over candidates it read; the
//! host's Reserve runs them again on its stored state, which is what decides.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Host, HostStatus, Reservation};
use crate::values::fleet::{Demand, HostBackend};

/// One placement gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    /// The host takes new VMs (active).
    HostActive,
    /// The host's backend serves the demand (GPUs need qemu).
    Backend,
    /// The host's architecture is the one asked for.
    Arch,
    /// Every label selector matches the host's labels.
    Labels,
    /// The VM is pinned to another host.
    Pin,
    /// Enough vCPUs are free.
    Cpus,
    /// Enough RAM is free.
    Ram,
    /// Enough disk is free.
    Storage,
    /// The host runs fewer VMs than it may.
    VmCount,
    /// The host's GPUs are of the model asked for.
    GpuKind,
    /// Enough whole GPUs are free.
    Gpus,
    /// Enough MIG instances of the profile asked for are free.
    MigProfile,
}

impl Gate {
    /// Its name, as errors and placement decisions spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::HostActive => "host_active",
            Self::Backend => "backend",
            Self::Arch => "arch",
            Self::Labels => "labels",
            Self::Pin => "pin",
            Self::Cpus => "cpus",
            Self::Ram => "ram",
            Self::Storage => "storage",
            Self::VmCount => "vm_count",
            Self::GpuKind => "gpu_kind",
            Self::Gpus => "gpus",
            Self::MigProfile => "mig_profile",
        }
    }
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The reservation `demand` takes on `host`, or the first gate it fails. MIG instances are
/// bound by uuid, the lowest free ones first, on hosts that report them.
///
/// # Errors
/// The first failing [`Gate`].
pub fn fit(host: &Host, demand: &Demand) -> Result<Reservation, Gate> {
    let spec = host.spec.as_ref().filter(|_| host.status == HostStatus::Active);
    let Some(spec) = spec else { return Err(Gate::HostActive) };
    if demand.wants_gpu() && spec.backend != HostBackend::Qemu {
        return Err(Gate::Backend);
    }
    let capacity = &spec.capacity;
    if demand.arch.as_ref().is_some_and(|arch| arch != &capacity.arch) {
        return Err(Gate::Arch);
    }
    if !spec.labels.satisfy(&demand.labels) {
        return Err(Gate::Labels);
    }
    let free = |have: u64, used: u64, want: u64| used.saturating_add(want) <= have;
    let used = &host.allocated;
    if !free(u64::from(capacity.cpus), used.cpus, u64::from(demand.cpus)) {
        return Err(Gate::Cpus);
    }
    if !free(capacity.ram_mb, used.ram_mb, demand.ram_mb) {
        return Err(Gate::Ram);
    }
    if !free(capacity.storage_gb, used.storage_gb, demand.storage_gb) {
        return Err(Gate::Storage);
    }
    if !free(u64::from(capacity.vm_count), u64::from(used.vm_count), 1) {
        return Err(Gate::VmCount);
    }
    let mut reservation = Reservation {
        cpus: demand.cpus,
        ram_mb: demand.ram_mb,
        storage_gb: demand.storage_gb,
        ..Reservation::default()
    };
    gpus(host, demand, &mut reservation)?;
    Ok(reservation)
}

/// The GPU gates: whole devices of the model asked for, or MIG instances of a profile.
fn gpus(host: &Host, demand: &Demand, reservation: &mut Reservation) -> Result<(), Gate> {
    if !demand.wants_gpu() {
        return Ok(());
    }
    let capacity = &host.spec.as_ref().expect("checked by fit").capacity;
    let counted_kind_differs =
        demand.gpu_kind.as_ref().is_some_and(|kind| Some(kind) != capacity.gpu_kind.as_ref());
    let Some(profile) = &demand.gpu_profile else {
        if counted_kind_differs {
            return Err(Gate::GpuKind);
        }
        let used = host.allocated.gpus;
        if used.saturating_add(u64::from(demand.gpus)) > u64::from(capacity.gpus) {
            return Err(Gate::Gpus);
        }
        reservation.gpus = demand.gpus;
        return Ok(());
    };
    let wanted = demand.gpus.max(1);
    if capacity.mig_instances.is_empty() {
        if counted_kind_differs {
            return Err(Gate::GpuKind);
        }
        let have = capacity.mig_profiles.get(profile).copied().unwrap_or_default();
        let used = host.allocated.mig.get(profile).copied().unwrap_or_default();
        if used.saturating_add(u64::from(wanted)) > u64::from(have) {
            return Err(Gate::MigProfile);
        }
        reservation.mig = Some((profile.clone(), wanted));
        return Ok(());
    }
    let bound: std::collections::BTreeSet<&str> = host
        .reservations
        .values()
        .flat_map(|held| held.mig_instances.iter().map(String::as_str))
        .collect();
    let mut free: Vec<&str> = capacity
        .mig_instances
        .iter()
        .filter(|instance| &instance.profile == profile)
        .filter(|instance| demand.gpu_kind.as_ref().is_none_or(|kind| kind == &instance.kind))
        .map(|instance| instance.uuid.as_str())
        .filter(|uuid| !bound.contains(uuid))
        .collect();
    free.sort_unstable();
    if free.len() < wanted as usize {
        return Err(Gate::MigProfile);
    }
    reservation.mig_instances = free[..wanted as usize].iter().map(|u| (*u).to_owned()).collect();
    Ok(())
}
