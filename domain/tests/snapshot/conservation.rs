//! Quota conservation over random sequences of snapshot commands, each with the quota command
//! its decision carries (`quota_effect`) decided on the tenant's quota and committed with it
//! or not at all, as the service's linked append does: at every step the quota holds exactly
//! one reservation per snapshot that counts, of that snapshot's size, its usage is their sum,
//! and no limit is ever passed. (The agents' honest sizes here never exceed the estimates, so
//! no settlement raises usage; a larger honest size is recorded whatever it is, by design.)

use std::collections::BTreeMap;

use leasehold_domain::Aggregate;
use leasehold_domain::quota::{QuotaCommand, QuotaLimits, QuotaUsage, SnapshotQuota};
use leasehold_domain::snapshot::{
    DeleteCause, ReportedSizes, RequestedKind, Snapshot, SnapshotCommand as C, SnapshotId,
    SnapshotKind, SnapshotMode, Written, quota_effect,
};
use leasehold_domain::values::{OperationId, OperatorDetail};
use leasehold_domain::vm::SnapshotRef;
use proptest::prelude::*;
use uuid::Uuid;

use super::{ctx, running, terms};

/// What the sequence does to snapshot `n`; reports name its current operation.
#[derive(Debug, Clone)]
enum Action {
    Create { n: u128, estimate: u64, build: bool },
    Confirm { n: u128, share: u64 },
    Fail { n: u128 },
    Restore { n: u128 },
    ConfirmRestore { n: u128 },
    FailRestore { n: u128 },
    Delete { n: u128 },
    ConfirmDeleted { n: u128 },
    FailDelete { n: u128 },
    SetLimits { max_count: u32, max_bytes: u64 },
}

fn action() -> impl Strategy<Value = Action> {
    let n = 1u128..6;
    prop_oneof![
        (n.clone(), 0u64..400, any::<bool>()).prop_map(|(n, estimate, build)| Action::Create {
            n,
            estimate,
            build: build && n == 5
        }),
        (n.clone(), 0u64..=100).prop_map(|(n, share)| Action::Confirm { n, share }),
        n.clone().prop_map(|n| Action::Fail { n }),
        n.clone().prop_map(|n| Action::Restore { n }),
        n.clone().prop_map(|n| Action::ConfirmRestore { n }),
        n.clone().prop_map(|n| Action::FailRestore { n }),
        n.clone().prop_map(|n| Action::Delete { n }),
        n.clone().prop_map(|n| Action::ConfirmDeleted { n }),
        n.prop_map(|n| Action::FailDelete { n }),
        (0u32..5, 0u64..1_200)
            .prop_map(|(max_count, max_bytes)| Action::SetLimits { max_count, max_bytes }),
    ]
}

fn id(n: u128) -> SnapshotId {
    SnapshotId(Uuid::from_u128(n))
}

/// The snapshot command `action` is, on `stored` (the current operation for reports); `step`
/// makes fresh operations unique.
fn command_of(action: &Action, stored: &Snapshot, step: u128) -> C {
    let current = stored.operation.unwrap_or(OperationId(Uuid::nil()));
    let fresh = OperationId(Uuid::from_u128(10_000 + step));
    let detail = || OperatorDetail::new("failed");
    match *action {
        Action::Create { n, estimate, build } => {
            let mode = if build { SnapshotMode::Build } else { SnapshotMode::Manual };
            let mut asked = terms(mode, RequestedKind::Disk);
            asked.snapshot = id(n);
            asked.estimate_bytes = estimate;
            C::Create { terms: Box::new(asked), operation: fresh }
        }
        Action::Confirm { share, .. } => {
            // The honest size is a share of the estimate: never above it.
            let estimate = stored.terms.as_ref().map_or(0, |terms| terms.estimate_bytes);
            let written = Written {
                kind: SnapshotKind::Disk,
                sizes: ReportedSizes { disk_bytes: estimate * share / 100, memory_bytes: 0 },
                digest: None,
                store_ref: SnapshotRef::parse("ref", "snap-1").expect("valid"),
                diff_of: None,
            };
            C::Confirm { operation: current, written }
        }
        Action::Fail { .. } => C::Fail { operation: current, detail: detail() },
        Action::Restore { .. } => C::Restore { vm: super::vm(), operation: fresh },
        Action::ConfirmRestore { .. } => C::ConfirmRestore { operation: current },
        Action::FailRestore { .. } => {
            C::FailRestore { operation: current, missing: step.is_multiple_of(2), detail: detail() }
        }
        Action::Delete { .. } => C::Delete { operation: fresh, cause: DeleteCause::Tenant },
        Action::ConfirmDeleted { .. } => {
            C::ConfirmDeleted { operation: current, not_found: step.is_multiple_of(2) }
        }
        Action::FailDelete { .. } => C::FailDelete { operation: current, detail: detail() },
        Action::SetLimits { .. } => unreachable!("a quota command"),
    }
}

/// Decides `command` on `quota`; the quota after it, or `None` when refused.
fn on_quota(quota: &SnapshotQuota, command: &QuotaCommand) -> Option<SnapshotQuota> {
    let events = quota.decide(command, &super::quota_ctx()).ok()?;
    Some(events.iter().fold(quota.clone(), |quota, event| quota.evolve(event)))
}

proptest! {
    #[test]
    fn the_quota_holds_one_reservation_per_counted_snapshot_and_never_passes_a_limit(
        actions in proptest::collection::vec(action(), 1..80)
    ) {
        let mut quota = SnapshotQuota::initial();
        let mut snapshots: BTreeMap<u128, Snapshot> = BTreeMap::new();
        for (step, action) in actions.iter().enumerate() {
            if let Action::SetLimits { max_count, max_bytes } = *action {
                let limits = QuotaLimits { max_count, max_bytes };
                quota = on_quota(&quota, &QuotaCommand::SetLimits { limits }).expect("never refused");
                continue;
            }
            let n = match *action {
                Action::Create { n, .. } | Action::Confirm { n, .. } | Action::Fail { n }
                | Action::Restore { n } | Action::ConfirmRestore { n } | Action::FailRestore { n }
                | Action::Delete { n } | Action::ConfirmDeleted { n } | Action::FailDelete { n } => n,
                Action::SetLimits { .. } => unreachable!(),
            };
            let before = snapshots.get(&n).cloned().unwrap_or_else(Snapshot::initial);
            let command = command_of(action, &before, step as u128);
            let Ok(events) = before.decide(&command, &ctx(running())) else { continue };
            // The linked quota command, committed with the snapshot's events or neither.
            let linked = quota_effect(&before, &events);
            let limits_before = quota.limits;
            let usage_before = quota.usage;
            if let Some(effect) = &linked {
                let Some(after) = on_quota(&quota, effect) else { continue };
                quota = after;
            }
            let after = events.iter().fold(before, |state, event| state.evolve(event));
            snapshots.insert(n, after);
            // One reservation per counted snapshot, of its size.
            let counted: BTreeMap<SnapshotId, u64> = snapshots
                .iter()
                .filter(|(_, snapshot)| snapshot.counts())
                .map(|(n, snapshot)| (id(*n), snapshot.size_bytes))
                .collect();
            prop_assert_eq!(&quota.reservations, &counted, "after {:?}", action);
            let count = u32::try_from(counted.len()).expect("small");
            prop_assert_eq!(quota.usage, QuotaUsage { count, bytes: counted.values().sum() });
            // A limit is never passed by a step that raised usage.
            let QuotaLimits { max_count, max_bytes } = limits_before;
            if quota.usage.count > usage_before.count {
                prop_assert!(max_count == 0 || quota.usage.count <= max_count, "{:?}", quota);
            }
            if quota.usage.bytes > usage_before.bytes {
                prop_assert!(max_bytes == 0 || quota.usage.bytes <= max_bytes, "{:?}", quota);
            }
        }
    }
}
