//! The JSON bodies of the backends' protocol, field for field as fred spells them
//! (`docs/issue-10-research.md` §3 and §6). Optional fields are left out when absent, as Go's
//! `omitempty` does; bytes are standard base64 with padding and times RFC 3339, as Go's
//! `encoding/json` writes them. The seed's extensions (`maintenance_id`, `admitted_at`,
//! `lifecycle_callback_url`, ...) are optional, so a backend that predates them still parses.

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use uuid::Uuid;

/// One item of a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseItem {
    /// The SKU.
    pub sku: String,
    /// How many.
    pub quantity: u32,
    /// The service it runs as (absent: `app`, for a single legacy item).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// The tenant's own domain for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_domain: Option<String>,
}

/// `POST /provision`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvisionRequest {
    /// The lease.
    pub lease_uuid: Uuid,
    /// Its tenant.
    pub tenant: String,
    /// Its provider.
    pub provider_uuid: Uuid,
    /// What to run.
    pub items: Vec<LeaseItem>,
    /// Where to report the outcome (one URL per operation).
    pub callback_url: String,
    /// The deployment manifest.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "base64_bytes")]
    pub payload: Option<Vec<u8>>,
    /// Lower-case hex SHA-256 of `payload`, sent only with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_hash: Option<String>,
    /// Where to report later observations of the lease (the seed's extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle_callback_url: Option<String>,
}

/// `202` to a provision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvisionAccepted {
    /// The backend's id for it.
    pub provision_id: String,
}

/// `POST /restart`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartRequest {
    /// The lease.
    pub lease_uuid: Uuid,
    /// Where to report the outcome.
    pub callback_url: String,
    /// The maintenance the completion must echo (the seed's extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_id: Option<String>,
    /// When the maintenance was admitted, RFC 3339 UTC, the same on every replay (the seed's
    /// extension; older providers omit it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted_at: Option<String>,
}

/// `POST /update`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateRequest {
    /// The lease.
    pub lease_uuid: Uuid,
    /// Where to report the outcome.
    pub callback_url: String,
    /// The new manifest (required).
    #[serde(with = "base64_required")]
    pub payload: Vec<u8>,
    /// Lower-case hex SHA-256 of `payload`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_hash: Option<String>,
    /// As on a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_id: Option<String>,
    /// As on a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted_at: Option<String>,
}

/// `POST /restore`: a new lease from a closed one's retained data (no manifest travels).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreRequest {
    /// The new lease.
    pub lease_uuid: Uuid,
    /// The lease whose data is retained.
    pub from_lease_uuid: Uuid,
    /// The tenant.
    pub tenant: String,
    /// The provider (cross-checked by the backend when not empty).
    pub provider_uuid: Uuid,
    /// The new lease's items: the same services and summed quantities, any tier.
    pub items: Vec<LeaseItem>,
    /// Where to report the outcome.
    pub callback_url: String,
    /// As on a provision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle_callback_url: Option<String>,
}

/// `POST /deprovision`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeprovisionRequest {
    /// The lease.
    pub lease_uuid: Uuid,
}

/// `POST /reconcile_custom_domain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileCustomDomainRequest {
    /// The lease.
    pub lease_uuid: Uuid,
    /// Its items, with their custom domains.
    pub items: Vec<LeaseItem>,
}

/// A published port. `host_port` is a string on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortBinding {
    /// The address bound.
    pub host_ip: String,
    /// The port, as text.
    pub host_port: String,
}

/// One running instance of a lease's service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInstance {
    /// Its index within its service.
    pub instance_index: u32,
    /// The container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// Its image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Its status, as the backend words it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Its host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fqdn: Option<String>,
    /// Its ports, by `port/protocol`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<BTreeMap<String, PortBinding>>,
}

/// One service of a stack lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseService {
    /// Its host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fqdn: Option<String>,
    /// Its instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<Vec<LeaseInstance>>,
}

/// `200` to `GET /info/{lease}`: how to reach the lease. Other keys are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LeaseInfo {
    /// The host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The host name (absent: the first instance's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fqdn: Option<String>,
    /// The protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Its ports, by `port/protocol`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<BTreeMap<String, PortBinding>>,
    /// Its instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<Vec<LeaseInstance>>,
    /// Its services, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<BTreeMap<String, LeaseService>>,
    /// Free-form facts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// The generation a provision belongs to (the seed's extension).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleGeneration {
    /// `operation`, `lifecycle`, ...
    pub kind: String,
    /// Its id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// The failure budget a complete inventory reports (the seed's extension).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalBudget {
    /// The backend's verdict.
    pub verdict: String,
    /// Failures in a row.
    pub consecutive_failures: u32,
}

/// One provision, as `GET /provisions` and `GET /provisions/{lease}` report it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvisionInfo {
    /// The lease.
    pub lease_uuid: Uuid,
    /// Its provider.
    pub provider_uuid: Uuid,
    /// `provisioning`, `ready`, `failed`, `retained`, ...
    pub status: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// Failed attempts.
    pub fail_count: u32,
    /// Why it is in its status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// More about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Until when its data is retained. fred always writes it, as Go's zero time
    /// (`0001-01-01T00:00:00Z`) on a live provision: read as absent.
    #[serde(
        default,
        deserialize_with = "zero_time_is_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub retained_until: Option<DateTime<Utc>>,
    /// Its tenant (between control plane and backend only; never shown to tenants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Where it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Its image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Its SKU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sku: Option<String>,
    /// How many.
    #[serde(default)]
    pub quantity: u32,
    /// Its items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<LeaseItem>>,
    /// Each service's image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_images: Option<BTreeMap<String, String>>,
    /// The seed's extension; never settlement evidence on a point read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle_generation: Option<LifecycleGeneration>,
    /// The seed's extension; only a complete, identity-bearing listing carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_budget: Option<TerminalBudget>,
}

/// `200` to `GET /provisions`: one keyset page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvisionsPage {
    /// The page, ascending by lease.
    pub provisions: Vec<ProvisionInfo>,
    /// The token of the next page, when one follows.
    #[serde(default, rename = "continue", skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// One lease whose data a backend retains.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetainedLease {
    /// The lease.
    pub lease_uuid: Uuid,
    /// Its provider (the seed's extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_uuid: Option<Uuid>,
    /// Its tenant (the seed's extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// `200` to `GET /retentions`: one keyset page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionsPage {
    /// The page, ascending by lease.
    pub retentions: Vec<RetainedLease>,
    /// The token of the next page, when one follows.
    #[serde(default, rename = "continue", skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// One release of a lease, as `GET /releases/{lease}` lists them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseInfo {
    /// From 1, ascending.
    pub version: u32,
    /// Its image.
    pub image: String,
    /// `deploying`, `active`, `superseded` or `failed`.
    pub status: String,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// Why it is in its status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// More about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Its manifest.
    #[serde(default, with = "base64_required")]
    pub manifest: Vec<u8>,
}

/// `200` to `GET /stats`: the backend's load. Fields it leaves out read as 0.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LoadStats {
    /// CPU cores in all.
    pub total_cpu_cores: f64,
    /// CPU cores allocated.
    pub allocated_cpu_cores: f64,
    /// Containers running.
    pub active_containers: u64,
    /// Whether the backend is withholding disk (the seed's extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_withheld: Option<bool>,
}

/// A backend's report, `POST`ed to the callback URL it was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackPayload {
    /// The lease (must be the URL's).
    pub lease_uuid: String,
    /// `success`, `failed` or `deprovisioned`.
    pub status: String,
    /// What failed (tenant-visible).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The backend's name (no authority).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Whether the data was kept when it was deprovisioned.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retained: bool,
    /// The maintenance completed (the seed's extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_id: Option<String>,
    /// The echo of the maintenance's `admitted_at` (the seed's extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_admitted_at: Option<String>,
    /// Leasehold's extension: whether a failed restart or update was rolled back to what ran
    /// before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolled_back: Option<bool>,
}

/// Go's zero `time.Time`, which fred writes for "no time", read as `None`.
fn zero_time_is_none<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<DateTime<Utc>>, D::Error> {
    let time = Option::<DateTime<Utc>>::deserialize(deserializer)?;
    Ok(time.filter(|time| time.year() > 1))
}

/// Optional bytes as standard base64 with padding.
mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(bytes) => s.serialize_str(&STANDARD.encode(bytes)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| STANDARD.decode(text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Bytes as standard base64 with padding (`null` reads as none, as Go's `[]byte` does).
mod base64_required {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        Option::<String>::deserialize(d)?
            .map_or(Ok(Vec::new()), |text| STANDARD.decode(text).map_err(serde::de::Error::custom))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    const LEASE: &str = "550e8400-e29b-41d4-a716-446655440000";
    const PROVIDER: &str = "00000000-0000-0000-0000-000000000007";

    fn round_trip<T: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug>(
        wire: &Value,
    ) -> T {
        let parsed: T = serde_json::from_value(wire.clone()).expect("parses");
        assert_eq!(&serde_json::to_value(&parsed).expect("serializes"), wire);
        parsed
    }

    #[test]
    fn requests_carry_freds_field_names() {
        let provision: ProvisionRequest = round_trip(&json!({
            "lease_uuid": LEASE, "tenant": "manifest1abc", "provider_uuid": PROVIDER,
            "items": [{"sku": "gpu.h100.1x", "quantity": 1, "service_name": "web"}],
            "callback_url": "https://cp.example/callbacks/leases/x/operations/y",
            "payload": "eyJrIjoidiJ9", "payload_hash": "666c1aa0",
        }));
        assert_eq!(provision.payload.as_deref(), Some(&br#"{"k":"v"}"#[..]));
        // Without a payload, neither it nor its hash is sent.
        let bare = ProvisionRequest { payload: None, payload_hash: None, ..provision };
        let wire = serde_json::to_value(&bare).expect("serializes");
        assert!(wire.get("payload").is_none() && wire.get("payload_hash").is_none(), "{wire}");
        let restart: RestartRequest = round_trip(&json!({
            "lease_uuid": LEASE, "callback_url": "https://cp.example/m",
            "maintenance_id": "m-1", "admitted_at": "2026-12-01T12:00:00Z",
        }));
        // An older provider's restart: no maintenance id, no stamp.
        let old: RestartRequest =
            serde_json::from_value(json!({"lease_uuid": LEASE, "callback_url": "u"})).unwrap();
        assert_eq!((old.maintenance_id, old.admitted_at), (None, None));
        assert_eq!(restart.maintenance_id.as_deref(), Some("m-1"));
        let update: UpdateRequest = round_trip(&json!({
            "lease_uuid": LEASE, "callback_url": "u", "payload": "", "payload_hash": "e3b0",
        }));
        assert!(update.payload.is_empty());
        round_trip::<RestoreRequest>(&json!({
            "lease_uuid": LEASE, "from_lease_uuid": LEASE, "tenant": "t",
            "provider_uuid": PROVIDER, "items": [], "callback_url": "u",
        }));
        round_trip::<DeprovisionRequest>(&json!({"lease_uuid": LEASE}));
        round_trip::<ReconcileCustomDomainRequest>(&json!({
            "lease_uuid": LEASE,
            "items": [{"sku": "s", "quantity": 2, "custom_domain": "app.example.com"}],
        }));
    }

    #[test]
    fn answers_parse_as_go_writes_them() {
        let info: LeaseInfo = round_trip(&json!({
            "host": "10.0.0.5", "protocol": "tcp",
            "instances": [{"instance_index": 0, "fqdn": "a.example",
                           "ports": {"80/tcp": {"host_ip": "0.0.0.0", "host_port": "32768"}}}],
            "services": {"web": {"fqdn": "web.example", "instances": []}},
        }));
        let first = &info.instances.as_ref().unwrap()[0];
        assert_eq!(first.ports.as_ref().unwrap()["80/tcp"].host_port, "32768");

        // Go writes nanoseconds when it has them, and the zero time for "none".
        let live: ProvisionInfo = serde_json::from_value(json!({
            "lease_uuid": LEASE, "provider_uuid": PROVIDER, "status": "ready",
            "created_at": "2024-01-15T10:30:00.123456789Z", "fail_count": 0,
            "retained_until": "0001-01-01T00:00:00Z", "quantity": 1,
        }))
        .expect("parses");
        assert_eq!(live.retained_until, None);
        assert_eq!(live.created_at.timestamp_subsec_nanos(), 123_456_789);
        let page: ProvisionsPage = serde_json::from_value(json!({
            "provisions": [], "continue": LEASE,
        }))
        .expect("parses");
        assert_eq!(page.next.as_deref(), Some(LEASE));
        round_trip::<RetentionsPage>(&json!({"retentions": [{"lease_uuid": LEASE}]}));
        let releases: Vec<ReleaseInfo> = serde_json::from_value(json!([{
            "version": 1, "image": "nginx:1", "status": "active",
            "created_at": "2026-12-01T12:00:00Z", "manifest": "e30=",
        }]))
        .expect("parses");
        assert_eq!(releases[0].manifest, b"{}");
        let stats: LoadStats = serde_json::from_value(json!({
            "total_cpu_cores": 16.0, "allocated_cpu_cores": 4.5, "active_containers": 3,
            "total_memory_mb": 65536,
        }))
        .expect("parses");
        assert_eq!((stats.allocated_cpu_cores, stats.disk_withheld), (4.5, None));
        let callback: CallbackPayload = round_trip(&json!({
            "lease_uuid": LEASE, "status": "failed", "error": "image pull failed",
        }));
        assert!(!callback.retained);
    }
}
