//! VMs and hosts under the hammer: 8 hosts with room for one VM each, cordoned and
//! uncordoned by an operator now and then, and acme's VM quota of 6 over 8 slots. A slot's
//! VM is created (placed on a host, which reserves its room in the same append), reported
//! booted by its host's agent, used, destroyed and confirmed removed (which frees the room);
//! then the slot creates a new one. Now and then an agent reports on an operation that is
//! not the VM's (fenced).

use leasehold_adapters::PgEventStore;
use leasehold_adapters::StoreConfig;
use leasehold_adapters::vault::PgCredentialVault;
use leasehold_commands::CommandPipeline;
use leasehold_commands::host_service::{HostCaller, HostService};
use leasehold_commands::lease_service::Caller;
use leasehold_commands::quota::WorkloadQuotas;
use leasehold_commands::vm_service::{StreamCatalog, VmService, vm_of};
use leasehold_domain::host::HostCommand;
use leasehold_domain::values::OperationId;
use leasehold_domain::values::fleet::{HostBackend, HostId, VmId};
use leasehold_domain::vm::{PlacementPolicy, Vm, VmStatus, VmUrl};
use leasehold_domain::workload_quota::{Limit, WorkloadKind};
use leasehold_tests::TestDb;

use super::delivery::deliver;
use super::{Answer, SLOTS, Slots, Via, answer};
use crate::fleet::support::{VAULT_KEY, agent, host_id, host_spec, no_secrets, spec, task, tenant};

type Service = VmService<PgEventStore, StreamCatalog<PgEventStore>, PgCredentialVault>;

/// acme's VM quota: fewer VMs than slots.
const LIMIT: u64 = 6;

pub fn operator() -> Caller {
    Caller {
        actor: leasehold_domain::Actor { subject: "ops".into(), role: "operator".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

fn host_operator() -> HostCaller {
    crate::fleet::support::operator()
}

pub struct Vms {
    slots: Slots<VmId>,
    hosts: Vec<HostId>,
    processes: [(Service, HostService<PgEventStore>); 2],
}

impl Vms {
    pub async fn new(db: &TestDb, pipelines: &[CommandPipeline<PgEventStore>; 2]) -> Vms {
        let names: Vec<String> = (0..SLOTS).map(|n| format!("hammer-{n}")).collect();
        let hosts: Vec<HostId> = names.iter().map(|name| host_id(name)).collect();
        let vault = PgCredentialVault::new(
            db.store_with(StoreConfig { pool_size: 2, ..StoreConfig::default() }),
            VAULT_KEY,
        );
        let process = |pipeline: &CommandPipeline<PgEventStore>| {
            let catalog = StreamCatalog::new(pipeline.clone(), hosts.clone());
            let vms =
                VmService::new(pipeline.clone(), (catalog, vault.clone()), PlacementPolicy::Spread);
            (vms, HostService::new(pipeline.clone()))
        };
        let processes = [process(&pipelines[0]), process(&pipelines[1])];
        for (name, host) in names.iter().zip(&hosts) {
            let spec = host_spec(HostBackend::Firecracker, 2, 1);
            let key = format!("register-{name}");
            let register = HostCommand::Register { id: host.clone(), spec };
            processes[0].1.run(&host_operator(), &key, host, register).await.expect("registered");
        }
        let limits = vec![Limit { resource: "count".into(), max: LIMIT }];
        let quotas = WorkloadQuotas::new(pipelines[0].clone());
        let acme = leasehold_domain::TenantId::parse("acme").expect("valid");
        let set = (&acme, WorkloadKind::Vm, limits);
        quotas.set_limits(&operator(), "vm-limits", set).await.expect("set");
        Vms { slots: Slots::new(), hosts, processes }
    }

    pub async fn step(
        &self,
        (process, delivery): Via<'_>,
        rng: &mut super::Rng,
        key: String,
    ) -> Answer {
        let (vms, hosts) = &self.processes[process];
        let slot = rng.below(SLOTS + 1);
        if slot == SLOTS {
            let host = &self.hosts[rng.below(self.hosts.len())];
            let command = if rng.one_in(2) { HostCommand::Cordon } else { HostCommand::Uncordon };
            let operator = host_operator();
            return deliver(delivery, || hosts.run(&operator, &key, host, command.clone())).await;
        }
        let (round, vm) = self.slots.get(slot);
        let Some(vm) = vm else {
            let (acme, task) = (tenant("acme"), task(&format!("vm-{slot}-{round}")));
            let secrets = no_secrets();
            let create = || vms.create(&acme, &key, (&task, spec()), &secrets);
            let answered = deliver(delivery, create).await;
            if matches!(answered, Answer::Applied) {
                let owner = acme.tenant.as_ref().expect("a tenant's caller");
                self.slots.created(slot, round, vm_of(owner, &task));
            }
            return answered;
        };
        let stored = match vms.owned(vm).await {
            Ok((_, stored)) => stored,
            Err(error) => return answer::<(), _>(Err(error)),
        };
        match next((vms, delivery), &stored, rng, (&key, vm)).await {
            Some(result) => result,
            None => self.slots.ended(slot, round),
        }
    }
}

/// The command the VM's state calls for (now and then a stale one), sent; none when its life
/// has ended.
async fn next(
    (vms, delivery): (&Service, (super::Fault, &super::delivery::Observer)),
    stored: &Vm,
    rng: &mut super::Rng,
    (key, vm): (&str, VmId),
) -> Option<Answer> {
    let operation = stored.operation.unwrap_or(OperationId(uuid::Uuid::nil()));
    let operation = if rng.one_in(6) { OperationId(uuid::Uuid::from_u128(9)) } else { operation };
    let host = stored.placement.as_ref().map(|placement| placement.host.clone());
    let url = VmUrl::parse("url", "127.0.0.1:19551").expect("valid");
    let acme = tenant("acme");
    Some(match (stored.status, host) {
        (VmStatus::Provisioning, Some(host)) => {
            let agent = agent();
            deliver(delivery, || {
                vms.report_booted(&agent, &host, key, vm, (operation, url.clone()))
            })
            .await
        }
        (VmStatus::Running, Some(host)) if rng.one_in(3) => {
            let agent = agent();
            deliver(delivery, || vms.record_activity(&agent, &host, key, vm)).await
        }
        (VmStatus::Running | VmStatus::Draining, _) => {
            deliver(delivery, || vms.destroy(&acme, key, vm)).await
        }
        (VmStatus::Destroying, Some(host)) => {
            let agent = agent();
            deliver(delivery, || vms.confirm_removed(&agent, &host, key, (vm, operation))).await
        }
        _ => return None,
    })
}
