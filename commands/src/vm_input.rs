//! Outside input for VMs and hosts, turned into typed values: every field checked, the bad
//! one named (`cpus`, `labels.zone`, `guestFiles[2]`) before anything is decided.

use std::collections::BTreeMap;

use leasehold_domain::host::{HostCapacity, HostSpec};
use leasehold_domain::values::fleet::{
    AgentUrl, Arch, GpuKind, HostBackend, HostId, Labels, MigProfile, Region, TaskId,
};
use leasehold_domain::values::{FieldError, Problem, ServiceName};
use leasehold_domain::vm::{ExposedPort, GuestPath, ImageName, Protocol, SnapshotRef, VmSpec};

/// A VM as a tenant asks for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[allow(missing_docs)] // Each field is a `VmSpec` field, unchecked.
pub struct VmInput {
    pub task_id: String,
    pub cpus: i64,
    pub ram_mb: i64,
    pub storage_gb: i64,
    pub region: Option<String>,
    pub arch: Option<String>,
    pub gpus: i64,
    pub gpu_kind: Option<String>,
    pub gpu_profile: Option<String>,
    pub host_id: Option<String>,
    pub labels: Vec<(String, String)>,
    pub max_runtime_seconds: Option<i64>,
    pub idle_timeout_seconds: Option<i64>,
    pub image: Option<String>,
    pub seed_snapshot_id: Option<String>,
    pub resume_seed: bool,
    pub huge_pages: bool,
    pub egress_proxy: Option<String>,
    pub startup_script_timeout_seconds: Option<i64>,
    pub guest_files: Vec<String>,
    pub expose: Vec<(i64, String, Option<String>)>,
}

/// A host as an operator declares it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[allow(missing_docs)] // Each field is a `HostSpec` field, unchecked.
pub struct HostInput {
    pub host_id: String,
    pub url: String,
    pub region: Option<String>,
    pub backend: Option<String>,
    pub labels: Vec<(String, String)>,
    pub cpus: i64,
    pub ram_mb: i64,
    pub storage_gb: i64,
    pub vm_count: i64,
    pub arch: Option<String>,
    pub gpus: i64,
    pub gpu_kind: Option<String>,
    pub mig_profiles: Vec<(String, i64)>,
}

fn count<T: TryFrom<i64>>(field: &str, value: i64, min: i64, max: i64) -> Result<T, FieldError> {
    let out_of_range = || {
        let range = Problem::OutOfRange {
            min: u64::try_from(min).unwrap_or(0),
            max: u64::try_from(max).unwrap_or(0),
        };
        FieldError::new(field, range)
    };
    if !(min..=max).contains(&value) {
        return Err(out_of_range());
    }
    T::try_from(value).map_err(|_| out_of_range())
}

fn seconds(field: &str, value: Option<i64>) -> Result<Option<u32>, FieldError> {
    value.map(|value| count(field, value, 1, i64::from(u32::MAX))).transpose()
}

fn optional<T>(
    value: Option<&str>,
    parse: impl FnOnce(&str) -> Result<T, FieldError>,
) -> Result<Option<T>, FieldError> {
    value.filter(|value| !value.is_empty()).map(parse).transpose()
}

fn labels(pairs: &[(String, String)]) -> Result<Labels, FieldError> {
    Labels::parse("labels", pairs.iter().map(|(key, value)| (key.as_str(), value.as_str())))
}

/// The task and spec of a VM a tenant asks for.
///
/// # Errors
/// The first malformed field, or the spec breaking one of its own rules.
pub fn vm(input: &VmInput) -> Result<(TaskId, VmSpec), FieldError> {
    let task = TaskId::parse("taskId", input.task_id.as_str())?;
    let mut guest_files = Vec::with_capacity(input.guest_files.len());
    for (n, path) in input.guest_files.iter().enumerate() {
        guest_files.push(GuestPath::parse(&format!("guestFiles[{n}]"), path.as_str())?);
    }
    let mut expose = Vec::with_capacity(input.expose.len());
    for (n, (port, name, protocol)) in input.expose.iter().enumerate() {
        let protocol = match protocol.as_deref() {
            None | Some("" | "tcp") => Protocol::Tcp,
            Some("udp") => Protocol::Udp,
            Some(_) => {
                let problem = Problem::BadFormat { expected: "tcp or udp" };
                return Err(FieldError::new(format!("expose[{n}].protocol"), problem));
            }
        };
        expose.push(ExposedPort {
            port: count(&format!("expose[{n}].port"), *port, 1, 65_535)?,
            name: ServiceName::parse(&format!("expose[{n}].as"), name.as_str())?,
            protocol,
        });
    }
    let spec = VmSpec {
        cpus: count("cpus", input.cpus, 1, i64::from(u32::MAX))?,
        ram_mb: count("ramMb", input.ram_mb, 1, i64::MAX)?,
        storage_gb: count("storageGb", input.storage_gb, 0, i64::MAX)?,
        region: optional(input.region.as_deref(), |v| Region::parse("region", v))?,
        arch: optional(input.arch.as_deref(), |v| Arch::parse("arch", v))?,
        gpus: count("gpus", input.gpus, 0, 1_024)?,
        gpu_kind: optional(input.gpu_kind.as_deref(), |v| GpuKind::parse("gpuKind", v))?,
        gpu_profile: optional(input.gpu_profile.as_deref(), |v| {
            MigProfile::parse("gpuProfile", v)
        })?,
        pin: optional(input.host_id.as_deref(), |v| HostId::parse("hostId", v))?,
        labels: labels(&input.labels)?,
        max_runtime_seconds: seconds("maxRuntimeSeconds", input.max_runtime_seconds)?,
        idle_timeout_seconds: seconds("idleTimeoutSeconds", input.idle_timeout_seconds)?,
        image: optional(input.image.as_deref(), |v| ImageName::parse("image", v))?,
        seed: optional(input.seed_snapshot_id.as_deref(), |v| {
            SnapshotRef::parse("seedSnapshotId", v)
        })?,
        resume_seed: input.resume_seed,
        huge_pages: input.huge_pages,
        egress_proxy: optional(input.egress_proxy.as_deref(), |v| {
            ServiceName::parse("egressProxy", v)
        })?,
        startup_script_timeout_seconds: seconds(
            "startupScriptTimeoutSeconds",
            input.startup_script_timeout_seconds,
        )?,
        guest_files,
        expose,
    };
    spec.check()?;
    Ok((task, spec))
}

/// The id and spec of a host an operator registers.
///
/// # Errors
/// The first malformed field.
pub fn host(input: &HostInput) -> Result<(HostId, HostSpec), FieldError> {
    let id = HostId::parse("hostId", input.host_id.as_str())?;
    let backend = input.backend.as_deref().unwrap_or_default();
    let backend = HostBackend::from_name(backend).ok_or_else(|| {
        FieldError::new("backend", Problem::BadFormat { expected: "firecracker or qemu" })
    })?;
    let mut mig_profiles = BTreeMap::new();
    for (n, (profile, instances)) in input.mig_profiles.iter().enumerate() {
        let field = format!("migProfiles[{n}]");
        let profile = MigProfile::parse(&format!("{field}.profile"), profile.as_str())?;
        let instances = count(&format!("{field}.count"), *instances, 1, 1_024)?;
        if mig_profiles.insert(profile.clone(), instances).is_some() {
            let problem = Problem::Duplicate { value: profile.to_string() };
            return Err(FieldError::new(field, problem));
        }
    }
    let capacity = HostCapacity {
        cpus: count("cpus", input.cpus, 1, i64::from(u32::MAX))?,
        ram_mb: count("ramMb", input.ram_mb, 1, i64::MAX)?,
        storage_gb: count("storageGb", input.storage_gb, 0, i64::MAX)?,
        vm_count: count("vmCount", input.vm_count, 1, i64::from(u32::MAX))?,
        arch: optional(input.arch.as_deref(), |v| Arch::parse("arch", v))?
            .unwrap_or_else(Arch::amd64),
        gpus: count("gpus", input.gpus, 0, 1_024)?,
        gpu_kind: optional(input.gpu_kind.as_deref(), |v| GpuKind::parse("gpuKind", v))?,
        mig_profiles,
        mig_instances: Vec::new(),
    };
    let spec = HostSpec {
        url: AgentUrl::parse("url", input.url.as_str())?,
        region: optional(input.region.as_deref(), |v| Region::parse("region", v))?,
        backend,
        labels: labels(&input.labels)?,
        capacity,
    };
    Ok((id, spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> VmInput {
        VmInput {
            task_id: "build-1".into(),
            cpus: 2,
            ram_mb: 2_048,
            storage_gb: 10,
            ..VmInput::default()
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases: Vec<(VmInput, &str)> = vec![
            (VmInput { task_id: String::new(), ..good() }, "taskId"),
            (VmInput { cpus: 0, ..good() }, "cpus"),
            (VmInput { ram_mb: 64, ..good() }, "ramMb"),
            (
                VmInput { guest_files: vec!["/etc/ok".into(), "/fuse/x".into()], ..good() },
                "guestFiles[1]",
            ),
            (VmInput { labels: vec![("Zone".into(), "a".into())], ..good() }, "labels.Zone"),
            (
                VmInput {
                    image: Some("ubuntu".into()),
                    seed_snapshot_id: Some("snap-1".into()),
                    host_id: Some("agent-1".into()),
                    ..good()
                },
                "seedSnapshotId",
            ),
            (VmInput { expose: vec![(0, "web".into(), None)], ..good() }, "expose[0].port"),
            (
                VmInput { expose: vec![(80, "web".into(), Some("sctp".into()))], ..good() },
                "expose[0].protocol",
            ),
        ];
        for (input, field) in cases {
            let error = vm(&input).expect_err(field);
            assert_eq!(error.field, field, "{error}");
        }
        assert!(vm(&good()).is_ok());
    }

    #[test]
    fn a_host_needs_a_known_backend_and_a_url_without_credentials() {
        let input = HostInput {
            host_id: "agent-1".into(),
            url: "http://agent-1:8090".into(),
            cpus: 8,
            ram_mb: 16_384,
            storage_gb: 100,
            vm_count: 4,
            ..HostInput::default()
        };
        let (_, spec) = host(&input).expect("valid");
        assert_eq!(
            (spec.backend, spec.capacity.arch.as_str()),
            (HostBackend::Firecracker, "amd64")
        );
        let bad = HostInput { backend: Some("docker".into()), ..input.clone() };
        assert_eq!(host(&bad).expect_err("bad backend").field, "backend");
        let secret = HostInput { url: "http://user:pw@agent-1:8090".into(), ..input };
        assert_eq!(host(&secret).expect_err("credentials in the URL").field, "url");
    }
}
