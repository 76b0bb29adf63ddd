//! Runner leases under the hammer: acme's runner capacity allows 5 leases of the tier at
//! once over 8 slots. A slot's lease is requested, assigned its job (which charges the
//! capacity in the same append) and released done (which frees it); then the slot requests a
//! new one. Now and then a holder names an epoch that is not the lease's (fenced).

use leasehold_adapters::PgEventStore;
use leasehold_commands::CommandPipeline;
use leasehold_commands::runner_service::RunnerService;
use leasehold_domain::runner::{JobRef, JobRequestId, Outcome, Phase, RunnerLeaseId};
use leasehold_domain::runner_capacity::{RunnerLimits, TierLimit};

use super::{Answer, SLOTS, Slots, answer};
use crate::runners::support::{acme, ask, operator, tenant, tier};

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

    pub async fn step(&self, process: usize, rng: &mut super::Rng, key: String) -> Answer {
        let runners = &self.processes[process];
        let slot = rng.below(SLOTS);
        let (round, lease) = self.slots.get(slot);
        let Some(lease) = lease else {
            let requested =
                runners.request(&tenant("acme"), &format!("runner-{slot}-{round}"), &ask()).await;
            if let Ok(requested) = &requested {
                self.slots.created(slot, round, requested.lease);
            }
            return answer(requested);
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
                answer(runners.assign(&acme_tenant, &key, (lease, epoch, job)).await)
            }
            Phase::Done | Phase::Failed => self.slots.ended(slot, round),
            _ => {
                let outcome = if rng.one_in(4) { Outcome::Failed } else { Outcome::Done };
                let owned = (acme(), lease, epoch);
                answer(runners.release(&acme_tenant, &key, owned, (outcome, None)).await)
            }
        }
    }
}
