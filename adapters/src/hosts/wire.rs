//! The host agent's JSON, field for field as fuse's client sends and reads it
//! (`internal/firecracker/firecracker.go`); one definition for the client and the simulator.

use serde::{Deserialize, Serialize};

/// `POST /v1/vm`. `cpus`, `memory_mb`, `storage_gb` and `region` are always sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateVmRequest {
    /// The VM's name; the agent's `vm_id` is it, lower-cased to `[a-z0-9-]`.
    pub name: String,
    /// vCPUs.
    pub cpus: u32,
    /// RAM in MiB.
    pub memory_mb: u64,
    /// Disk in GiB.
    pub storage_gb: u64,
    /// Region (stored by the agent).
    #[serde(default)]
    pub region: String,
    /// A base image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// A snapshot of the agent's store to boot from (wins over `image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_snapshot: Option<String>,
}

/// A VM the agent has: `POST /v1/vm` and `GET /v1/vm/{id}` answer one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentVm {
    /// Its id at the agent.
    pub vm_id: String,
    /// Where it is reached (`host:port`, no scheme).
    #[serde(default)]
    pub url: String,
}

/// `GET /v1/vm?prefix=P`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentVms {
    /// The VMs whose names start with the prefix (an empty list, never null).
    pub vms: Vec<AgentVm>,
}

/// `GET /v1/capacity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentCapacity {
    /// vCPUs.
    pub cpus: u32,
    /// RAM in MiB.
    pub ram_mb: u64,
    /// Free disk in GiB.
    pub storage_gb: u64,
    /// GOARCH.
    #[serde(default)]
    pub arch: String,
    /// Whole GPUs.
    #[serde(default)]
    pub gpus: u32,
}

/// The agent's name of a Leasehold VM: `lh-<uuid>` (already `[a-z0-9-]`, so the agent keeps
/// it as its `vm_id`), and the prefix every one of them shares (its listing's filter).
pub fn agent_name(vm: leasehold_domain::values::fleet::VmId) -> String {
    format!("{AGENT_NAME_PREFIX}{}", vm.0)
}

/// The prefix of every Leasehold VM's name at an agent.
pub const AGENT_NAME_PREFIX: &str = "lh-";

/// `POST /v1/vm/{id}/snapshot`. The Go client sends `include_ram`, which the agent ignores; the
/// agent reads `live`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRequest {
    /// A note kept with the snapshot.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub comment: String,
    /// Capture the guest's memory too.
    #[serde(default)]
    pub live: bool,
}

/// `POST /v1/vm/{id}/restore`. The Go client adds `include_ram`, which the agent ignores (it
/// branches on the kind it recorded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreRequest {
    /// The snapshot, by the agent's id.
    pub snapshot_id: String,
}

/// `POST /v1/vm/{id}/snapshots/{snapshot}/export`, Leasehold's own route (fuse's agent has
/// none, and answers 404): write the snapshot to `destination`, an object-storage URL with no
/// credentials in it (the agent holds its own). 200 or 204: written; 202: accepted, reported
/// later through `reportSnapshotExport` naming `operation_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportRequest {
    /// Where to write it.
    pub destination: String,
    /// The export's operation, which a later report names.
    pub operation_id: uuid::Uuid,
}

/// The answer to a snapshot: the agent chose its id (`snap-<seconds>-<6 hex>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotTaken {
    /// Its id in the agent's host-wide store.
    pub snapshot_id: String,
    /// sha256 (hex) of its rootfs only: integrity, never identity.
    #[serde(default)]
    pub digest: String,
    /// `disk` or `live`, as taken (not as asked).
    #[serde(default)]
    pub kind: String,
    /// What it occupies, memory image included.
    #[serde(default)]
    pub size_bytes: u64,
}

/// `POST /v1/vm/{source}/fork`: a new VM from one of the source's snapshots, on the same host.
/// Zero or empty sizes mean the source's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkVmRequest {
    /// The new VM's name.
    pub name: String,
    /// The snapshot it boots from.
    pub snapshot_id: String,
    /// vCPUs.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub cpus: u32,
    /// RAM in MiB.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub memory_mb: u64,
    /// Disk in GiB.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub storage_gb: u64,
    /// Region.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub region: String,
}

fn is_zero_u32(value: &u32) -> bool {
    *value == 0
}

fn is_zero_u64(value: &u64) -> bool {
    *value == 0
}

/// `POST /v1/artifacts/{digest}/pull`: the agent fetches the artifact from `peer_url` with the
/// grant (minted with the peer's token) and files it under `snapshot_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactPullRequest {
    /// The serving agent's base URL.
    pub peer_url: String,
    /// The grant the peer checks (`crate::hosts::grant`).
    pub grant: String,
    /// The id to file it under (empty: `art-<digest[:16]>`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub snapshot_id: String,
}

/// The answer to a pull.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactPulled {
    /// The id it was filed under.
    pub snapshot_id: String,
    /// Its digest, verified.
    #[serde(default)]
    pub digest: String,
    /// Its size.
    #[serde(default)]
    pub bytes: u64,
}
