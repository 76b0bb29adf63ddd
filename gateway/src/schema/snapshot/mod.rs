//! The snapshot kind in GraphQL: tenants create, restore, delete and export the snapshots of
//! their VMs and read them, their quota and their artifact index; host agents confirm and
//! fail the snapshots of their own host, fenced by the operation; operators set tenants'
//! quotas and read every tenant's usage. Merged into the roots (`schema/mod.rs`).

mod mutation;
mod query;
mod types;

pub use mutation::SnapshotMutation;
pub use query::SnapshotQuery;

use crate::reads::KindReads;

/// What the snapshot's root query fields read: the snapshot projection's `snapshot_records`.
pub(crate) const READS: KindReads = KindReads {
    stream_type: <leasehold_domain::snapshot::Snapshot as leasehold_domain::Aggregate>::STREAM_TYPE,
    projection: "snapshot_views",
    projection_fields: &["snapshot", "snapshots", "layerArtifact", "artifactHosts"],
    log_fields: &[],
    joins: &[],
};

/// What the tenant quota's root query fields read: the snapshot projection's
/// `snapshot_quota_usage` (the quota kind has no module of its own: its commands are the
/// snapshot's consequences and an operator's limits).
pub(crate) const QUOTA_READS: KindReads = KindReads {
    stream_type:
        <leasehold_domain::quota::SnapshotQuota as leasehold_domain::Aggregate>::STREAM_TYPE,
    projection: "snapshot_views",
    projection_fields: &["snapshotQuotaUsage", "snapshotQuotaUsages"],
    log_fields: &[],
    joins: &[],
};
