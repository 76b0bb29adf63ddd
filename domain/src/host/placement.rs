//! Placement: which host a VM goes on. Gates first (every one of [`fit`] on every candidate,
//! a pin first of all), then the policy among the hosts that pass (spread: the most room
//! left; pack: the least), then artifact locality, only to break a tie, then the host id, so
//! that the same fleet always gives the same answer.
//!
//! The decision is advice: the host's Reserve, linked to the VM's creation, checks the gates
//! again on the host's stored state, and that is what decides.

use std::borrow::Borrow;
use std::collections::BTreeSet;

use super::Host;
use super::fit::{Gate, fit};
use crate::values::fleet::{Demand, HostId};
use crate::vm::{Placement, PlacementPolicy};

/// What placement is asked.
#[derive(Debug, Clone)]
pub struct PlacementRequest<'a> {
    /// What the VM asks of its host.
    pub demand: &'a Demand,
    /// The host it must go on, if pinned.
    pub pin: Option<&'a HostId>,
    /// The fleet's policy.
    pub policy: PlacementPolicy,
    /// Hosts holding the VM's seed artifact (a preference, never a gate).
    pub artifact_hosts: &'a BTreeSet<HostId>,
    /// Hosts already tried and refused by their own Reserve (a lost race), skipped.
    pub excluded: &'a BTreeSet<HostId>,
    /// Placements decided before this one for the same VM.
    pub retries: u32,
    /// What ties are broken by, after the policy and locality: a value of the VM's own (its
    /// id's bits), so that concurrent creates over equal hosts spread over them instead of
    /// all taking the first by id, and the same VM always gets the same answer.
    pub tie_break: u64,
}

/// The host `request` goes on among `hosts`, or the gate that kept it off every host: the
/// pinned host's, or else the furthest any host got (the most specific reason).
/// `hosts` may be the hosts themselves or shared ones (`Arc<Host>`): placement only reads them.
///
/// # Errors
/// The [`Gate`] that refused.
pub fn place<H: Borrow<Host>>(
    hosts: &[H],
    request: &PlacementRequest<'_>,
) -> Result<Placement, Gate> {
    let open = |host: &&Host| host.id.as_ref().is_some_and(|id| !request.excluded.contains(id));
    let hosts = || hosts.iter().map(Borrow::borrow);
    let passing: Vec<&Host> = match request.pin {
        // A pin is a hard gate: only the pinned host counts, and its own gates still apply.
        Some(pin) => {
            let host = hosts().filter(open).find(|host| host.id.as_ref() == Some(pin));
            let host = host.ok_or(Gate::Pin)?;
            fit(host, request.demand)?;
            vec![host]
        }
        None => {
            let mut furthest: Option<Gate> = None;
            let mut passing = Vec::new();
            for host in hosts().filter(open).filter(|host| host.status.is_member()) {
                match fit(host, request.demand) {
                    Ok(_) => passing.push(host),
                    Err(gate) => furthest = Some(furthest.map_or(gate, |seen| further(seen, gate))),
                }
            }
            if passing.is_empty() {
                return Err(furthest.unwrap_or(Gate::HostActive));
            }
            passing
        }
    };
    let chosen = choose(&passing, request).expect("at least one host passes");
    let headroom = chosen.headroom().expect("a registered host");
    let id = chosen.id.clone().expect("a registered host");
    Ok(Placement {
        artifact_local: request.artifact_hosts.contains(&id),
        host: id,
        policy: request.policy,
        candidates: u32::try_from(passing.len()).unwrap_or(u32::MAX),
        headroom_cpus: headroom.cpus - i64::from(request.demand.cpus),
        headroom_ram_mb: headroom.ram_mb - i64::try_from(request.demand.ram_mb).unwrap_or(0),
        retries: request.retries,
    })
}

/// The gate later in the order of the two: the host that got further tells more.
fn further(a: Gate, b: Gate) -> Gate {
    if (b as u8) > (a as u8) { b } else { a }
}

/// A host's place among equals for one VM: FNV-1a of its id, mixed with the VM's value.
fn rank(host: &Host, tie_break: u64) -> u64 {
    let id = host.id.as_ref().map_or("", |id| id.as_str());
    id.bytes().fold(0xcbf2_9ce4_8422_2325 ^ tie_break, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The best of the hosts that pass, by the policy, then locality, then the VM's own order
/// of equals, then id.
fn choose<'h>(passing: &[&'h Host], request: &PlacementRequest<'_>) -> Option<&'h Host> {
    let room = |host: &Host| {
        let headroom = host.headroom().expect("a registered host");
        (headroom.cpus, headroom.ram_mb)
    };
    let local =
        |host: &Host| host.id.as_ref().is_some_and(|id| request.artifact_hosts.contains(id));
    passing.iter().copied().min_by(|a, b| {
        let by_room = match request.policy {
            PlacementPolicy::Spread => room(b).cmp(&room(a)),
            PlacementPolicy::Pack => room(a).cmp(&room(b)),
        };
        by_room
            .then_with(|| local(b).cmp(&local(a)))
            .then_with(|| rank(a, request.tie_break).cmp(&rank(b, request.tie_break)))
            .then_with(|| a.id.cmp(&b.id))
    })
}
