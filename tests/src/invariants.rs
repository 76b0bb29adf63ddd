//! What must hold in the log at every cursor, checked by reading the whole log once in
//! commit order and folding as it goes (issue 17, part 3):
//!
//! - every stream's versions are 1, 2, 3, … with no gap and no repeat (the store assigns
//!   them, so no test can append a breach of this one: it guards the store itself);
//! - a reservation never takes a host past its capacity: a resource whose room the
//!   reservation shrinks is never left below zero (a capacity refreshed below what is
//!   allocated is recorded as reported, by the host's rule, and a reservation that does not
//!   touch that resource is no breach);
//! - an append never grows a tenant's workload quota usage of a resource past its limit
//!   (checked per append, not per event: a migration's copy starts holding in the same
//!   append as its source stops; a lowered limit refuses growth, not what is held);
//! - a reservation never grows a tenant's runner capacity charge past a limit;
//! - a reservation never grows a tenant's snapshot quota past its count or its bytes (a
//!   settlement to the honest size may, by the quota's rule: the snapshot exists by then);
//! - generations, fencing tokens and epochs (a payload's top-level member of one of those
//!   names) never decrease within a stream. Nested ones are not compared: a run's attempts
//!   carry their own node's token (`attempt.fencing_token`), which a later attempt on another
//!   node may have lower.
//!
//! The checks run on the events themselves, not on read models: a read model could hide a
//! breach the log holds.

use std::collections::{BTreeMap, HashMap};

use leasehold_domain::host::{Headroom, Host, HostEvent};
use leasehold_domain::quota::{QuotaEvent, SnapshotQuota};
use leasehold_domain::runner_capacity::{RunnerCapacity, RunnerCapacityEvent};
use leasehold_domain::workload_quota::{WorkloadQuota, WorkloadQuotaEvent};
use leasehold_domain::{Aggregate, Cursor, DomainEvent, EventStore as _, RecordedEvent};

use crate::TestDb;

/// Top-level payload members that must never decrease within a stream.
const RISING: &[&str] = &["generation", "fencing_token", "epoch", "node_epoch"];

/// What a read of the whole log found.
#[derive(Debug, Default)]
pub struct Audit {
    /// Events read.
    pub events: usize,
    /// Streams seen.
    pub streams: usize,
    /// Reservations checked against a limit (hosts, workload quotas, runner capacities,
    /// snapshot quotas).
    pub reservations: usize,
    /// Generations, tokens and epochs compared with their stream's previous value.
    pub rising: usize,
    /// Every breach, naming the event (its stream and version) and what was exceeded.
    pub violations: Vec<String>,
}

/// Reads the whole log of `db`, every event committed so far (waiting until no open
/// transaction, of any database of the server, hides one from readers), and checks every
/// invariant above after every event.
///
/// # Panics
/// When the log cannot be read, or an event of a checked kind cannot be decoded.
pub async fn audit(db: &TestDb) -> Audit {
    db.settled_head().await;
    let store = db.store();
    let mut folds = Folds::default();
    let mut after = Cursor::START;
    loop {
        let page = store.read_log(after, 1_000).await.expect("the log is readable");
        if page.events.is_empty() {
            break;
        }
        for event in &page.events {
            folds.check(event);
        }
        after = page.next;
    }
    folds.close_append();
    folds.audit.streams = folds.versions.len();
    folds.audit
}

#[derive(Default)]
struct Folds {
    audit: Audit,
    versions: HashMap<String, u64>,
    rising: HashMap<(String, String), u64>,
    hosts: HashMap<String, Host>,
    quotas: HashMap<String, WorkloadQuota>,
    capacities: HashMap<String, RunnerCapacity>,
    snapshot_quotas: HashMap<String, SnapshotQuota>,
    /// The append being read: its events share a transaction.
    append: Option<(u32, u64)>,
    /// Each quota the append touched: its usage before the append, and its first event.
    quotas_before: HashMap<String, (BTreeMap<String, u64>, String)>,
}

impl Folds {
    fn check(&mut self, event: &RecordedEvent) {
        self.audit.events += 1;
        let append = (event.cursor.log_epoch, event.cursor.tx_id);
        if self.append != Some(append) {
            self.close_append();
            self.append = Some(append);
        }
        let at = format!("{} v{} ({})", event.stream_id, event.version, event.event_type);
        self.contiguous(event, &at);
        self.never_decrease(event, &at);
        let breach = match event.stream_type.as_str() {
            "host" => self.host(event),
            "workload-quota" => self.quota(event, &at),
            "runner-capacity" => self.capacity(event),
            "tenant-quota" => self.snapshot_quota(event),
            _ => None,
        };
        if let Some(breach) = breach {
            self.audit.violations.push(format!("{at}: {breach}"));
        }
    }

    fn contiguous(&mut self, event: &RecordedEvent, at: &str) {
        let last = self.versions.insert(event.stream_id.to_string(), event.version);
        let expected = last.unwrap_or(0) + 1;
        if event.version != expected {
            self.audit.violations.push(format!("{at}: version {expected} expected"));
        }
    }

    fn never_decrease(&mut self, event: &RecordedEvent, at: &str) {
        let mut found = Vec::new();
        rising_members(&event.payload, &mut found);
        for (path, value) in found {
            self.audit.rising += 1;
            let key = (event.stream_id.to_string(), path);
            let last = self.rising.insert(key.clone(), value);
            if let Some(last) = last.filter(|last| *last > value) {
                self.audit.violations.push(format!("{at}: {} fell from {last} to {value}", key.1));
            }
        }
    }

    fn host(&mut self, event: &RecordedEvent) -> Option<String> {
        let decoded = decode::<HostEvent>(event);
        let before = self.hosts.get(event.stream_id.as_str()).and_then(Host::headroom);
        let after = fold(&mut self.hosts, event, &decoded).headroom();
        let (HostEvent::HostCapacityReserved { .. }, Some(before), Some(after)) =
            (&decoded, before, after)
        else {
            return None;
        };
        self.audit.reservations += 1;
        let room = |h: &Headroom| [h.cpus, h.ram_mb, h.storage_gb, h.vm_count, h.gpus];
        let names = ["cpus", "ram_mb", "storage_gb", "vm_count", "gpus"];
        let over: Vec<_> = names
            .iter()
            .zip(room(&before).into_iter().zip(room(&after)))
            .filter(|(_, (before, after))| *after < 0 && after < before)
            .map(|(name, (_, after))| format!("{name} {after}"))
            .collect();
        (!over.is_empty()).then(|| format!("host over capacity: {over:?}"))
    }

    fn quota(&mut self, event: &RecordedEvent, at: &str) -> Option<String> {
        let decoded = decode::<WorkloadQuotaEvent>(event);
        let stream = event.stream_id.to_string();
        let usage = self.quotas.get(&stream).map(|quota| quota.usage.clone()).unwrap_or_default();
        self.quotas_before.entry(stream).or_insert_with(|| (usage, at.to_owned()));
        fold(&mut self.quotas, event, &decoded);
        if matches!(decoded, WorkloadQuotaEvent::WorkloadReserved { .. }) {
            self.audit.reservations += 1;
        }
        None
    }

    /// The append just read is whole: no quota it touched grew past a limit.
    fn close_append(&mut self) {
        for (stream, (before, at)) in self.quotas_before.drain() {
            let quota = &self.quotas[&stream];
            let grown_past: Vec<String> = quota
                .usage
                .iter()
                .filter_map(|(resource, used)| {
                    let limit = quota.limits.get(resource).copied().unwrap_or(0);
                    let was = before.get(resource).copied().unwrap_or(0);
                    (limit > 0 && *used > limit && *used > was)
                        .then(|| format!("{resource} {was} -> {used} > {limit}"))
                })
                .collect();
            if !grown_past.is_empty() {
                let breach = format!("{at}: workload quota exceeded: {grown_past:?}");
                self.audit.violations.push(breach);
            }
        }
    }

    fn capacity(&mut self, event: &RecordedEvent) -> Option<String> {
        let decoded = decode::<RunnerCapacityEvent>(event);
        let before = self.capacities.get(event.stream_id.as_str()).map(charged);
        let capacity = fold(&mut self.capacities, event, &decoded);
        if !matches!(decoded, RunnerCapacityEvent::RunnerCapacityReserved { .. }) {
            return None;
        }
        self.audit.reservations += 1;
        let before = before.unwrap_or_default();
        let over: Vec<String> = charged(capacity)
            .into_iter()
            .filter(|(dimension, (used, limit))| {
                let was = before.get(dimension).map_or(0, |(used, _)| *used);
                *limit > 0 && used > limit && *used > was
            })
            .map(|(dimension, (used, limit))| format!("{dimension} {used} > {limit}"))
            .collect();
        (!over.is_empty()).then(|| format!("runner capacity exceeded: {over:?}"))
    }

    fn snapshot_quota(&mut self, event: &RecordedEvent) -> Option<String> {
        let decoded = decode::<QuotaEvent>(event);
        let before = self.snapshot_quotas.get(event.stream_id.as_str()).map(|q| q.usage);
        let quota = fold(&mut self.snapshot_quotas, event, &decoded);
        if !matches!(decoded, QuotaEvent::QuotaReserved { .. }) {
            return None;
        }
        self.audit.reservations += 1;
        let (before, after, limits) = (before.unwrap_or_default(), quota.usage, quota.limits);
        let dimensions = [
            ("count", u64::from(before.count), u64::from(after.count), u64::from(limits.max_count)),
            ("bytes", before.bytes, after.bytes, limits.max_bytes),
        ];
        let over: Vec<String> = dimensions
            .into_iter()
            .filter(|(_, was, used, limit)| *limit > 0 && used > limit && used > was)
            .map(|(dimension, _, used, limit)| format!("{dimension} {used} > {limit}"))
            .collect();
        (!over.is_empty()).then(|| format!("snapshot quota exceeded: {over:?}"))
    }
}

/// A runner capacity's charge and limit (0: none) by dimension (`vcpu`, `memory_mb`,
/// `macos`, `tier:<tier>`).
fn charged(capacity: &RunnerCapacity) -> BTreeMap<String, (u64, u64)> {
    let (limits, usage) = (&capacity.limits, &capacity.usage);
    let mut charged = BTreeMap::from([
        ("vcpu".to_owned(), (usage.vcpu, limits.vcpu)),
        ("memory_mb".to_owned(), (usage.memory_mb, limits.memory_mb)),
        ("macos".to_owned(), (u64::from(usage.macos), u64::from(limits.macos_slots))),
    ]);
    for (tier, used) in &usage.tiers {
        let limit = u64::from(limits.of_tier(tier));
        charged.insert(format!("tier:{tier:?}"), (u64::from(*used), limit));
    }
    charged
}

fn decode<E: DomainEvent>(event: &RecordedEvent) -> E {
    E::from_stored(event.event_type.as_str(), &event.payload)
        .unwrap_or_else(|error| panic!("{} decodes: {error}", event.event_type))
}

/// `event` folded into its stream's state, which is returned.
fn fold<'a, A: Aggregate + Clone>(
    states: &'a mut HashMap<String, A>,
    event: &RecordedEvent,
    decoded: &A::Event,
) -> &'a A {
    let state = states.entry(event.stream_id.to_string()).or_insert_with(A::initial);
    *state = state.clone().evolve(decoded);
    state
}

/// Every top-level member named in [`RISING`] holding a number.
fn rising_members(value: &serde_json::Value, found: &mut Vec<(String, u64)>) {
    let Some(members) = value.as_object() else {
        return;
    };
    for (name, member) in members {
        if let Some(number) = member.as_u64().filter(|_| RISING.contains(&name.as_str())) {
            found.push((name.clone(), number));
        }
    }
}
