//! The host's GraphQL types.

use async_graphql::{InputObject, Json, SimpleObject};
use chrono::{DateTime, Utc};
use leasehold_adapters::read_models::HostSummary;

use crate::schema::vm::LabelInput;

/// A host of the fleet, as operators see it. Never its agent's token.
#[derive(Debug, Clone, SimpleObject)]
pub struct Host {
    /// Its id.
    pub id: String,
    /// `active`, `cordoned`, `draining` or `removed`.
    pub state: String,
    /// `firecracker` or `qemu`.
    pub backend: String,
    /// Its region.
    pub region: Option<String>,
    /// Its agent's base URL.
    pub url: String,
    /// Its labels, as declared.
    pub labels: Json<serde_json::Value>,
    /// What it has.
    pub capacity: Json<serde_json::Value>,
    /// What its VMs hold.
    pub allocated: Json<serde_json::Value>,
    /// What is left (negative when capacity was lowered below what is held).
    pub headroom: Json<serde_json::Value>,
    /// VMs bound to it.
    pub vm_count: i64,
    /// Its agent's last recorded heartbeat.
    pub last_seen: Option<DateTime<Utc>>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl From<HostSummary> for Host {
    fn from(host: HostSummary) -> Self {
        Self {
            id: host.host_id,
            state: host.state,
            backend: host.backend,
            region: host.region,
            url: host.url,
            labels: Json(host.labels),
            capacity: Json(host.capacity),
            allocated: Json(host.allocated),
            headroom: Json(host.headroom),
            vm_count: host.vm_count,
            last_seen: host.last_seen,
            updated_at: host.updated_at,
        }
    }
}

/// MIG instances of one profile a host declares.
#[derive(Debug, Clone, InputObject)]
pub struct MigProfileInput {
    /// The profile (`1g.10gb`).
    pub profile: String,
    /// How many instances.
    pub count: i64,
}

/// `registerHost`: an upsert that also refreshes what the host declares.
#[derive(Debug, Clone, InputObject)]
pub struct RegisterHostInput {
    /// Your idempotency key.
    pub operation_key: String,
    /// Its id (a DNS label).
    pub host_id: String,
    /// Its agent's base URL (no credentials in it).
    pub url: String,
    /// Its agent's bearer token (fuse's `FC_AGENT_TOKEN`): sealed apart from the log, never
    /// in an event, a read model or an answer. Absent: the one registered before is kept.
    #[graphql(secret)]
    pub token: Option<String>,
    /// Its region.
    pub region: Option<String>,
    /// `firecracker` (default) or `qemu`.
    pub backend: Option<String>,
    /// Labels placement selects on (declared, never probed).
    pub labels: Option<Vec<LabelInput>>,
    /// vCPUs.
    pub cpus: i64,
    /// RAM in MiB.
    pub ram_mb: i64,
    /// Disk in GiB.
    pub storage_gb: i64,
    /// Most VMs at once.
    pub vm_count: i64,
    /// Its architecture (default `amd64`).
    pub arch: Option<String>,
    /// Whole GPUs (qemu only).
    pub gpus: Option<i64>,
    /// Their model (qemu only).
    pub gpu_kind: Option<String>,
    /// MIG instances by profile (qemu only).
    pub mig_profiles: Option<Vec<MigProfileInput>>,
}

/// A command on one host that needs nothing else.
#[derive(Debug, Clone, InputObject)]
pub struct HostOperationInput {
    /// The host.
    pub host_id: String,
    /// Your idempotency key.
    pub operation_key: String,
}
