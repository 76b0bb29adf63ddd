//! `evolve` for the lease: folds one recorded event into the state. It holds no rules: every
//! decision was made by `decide` and is in the event; this only writes it down.

use chrono::{DateTime, Utc};

use super::{
    ChainState, Lease, LeaseEvent, LeaseStatus, LeaseTerms, Maintenance, MaintenanceKind,
    Retention, RetentionStatus, TerminalBudget,
};

pub(super) fn evolve(mut lease: Lease, event: &LeaseEvent) -> Lease {
    use LeaseEvent as E;
    match event {
        E::LeaseProvisionRequested { .. } | E::LeaseRestoreStarted { .. } => {
            return started(lease, event);
        }
        E::LeaseProvisioned { release, at } => {
            lease.status = LeaseStatus::Ready;
            promote(&mut lease, *release);
            clear_failure(&mut lease);
            lease.updated_at = Some(*at);
        }
        E::LeaseActivated { at } => set_chain(&mut lease, ChainState::Active, *at),
        E::LeaseProvisionFailed { reason, message, detail, release, at } => {
            failed(&mut lease, (reason, message, detail), *at);
            if release.is_some() {
                lease.deploying_release = None;
            }
        }
        E::LeaseRejected { at } => set_chain(&mut lease, ChainState::Rejected, *at),
        E::LeaseFailing { detail, at } => {
            lease.status = LeaseStatus::Failing;
            lease.last_error = Some(detail.clone());
            lease.updated_at = Some(*at);
        }
        E::LeaseFailed { reason, message, detail, at } => {
            failed(&mut lease, (reason, message, detail), *at);
        }
        E::LeaseRestartStarted { maintenance_id, admitted_at, generation } => {
            let pending = Maintenance {
                id: *maintenance_id,
                admitted_at: *admitted_at,
                kind: MaintenanceKind::Restart,
            };
            maintenance_started(&mut lease, pending, *generation);
        }
        E::LeaseUpdateStarted {
            maintenance_id,
            admitted_at,
            generation,
            payload_hash,
            release,
        } => {
            let pending = Maintenance {
                id: *maintenance_id,
                admitted_at: *admitted_at,
                kind: MaintenanceKind::Update,
            };
            maintenance_started(&mut lease, pending, *generation);
            lease.release_count = *release;
            lease.deploying_release = Some(*release);
            if let Some(terms) = &mut lease.terms {
                terms.payload_hash = Some(payload_hash.clone());
            }
        }
        E::LeaseMaintenanceSucceeded { release, at, .. } => {
            maintenance_settled(&mut lease, LeaseStatus::Ready, *at);
            promote(&mut lease, *release);
            clear_failure(&mut lease);
        }
        E::LeaseMaintenanceRecovered { reason, message, detail, release, at, .. } => {
            maintenance_settled(&mut lease, LeaseStatus::Ready, *at);
            if release.is_some() {
                lease.deploying_release = None;
            }
            lease.fail_count += 1;
            lease.reason = Some(reason.clone());
            lease.message = Some(message.clone());
            lease.last_error = Some(detail.clone());
        }
        E::LeaseMaintenanceFailed { reason, message, detail, release, at, .. } => {
            maintenance_settled(&mut lease, LeaseStatus::Failed, *at);
            if release.is_some() {
                lease.deploying_release = None;
            }
            failed(&mut lease, (reason, message, detail), *at);
        }
        E::LeaseDeprovisionRequested { generation, at } => {
            raise_generation(&mut lease, *generation);
            lease.status = LeaseStatus::Deprovisioning;
            lease.pending = None;
            lease.deploying_release = None;
            lease.updated_at = Some(*at);
        }
        E::LeaseDeprovisioned { retained, retained_until, at } => {
            lease.active_release = None;
            if *retained {
                lease.status = LeaseStatus::Retained;
                let status = RetentionStatus::Active;
                lease.retention = Some(Retention { status, retained_until: *retained_until });
            } else {
                lease.status = LeaseStatus::Deprovisioned;
            }
            lease.updated_at = Some(*at);
        }
        E::LeaseRetentionRestoring { into, at } => {
            set_retention(&mut lease, RetentionStatus::Restoring { into: *into }, *at);
        }
        E::LeaseRetentionRestoreRolledBack { at, .. } => {
            set_retention(&mut lease, RetentionStatus::Active, *at);
        }
        E::LeaseRetentionReaping { at, .. } => {
            set_retention(&mut lease, RetentionStatus::Reaping, *at);
        }
        E::LeaseRetentionConsumed { at, .. } | E::LeaseRetentionDeleted { at } => {
            assert!(lease.retention.is_some(), "a retained record ends only if it exists");
            lease.retention = None;
            lease.status = LeaseStatus::Deprovisioned;
            lease.updated_at = Some(*at);
        }
        E::LeaseCustomDomainSet { service, domain, at } => {
            let terms = lease.terms.as_mut().expect("a custom domain is set on a requested lease");
            let index = terms.items.find(service.as_ref()).expect("decide found the item");
            terms.items = terms.items.with_custom_domain(index, domain.clone());
            lease.updated_at = Some(*at);
        }
        E::LeaseTerminalBudgetObserved { verdict, consecutive_failures, at } => {
            let consecutive_failures = *consecutive_failures;
            lease.terminal_budget =
                Some(TerminalBudget { verdict: *verdict, consecutive_failures });
            lease.updated_at = Some(*at);
        }
        E::LeaseClosedForFailure { at, .. } | E::LeaseClosed { at, .. } => {
            set_chain(&mut lease, ChainState::Closed, *at);
        }
        E::LeaseExpired { at } => set_chain(&mut lease, ChainState::Expired, *at),
        E::LeaseDispatched { at, .. } | E::LeaseDispatchFailed { at, .. } => {
            lease.updated_at = Some(*at);
        }
    }
    lease
}

/// A provision request or a restore: the lease's terms are set (on the first) and backend work
/// starts under a new generation.
fn started(mut lease: Lease, event: &LeaseEvent) -> Lease {
    match event {
        LeaseEvent::LeaseProvisionRequested {
            lease: id,
            provider,
            items,
            payload_hash,
            backend,
            generation,
            release,
            at,
            operation,
        } => {
            raise_generation(&mut lease, *generation);
            lease.operation = *operation;
            let created_at = lease.terms.as_ref().map_or(*at, |terms| terms.created_at);
            let restored_from = lease.terms.as_ref().and_then(|terms| terms.restored_from);
            lease.terms = Some(LeaseTerms {
                id: *id,
                provider: *provider,
                items: items.clone(),
                payload_hash: Some(payload_hash.clone()),
                backend: backend.clone(),
                created_at,
                restored_from,
            });
            lease.status = LeaseStatus::Provisioning;
            lease.release_count = *release;
            lease.deploying_release = Some(*release);
            lease.updated_at = Some(*at);
        }
        LeaseEvent::LeaseRestoreStarted {
            lease: id,
            from,
            provider,
            items,
            backend,
            generation,
            at,
            operation,
        } => {
            raise_generation(&mut lease, *generation);
            lease.operation = *operation;
            lease.terms = Some(LeaseTerms {
                id: *id,
                provider: *provider,
                items: items.clone(),
                payload_hash: None,
                backend: backend.clone(),
                created_at: *at,
                restored_from: Some(*from),
            });
            lease.status = LeaseStatus::Restarting;
            lease.updated_at = Some(*at);
        }
        _ => unreachable!("started() is called only for the two starting events"),
    }
    lease
}

fn raise_generation(lease: &mut Lease, generation: u64) {
    assert!(generation > lease.generation, "generations only rise");
    lease.generation = generation;
}

fn set_chain(lease: &mut Lease, chain: ChainState, at: DateTime<Utc>) {
    assert!(!lease.chain.is_terminal(), "a terminal chain state never changes");
    lease.chain = chain;
    lease.updated_at = Some(at);
}

fn set_retention(lease: &mut Lease, status: RetentionStatus, at: DateTime<Utc>) {
    let retention = lease.retention.as_mut().expect("only a retained lease changes retention");
    retention.status = status;
    lease.updated_at = Some(at);
}

/// The deploying release becomes the running one; the one it replaces is superseded.
fn promote(lease: &mut Lease, release: Option<u32>) {
    if let Some(release) = release {
        lease.active_release = Some(release);
        lease.deploying_release = None;
    }
}

fn clear_failure(lease: &mut Lease) {
    lease.reason = None;
    lease.message = None;
}

fn failed(
    lease: &mut Lease,
    (reason, message, detail): (&super::Reason, &super::TenantMessage, &super::OperatorDetail),
    at: DateTime<Utc>,
) {
    lease.status = LeaseStatus::Failed;
    lease.fail_count += 1;
    lease.reason = Some(reason.clone());
    lease.message = Some(message.clone());
    lease.last_error = Some(detail.clone());
    lease.updated_at = Some(at);
}

fn maintenance_started(lease: &mut Lease, pending: Maintenance, generation: u64) {
    raise_generation(lease, generation);
    lease.operation = Some(pending.id.into());
    lease.status = match pending.kind {
        MaintenanceKind::Restart => LeaseStatus::Restarting,
        MaintenanceKind::Update => LeaseStatus::Updating,
    };
    lease.updated_at = Some(pending.admitted_at);
    lease.pending = Some(pending);
}

fn maintenance_settled(lease: &mut Lease, status: LeaseStatus, at: DateTime<Utc>) {
    let pending = lease.pending.take().expect("a completion settles a pending maintenance");
    lease.last_settled = Some((pending.id, pending.admitted_at));
    lease.status = status;
    lease.updated_at = Some(at);
}
