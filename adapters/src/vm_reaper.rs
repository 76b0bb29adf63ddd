//! The `vm-reaper` reconciler: every sweep (fuse's reconcile interval, 30 s by default) it
//! looks at each running VM, as the VM projection last wrote it, and strikes the stuck ones
//! (running past their maximum runtime, 2 h by default) and the idle ones (no activity past
//! their idle timeout, none by default); a VM found fine again has its strikes cleared. Two
//! strikes in a row destroy the VM (the aggregate decides that), which the projection then
//! records as a dead letter.
//!
//! Each command's operation key names the VM and the state it was decided on (its last
//! change), so a reaper stopped between a command and its checkpoint, and started again,
//! repeats the same command, which the ledger answers once: a VM is destroyed exactly once.
//! Sweeps run on the reconciler's clock, never the system's.

use chrono::{DateTime, TimeDelta, Utc};
use leasehold_commands::lease_service::Caller;
use leasehold_commands::vm_service::{CredentialVault, HostCatalog, VmService};
use leasehold_commands::{CommandError, CommandStore};
use leasehold_domain::values::fleet::VmId;
use leasehold_domain::vm::{StrikeReason, Vm, VmError, VmStatus};
use leasehold_domain::{Actor, StoreError};
use leasehold_projections::vm::VmView;
use leasehold_projections::{ReconcileError, Reconciler, Seen};

use crate::store::{PgEventStore, from_driver};

/// When the reaper strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmReapPolicy {
    /// How often it sweeps.
    pub sweep_every: TimeDelta,
    /// A running VM older than this without a maximum runtime of its own is stuck.
    pub stuck_after: TimeDelta,
    /// A running VM idle this long without an idle timeout of its own is idle (none: only
    /// VMs that ask for one).
    pub idle_after: Option<TimeDelta>,
}

impl Default for VmReapPolicy {
    fn default() -> Self {
        Self {
            sweep_every: TimeDelta::seconds(30),
            stuck_after: TimeDelta::hours(2),
            idle_after: None,
        }
    }
}

/// The reaper.
#[derive(Debug)]
pub struct VmReaper<S, C, V> {
    vms: VmService<S, C, V>,
    store: PgEventStore,
    policy: VmReapPolicy,
    next_sweep: std::sync::Mutex<Option<DateTime<Utc>>>,
}

impl<S, C, V> VmReaper<S, C, V> {
    /// A reaper acting through `vms`, reading the VM projection in the database of `store`.
    pub fn new(vms: VmService<S, C, V>, store: PgEventStore, policy: VmReapPolicy) -> Self {
        Self { vms, store, policy, next_sweep: std::sync::Mutex::new(None) }
    }
}

/// Why a running VM is struck now, if it is.
fn verdict(vm: &Vm, now: DateTime<Utc>, policy: &VmReapPolicy) -> Option<StrikeReason> {
    let terms = vm.terms.as_ref()?;
    let since = vm.running_since?;
    let seconds = |value: u32| TimeDelta::seconds(i64::from(value));
    let stuck_after = terms.spec.max_runtime_seconds.map_or(policy.stuck_after, seconds);
    if since + stuck_after <= now {
        return Some(StrikeReason::Stuck);
    }
    let idle_after = terms.spec.idle_timeout_seconds.map(seconds).or(policy.idle_after)?;
    let active = vm.last_activity.unwrap_or(since).max(since);
    (active + idle_after <= now).then_some(StrikeReason::Idle)
}

fn reaper() -> Caller {
    Caller {
        actor: Actor { subject: "vm-reaper".into(), role: "system".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

impl<S, C, V> VmReaper<S, C, V>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    C: HostCatalog,
    V: CredentialVault,
{
    /// The running VMs, as the VM projection last wrote them.
    async fn running(&self) -> Result<Vec<(VmId, VmView)>, ReconcileError> {
        let client =
            self.store.client().await.map_err(|error| retry("read running VMs", &error))?;
        let rows = client
            .query(
                "SELECT s.vm_id, s.state FROM vm_view_states s JOIN vms v USING (vm_id) \
                 WHERE v.state = 'running' ORDER BY s.vm_id",
                &[],
            )
            .await
            .map_err(|error| {
                retry("read running VMs", &from_driver(error, self.store.endpoint()))
            })?;
        let mut running = Vec::with_capacity(rows.len());
        for row in rows {
            let vm = VmId(row.get(0));
            let view: VmView = postcard::from_bytes(row.get(1)).map_err(|error| {
                retry(
                    "read running VMs",
                    &StoreError::Corrupt { position: 0, reason: error.to_string() },
                )
            })?;
            running.push((vm, view));
        }
        Ok(running)
    }

    async fn sweep(&self, now: DateTime<Utc>) -> Result<(), ReconcileError> {
        for (vm, view) in self.running().await? {
            let state = &view.vm;
            if state.status != VmStatus::Running {
                continue;
            }
            let reason = verdict(state, now, &self.policy);
            if reason.is_none() && state.strikes.is_none() {
                continue;
            }
            let decided_on = state.updated_at.map_or(0, |at| at.timestamp_micros());
            let what = match reason {
                Some(StrikeReason::Stuck) => "stuck",
                Some(StrikeReason::Idle) => "idle",
                None => "clear",
            };
            let key = format!("vm-reaper:{}:{decided_on}:{what}", vm.0);
            // One VM's failure never ends the sweep (and never makes the next one come early:
            // strikes must be a sweep apart).
            match self.vms.strike(&reaper(), &key, vm, reason).await {
                // Moved on since the projection wrote it (destroyed, drained): nothing to do.
                Ok(_)
                | Err(
                    CommandError::Refused(VmError::InvalidState { .. }) | CommandError::NotFound,
                ) => {}
                Err(error) => {
                    tracing::warn!(vm = %vm.0, %error, "a VM's strike was not recorded; the next sweep looks again");
                }
            }
        }
        Ok(())
    }
}

fn retry(action: &str, error: &impl std::fmt::Display) -> ReconcileError {
    ReconcileError::Retry { action: action.to_owned(), reason: error.to_string() }
}

impl<S, C, V> Reconciler for VmReaper<S, C, V>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    C: HostCatalog + 'static,
    V: CredentialVault + 'static,
{
    const NAME: &'static str = "vm-reaper";
    const VERSION: u32 = 1;

    async fn reconcile(&self, seen: Seen<'_>) -> Result<Option<DateTime<Utc>>, ReconcileError> {
        let scheduled = *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if scheduled.is_some_and(|at| seen.now < at) {
            return Ok(scheduled);
        }
        // The next sweep is set before this one runs: a sweep that fails part way is not
        // repeated at once, which would give its first strikes their second too soon.
        let next = seen.now + self.policy.sweep_every;
        *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(next);
        self.sweep(seen.now).await?;
        Ok(Some(next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_domain::Aggregate as _;

    #[test]
    fn stuck_comes_before_idle_and_a_vms_own_limits_win() {
        let policy =
            VmReapPolicy { idle_after: Some(TimeDelta::minutes(10)), ..VmReapPolicy::default() };
        let t0 = chrono::TimeZone::with_ymd_and_hms(&Utc, 2026, 12, 1, 12, 0, 0)
            .single()
            .expect("a time");
        let mut vm = Vm::initial();
        assert_eq!(verdict(&vm, t0, &policy), None, "not running: never struck");
        vm.running_since = Some(t0);
        vm.terms = Some(leasehold_domain::vm::VmTerms {
            id: VmId(uuid::Uuid::nil()),
            task: leasehold_domain::values::fleet::TaskId::parse("t", "t").expect("valid"),
            spec: serde_json::from_value(serde_json::json!({
                "cpus": 1, "ram_mb": 512, "storage_gb": 1, "region": null, "arch": null, "gpus": 0,
                "gpu_kind": null, "gpu_profile": null, "pin": null, "labels": [],
                "max_runtime_seconds": null, "idle_timeout_seconds": null, "image": null,
                "seed": null, "resume_seed": false, "huge_pages": false, "egress_proxy": null,
                "startup_script_timeout_seconds": null, "guest_files": [], "expose": []
            }))
            .expect("a spec"),
            credentials: leasehold_domain::vm::CredentialRef(uuid::Uuid::nil()),
            created_at: t0,
        });
        assert_eq!(verdict(&vm, t0 + TimeDelta::minutes(9), &policy), None);
        assert_eq!(verdict(&vm, t0 + TimeDelta::minutes(10), &policy), Some(StrikeReason::Idle));
        vm.last_activity = Some(t0 + TimeDelta::minutes(5));
        assert_eq!(
            verdict(&vm, t0 + TimeDelta::minutes(10), &policy),
            None,
            "activity resets idle"
        );
        assert_eq!(verdict(&vm, t0 + TimeDelta::hours(2), &policy), Some(StrikeReason::Stuck));
    }
}
