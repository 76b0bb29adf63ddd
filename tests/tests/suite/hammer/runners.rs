//! Runner leases under the hammer: acme's runner capacity allows 5 leases of the tier at
//! once over 8 slots. A slot's lease is requested, assigned its job (which charges the
//! capacity in the same append) and released done (which frees it); then the slot requests a
//! new one. Now and then a holder names an epoch that is not the lease's (fenced). Their
//! runner node registers again now and then (a new node epoch) and reports its inventory,
//! now and then under an epoch an earlier registration held (fenced).

use leasehold_adapters::PgEventStore;
use leasehold_commands::CommandPipeline;
use leasehold_commands::lease_service::minted_id;
use leasehold_commands::runner_service::RunnerService;
use leasehold_domain::runner::{JobRef, JobRequestId, Outcome, Phase, RunnerLeaseId};
use leasehold_domain::runner_capacity::{RunnerLimits, TierLimit};

use super::delivery::deliver;
use super::{Answer, SLOTS, Slots, Via, answer};
use crate::runners::support::{
    acme, ask, machine, node_name, operator, registration, tenant, tier,
};

/// acme's runner capacity for the tier: fewer leases than slots.
const LIMIT: u32 = 5;

pub struct Runners {
    slots: Slots<RunnerLeaseId>,
    processes: [RunnerService<PgEventStore>; 2],
}

impl Runners {
    pub async fn new(pipelines: &[CommandPipeline<PgEventStore>; 2]) -> Runners {
        let processes = pipelines.clone().map(RunnerService::new);
        let limits = RunnerLimits {
            tiers: vec![TierLimit { tier: tier(), max: LIMIT }],
            ..RunnerLimits::default()
        };
        processes[0]
            .set_limits(&operator(), "runner-limits", (&acme(), limits))
            .await
            .expect("set");
        Runners { slots: Slots::new(), processes }
    }

    pub async fn step(
        &self,
        (process, delivery): Via<'_>,
        rng: &mut super::Rng,
        key: String,
    ) -> Answer {
        let runners = &self.processes[process];
        let slot = rng.below(SLOTS + 1);
        if slot == SLOTS {
            return node_step((runners, delivery), rng, &key).await;
        }
        let (round, lease) = self.slots.get(slot);
        let Some(lease) = lease else {
            let key = format!("runner-{slot}-{round}");
            let acme = tenant("acme");
            let ask = ask();
            let answered = deliver(delivery, || runners.request(&acme, &key, &ask)).await;
            if matches!(answered, Answer::Applied) {
                // The service mints a lease's id from its tenant and key.
                let id = minted_id("runner-lease", &super::super::runners::support::acme(), &key);
                self.slots.created(slot, round, RunnerLeaseId(id));
            }
            return answered;
        };
        let stored = match runners.owned(lease).await {
            Ok((_, stored)) => stored,
            Err(error) => return answer::<(), _>(Err(error)),
        };
        // Now and then a holder of an earlier epoch.
        let epoch = if rng.one_in(6) { stored.epoch.saturating_sub(1) } else { stored.epoch };
        let job = JobRef {
            request: JobRequestId(uuid::Uuid::from_u128(
                0x900 + (slot as u128) * 1_000_000 + u128::from(round),
            )),
            run: 1,
        };
        let acme_tenant = tenant("acme");
        match stored.phase {
            Phase::Capacity => {
                let assign = || runners.assign(&acme_tenant, &key, (lease, epoch, job));
                deliver(delivery, assign).await
            }
            Phase::Done | Phase::Failed => self.slots.ended(slot, round),
            _ => {
                let outcome = if rng.one_in(4) { Outcome::Failed } else { Outcome::Done };
                let owned = (acme(), lease, epoch);
                let release =
                    || runners.release(&acme_tenant, &key, owned.clone(), (outcome, None));
                deliver(delivery, release).await
            }
        }
    }
}

/// The runner node registers again (a new node epoch), or reports what it runs under its
/// epoch, now and then under an earlier one (fenced).
async fn node_step(
    (runners, delivery): (&RunnerService<PgEventStore>, (super::Fault, &super::delivery::Observer)),
    rng: &mut super::Rng,
    key: &str,
) -> Answer {
    let node = machine("node:docker-1");
    let found = match runners.node(&node_name()).await {
        Ok(found) => found,
        Err(error) => return answer::<(), _>(Err(error)),
    };
    let Some(stored) = found.filter(|_| !rng.one_in(3)) else {
        let register = || runners.register_node(&node, key, (registration(), None));
        return deliver(delivery, register).await;
    };
    let epoch = if rng.one_in(3) { stored.node_epoch.saturating_sub(1) } else { stored.node_epoch };
    let name = node_name();
    let report = || runners.report_inventory(&node, key, (&name, epoch, Vec::new()));
    deliver(delivery, report).await
}
