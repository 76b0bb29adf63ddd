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

/// Routing rules in which `docker-1` serves only `gpu.h100.1x`.
#[derive(Debug)]
struct OnlyH100;

impl leasehold_commands::BackendRouter for OnlyH100 {
    fn route<'a>(
        &'a self,
        _items: &'a leasehold_domain::lease::LeaseItems,
    ) -> leasehold_commands::Routed<'a> {
        Box::pin(async { Some(ServiceName::parse("backend", "docker-1").expect("valid")) })
    }

    fn serves(&self, _backend: &ServiceName, sku: &leasehold_domain::lease::Sku) -> bool {
        sku.as_str() == "gpu.h100.1x"
    }
}

/// A restore into another SKU tier stays on the retained lease's backend, so that backend must
/// serve the new SKU: one it does not is refused before anything is recorded.
#[tokio::test]
async fn a_restore_into_a_tier_its_backend_does_not_serve_is_refused() {
    let db = TestDb::migrated().await;
    let leases = service(&db).with_router(std::sync::Arc::new(OnlyH100));
    let acme = caller("alice", "tenant", Some("acme"), None);
    let source = leases.request(&acme, "req-1", None, &input()).await.expect("requested").lease;
    let system = caller("dispatcher", "system", None, None);
    let stream = source.stream_id();
    let stored = leases.pipeline().state::<leasehold_domain::lease::Lease>(&stream).await;
    let (_, _, lease) = stored.expect("readable").expect("stored");
    let operation = lease.operation.expect("an operation");
    for (key, command) in [
        ("up", LeaseCommand::ReportProvisioned { operation }),
        ("down", LeaseCommand::Deprovision),
        ("kept", LeaseCommand::ConfirmDeprovisioned { retained: true }),
    ] {
        leases.for_owner(&system, key, source, command).await.expect("recorded");
    }
    let tier = |sku: &str| vec![ItemInput { sku: sku.into(), quantity: 1, service_name: None }];
    let refused =
        leases.restore(&acme, "restore-1", (None, source), None, &tier("gpu.a10.1x")).await;
    assert!(
        matches!(
            &refused,
            Err(CommandError::Refused(leasehold_domain::lease::LeaseError::NoBackend { sku }))
                if sku.as_str() == "gpu.a10.1x"
        ),
        "{refused:?}"
    );
    let restored =
        leases.restore(&acme, "restore-2", (None, source), None, &tier("gpu.h100.1x")).await;
    assert!(restored.is_ok(), "the same tier restores: {restored:?}");
}
