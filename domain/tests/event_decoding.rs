//! Event decoding under hostile input: every kind's events, from any stored type and any
//! payload, decode or are refused with a typed error (never a panic), and the refusal never
//! quotes a value of the payload (a payload's values are tenants' data; the error goes to
//! operators' logs). A decoded event reads back the same from what it stores.
//!
//! CI runs proptest's default 256 cases a property; `PROPTEST_CASES=100000 cargo test -p
//! leasehold-domain --test event_decoding` is the long run.

use leasehold_domain::DomainEvent;
use proptest::prelude::*;
use serde_json::{Map, Value};

/// Every string value a payload holds starts with this: no field or variant name does.
const MARK: &str = "zq";

/// A string value, marked.
fn marked() -> impl Strategy<Value = String> {
    "[a-z0-9 \"`\\\\]{0,12}".prop_map(|rest| format!("{MARK}{rest}"))
}

/// Field names the kinds' events use, and some no event has.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "id",
            "lease_id",
            "vm_id",
            "host",
            "tenant",
            "reason",
            "at",
            "generation",
            "token",
            "size_bytes",
            "amount",
            "items",
            "state",
            "cause",
            "detail",
            "epoch",
            "node",
            "provider",
            "operation",
            "quantity",
            "sku",
            "limits",
            "run_id",
            "runner",
        ])
        .prop_map(str::to_owned),
        "[a-z_]{1,10}",
    ]
}

/// Any JSON value, strings marked.
fn payload() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        marked().prop_map(Value::String),
        // A UUID-shaped string and a timestamp-shaped one get past the first checks.
        "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
            .prop_map(|id| Value::String(format!("{MARK}{id}"))),
    ];
    leaf.prop_recursive(4, 48, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..8)
                .prop_map(|fields| Value::Object(fields.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A stored type: mostly one of `E`'s, else anything.
fn event_type<E: DomainEvent>() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(E::EVENT_TYPES).prop_map(str::to_owned),
        1 => "[A-Z][A-Za-y]{0,23}",
    ]
}

/// `E` decodes `(event_type, payload)` and stores it back the same, or refuses it quoting
/// no value of it.
fn decodes_or_refuses_quietly<E: DomainEvent>(
    event_type: &str,
    payload: &Value,
) -> Result<(), TestCaseError> {
    match E::from_stored(event_type, payload) {
        Ok(event) => {
            prop_assert_eq!(event.event_type(), event_type);
            let again = E::from_stored(event_type, &event.to_payload());
            prop_assert!(again.is_ok(), "what it stores reads back: {:?}", again.err());
        }
        Err(refused) => {
            prop_assert_eq!(&refused.event_type, event_type);
            prop_assert!(!refused.reason.contains(MARK), "a value quoted: {}", refused.reason);
        }
    }
    Ok(())
}

macro_rules! every_kind {
    ($($name:ident: $event:ty),+ $(,)?) => {
        proptest! {
            $(
                #[test]
                fn $name(event_type in event_type::<$event>(), payload in payload()) {
                    decodes_or_refuses_quietly::<$event>(&event_type, &payload)?;
                }
            )+
        }
    };
}

every_kind! {
    host_events: leasehold_domain::host::HostEvent,
    lease_events: leasehold_domain::lease::LeaseEvent,
    node_events: leasehold_domain::node::NodeEvent,
    quota_events: leasehold_domain::quota::QuotaEvent,
    rental_events: leasehold_domain::rental::RentalEvent,
    run_events: leasehold_domain::run::RunEvent,
    runner_events: leasehold_domain::runner::RunnerEvent,
    runner_capacity_events: leasehold_domain::runner_capacity::RunnerCapacityEvent,
    runner_job_events: leasehold_domain::runner_job::RunnerJobEvent,
    runner_node_events: leasehold_domain::runner_node::RunnerNodeEvent,
    snapshot_events: leasehold_domain::snapshot::SnapshotEvent,
    vm_events: leasehold_domain::vm::VmEvent,
    workload_quota_events: leasehold_domain::workload_quota::WorkloadQuotaEvent,
}

#[test]
fn a_refusal_names_the_fault_and_the_field_but_no_value() {
    use leasehold_domain::quota::QuotaEvent;
    let payload = serde_json::json!({ "tenant": 5, "limits": "zqsecret \"quoted\" `tick`" });
    let refused = QuotaEvent::from_stored("QuotaLimitsSet", &payload).expect_err("refused");
    assert!(!refused.reason.contains("zqsecret") && !refused.reason.contains('5'), "{refused}");
    assert!(refused.reason.contains("invalid type"), "{refused}");
}
