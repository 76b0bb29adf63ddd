//! The tenant quota's table, and its conservation over random command sequences.

use leasehold_domain::quota::{
    QuotaCommand as Q, QuotaError, QuotaLimit, QuotaLimits, QuotaUsage, SnapshotQuota,
};
use leasehold_domain::snapshot::SnapshotId;
use leasehold_domain::{Actor, Aggregate, Context, Refusal, RefusalKind, TenantId};
use proptest::prelude::*;
use uuid::Uuid;

fn ctx() -> Context<()> {
    Context {
        now: super::t(30),
        tenant: TenantId::parse("acme").expect("valid"),
        actor: Actor { subject: "ops".into(), role: "operator".into() },
        new_ids: Vec::new(),
        facts: (),
    }
}

fn snap(n: u128) -> SnapshotId {
    SnapshotId(Uuid::from_u128(n))
}

fn apply(quota: SnapshotQuota, command: &Q) -> Result<SnapshotQuota, QuotaError> {
    let events = quota.decide(command, &ctx())?;
    Ok(events.iter().fold(quota, |quota, event| quota.evolve(event)))
}

fn limited(max_count: u32, max_bytes: u64) -> SnapshotQuota {
    apply(SnapshotQuota::initial(), &Q::SetLimits { limits: QuotaLimits { max_count, max_bytes } })
        .expect("limits set")
}

#[test]
fn reservations_are_refused_at_the_count_limit() {
    let mut quota = limited(2, 0);
    for n in 1..=2 {
        quota = apply(quota, &Q::Reserve { snapshot: snap(n), bytes: 10 }).expect("room");
    }
    let refused = apply(quota.clone(), &Q::Reserve { snapshot: snap(3), bytes: 10 });
    assert_eq!(refused, Err(QuotaError::QuotaExceeded { limit: QuotaLimit::Count, max: 2 }));
    assert_eq!(
        QuotaError::QuotaExceeded { limit: QuotaLimit::Count, max: 2 }.kind(),
        RefusalKind::QuotaExceeded
    );
    // The same reservation again is a retry; another size for it a conflict.
    assert_eq!(quota.decide(&Q::Reserve { snapshot: snap(1), bytes: 10 }, &ctx()), Ok(Vec::new()));
    assert_eq!(
        quota.decide(&Q::Reserve { snapshot: snap(1), bytes: 11 }, &ctx()),
        Err(QuotaError::ReservationMismatch)
    );
    let released = apply(quota, &Q::Release { snapshot: snap(1) }).expect("released");
    assert_eq!(released.usage, QuotaUsage { count: 1, bytes: 10 });
    apply(released, &Q::Reserve { snapshot: snap(3), bytes: 10 }).expect("room again");
}

#[test]
fn reservations_are_refused_over_the_bytes_limit_and_settlement_is_recorded_whatever_it_comes_to() {
    let quota = limited(0, 100);
    let quota = apply(quota, &Q::Reserve { snapshot: snap(1), bytes: 60 }).expect("room");
    let over = apply(quota.clone(), &Q::Reserve { snapshot: snap(2), bytes: 41 });
    assert_eq!(over, Err(QuotaError::QuotaExceeded { limit: QuotaLimit::Bytes, max: 100 }));
    let quota = apply(quota, &Q::Reserve { snapshot: snap(2), bytes: 40 }).expect("exactly fits");
    // The honest size came out larger: recorded, and nothing more fits, not even 0 bytes.
    let quota = apply(quota, &Q::Settle { snapshot: snap(2), bytes: 70 }).expect("settled");
    assert_eq!(quota.usage, QuotaUsage { count: 2, bytes: 130 });
    let full = apply(quota.clone(), &Q::Reserve { snapshot: snap(3), bytes: 0 });
    assert_eq!(full, Err(QuotaError::QuotaExceeded { limit: QuotaLimit::Bytes, max: 100 }));
    // A settlement without a reservation is counted, never refused.
    let unreserved = apply(quota.clone(), &Q::Settle { snapshot: snap(9), bytes: 1 });
    assert_eq!(unreserved.map(|q| q.usage), Ok(QuotaUsage { count: 3, bytes: 131 }));
    assert_eq!(quota.decide(&Q::Settle { snapshot: snap(2), bytes: 70 }, &ctx()), Ok(Vec::new()));
    assert_eq!(
        quota.decide(&Q::Release { snapshot: snap(9) }, &ctx()),
        Ok(Vec::new()),
        "idempotent"
    );
}

#[test]
fn zero_disables_a_limit_and_unchanged_limits_record_nothing() {
    let mut quota = limited(0, 0);
    for n in 1..=50 {
        quota = apply(quota, &Q::Reserve { snapshot: snap(n), bytes: u64::MAX / 64 })
            .expect("no limit");
    }
    assert_eq!(quota.usage.count, 50);
    let same = Q::SetLimits { limits: QuotaLimits { max_count: 0, max_bytes: 0 } };
    assert_eq!(quota.decide(&same, &ctx()), Ok(Vec::new()));
}

fn command() -> impl Strategy<Value = Q> {
    let n = 1u128..10;
    prop_oneof![
        (0u32..6, 0u64..500).prop_map(|(max_count, max_bytes)| Q::SetLimits {
            limits: QuotaLimits { max_count, max_bytes }
        }),
        (n.clone(), 0u64..200).prop_map(|(n, bytes)| Q::Reserve { snapshot: snap(n), bytes }),
        (n.clone(), 0u64..200).prop_map(|(n, bytes)| Q::Settle { snapshot: snap(n), bytes }),
        n.prop_map(|n| Q::Release { snapshot: snap(n) }),
    ]
}

/// Whether a reservation of `bytes` has room under `quota`'s limits.
fn has_room(quota: &SnapshotQuota, bytes: u64) -> bool {
    let QuotaLimits { max_count, max_bytes } = quota.limits;
    let count = max_count == 0 || quota.usage.count < max_count;
    let within =
        max_bytes == 0 || (quota.usage.bytes < max_bytes && quota.usage.bytes + bytes <= max_bytes);
    count && within
}

proptest! {
    #[test]
    fn usage_is_the_sum_of_reservations_and_a_reservation_is_refused_exactly_when_no_room(
        commands in proptest::collection::vec(command(), 1..60)
    ) {
        let mut quota = SnapshotQuota::initial();
        for command in &commands {
            let before = quota.clone();
            let after = apply(quota.clone(), command);
            if let Q::Reserve { snapshot, bytes } = command {
                let new = !before.reservations.contains_key(snapshot);
                let exceeded = matches!(after, Err(QuotaError::QuotaExceeded { .. }));
                prop_assert_eq!(exceeded, new && !has_room(&before, *bytes), "{:?}", command);
            }
            let Ok(after) = after else { continue };
            quota = after;
            let count = u32::try_from(quota.reservations.len()).expect("small");
            let bytes: u64 = quota.reservations.values().sum();
            prop_assert_eq!(quota.usage, QuotaUsage { count, bytes });
        }
    }
}
