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
