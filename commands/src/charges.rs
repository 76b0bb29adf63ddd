//! Workload quota charges (`leasehold_domain::workload_quota`). Every append that changes
//! what a workload holds ([`Aggregate::charge`]: a creation, an end, a migration's copy
//! taking over from its source) carries one `Apply` on the quota stream of each tenant and
//! kind it charges, with every change of the append in it, decided and appended like any
//! link: an admission (an append creating a workload) past a limit is refused
//! (`QUOTA_EXCEEDED`) with the whole command; a fact (a boot reported, a VM found missing) is
//! recorded whatever it comes to; a lost race on the quota stream decides everything again.
//! Being the pipeline's own, no command service can forget it, and a new kind is charged by
//! declaring its charge in the domain.
//!
//! A tenant's creations of one kind all append to one quota stream: a creation waits for that
//! stream's in-process lane (`lanes.rs`) before its first decision, and any other command
//! once it lost a race on that stream, so that a process's own commands take turns instead of
//! racing each other for the quota stream (a creation deciding without a turn could starve
//! one that waits, losing to it again and again).

use leasehold_domain::workload_quota::{
    ChargeChange, WorkloadKind, WorkloadQuota, WorkloadQuotaCommand,
};
use leasehold_domain::{Aggregate, StreamId, TenantId};

use crate::cross::{Link, LinkedCommand};
use crate::port::CommandStore;
use crate::quota::workload_quota_of;

/// One workload's charge changing in an append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Charged {
    pub tenant: TenantId,
    pub kind: WorkloadKind,
    pub change: ChargeChange,
    /// Whether the command that changed it creates the workload (an admission, which the
    /// limits may refuse) rather than records a fact about it.
    pub admission: bool,
}

/// The change of `stream`'s charge (owned by `tenant`) from `before` to `after`, if any; an
/// admission when the command that made it creates the workload.
pub(crate) fn charged<A: Aggregate>(
    tenant: &TenantId,
    (stream, admission): (&StreamId, bool),
    before: &A,
    after: &A,
) -> Option<Charged> {
    let kind = A::WORKLOAD?;
    let (before, charge) = (before.charge(), after.charge());
    if before == charge {
        return None;
    }
    let change = ChargeChange { workload: stream.to_string(), before, charge };
    Some(Charged { tenant: tenant.clone(), kind, change, admission })
}

/// One link per tenant and kind, each with that quota's changes in the order they came, an
/// admission when any of them is.
pub(crate) fn quota_links<S>(charges: Vec<Charged>) -> Vec<Box<dyn Link<S>>>
where
    S: CommandStore + Send + Sync,
{
    let mut grouped: Vec<(TenantId, WorkloadKind, Vec<ChargeChange>, bool)> = Vec::new();
    for Charged { tenant, kind, change, admission } in charges {
        match grouped.iter_mut().find(|(t, k, ..)| *t == tenant && *k == kind) {
            Some((_, _, changes, admits)) => {
                changes.push(change);
                *admits |= admission;
            }
            None => grouped.push((tenant, kind, vec![change], admission)),
        }
    }
    grouped
        .into_iter()
        .map(|(tenant, kind, changes, admission)| {
            let stream = workload_quota_of(&tenant, kind).stream_id();
            let command = WorkloadQuotaCommand::Apply { kind, changes, admission };
            let link = LinkedCommand::<WorkloadQuota>::new(stream, command, ()).owned_by(tenant);
            Box::new(link) as Box<dyn Link<S>>
        })
        .collect()
}
