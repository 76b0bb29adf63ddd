//! `evolve` for the host: folds one recorded event into the state. No rules here: `decide`
//! made every decision and the event holds it.

use super::{Allocation, Host, HostEvent, HostStatus};

pub(super) fn evolve(mut host: Host, event: &HostEvent) -> Host {
    use HostEvent as E;
    match event {
        E::HostRegistered { host: id, spec, at } => {
            host.status = HostStatus::Active;
            host.id = Some(id.clone());
            host.spec = Some(spec.clone());
            // A host registered again after its removal starts with nothing bound.
            host.reservations.clear();
            host.allocated = Allocation::default();
            host.last_seen = Some(*at);
            host.updated_at = Some(*at);
        }
        E::HostRefreshed { spec, at } => {
            host.spec = Some(spec.clone());
            host.last_seen = Some(*at);
            host.updated_at = Some(*at);
        }
        E::HostHeartbeat { at } => host.last_seen = Some(*at),
        E::HostCordoned { at } => set(&mut host, HostStatus::Cordoned, *at),
        E::HostDraining { at } => set(&mut host, HostStatus::Draining, *at),
        E::HostUncordoned { at } => set(&mut host, HostStatus::Active, *at),
        E::HostRemoved { at } => set(&mut host, HostStatus::Removed, *at),
        E::HostCapacityReserved { vm, reservation, at } => {
            host.allocated.add(reservation);
            host.reservations.insert(*vm, reservation.clone());
            host.updated_at = Some(*at);
        }
        E::HostOrphanDeadLettered { at, .. } => host.updated_at = Some(*at),
        E::HostCapacityReleased { vm, at, .. } => {
            if let Some(held) = host.reservations.remove(vm) {
                host.allocated.remove(&held);
            }
            host.updated_at = Some(*at);
        }
    }
    host
}

fn set(host: &mut Host, status: HostStatus, at: chrono::DateTime<chrono::Utc>) {
    host.status = status;
    host.updated_at = Some(at);
}
