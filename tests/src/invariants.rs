//! What must hold in the log at every cursor, checked by reading the whole log once in
//! commit order and folding as it goes (issue 17, part 3):
//!
//! - every stream's versions are 1, 2, 3, … with no gap and no repeat;
//! - a host's allocation never exceeds its capacity after a reservation (a refresh below
//!   what is allocated is recorded as reported, by the host's rule, and is not a breach);
//! - a tenant's workload quota never holds more than its limit of a resource after a
//!   workload's admission (a reservation of something held anew);
//! - a tenant's runner capacity never charges more than a limit after a reservation;
//! - generations, fencing tokens and epochs (any payload member of those names, at any
//!   depth outside arrays) never decrease within a stream.
//!
//! The checks run on the events themselves, not on read models: a read model could hide a
//! breach the log holds. Snapshot quotas (`quota.rs`) are not checked here yet.

use std::collections::{BTreeMap, HashMap};

use leasehold_domain::host::{Host, HostEvent};
use leasehold_domain::runner_capacity::{RunnerCapacity, RunnerCapacityEvent};
use leasehold_domain::workload_quota::{WorkloadQuota, WorkloadQuotaEvent};
use leasehold_domain::{Aggregate, Cursor, DomainEvent, EventStore as _, RecordedEvent};

use crate::TestDb;

/// Payload members that must never decrease within a stream.
const RISING: &[&str] = &["generation", "fencing_token", "epoch", "node_epoch"];

/// What a read of the whole log found.
#[derive(Debug, Default)]
pub struct Audit {
    /// Events read.
    pub events: usize,
    /// Streams seen.
    pub streams: usize,
    /// Reservations checked against a limit (hosts, workload quotas, runner capacities).
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
}

impl Folds {
    fn check(&mut self, event: &RecordedEvent) {
        self.audit.events += 1;
        let at = format!("{} v{} ({})", event.stream_id, event.version, event.event_type);
        self.contiguous(event, &at);
        self.never_decrease(event, &at);
        let breach = match event.stream_type.as_str() {
            "host" => self.host(event),
            "workload-quota" => self.quota(event),
            "runner-capacity" => self.capacity(event),
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
        rising_members(&event.payload, "", &mut found);
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
        let host = fold(&mut self.hosts, event, &decoded);
        if !matches!(decoded, HostEvent::HostCapacityReserved { .. }) {
            return None;
        }
        self.audit.reservations += 1;
        let headroom = host.headroom()?;
        let over = [
            ("cpus", headroom.cpus),
            ("ram_mb", headroom.ram_mb),
            ("storage_gb", headroom.storage_gb),
            ("vm_count", headroom.vm_count),
            ("gpus", headroom.gpus),
        ];
        let over: Vec<_> = over.iter().filter(|(_, left)| *left < 0).collect();
        (!over.is_empty()).then(|| format!("host over capacity: {over:?}"))
    }

    fn quota(&mut self, event: &RecordedEvent) -> Option<String> {
        let decoded = decode::<WorkloadQuotaEvent>(event);
        let quota = fold(&mut self.quotas, event, &decoded);
        let WorkloadQuotaEvent::WorkloadReserved { held, replaced, .. } = &decoded else {
            return None;
        };
        if !replaced.is_empty() {
            return None; // a change of what a workload holds, not an admission
        }
        self.audit.reservations += 1;
        let over: Vec<String> = held
            .iter()
            .filter_map(|held| {
                let limit = quota.limits.get(&held.resource).copied().unwrap_or(0);
                let used = quota.usage.get(&held.resource).copied().unwrap_or(0);
                (limit > 0 && used > limit).then(|| format!("{} {used} > {limit}", held.resource))
            })
            .collect();
        (!over.is_empty()).then(|| format!("workload quota exceeded: {over:?}"))
    }

    fn capacity(&mut self, event: &RecordedEvent) -> Option<String> {
        let decoded = decode::<RunnerCapacityEvent>(event);
        let capacity = fold(&mut self.capacities, event, &decoded);
        if !matches!(decoded, RunnerCapacityEvent::RunnerCapacityReserved { .. }) {
            return None;
        }
        self.audit.reservations += 1;
        let (limits, usage) = (&capacity.limits, &capacity.usage);
        let over = |limit: u64, used: u64| limit > 0 && used > limit;
        let mut breaches = BTreeMap::new();
        breaches.insert("vcpu", over(limits.vcpu, usage.vcpu));
        breaches.insert("memory_mb", over(limits.memory_mb, usage.memory_mb));
        breaches.insert("macos", over(limits.macos_slots.into(), usage.macos.into()));
        let tiers = usage
            .tiers
            .iter()
            .any(|(tier, used)| over(u64::from(limits.of_tier(tier)), u64::from(*used)));
        breaches.insert("tiers", tiers);
        breaches.retain(|_, over| *over);
        (!breaches.is_empty())
            .then(|| format!("runner capacity exceeded: {:?} of {limits:?}", breaches.keys()))
    }
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

/// Every member named in [`RISING`] holding a number, with its path, at any depth outside
/// arrays.
fn rising_members(value: &serde_json::Value, path: &str, found: &mut Vec<(String, u64)>) {
    // Members of an array's items are not compared: two items of one event (two leases of
    // a node's inventory, say) are not one value over time.
    let serde_json::Value::Object(members) = value else {
        return;
    };
    for (name, member) in members {
        let path = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
        match member.as_u64() {
            Some(number) if RISING.contains(&name.as_str()) => found.push((path, number)),
            _ => rising_members(member, &path, found),
        }
    }
}
