//! `decide` for the lease: one function per command, each following its rows of the
//! transition table in `lease.rs`.

use chrono::{DateTime, Timelike, Utc};

use super::{
    ChainState, DispatchAnswer, Lease, LeaseCommand, LeaseError, LeaseEvent, LeaseFacts,
    LeaseItems, LeaseStatus, MaintenanceId, MaintenanceOutcome, OperationId, OperatorDetail,
    PayloadHash, ProviderId, Reason, RetentionStatus, TenantMessage, TerminalVerdict,
};
use crate::aggregate::Context;
use crate::lease::{CloseCause, HostName, LeaseId, MaintenanceKind, ReapCause, ServiceName};

type Decision = Result<Vec<LeaseEvent>, LeaseError>;

/// Nothing to append: the command repeats what is already true.
const NO_CHANGE: Decision = Ok(Vec::new());

pub(super) fn decide(lease: &Lease, command: &LeaseCommand, ctx: &Context<LeaseFacts>) -> Decision {
    let at = ctx.now;
    if lease.status == LeaseStatus::None
        && !matches!(command, LeaseCommand::RequestProvision { .. } | LeaseCommand::Restore { .. })
    {
        return Err(LeaseError::NotFound);
    }
    if let Some(operation) = command.reported_operation()
        && lease.operation.is_some_and(|current| current != operation)
        && !lease.status.is_gone()
    {
        return Err(LeaseError::Fenced);
    }
    let refuse = || invalid(lease, command);
    match command {
        LeaseCommand::RequestProvision { lease: id, provider, items, payload_hash, operation } => {
            let terms = (*id, *provider, items, payload_hash);
            request_provision(lease, command, terms, *operation, ctx)
        }
        LeaseCommand::ReportProvisioned { .. } => report_provisioned(lease, at).ok_or_else(refuse),
        LeaseCommand::ReportFailed { reason, message, detail, .. } => {
            report_failed(lease, (reason, message, detail), at).ok_or_else(refuse)
        }
        LeaseCommand::ReportContainerDied { detail, .. } => match lease.status {
            LeaseStatus::Ready => Ok(vec![LeaseEvent::LeaseFailing { detail: detail.clone(), at }]),
            LeaseStatus::Failing | LeaseStatus::Failed => NO_CHANGE,
            status if status.is_gone() => NO_CHANGE,
            _ => Err(refuse()),
        },
        LeaseCommand::Restart { maintenance_id } => {
            start_maintenance(lease, command, *maintenance_id, None, at)
        }
        LeaseCommand::Update { maintenance_id, payload_hash } => {
            start_maintenance(lease, command, *maintenance_id, Some(payload_hash), at)
        }
        LeaseCommand::CompleteMaintenance { maintenance_id, admitted_at, outcome } => {
            complete_maintenance(lease, (*maintenance_id, *admitted_at), outcome, at)
        }
        LeaseCommand::Deprovision => Ok(deprovision(lease, at)),
        LeaseCommand::ConfirmDeprovisioned { retained, .. } => {
            confirm_deprovisioned(lease, command, *retained, ctx)
        }
        LeaseCommand::Restore { lease: id, from, provider, items, operation } => {
            restore(lease, command, (*id, *from, *provider, items), *operation, ctx)
        }
        LeaseCommand::BeginRestore { into } => match lease.retention.map(|r| r.status) {
            Some(RetentionStatus::Active) => {
                Ok(vec![LeaseEvent::LeaseRetentionRestoring { into: *into, at }])
            }
            _ => Err(LeaseError::RetainedNotRestorable),
        },
        LeaseCommand::FinishRestore { into, committed } => {
            finish_restore(lease, *into, *committed, at)
        }
        LeaseCommand::Reap { cause } => reap(lease, command, *cause, at),
        LeaseCommand::ConfirmReaped => match lease.retention.map(|r| r.status) {
            Some(RetentionStatus::Reaping) => Ok(vec![LeaseEvent::LeaseRetentionDeleted { at }]),
            _ => Err(refuse()),
        },
        LeaseCommand::SetCustomDomain { service, domain } => {
            set_custom_domain(lease, command, service.as_ref(), domain.as_ref(), at)
        }
        LeaseCommand::ObserveTerminalBudget {
            verdict,
            consecutive_failures,
            complete_inventory,
        } => {
            if !complete_inventory || lease.status.is_gone() {
                return NO_CHANGE;
            }
            Ok(observe_budget(lease, *verdict, *consecutive_failures, at))
        }
        LeaseCommand::Close { cause } => close(lease, command, *cause, at),
        LeaseCommand::Expire => match lease.chain {
            ChainState::Active if !lease.status.is_gone() => Ok(vec![
                LeaseEvent::LeaseExpired { at },
                LeaseEvent::LeaseDeprovisionRequested { generation: lease.generation + 1, at },
            ]),
            ChainState::Active => Ok(vec![LeaseEvent::LeaseExpired { at }]),
            ChainState::Expired => NO_CHANGE,
            _ => Err(refuse()),
        },
        LeaseCommand::RecordDispatch { generation, attempt, answer } => {
            record_dispatch(lease, (*generation, *attempt), answer, at)
        }
    }
}

/// One dispatch attempt's answer. Only the current work's answer counts: a newer command has
/// started other work, whose own dispatch is recorded under its own generation.
fn record_dispatch(
    lease: &Lease,
    (generation, attempt): (u64, u32),
    answer: &DispatchAnswer,
    at: DateTime<Utc>,
) -> Decision {
    if generation != lease.generation {
        return NO_CHANGE;
    }
    match answer {
        DispatchAnswer::Accepted => {
            Ok(vec![LeaseEvent::LeaseDispatched { generation, attempt, at }])
        }
        DispatchAnswer::Failed { detail } => Ok(vec![LeaseEvent::LeaseDispatchFailed {
            generation,
            attempt,
            detail: detail.clone(),
            at,
        }]),
        DispatchAnswer::Refused { reason, message, detail } => match lease.pending {
            // A refused restart or update never started: it settles as failed, so the tenant
            // sees why and may try again.
            Some(pending)
                if matches!(lease.status, LeaseStatus::Restarting | LeaseStatus::Updating) =>
            {
                let outcome = MaintenanceOutcome::Failed {
                    reason: reason.clone(),
                    message: message.clone(),
                    detail: detail.clone(),
                };
                complete_maintenance(lease, (pending.id, Some(pending.admitted_at)), &outcome, at)
            }
            _ if lease.status == LeaseStatus::Provisioning
                || lease.status == LeaseStatus::Restarting =>
            {
                Ok(report_failed(lease, (reason, message, detail), at).unwrap_or_default())
            }
            _ => NO_CHANGE,
        },
    }
}

fn invalid(lease: &Lease, command: &LeaseCommand) -> LeaseError {
    LeaseError::InvalidState { command: command.name(), status: lease.status, chain: lease.chain }
}

fn request_provision(
    lease: &Lease,
    command: &LeaseCommand,
    (id, provider, items, payload_hash): (LeaseId, ProviderId, &LeaseItems, &PayloadHash),
    operation: OperationId,
    ctx: &Context<LeaseFacts>,
) -> Decision {
    let retry = match lease.status {
        // While provisioning, the same request again is a no-op, and a contradicting one a
        // conflict (checked below, with the recorded terms).
        LeaseStatus::None | LeaseStatus::Provisioning => false,
        LeaseStatus::Failing | LeaseStatus::Failed if !lease.chain.is_terminal() => true,
        _ => return Err(invalid(lease, command)),
    };
    if let Some(terms) = &lease.terms
        && (terms.id != id
            || terms.provider != provider
            || terms.items.shape() != items.shape()
            || terms.items.skus() != items.skus()
            || terms.payload_hash.as_ref() != Some(payload_hash))
    {
        return Err(LeaseError::ProvisionMismatch);
    }
    if lease.status == LeaseStatus::Provisioning {
        return NO_CHANGE;
    }
    let backend = match (&lease.terms, &ctx.facts.backend) {
        (Some(terms), _) if retry => terms.backend.clone(),
        (_, Some(backend)) => backend.clone(),
        (_, None) => {
            let sku = items.as_slice()[0].sku.clone();
            return Err(LeaseError::NoBackend { sku });
        }
    };
    // A retry keeps the lease's items as recorded, custom domains included.
    let items = lease.terms.as_ref().map_or_else(|| items.clone(), |terms| terms.items.clone());
    Ok(vec![LeaseEvent::LeaseProvisionRequested {
        lease: id,
        provider,
        items,
        payload_hash: payload_hash.clone(),
        backend,
        generation: lease.generation + 1,
        release: lease.release_count + 1,
        at: ctx.now,
        operation: Some(operation),
    }])
}

/// `None` when the status does not allow the report.
fn report_provisioned(lease: &Lease, at: DateTime<Utc>) -> Option<Vec<LeaseEvent>> {
    let restoring = lease.status == LeaseStatus::Restarting && lease.pending.is_none();
    match lease.status {
        LeaseStatus::Provisioning => {}
        LeaseStatus::Restarting if restoring => {}
        LeaseStatus::Ready => return Some(Vec::new()),
        status if status.is_gone() => return Some(Vec::new()),
        _ => return None,
    }
    let mut events = vec![LeaseEvent::LeaseProvisioned { release: lease.deploying_release, at }];
    if lease.chain == ChainState::Pending {
        events.push(LeaseEvent::LeaseActivated { at });
    }
    Some(events)
}

/// `None` when the status does not allow the report.
fn report_failed(
    lease: &Lease,
    (reason, message, detail): (&Reason, &TenantMessage, &OperatorDetail),
    at: DateTime<Utc>,
) -> Option<Vec<LeaseEvent>> {
    let (reason, message, detail) = (reason.clone(), message.clone(), detail.clone());
    let restoring = lease.status == LeaseStatus::Restarting && lease.pending.is_none();
    match lease.status {
        LeaseStatus::Provisioning => {}
        LeaseStatus::Restarting if restoring => {}
        LeaseStatus::Ready | LeaseStatus::Failing => {
            return Some(vec![LeaseEvent::LeaseFailed { reason, message, detail, at }]);
        }
        LeaseStatus::Failed => return Some(Vec::new()),
        status if status.is_gone() => return Some(Vec::new()),
        _ => return None,
    }
    let release = lease.deploying_release;
    let mut events =
        vec![LeaseEvent::LeaseProvisionFailed { reason, message, detail, release, at }];
    if lease.chain == ChainState::Pending {
        events.push(LeaseEvent::LeaseRejected { at });
    }
    Some(events)
}

fn start_maintenance(
    lease: &Lease,
    command: &LeaseCommand,
    maintenance_id: MaintenanceId,
    update: Option<&PayloadHash>,
    at: DateTime<Utc>,
) -> Decision {
    let startable =
        matches!(lease.status, LeaseStatus::Ready | LeaseStatus::Failing | LeaseStatus::Failed);
    if !startable || lease.chain.is_terminal() {
        return Err(invalid(lease, command));
    }
    let generation = lease.generation + 1;
    // The admission stamp is the decision's time: every replay of this command's completion
    // must echo it, so a completion of an older command with a reused id cannot settle it.
    let at = fresh_stamp(lease, at);
    Ok(vec![match update {
        None => LeaseEvent::LeaseRestartStarted { maintenance_id, admitted_at: at, generation },
        Some(payload_hash) => LeaseEvent::LeaseUpdateStarted {
            maintenance_id,
            admitted_at: at,
            generation,
            payload_hash: payload_hash.clone(),
            release: lease.release_count + 1,
        },
    }])
}

fn complete_maintenance(
    lease: &Lease,
    fence: (MaintenanceId, Option<DateTime<Utc>>),
    outcome: &MaintenanceOutcome,
    at: DateTime<Utc>,
) -> Decision {
    if lease.status.is_gone() {
        return NO_CHANGE;
    }
    // A backend that predates admission stamps echoes none: the id alone must match.
    let same = |(id, admitted_at): (MaintenanceId, DateTime<Utc>)| {
        id == fence.0
            && fence.1.is_none_or(|echoed| admission_stamp(admitted_at) == admission_stamp(echoed))
    };
    let pending = match lease.pending {
        Some(pending) if same((pending.id, pending.admitted_at)) => pending,
        // A repeated report of the completion that settled the last command, with nothing
        // newer pending, changes nothing. With a newer command pending it is stale: fenced.
        None if lease.last_settled.is_some_and(same) => return NO_CHANGE,
        _ => return Err(LeaseError::Fenced),
    };
    let maintenance_id = pending.id;
    let release = match pending.kind {
        MaintenanceKind::Update => lease.deploying_release,
        MaintenanceKind::Restart => None,
    };
    Ok(vec![match outcome.clone() {
        MaintenanceOutcome::Succeeded => {
            LeaseEvent::LeaseMaintenanceSucceeded { maintenance_id, release, at }
        }
        MaintenanceOutcome::Recovered { reason, message, detail } => {
            LeaseEvent::LeaseMaintenanceRecovered {
                maintenance_id,
                reason,
                message,
                detail,
                release,
                at,
            }
        }
        MaintenanceOutcome::Failed { reason, message, detail } => {
            LeaseEvent::LeaseMaintenanceFailed {
                maintenance_id,
                reason,
                message,
                detail,
                release,
                at,
            }
        }
    }])
}

fn confirm_deprovisioned(
    lease: &Lease,
    command: &LeaseCommand,
    retained: bool,
    ctx: &Context<LeaseFacts>,
) -> Decision {
    match lease.status {
        LeaseStatus::Deprovisioning => {}
        LeaseStatus::Deprovisioned | LeaseStatus::Retained => return NO_CHANGE,
        _ => return Err(invalid(lease, command)),
    }
    let created_at = lease.terms.as_ref().map(|terms| terms.created_at);
    let retained_until = match (retained, created_at, ctx.facts.retention_max_age) {
        (true, Some(created_at), Some(max_age)) => created_at.checked_add_signed(max_age),
        _ => None,
    };
    Ok(vec![LeaseEvent::LeaseDeprovisioned { retained, retained_until, at: ctx.now }])
}

fn restore(
    lease: &Lease,
    command: &LeaseCommand,
    (id, from, provider, items): (LeaseId, LeaseId, Option<ProviderId>, &LeaseItems),
    operation: OperationId,
    ctx: &Context<LeaseFacts>,
) -> Decision {
    if lease.status != LeaseStatus::None {
        return Err(invalid(lease, command));
    }
    // Another tenant's retained lease is not found, never "forbidden": that would confirm it.
    let source = match &ctx.facts.retained_source {
        Some(source) if source.same_tenant && source.lease.status == LeaseStatus::Retained => {
            &source.lease
        }
        _ => return Err(LeaseError::RetainedNotFound),
    };
    let (Some(terms), Some(retention)) = (&source.terms, source.retention) else {
        return Err(LeaseError::RetainedNotFound);
    };
    if terms.id != from {
        return Err(LeaseError::RetainedNotFound);
    }
    if retention.status != RetentionStatus::Active {
        return Err(LeaseError::RetainedNotRestorable);
    }
    if provider.is_some_and(|provider| provider != terms.provider) {
        return Err(LeaseError::ProviderMismatch);
    }
    if items.shape() != terms.items.shape() {
        return Err(LeaseError::ItemShapeMismatch);
    }
    // Another SKU tier of the same shape is the backend's to judge: a promote always fits, a
    // demote only if the retained data it measures does (else `422 demote_exceeds_tier`,
    // which fails this restore with reason `DemoteExceedsTier`).
    Ok(vec![LeaseEvent::LeaseRestoreStarted {
        lease: id,
        from,
        provider: terms.provider,
        items: items.clone(),
        backend: terms.backend.clone(),
        generation: lease.generation + 1,
        at: ctx.now,
        operation: Some(operation),
    }])
}

fn finish_restore(lease: &Lease, into: LeaseId, committed: bool, at: DateTime<Utc>) -> Decision {
    match lease.retention.map(|r| r.status) {
        Some(RetentionStatus::Restoring { into: restoring }) if restoring == into => {
            Ok(vec![if committed {
                LeaseEvent::LeaseRetentionConsumed { into, at }
            } else {
                LeaseEvent::LeaseRetentionRestoreRolledBack { into, at }
            }])
        }
        _ => Err(LeaseError::Fenced),
    }
}

fn reap(lease: &Lease, command: &LeaseCommand, cause: ReapCause, at: DateTime<Utc>) -> Decision {
    match lease.retention.map(|r| r.status) {
        Some(RetentionStatus::Active) => Ok(vec![LeaseEvent::LeaseRetentionReaping { cause, at }]),
        Some(RetentionStatus::Reaping) => NO_CHANGE,
        _ => Err(invalid(lease, command)),
    }
}

fn set_custom_domain(
    lease: &Lease,
    command: &LeaseCommand,
    service: Option<&ServiceName>,
    domain: Option<&HostName>,
    at: DateTime<Utc>,
) -> Decision {
    let Some(terms) = lease.terms.as_ref().filter(|_| lease.status.is_live()) else {
        return Err(invalid(lease, command));
    };
    if lease.chain.is_terminal() {
        return Err(invalid(lease, command));
    }
    let Some(index) = terms.items.find(service) else {
        return Err(LeaseError::ItemNotFound { service: service.cloned() });
    };
    if terms.items.as_slice()[index].custom_domain.as_ref() == domain {
        return NO_CHANGE;
    }
    Ok(vec![LeaseEvent::LeaseCustomDomainSet {
        service: service.cloned(),
        domain: domain.cloned(),
        at,
    }])
}

fn observe_budget(
    lease: &Lease,
    verdict: TerminalVerdict,
    consecutive_failures: u32,
    at: DateTime<Utc>,
) -> Vec<LeaseEvent> {
    let mut events = Vec::new();
    let observed = super::TerminalBudget { verdict, consecutive_failures };
    if lease.terminal_budget != Some(observed) {
        events.push(LeaseEvent::LeaseTerminalBudgetObserved { verdict, consecutive_failures, at });
    }
    let exhausted = verdict == TerminalVerdict::Exhausted && consecutive_failures >= 1;
    if exhausted && lease.status == LeaseStatus::Failed && lease.chain == ChainState::Active {
        events.push(LeaseEvent::LeaseClosedForFailure { consecutive_failures, at });
        // Closed for good: what the backend still holds for the failed lease is released.
        let generation = lease.generation + 1;
        events.push(LeaseEvent::LeaseDeprovisionRequested { generation, at });
    }
    events
}

/// A tenant releases its lease: the backend is asked to release it, and the lease ends on the
/// chain (closed by its tenant; rejected if never acknowledged). A lease released before
/// this rule, whose chain was left active, is closed when asked again.
fn deprovision(lease: &Lease, at: DateTime<Utc>) -> Vec<LeaseEvent> {
    let mut events = Vec::new();
    if !lease.status.is_gone() {
        let generation = lease.generation + 1;
        events.push(LeaseEvent::LeaseDeprovisionRequested { generation, at });
    }
    match lease.chain {
        ChainState::Active => {
            events.push(LeaseEvent::LeaseClosed { cause: CloseCause::Tenant, at })
        }
        ChainState::Pending => events.push(LeaseEvent::LeaseRejected { at }),
        _ => {}
    }
    events
}

/// Closing a lease on the chain also releases what its backend holds.
fn close(lease: &Lease, command: &LeaseCommand, cause: CloseCause, at: DateTime<Utc>) -> Decision {
    let mut events = match lease.chain {
        ChainState::Active => vec![LeaseEvent::LeaseClosed { cause, at }],
        ChainState::Closed => Vec::new(),
        _ => return Err(invalid(lease, command)),
    };
    if !lease.status.is_gone() {
        let generation = lease.generation + 1;
        events.push(LeaseEvent::LeaseDeprovisionRequested { generation, at });
    }
    Ok(events)
}

/// An admission stamp is issued in whole seconds and compared at that precision: backends
/// echo it as RFC 3339 text, often without a fraction, and a stamp compared to the
/// microsecond fenced every such completion for ever. (Stamps stored to the microsecond
/// before this rule compare by their second too.)
fn admission_stamp(at: DateTime<Utc>) -> DateTime<Utc> {
    at.with_nanosecond(0).unwrap_or(at)
}

/// The stamp of a new maintenance: the decision's second, or, when the last settled
/// maintenance (whatever its id) was stamped in that second or later, the second after it.
/// Stamps of one lease thus only increase, so `(id, stamp)` never repeats and a repeated old
/// completion never settles a new one, even with ids reused in turn within one second.
fn fresh_stamp(lease: &Lease, at: DateTime<Utc>) -> DateTime<Utc> {
    let at = admission_stamp(at);
    match lease.last_settled {
        Some((_, last)) if admission_stamp(last) >= at => {
            admission_stamp(last) + chrono::TimeDelta::seconds(1)
        }
        _ => at,
    }
}
