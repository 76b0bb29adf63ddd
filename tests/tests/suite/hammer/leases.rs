//! Leases under the hammer: acme's lease quota allows 6 at once over 8 slots. A slot's lease
//! is requested, reported provisioned by its backend, restarted, updated, given a custom
//! domain, released and confirmed released; then the slot requests a new one. Now and then a
//! backend reports on an operation that is not the lease's (fenced).

use leasehold_adapters::PgEventStore;
use leasehold_commands::quota::WorkloadQuotas;
use leasehold_commands::{CommandPipeline, CommandRequest, lease_input};
use leasehold_domain::lease::{
    Lease, LeaseCommand, LeaseFacts, LeaseId, LeaseStatus, MaintenanceId, MaintenanceOutcome,
    OperationId, PayloadHash,
};
use leasehold_domain::workload_quota::{Limit, WorkloadKind};
use leasehold_domain::{Actor, OperationKey, TenantId};
use uuid::Uuid;

use super::delivery::deliver;
use super::{Answer, SLOTS, Slots, Via, answer};
use crate::commands::support::{provision, routed, tenant};

type Pipeline = CommandPipeline<PgEventStore>;

/// acme's lease quota: fewer leases than slots.
const LIMIT: u64 = 6;

pub struct Leases {
    slots: Slots<LeaseId>,
    processes: [Pipeline; 2],
}

impl Leases {
    pub async fn new(processes: &[Pipeline; 2]) -> Leases {
        let limits = vec![Limit { resource: "count".into(), max: LIMIT }];
        let set = (&tenant("acme"), WorkloadKind::Lease, limits);
        let quotas = WorkloadQuotas::new(processes[0].clone());
        quotas.set_limits(&super::vms::operator(), "lease-limits", set).await.expect("set");
        Leases { slots: Slots::new(), processes: processes.clone() }
    }

    pub async fn step(
        &self,
        (process, delivery): Via<'_>,
        rng: &mut super::Rng,
        key: String,
    ) -> Answer {
        let pipeline = &self.processes[process];
        let slot = rng.below(SLOTS);
        let (round, lease) = self.slots.get(slot);
        let Some(lease) = lease else {
            return self.request((pipeline, delivery), slot, round).await;
        };
        let stored = match pipeline.state::<Lease>(&lease.stream_id()).await {
            Ok(Some((_, _, stored))) => stored,
            Ok(None) => return Answer::Failed(format!("{lease:?} created but not stored")),
            Err(error) => return answer::<(), _>(Err(error)),
        };
        let Some(command) = next(&stored, rng, &key) else {
            return self.slots.ended(slot, round);
        };
        let role = if backend_reports(&command) { "backend" } else { "tenant" };
        let send =
            || pipeline.execute(as_role(role, lease, &key, command.clone(), LeaseFacts::default()));
        deliver(delivery, send).await
    }

    /// The slot's lease of `round`, requested under a key of its own: clients racing on the
    /// slot send the same request, which lands once.
    async fn request(
        &self,
        (pipeline, delivery): (&Pipeline, (super::Fault, &super::delivery::Observer)),
        slot: usize,
        round: u32,
    ) -> Answer {
        let lease =
            LeaseId(Uuid::from_u128((1 << 64) | ((slot as u128) << 32) | u128::from(round)));
        let key = format!("lease-{slot}-{round}");
        let send =
            || pipeline.execute(as_role("tenant", lease, &key, provision(lease, 1), routed()));
        let answered = deliver(delivery, send).await;
        if matches!(answered, Answer::Applied) {
            self.slots.created(slot, round, lease);
        }
        answered
    }
}

/// The command the lease's state calls for (now and then a stale one), or none when its
/// life has ended.
fn next(lease: &Lease, rng: &mut super::Rng, key: &str) -> Option<LeaseCommand> {
    let operation = lease.operation.unwrap_or(OperationId(Uuid::nil()));
    let stale = OperationId(Uuid::from_u128(rng.below(1 << 16) as u128 + 1));
    let maintenance = MaintenanceId(Uuid::now_v7());
    let hash = PayloadHash::parse("payload", "cd".repeat(32)).expect("valid");
    Some(match lease.status {
        LeaseStatus::Provisioning if rng.one_in(5) => {
            LeaseCommand::ReportProvisioned { operation: stale }
        }
        LeaseStatus::Provisioning => LeaseCommand::ReportProvisioned { operation },
        LeaseStatus::Ready => match rng.below(5) {
            0 => LeaseCommand::Restart { maintenance_id: maintenance },
            1 => LeaseCommand::Update { maintenance_id: maintenance, payload_hash: hash },
            2 => {
                let domain = format!("{}.example.com", key.replace('-', "x"));
                lease_input::set_custom_domain(Some("web"), Some(&domain)).expect("valid")
            }
            _ => LeaseCommand::Deprovision,
        },
        LeaseStatus::Restarting | LeaseStatus::Updating => {
            let pending = lease.pending.as_ref()?;
            LeaseCommand::CompleteMaintenance {
                maintenance_id: if rng.one_in(5) { maintenance } else { pending.id },
                admitted_at: Some(pending.admitted_at),
                outcome: MaintenanceOutcome::Succeeded,
            }
        }
        LeaseStatus::Failing | LeaseStatus::Failed => LeaseCommand::Deprovision,
        LeaseStatus::Deprovisioning => LeaseCommand::ConfirmDeprovisioned { retained: false },
        LeaseStatus::None | LeaseStatus::Deprovisioned | LeaseStatus::Retained => return None,
    })
}

fn backend_reports(command: &LeaseCommand) -> bool {
    matches!(
        command,
        LeaseCommand::ReportProvisioned { .. }
            | LeaseCommand::CompleteMaintenance { .. }
            | LeaseCommand::ConfirmDeprovisioned { .. }
    )
}

fn as_role(
    role: &str,
    lease: LeaseId,
    key: &str,
    command: LeaseCommand,
    facts: LeaseFacts,
) -> CommandRequest<Lease> {
    let actor = Actor { subject: format!("acme-{role}"), role: role.into() };
    let key = OperationKey::parse(key).expect("valid");
    let acme = TenantId::parse("acme").expect("valid");
    CommandRequest::new(acme, actor, lease.stream_id(), key, command, facts)
}
