//! The bodies of the runner provider protocol (`docs/billet-protocol.md` §1) and of the
//! registration issuer (GitHub's `generate-jitconfig`), as both sides read and write them.
//!
//! A runner's registration (its JIT config) is a credential: [`JitConfig`] shows nothing in
//! `Debug`, is never written to a log, an event or a read model, and travels only in the body
//! of a launch.

use serde::{Deserialize, Serialize};

/// A runner's registration (GitHub's `encoded_jit_config`). Its `Debug` shows nothing.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JitConfig(String);

impl JitConfig {
    /// A registration from its text.
    pub fn new(text: String) -> Self {
        Self(text)
    }

    /// Its text, for a launch's body only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for JitConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JitConfig([redacted])")
    }
}

/// `GET /kind`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindAnswer {
    /// `docker`, `ec2`, `firecracker` or `tart`.
    pub kind: String,
}

/// `POST /instances`: billet's `Spec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchSpec {
    /// The instance's name, `billet-<lease id>`: the only link back to its lease.
    pub name: String,
    /// The lease.
    pub lease: uuid::Uuid,
    /// The tier.
    pub tier: String,
    /// Whose code it runs (`untrusted` or `trusted`).
    pub trust: String,
    /// `linux`, `macos` or `windows`.
    pub guest_os: String,
    /// vCPUs.
    pub vcpu: u32,
    /// Memory in MiB.
    pub memory_mb: u64,
    /// The argv that starts the runner.
    pub command: Vec<String>,
    /// The runner's registration: in this body only.
    pub jit_config: JitConfig,
}

/// An instance, as a provider reports it (billet's `Instance`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceWire {
    /// The provider's handle for it.
    pub id: String,
    /// Its name (`billet-<lease id>` for ours).
    pub name: String,
    /// It may be running (true when the provider cannot tell).
    pub running: bool,
    /// It is gone, on positive proof only.
    pub terminal: bool,
}

/// `GET /instances?name=`: an explicit flag, never a zero value for "absent".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindAnswer {
    /// Whether the provider has an instance of that name.
    pub found: bool,
    /// It, when found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<InstanceWire>,
}

/// `GET /instances`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceList {
    /// Every instance the backend runs for billet, stopped ones included.
    pub instances: Vec<InstanceWire>,
}

/// `DELETE /instances/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeardownAnswer {
    /// `requested` (asked to go, may still run) or `stopped` (confirmed gone).
    pub teardown: String,
}

/// The issuer's `POST .../generate-jitconfig` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JitRequest {
    /// The runner's name (the instance's).
    pub name: String,
    /// The runner group.
    pub runner_group_id: u64,
    /// Its labels (the tier).
    pub labels: Vec<String>,
    /// Its work folder.
    pub work_folder: String,
}

/// The issuer's answer (only the registration is read; `Debug` shows it redacted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JitAnswer {
    /// The registration.
    pub encoded_jit_config: JitConfig,
}
