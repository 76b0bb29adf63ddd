//! `decide` for the host: the transition table of `host.rs`, row by row.

use chrono::{DateTime, TimeDelta, Utc};

use super::fit::fit;
use super::{Host, HostCommand, HostError, HostEvent, HostSpec, HostStatus};
use crate::limits::HOST_HEARTBEAT_RECORD_SECONDS;
use crate::values::fleet::{Demand, HostBackend, HostId, VmId};

pub(super) fn decide(
    host: &Host,
    command: &HostCommand,
    now: DateTime<Utc>,
) -> Result<Vec<HostEvent>, HostError> {
    use HostCommand as C;
    use HostStatus as S;
    let at = now;
    if host.status == S::None && !matches!(command, C::Register { .. }) {
        return Err(HostError::NotFound);
    }
    match (host.status, command) {
        (_, C::Register { id, spec }) => register(host, id, spec, at),
        (S::Active | S::Cordoned | S::Draining, C::Heartbeat) => Ok(heartbeat(host, at)),
        (S::Active, C::Cordon) => Ok(vec![HostEvent::HostCordoned { at }]),
        (S::Cordoned, C::Cordon) | (S::Draining, C::Drain) | (S::Active, C::Uncordon) => {
            Ok(Vec::new())
        }
        (S::Active | S::Cordoned, C::Drain) => Ok(vec![HostEvent::HostDraining { at }]),
        (S::Cordoned | S::Draining, C::Uncordon) => Ok(vec![HostEvent::HostUncordoned { at }]),
        (S::Active | S::Cordoned | S::Draining, C::Remove) => remove(host, at),
        (S::Removed, C::Remove) => Ok(Vec::new()),
        (_, C::Reserve { vm, demand }) => reserve(host, *vm, demand, at),
        (_, C::Release { vm }) => Ok(release(host, *vm, at)),
        (_, C::DeadLetterOrphan { name, attempts, detail }) => {
            Ok(vec![HostEvent::HostOrphanDeadLettered {
                name: name.clone(),
                attempts: *attempts,
                detail: detail.clone(),
                at,
            }])
        }
        (status, command) => {
            Err(HostError::InvalidState { status: status.name(), command: name(command) })
        }
    }
}

fn register(
    host: &Host,
    id: &HostId,
    spec: &HostSpec,
    at: DateTime<Utc>,
) -> Result<Vec<HostEvent>, HostError> {
    let capacity = &spec.capacity;
    let declares_gpu = capacity.gpus > 0
        || capacity.gpu_kind.is_some()
        || !capacity.mig_profiles.is_empty()
        || !capacity.mig_instances.is_empty();
    if declares_gpu && spec.backend != HostBackend::Qemu {
        return Err(HostError::GpuNeedsQemu);
    }
    if !host.status.is_member() {
        return Ok(vec![HostEvent::HostRegistered { host: id.clone(), spec: spec.clone(), at }]);
    }
    let before = host.spec.as_ref().expect("a member host has a spec");
    if before == spec {
        // An unchanged upsert is a heartbeat (fuse's hosts are seen only when registered).
        return Ok(heartbeat(host, at));
    }
    if before.backend != spec.backend && !host.reservations.is_empty() {
        return Err(HostError::BackendChangeWithVms);
    }
    Ok(vec![HostEvent::HostRefreshed { spec: spec.clone(), at }])
}

fn heartbeat(host: &Host, at: DateTime<Utc>) -> Vec<HostEvent> {
    let every = TimeDelta::seconds(HOST_HEARTBEAT_RECORD_SECONDS);
    match host.last_seen {
        Some(seen) if at < seen + every => Vec::new(),
        _ => vec![HostEvent::HostHeartbeat { at }],
    }
}

fn remove(host: &Host, at: DateTime<Utc>) -> Result<Vec<HostEvent>, HostError> {
    if !host.reservations.is_empty() {
        return Err(HostError::HostHasVms { count: host.reservations.len() });
    }
    Ok(vec![HostEvent::HostRemoved { at }])
}

fn reserve(
    host: &Host,
    vm: VmId,
    demand: &Demand,
    at: DateTime<Utc>,
) -> Result<Vec<HostEvent>, HostError> {
    if let Some(held) = host.reservations.get(&vm) {
        // A placement decided again after a lost race asks the same of the same host.
        let whole_gpus = if demand.gpu_profile.is_none() { demand.gpus } else { 0 };
        let same = held.cpus == demand.cpus
            && held.ram_mb == demand.ram_mb
            && held.storage_gb == demand.storage_gb
            && held.gpus == whole_gpus;
        return if same { Ok(Vec::new()) } else { Err(HostError::ReservationMismatch) };
    }
    let reservation = fit(host, demand).map_err(|gate| HostError::DoesNotFit { gate })?;
    Ok(vec![HostEvent::HostCapacityReserved { vm, reservation, at }])
}

fn release(host: &Host, vm: VmId, at: DateTime<Utc>) -> Vec<HostEvent> {
    match host.reservations.get(&vm) {
        Some(reservation) => {
            vec![HostEvent::HostCapacityReleased { vm, reservation: reservation.clone(), at }]
        }
        None => Vec::new(),
    }
}

fn name(command: &HostCommand) -> &'static str {
    match command {
        HostCommand::Register { .. } => "register",
        HostCommand::Heartbeat => "heartbeat",
        HostCommand::Cordon => "cordon",
        HostCommand::Drain => "drain",
        HostCommand::Uncordon => "uncordon",
        HostCommand::Remove => "remove",
        HostCommand::Reserve { .. } => "reserve",
        HostCommand::Release { .. } => "release",
        HostCommand::DeadLetterOrphan { .. } => "dead-letter an orphan",
    }
}
