//! Values the fleet's kinds share (hosts, VMs, and later snapshots): host and VM ids, the
//! host backend, CPU architecture, GPU kinds and MIG profiles, placement labels, and the
//! resources a VM asks for and a host has.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{FieldError, Problem, checked_string, uuid_type};
use crate::StreamId;
use crate::limits::{FLEET_LABELS_MAX, FLEET_URL_MAX_BYTES};

/// A DNS label: lower-case letters, digits and inner hyphens, 1 to 63 bytes.
fn check_label_like(value: &str) -> Result<(), Problem> {
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if super::is_dns_label(value) {
        Ok(())
    } else {
        Err(Problem::BadFormat {
            expected: "a DNS label: 1-63 lower-case letters, digits or inner hyphens",
        })
    }
}

/// Lower-case letters, digits, '.', '_' and '-', starting with a letter or digit, 1 to `max`
/// bytes: GOARCH names, GPU models, MIG profiles (`1g.10gb`), label keys.
pub(crate) fn check_token(value: &str, max: usize) -> Result<(), Problem> {
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() > max {
        return Err(Problem::TooLong { max });
    }
    let bytes = value.as_bytes();
    let allowed = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(b);
    if bytes[0].is_ascii_alphanumeric() && bytes.iter().all(allowed) {
        Ok(())
    } else {
        Err(Problem::BadFormat {
            expected: "lower-case letters, digits, '.', '_' or '-', from a letter or digit",
        })
    }
}

fn check_arch(value: &str) -> Result<(), Problem> {
    check_token(value, 16)
}

fn check_gpu_kind(value: &str) -> Result<(), Problem> {
    check_token(value, 64)
}

fn check_label_key(value: &str) -> Result<(), Problem> {
    check_token(value, 63)
}

fn check_label_value(value: &str) -> Result<(), Problem> {
    if value.len() > 63 {
        return Err(Problem::TooLong { max: 63 });
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    if value.chars().all(allowed) {
        Ok(())
    } else {
        Err(Problem::BadFormat { expected: "letters, digits, '.', '_' or '-'" })
    }
}

fn check_task_id(value: &str) -> Result<(), Problem> {
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() > 128 {
        return Err(Problem::TooLong { max: 128 });
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    if value.chars().all(allowed) {
        Ok(())
    } else {
        Err(Problem::BadFormat { expected: "1-128 letters, digits, '.', '_' or '-'" })
    }
}

fn check_agent_url(value: &str) -> Result<(), Problem> {
    const EXPECTED: &str = "an http:// or https:// URL without spaces or credentials";
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() > FLEET_URL_MAX_BYTES {
        return Err(Problem::TooLong { max: FLEET_URL_MAX_BYTES });
    }
    let rest = value.strip_prefix("https://").or_else(|| value.strip_prefix("http://"));
    let authority = rest.map(|rest| rest.split(['/', '?', '#']).next().unwrap_or_default());
    let clean = value.chars().all(|c| c.is_ascii_graphic());
    // A URL with user information would carry a credential into events and read models.
    match authority {
        Some(authority) if clean && !authority.is_empty() && !authority.contains('@') => Ok(()),
        _ => Err(Problem::BadFormat { expected: EXPECTED }),
    }
}

checked_string!(
    /// A host's id, chosen by the operator who registers it: a DNS label (`agent-1`).
    HostId,
    check_label_like
);
checked_string!(
    /// A region a host is in (`eu-west-1`): a DNS label.
    Region,
    check_label_like
);
checked_string!(
    /// A CPU architecture in GOARCH vocabulary (`amd64`, `arm64`).
    Arch,
    check_arch
);
checked_string!(
    /// A GPU model (`a100`), declared by the operator, never probed.
    GpuKind,
    check_gpu_kind
);
checked_string!(
    /// A MIG profile in mig-parted vocabulary (`1g.10gb`).
    MigProfile,
    check_gpu_kind
);
checked_string!(
    /// The key of a placement label (`zone`, `tier.gpu`).
    LabelKey,
    check_label_key
);
checked_string!(
    /// The value of a placement label (may be empty).
    LabelValue,
    check_label_value
);
checked_string!(
    /// The task a VM runs: one VM per task (a tenant's own name for it).
    TaskId,
    check_task_id
);
checked_string!(
    /// The base URL of a host's agent (`https://agent-1.local:8443`). Never holds a
    /// credential: the agent's token is kept encrypted, apart from the log.
    AgentUrl,
    check_agent_url
);

impl HostId {
    /// The host's stream: `host-<id>`.
    pub fn stream_id(&self) -> StreamId {
        StreamId::parse(format!("host-{}", self.as_str())).expect("a DNS label makes a stream id")
    }
}

impl Arch {
    /// The architecture of a host that reports none: every host before arches were
    /// recorded was x86-64.
    pub fn amd64() -> Self {
        Self("amd64".to_owned())
    }
}

uuid_type!(
    /// A VM's id, minted from its tenant and task (one VM per task).
    VmId,
    stream = "vm"
);

/// What runs a host's VMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostBackend {
    /// Firecracker microVMs: no GPUs.
    Firecracker,
    /// QEMU: whole GPUs and MIG instances may be passed through.
    Qemu,
}

impl HostBackend {
    /// Its name, the one spelling events, read models and clients use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Firecracker => "firecracker",
            Self::Qemu => "qemu",
        }
    }

    /// The backend named `name` (empty means firecracker, as fuse's default).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "" | "firecracker" => Some(Self::Firecracker),
            "qemu" => Some(Self::Qemu),
            _ => None,
        }
    }
}

/// Placement labels: a host's declared key/value pairs, or a VM's selectors (every pair must
/// match). At most [`FLEET_LABELS_MAX`] pairs.
///
/// Stored as a list of `{key, value}` in key order, so that every label has the same paths
/// (`labels[].key`) whatever its key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<Label>", into = "Vec<Label>")]
pub struct Labels(BTreeMap<LabelKey, LabelValue>);

/// One label, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Label {
    /// Its key.
    pub key: LabelKey,
    /// Its value.
    pub value: LabelValue,
}

impl Labels {
    /// Labels from pairs, each checked, `field` naming the input (`labels`).
    ///
    /// # Errors
    /// A bad key or value, or too many pairs.
    pub fn parse<'a>(
        field: &str,
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, FieldError> {
        let mut labels = BTreeMap::new();
        for (key, value) in pairs {
            let at = format!("{field}.{key}");
            let parsed = LabelKey::parse(&at, key)?;
            if labels.insert(parsed, LabelValue::parse(&at, value)?).is_some() {
                let problem = Problem::Duplicate { value: key.to_owned() };
                return Err(FieldError::new(at, problem));
            }
        }
        Self::try_from(labels).map_err(|problem| FieldError::new(field, problem))
    }

    /// Whether every pair of `selectors` is among these labels.
    pub fn satisfy(&self, selectors: &Self) -> bool {
        selectors.0.iter().all(|(key, value)| self.0.get(key) == Some(value))
    }

    /// The pairs, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&LabelKey, &LabelValue)> {
        self.0.iter()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl TryFrom<BTreeMap<LabelKey, LabelValue>> for Labels {
    type Error = Problem;

    fn try_from(labels: BTreeMap<LabelKey, LabelValue>) -> Result<Self, Problem> {
        if labels.len() > FLEET_LABELS_MAX {
            return Err(Problem::OutOfRange { min: 0, max: FLEET_LABELS_MAX as u64 });
        }
        Ok(Self(labels))
    }
}

impl TryFrom<Vec<Label>> for Labels {
    type Error = Problem;

    fn try_from(labels: Vec<Label>) -> Result<Self, Problem> {
        let mut map = BTreeMap::new();
        for label in labels {
            let key = label.key.to_string();
            if map.insert(label.key, label.value).is_some() {
                return Err(Problem::Duplicate { value: key });
            }
        }
        Self::try_from(map)
    }
}

impl From<Labels> for Vec<Label> {
    fn from(labels: Labels) -> Self {
        labels.0.into_iter().map(|(key, value)| Label { key, value }).collect()
    }
}

impl fmt::Display for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pairs: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&pairs.join(","))
    }
}

/// One carved MIG GPU instance a host reports.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MigInstance {
    /// The instance's uuid (`MIG-…`), as the host reports it.
    pub uuid: String,
    /// Its profile.
    pub profile: MigProfile,
    /// The model of the GPU it is carved from.
    pub kind: GpuKind,
}

/// What a VM asks of its host, as placement gates check it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Demand {
    /// vCPUs.
    pub cpus: u32,
    /// RAM in MiB.
    pub ram_mb: u64,
    /// Disk in GiB.
    pub storage_gb: u64,
    /// Only hosts of this architecture (none: any).
    pub arch: Option<Arch>,
    /// Whole GPUs, or MIG instances when `gpu_profile` is set (0: none).
    pub gpus: u32,
    /// The GPU model asked for (none: any model, when GPUs are asked for).
    pub gpu_kind: Option<GpuKind>,
    /// A MIG profile: fractional GPUs instead of whole devices.
    pub gpu_profile: Option<MigProfile>,
    /// Every pair must be among the host's labels.
    pub labels: Labels,
}

impl Demand {
    /// Whether it asks for any GPU (whole or MIG): only qemu hosts serve those.
    pub fn wants_gpu(&self) -> bool {
        self.gpus > 0 || self.gpu_profile.is_some()
    }
}

/// The tenant that owns the fleet's hosts: their streams are the fleet's, not any
/// tenant's. No token may name it (the `leasehold:` prefix is reserved), so no tenant reads
/// or writes a host's stream.
pub fn fleet_tenant() -> crate::TenantId {
    crate::TenantId::parse(FLEET_TENANT).expect("a valid tenant id")
}

/// The fleet tenant's id.
pub const FLEET_TENANT: &str = "leasehold:fleet";

/// The prefix of tenant ids Leasehold keeps for itself.
pub const RESERVED_TENANT_PREFIX: &str = "leasehold:";
