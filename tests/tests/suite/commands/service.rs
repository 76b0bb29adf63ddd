//! The lease command service every caller goes through (resolvers and callbacks): ids minted
//! from the tenant and the key, the owner looked up for machine actors, a provider-bound actor
//! finding only its provider's leases, and each caller's keys in its own namespace.

use leasehold_commands::lease_input::{ItemInput, LeaseInputLimits, RequestLeaseInput};
use leasehold_commands::lease_service::{Caller, LeaseService};
use leasehold_commands::{CommandError, PipelineConfig};
use leasehold_domain::lease::{LeaseCommand, OperationId, ProviderId, ServiceName};
use leasehold_domain::{Actor, KeyNamespace, TenantId};
use leasehold_tests::TestDb;
use uuid::Uuid;

use super::support::pipeline_with;

const PROVIDER: Uuid = Uuid::from_u128(7);

fn service(db: &TestDb) -> LeaseService<leasehold_adapters::PgEventStore> {
    let backend = ServiceName::parse("backend", "docker-1").expect("valid");
    let pipeline = pipeline_with(db, PipelineConfig::default());
    LeaseService::new(pipeline, Some(backend), LeaseInputLimits::default())
}

fn caller(subject: &str, role: &str, tenant: Option<&str>, provider: Option<Uuid>) -> Caller {
    Caller {
        actor: Actor { subject: subject.into(), role: role.into() },
        tenant: tenant.map(|name| TenantId::parse(name).expect("valid")),
        provider: provider.map(ProviderId),
        namespace: None,
    }
}

fn input() -> RequestLeaseInput {
    RequestLeaseInput {
        provider_id: PROVIDER.to_string(),
        items: vec![ItemInput { sku: "gpu.h100.1x".into(), quantity: 1, service_name: None }],
        payload_hash: "ab".repeat(32),
    }
}

#[tokio::test]
async fn a_retry_names_the_same_lease_and_machine_actors_act_for_its_owner() {
    let db = TestDb::migrated().await;
    let leases = service(&db);
    let acme = caller("alice", "tenant", Some("acme"), None);
    let first = leases.request(&acme, "req-1", None, &input()).await.expect("requested");
    let again = leases.request(&acme, "req-1", None, &input()).await.expect("a retry");
    assert_eq!(again.lease, first.lease, "the lease id is minted from the tenant and the key");
    assert!(again.outcome.duplicate);
    // Another tenant with the same key gets another lease.
    let beta = caller("bob", "tenant", Some("beta"), None);
    let theirs = leases.request(&beta, "req-1", None, &input()).await.expect("requested");
    assert_ne!(theirs.lease, first.lease);

    // An agent of another provider does not find the lease; the lease's own provider's does,
    // acting for its owner, and the same key in the agent's namespace is not the tenant's.
    let stream = first.lease.stream_id();
    let stored = leases.pipeline().state::<leasehold_domain::lease::Lease>(&stream).await;
    let (_, _, lease) = stored.expect("readable").expect("stored");
    let operation: OperationId = lease.operation.expect("the provision's operation");
    let report = || LeaseCommand::ReportProvisioned { operation };
    let stranger = caller("agent-9", "agent", None, Some(Uuid::from_u128(9)));
    let refused = leases.for_owner(&stranger, "req-1", first.lease, report()).await;
    assert!(matches!(refused, Err(CommandError::NotFound)), "{refused:?}");
    let agent = caller("agent-7", "agent", None, Some(PROVIDER));
    let reported = leases.for_owner(&agent, "req-1", first.lease, report()).await.expect("ok");
    assert!(!reported.outcome.duplicate);
    assert_eq!(reported.outcome.event_types, ["LeaseProvisioned", "LeaseActivated"]);
    // A callback's keys are in the callback namespace: the agent's key does not answer it.
    let callback = Caller { namespace: Some(KeyNamespace::callback()), ..agent };
    let repeated = leases.for_owner(&callback, "req-1", first.lease, report()).await;
    assert!(!repeated.expect("a no-op").outcome.duplicate);
}
