//! The runner lease read models: `runner_leases` (each lease as its tenant sees it), its
//! `workloads` row, its tenant's quota usage (`runner.vcpu`, `runner.memory_mb` while its
//! capacity is charged: from its assignment until it ends, quarantine and teardown
//! included), `runner_lease_holds` (what the reconcilers and operators need: its node, epoch,
//! instance and expiry; never a tenant's) and `runner_usage` (vCPUs, memory and leases
//! charged per tier and node, for operators).
//!
//! The runner's registration (JIT config) is never in any of them: no event holds it. A
//! tenant's row never holds the lease's epoch, node, instance or start command.

use chrono::{DateTime, Utc};
use leasehold_domain::runner::{RunnerEvent, RunnerLease, RunnerLeaseId};
use leasehold_domain::{Aggregate, RecordedEvent, TenantId};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::projection::{Projection, ProjectionError};
use crate::shared::{QuotaDelta, WorkloadRow};

/// The workload kind of runner leases in the unified listings.
pub const RUNNER_KIND: &str = "runner";

/// Projects runner lease streams into the runner read models.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunnerProjection;

/// One lease's working state: its owner and its aggregate state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunnerView {
    /// The owning tenant.
    pub tenant: TenantId,
    /// The aggregate's state.
    pub lease: RunnerLease,
}

/// A change to the runner read models.
#[derive(Debug, Clone, PartialEq)]
pub enum RunnerChange {
    /// Write every row derived from one lease's view.
    Put(Box<RunnerRows>),
    /// A lease began or stopped counting in its tenant's quota usage.
    Quota(QuotaDelta),
    /// What a tier and node hold changed.
    Usage(UsageDelta),
}

/// Every row derived from one lease's view.
#[derive(Debug, Clone, PartialEq)]
pub struct RunnerRows {
    /// The working state, kept for the next batch.
    pub view: RunnerView,
    /// `runner_leases`.
    pub row: RunnerLeaseRow,
    /// `runner_lease_holds`.
    pub hold: RunnerHoldRow,
    /// `workloads`.
    pub workload: WorkloadRow,
}

/// A row of `runner_leases`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0022_runners.sql.
pub struct RunnerLeaseRow {
    pub lease_id: Uuid,
    pub tenant_id: String,
    pub tier: String,
    pub trust: &'static str,
    pub guest_os: &'static str,
    pub vcpu: i32,
    pub memory_mb: i64,
    pub providers: Vec<&'static str>,
    pub phase: &'static str,
    pub job_request: Option<Uuid>,
    pub job_run: Option<i64>,
    pub outcome: Option<&'static str>,
    pub failure_reason: Option<String>,
    pub teardown: Option<&'static str>,
    pub expires_at: Option<DateTime<Utc>>,
    pub held_since: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A row of `runner_lease_holds`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0022_runners.sql.
pub struct RunnerHoldRow {
    pub lease_id: Uuid,
    pub tenant_id: String,
    pub node: Option<String>,
    pub epoch: i64,
    pub instance: Option<String>,
    pub phase: &'static str,
    pub expires_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

/// What one tier on one node (`""`: no node bound yet) gains or loses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageDelta {
    /// The tier.
    pub tier: String,
    /// The node, or `""`.
    pub node: String,
    /// Leases charged.
    pub leases: i64,
    /// Their vCPUs.
    pub vcpu: i64,
    /// Their memory in MiB.
    pub memory_mb: i64,
}

/// Revisions of what the runner projection derives from its view; its version adds the
/// state's schema, so a new `RunnerLease::STATE_SCHEMA` rebuilds it.
const ROWS_REVISION: u32 = 1;

impl Projection for RunnerProjection {
    const NAME: &'static str = "runner_views";
    const VERSION: u32 = ROWS_REVISION + RunnerLease::STATE_SCHEMA;
    const STREAM_TYPES: &'static [&'static str] = &[RunnerLease::STREAM_TYPE];
    type Key = RunnerLeaseId;
    type View = RunnerView;
    type Change = RunnerChange;

    fn key(&self, event: &RecordedEvent) -> Option<RunnerLeaseId> {
        (event.stream_type.as_str() == RunnerLease::STREAM_TYPE)
            .then(|| RunnerLeaseId::of_stream(&event.stream_id))
            .flatten()
    }

    fn project(
        &self,
        view: Option<&RunnerView>,
        event: &RecordedEvent,
        changes: &mut Vec<RunnerChange>,
    ) -> Result<RunnerView, ProjectionError> {
        let decoded = crate::projection::decoded::<RunnerEvent>(Self::NAME, event)?;
        let before = view.cloned().unwrap_or_else(|| RunnerView {
            tenant: event.tenant_id.clone(),
            lease: RunnerLease::initial(),
        });
        let after = RunnerView {
            tenant: before.tenant.clone(),
            lease: before.lease.clone().evolve(&decoded),
        };
        let tenant = after.tenant.to_string();
        let delta = QuotaDelta::between(tenant, RUNNER_KIND, held(&before), held(&after));
        changes.extend(delta.map(RunnerChange::Quota));
        changes.extend(
            usage_between(&before.lease, &after.lease).into_iter().map(RunnerChange::Usage),
        );
        Ok(after)
    }

    fn put(&self, _key: &RunnerLeaseId, view: &RunnerView) -> RunnerChange {
        RunnerChange::Put(Box::new(rows_of(view)))
    }
}

/// What a lease holds of its tenant's quota usage while charged.
fn held(view: &RunnerView) -> Vec<(String, i64)> {
    match (&view.lease.terms, view.lease.is_charged()) {
        (Some(terms), true) => vec![
            ("runner.vcpu".to_owned(), i64::from(terms.resources.vcpu)),
            (
                "runner.memory_mb".to_owned(),
                i64::try_from(terms.resources.memory_mb).unwrap_or(i64::MAX),
            ),
        ],
        _ => Vec::new(),
    }
}

/// What a lease holds of its tier on its node, while charged.
fn usage_of(lease: &RunnerLease) -> Option<UsageDelta> {
    let terms = lease.terms.as_ref().filter(|_| lease.is_charged())?;
    Some(UsageDelta {
        tier: terms.tier.to_string(),
        node: lease.node.as_ref().map(ToString::to_string).unwrap_or_default(),
        leases: 1,
        vcpu: i64::from(terms.resources.vcpu),
        memory_mb: i64::try_from(terms.resources.memory_mb).unwrap_or(i64::MAX),
    })
}

/// The usage changes from `before` to `after`: what it held taken off, what it holds added.
fn usage_between(before: &RunnerLease, after: &RunnerLease) -> Vec<UsageDelta> {
    let (was, is) = (usage_of(before), usage_of(after));
    if was == is {
        return Vec::new();
    }
    let negated = |delta: UsageDelta| UsageDelta {
        leases: -delta.leases,
        vcpu: -delta.vcpu,
        memory_mb: -delta.memory_mb,
        ..delta
    };
    was.map(negated).into_iter().chain(is).collect()
}

/// The rows of one lease, from its view.
///
/// # Panics
/// When the view has no terms: a runner lease stream always starts with its request.
pub fn rows_of(view: &RunnerView) -> RunnerRows {
    let lease = &view.lease;
    let terms = lease.terms.as_ref().expect("a runner lease stream starts with its request");
    let created_at = lease.requested_at.unwrap_or_default();
    let updated_at = lease.updated_at.unwrap_or(created_at);
    let phase = lease.phase.name();
    let row = RunnerLeaseRow {
        lease_id: terms.lease.0,
        tenant_id: view.tenant.to_string(),
        tier: terms.tier.to_string(),
        trust: terms.trust.name(),
        guest_os: terms.guest_os.name(),
        vcpu: i32::try_from(terms.resources.vcpu).unwrap_or(i32::MAX),
        memory_mb: i64::try_from(terms.resources.memory_mb).unwrap_or(i64::MAX),
        providers: terms.providers.iter().map(|provider| provider.name()).collect(),
        phase,
        job_request: lease.job.map(|job| job.request.0),
        job_run: lease.job.map(|job| i64::try_from(job.run).unwrap_or(i64::MAX)),
        outcome: lease.outcome.map(leasehold_domain::runner::Outcome::name),
        failure_reason: lease.failure_reason.as_ref().map(ToString::to_string),
        teardown: lease.teardown.map(leasehold_domain::runner::Teardown::name),
        expires_at: lease.expires_at,
        held_since: lease.held_since,
        created_at,
        updated_at,
    };
    let hold = RunnerHoldRow {
        lease_id: terms.lease.0,
        tenant_id: view.tenant.to_string(),
        node: lease.node.as_ref().map(ToString::to_string),
        epoch: i64::try_from(lease.epoch).unwrap_or(i64::MAX),
        instance: lease.instance.as_ref().map(ToString::to_string),
        phase,
        expires_at: lease.expires_at,
        updated_at,
    };
    let workload = WorkloadRow {
        kind: RUNNER_KIND,
        workload_id: terms.lease.0,
        tenant_id: view.tenant.to_string(),
        status: phase,
        backend_name: None,
        // What it is charged, named as its quota usage names it.
        items: serde_json::json!([
            {"sku": "runner.vcpu", "quantity": terms.resources.vcpu},
            {"sku": "runner.memory_mb", "quantity": terms.resources.memory_mb},
        ]),
        created_at,
        updated_at,
    };
    RunnerRows { view: view.clone(), row, hold, workload }
}
