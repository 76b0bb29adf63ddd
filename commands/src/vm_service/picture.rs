//! Placement's picture of the fleet: the host catalog's last answer (kept for a max age and
//! shared by a service's clones), with what this process's pipeline remembers of each host
//! (fresher than the catalog, which lags the log) laid over it.
//!
//! Each host is placement's view of it ([`placement_view`]: all of it but the reservations
//! that hold no MIG instance), shared, and the view of a remembered state is kept with its
//! version: a create redoes only the hosts that moved since the last create, where it used to
//! copy every host of the fleet (a third of a create's CPU at 100 hosts).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use leasehold_domain::StreamId;
use leasehold_domain::host::Host;

use crate::cache::StateCache;

/// A host as placement sees it, shared between creates.
pub(super) type View = Arc<Host>;

/// The catalog's last answer and the views laid over it (shared by the clones of one
/// service).
#[derive(Debug, Clone, Default)]
pub(super) struct FleetPicture {
    kept: Arc<Mutex<Kept>>,
    /// How long the catalog's answer is placed over (zero: read for every placement).
    pub(super) max_age: Duration,
}

#[derive(Debug, Default)]
struct Kept {
    read: Option<Read>,
    /// The view of each host's remembered state, with the version it was made of.
    overlaid: HashMap<StreamId, (u64, View)>,
}

/// When the catalog answered, and each of its hosts' views with its stream.
#[derive(Debug)]
struct Read {
    at: Instant,
    hosts: Vec<View>,
    streams: Vec<StreamId>,
}

impl FleetPicture {
    /// The picture over the catalog's kept answer, or `None` when there is none younger than
    /// the max age.
    pub(super) fn over_kept(&self, cache: &StateCache) -> Option<Vec<View>> {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let young = kept.read.as_ref().is_some_and(|read| read.at.elapsed() < self.max_age);
        young.then(|| kept.compose(cache))
    }

    /// Keeps `hosts`, the catalog's answer just read, and answers the picture over it.
    pub(super) fn over_read(&self, hosts: &[Host], cache: &StateCache) -> Vec<View> {
        // A host without an id is no candidate (placement skips it): it is left out.
        let (hosts, streams): (Vec<View>, Vec<StreamId>) = hosts
            .iter()
            .filter_map(|host| {
                let stream = host.id.as_ref()?.stream_id();
                Some((Arc::new(placement_view(host)), stream))
            })
            .unzip();
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.overlaid.retain(|stream, _| streams.contains(stream));
        kept.read = Some(Read { at: Instant::now(), hosts, streams });
        kept.compose(cache)
    }
}

impl Kept {
    /// Each host of the read: the view of its remembered state where the pipeline remembers
    /// one (made again only when that state moved), else the catalog's.
    fn compose(&mut self, cache: &StateCache) -> Vec<View> {
        let Some(read) = &self.read else { return Vec::new() };
        let versions = cache.versions::<Host>(&read.streams);
        let mut picture = Vec::with_capacity(read.hosts.len());
        for ((catalog, stream), version) in read.hosts.iter().zip(&read.streams).zip(versions) {
            let view = match (version, self.overlaid.get(stream)) {
                (None, _) => None,
                (Some(version), Some((made_of, view))) if *made_of == version => {
                    Some(Arc::clone(view))
                }
                (Some(_), _) => {
                    let made = cache.peek::<Host, _>(stream, |version, remembered| {
                        (version, Arc::new(placement_view(remembered)))
                    });
                    made.map(|(version, view)| {
                        self.overlaid.insert(stream.clone(), (version, Arc::clone(&view)));
                        view
                    })
                }
            };
            picture.push(view.unwrap_or_else(|| Arc::clone(catalog)));
        }
        picture
    }
}

/// `host` as placement needs it: all of it but the reservations, of which only those holding
/// MIG instances (the instances free are the ones no reservation holds). A fleet's picture
/// stays small however many VMs its hosts carry.
pub(super) fn placement_view(host: &Host) -> Host {
    let reservations = host
        .reservations
        .iter()
        .filter(|(_, held)| !held.mig_instances.is_empty())
        .map(|(vm, held)| (*vm, held.clone()))
        .collect();
    Host {
        status: host.status,
        id: host.id.clone(),
        spec: host.spec.clone(),
        reservations,
        allocated: host.allocated.clone(),
        last_seen: host.last_seen,
        updated_at: host.updated_at,
    }
}
