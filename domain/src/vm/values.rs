//! The VM's own validated inputs: what it boots from, its guest files' paths, its egress,
//! the ports it exposes, its spec, and the placement decision recorded when it is scheduled.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::limits::{
    VM_CPUS_MAX, VM_EXPOSED_PORTS_MAX, VM_GUEST_FILES_MAX, VM_RAM_MB_MAX, VM_RAM_MB_MIN,
    VM_STORAGE_GB_MAX,
};
use crate::values::fleet::{Arch, Demand, GpuKind, HostId, Labels, MigProfile, Region};
use crate::values::{FieldError, Problem, ServiceName, checked_string, uuid_type};

/// The directory of the guest that Leasehold's own files live in (the manifest, the
/// credentials, the agent's token): a tenant's guest file may never land there, so that no
/// caller can displace one of them.
pub const RESERVED_GUEST_DIR: &str = "/fuse";

fn check_image(value: &str) -> Result<(), Problem> {
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() > 255 {
        return Err(Problem::TooLong { max: 255 });
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-/:@".contains(c);
    if value.chars().all(allowed) {
        Ok(())
    } else {
        Err(Problem::BadFormat { expected: "letters, digits, '.', '_', '-', '/', ':' or '@'" })
    }
}

fn check_snapshot_ref(value: &str) -> Result<(), Problem> {
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() > 128 {
        return Err(Problem::TooLong { max: 128 });
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    if value.chars().all(allowed) {
        Ok(())
    } else {
        Err(Problem::BadFormat { expected: "lower-case letters, digits or '-'" })
    }
}

fn check_guest_path(value: &str) -> Result<(), Problem> {
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() > 4096 {
        return Err(Problem::TooLong { max: 4096 });
    }
    let absolute = value.starts_with('/') && value.len() > 1 && !value.ends_with('/');
    let clean =
        value.split('/').skip(1).all(|part| !part.is_empty() && part != "." && part != "..")
            && !value.chars().any(char::is_control);
    if !(absolute && clean) {
        return Err(Problem::BadFormat {
            expected: "an absolute file path without '.', '..' or empty parts",
        });
    }
    let reserved = value == RESERVED_GUEST_DIR
        || value.strip_prefix(RESERVED_GUEST_DIR).is_some_and(|rest| rest.starts_with('/'));
    if reserved {
        return Err(Problem::BadFormat { expected: "a path outside /fuse (reserved)" });
    }
    Ok(())
}

fn check_vm_url(value: &str) -> Result<(), Problem> {
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() > 512 {
        return Err(Problem::TooLong { max: 512 });
    }
    if value.chars().all(|c| c.is_ascii_graphic()) && !value.contains('@') {
        Ok(())
    } else {
        Err(Problem::BadFormat { expected: "host:port or a URL, without spaces or credentials" })
    }
}

checked_string!(
    /// A base image the host's agent resolves (`ubuntu-24.04`).
    ImageName,
    check_image
);
checked_string!(
    /// A snapshot held in a host's snapshot store (`snap-1733050000-a1b2c3`).
    SnapshotRef,
    check_snapshot_ref
);
checked_string!(
    /// An absolute path in the guest a tenant's file is written to, never under
    /// [`RESERVED_GUEST_DIR`].
    GuestPath,
    check_guest_path
);
checked_string!(
    /// Where a running VM is reached (the agent's `host:port`).
    VmUrl,
    check_vm_url
);

uuid_type!(
    /// The reference to a VM's credentials (its auth token and secrets), kept encrypted apart
    /// from the log: events carry this reference only.
    CredentialRef
);

/// A network protocol of an exposed port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// A guest port published under a name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExposedPort {
    /// The guest's port.
    pub port: u16,
    /// Its name.
    pub name: ServiceName,
    /// Its protocol.
    pub protocol: Protocol,
}

/// Everything a VM is asked to be, checked. Its startup script and guest files' contents are
/// not here: they may hold secrets and are kept encrypted with its credentials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmSpec {
    /// vCPUs.
    pub cpus: u32,
    /// RAM in MiB.
    pub ram_mb: u64,
    /// Disk in GiB.
    pub storage_gb: u64,
    /// A region, if it matters.
    pub region: Option<Region>,
    /// Only hosts of this architecture (none: any).
    pub arch: Option<Arch>,
    /// Whole GPUs, or MIG instances with `gpu_profile`.
    pub gpus: u32,
    /// The GPU model.
    pub gpu_kind: Option<GpuKind>,
    /// A MIG profile.
    pub gpu_profile: Option<MigProfile>,
    /// A host it must run on (a hard gate).
    pub pin: Option<HostId>,
    /// Label selectors.
    pub labels: Labels,
    /// Seconds after which a running VM counts as stuck (none: the fleet's default).
    pub max_runtime_seconds: Option<u32>,
    /// Seconds without activity after which a running VM counts as idle (none: the
    /// fleet's default).
    pub idle_timeout_seconds: Option<u32>,
    /// A named base image to boot from (none: the provider's default base). Never with a
    /// seed snapshot.
    pub image: Option<ImageName>,
    /// A snapshot in a host's store to boot from instead: one of its tenant's (by its store
    /// reference). Unpinned, placement prefers a host already holding its bytes (locality
    /// breaks ties only) and the dispatcher has the chosen host's agent pull it from a holder
    /// first when it holds none. Never with an image.
    pub seed: Option<SnapshotRef>,
    /// Resume the seed's memory instead of cold-booting (live migration only).
    pub resume_seed: bool,
    /// Guest memory on 2 MiB pages (needed for a lazy migration).
    pub huge_pages: bool,
    /// The egress proxy provider of the fleet's registry its traffic goes out through (none:
    /// straight out from its host). A proxy that cannot be provisioned means no egress,
    /// never direct.
    pub egress_proxy: Option<ServiceName>,
    /// How long its startup script may run, in seconds (none: the fleet's default).
    pub startup_script_timeout_seconds: Option<u32>,
    /// Where its guest files go (their contents are kept with its credentials).
    pub guest_files: Vec<GuestPath>,
    /// Ports it publishes.
    pub expose: Vec<ExposedPort>,
}

impl VmSpec {
    /// Checks the spec's own rules, naming the field that breaks one.
    ///
    /// # Errors
    /// [`FieldError`].
    pub fn check(&self) -> Result<(), FieldError> {
        let range = |field: &str, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(FieldError::new(field, Problem::OutOfRange { min, max }))
            }
        };
        range("cpus", u64::from(self.cpus), 1, u64::from(VM_CPUS_MAX))?;
        range("ramMb", self.ram_mb, VM_RAM_MB_MIN, VM_RAM_MB_MAX)?;
        range("storageGb", self.storage_gb, 0, VM_STORAGE_GB_MAX)?;
        range("guestFiles", self.guest_files.len() as u64, 0, VM_GUEST_FILES_MAX as u64)?;
        range("expose", self.expose.len() as u64, 0, VM_EXPOSED_PORTS_MAX as u64)?;
        if self.gpu_kind.is_some() && self.gpus == 0 && self.gpu_profile.is_none() {
            return Err(FieldError::new(
                "gpuKind",
                Problem::BadFormat { expected: "set with gpus" },
            ));
        }
        if self.image.is_some() && self.seed.is_some() {
            let problem = Problem::BadFormat { expected: "not set with an image" };
            return Err(FieldError::new("seedSnapshotId", problem));
        }
        if self.resume_seed && (self.seed.is_none() || self.pin.is_none()) {
            // A seed's memory resumes only where a live seed already is: the artifact moves
            // to an unpinned VM's host (see the VM service), its memory image does not.
            let problem = Problem::BadFormat { expected: "set with a seed snapshot and a hostId" };
            return Err(FieldError::new("resumeSeed", problem));
        }
        let mut paths: Vec<&GuestPath> = self.guest_files.iter().collect();
        paths.sort();
        if let Some(pair) = paths.windows(2).find(|pair| pair[0] == pair[1]) {
            let problem = Problem::Duplicate { value: pair[0].to_string() };
            return Err(FieldError::new("guestFiles", problem));
        }
        Ok(())
    }

    /// What it asks of a host.
    pub fn demand(&self) -> Demand {
        Demand {
            cpus: self.cpus,
            ram_mb: self.ram_mb,
            storage_gb: self.storage_gb,
            arch: self.arch.clone(),
            gpus: self.gpus,
            gpu_kind: self.gpu_kind.clone(),
            gpu_profile: self.gpu_profile.clone(),
            labels: self.labels.clone(),
        }
    }
}

/// How placement chooses among hosts that pass every gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacementPolicy {
    /// The host with the most room left (VMs spread over the fleet).
    Spread,
    /// The host with the least room left that still fits (hosts fill one by one).
    Pack,
}

impl PlacementPolicy {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Spread => "spread",
            Self::Pack => "pack",
        }
    }
}

/// Why a VM was placed where it was, recorded on its scheduling.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The host chosen.
    pub host: HostId,
    /// The policy that chose it.
    pub policy: PlacementPolicy,
    /// How many hosts passed every gate.
    pub candidates: u32,
    /// vCPUs left on the host after this VM.
    pub headroom_cpus: i64,
    /// RAM left on the host after this VM, in MiB.
    pub headroom_ram_mb: i64,
    /// Whether the host already held the VM's seed artifact (locality only breaks ties).
    pub artifact_local: bool,
    /// Placements decided again after a lost race on a host's capacity.
    pub retries: u32,
}
