//! The node-agent protocol's JSON bodies, field for field as mercator's agent sends and reads
//! them (`docs/mercator-protocol.md` §2), each decoded strictly (an unknown field is refused)
//! and turned into the domain's values, every problem named by its field.

use chrono::{DateTime, Utc};
use leasehold_domain::node::{
    AgentVersion, FactText, ImageFact, Locality, ManifestDigest, NodeFacts, NodeOperation,
    NodeOrder,
};
use leasehold_domain::run::{AttemptId, RunId, WorkloadObservation, WorkloadPhase};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::errors::{ApiError, ApiResult};

/// `POST /v1/node-agent/enroll`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EnrollRequest {
    pub(crate) node_id: Uuid,
    pub(crate) rental_id: Uuid,
    pub(crate) generation: u64,
    /// The bootstrap's token, or (to resume) the node's last session token.
    pub(crate) enrollment_token: String,
    pub(crate) agent_version: String,
    pub(crate) facts: Facts,
}

impl std::fmt::Debug for EnrollRequest {
    /// Never the token (a log line may print a request).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnrollRequest")
            .field("node_id", &self.node_id)
            .field("rental_id", &self.rental_id)
            .field("generation", &self.generation)
            .field("enrollment_token", &"<redacted>")
            .field("agent_version", &self.agent_version)
            .finish_non_exhaustive()
    }
}

/// What an enrollment answers.
#[derive(Serialize)]
pub(crate) struct EnrollResponse {
    pub(crate) node_id: Uuid,
    pub(crate) session_token: String,
    pub(crate) session_expires: DateTime<Utc>,
    pub(crate) fencing_token: u64,
    pub(crate) lease_expires: DateTime<Utc>,
    /// The node enrolled before under this identity and generation: a resume.
    pub(crate) duplicate: bool,
}

/// What a renewal answers (Leasehold's route: mercator has none).
#[derive(Serialize)]
pub(crate) struct RenewResponse {
    pub(crate) session_token: String,
    pub(crate) session_expires: DateTime<Utc>,
}

impl std::fmt::Debug for EnrollResponse {
    /// Never the session token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnrollResponse")
            .field("node_id", &self.node_id)
            .field("session_token", &"<redacted>")
            .field("fencing_token", &self.fencing_token)
            .field("duplicate", &self.duplicate)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for RenewResponse {
    /// Never the session token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenewResponse")
            .field("session_token", &"<redacted>")
            .field("session_expires", &self.session_expires)
            .finish()
    }
}

/// A node's facts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Facts {
    observed_at: DateTime<Utc>,
    host: HostFacts,
    #[serde(default)]
    images: Vec<ImageWire>,
    /// Reported by mercator's agent; Leasehold keeps none of them yet.
    #[serde(default)]
    #[allow(dead_code)]
    artifacts: Option<serde_json::Value>,
    #[serde(default)]
    #[allow(dead_code)]
    caches: Option<serde_json::Value>,
}

/// mercator's `HostFacts`, every field it sends (`M:internal/capability/node.go`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Decoded to refuse what is not mercator's; not all of it is kept.
struct HostFacts {
    os: String,
    #[serde(default)]
    kernel_version: Option<String>,
    architecture: String,
    container_runtime: String,
    #[serde(default)]
    runtime_version: Option<String>,
    #[serde(default)]
    accelerator_toolkit: Option<String>,
    #[serde(default)]
    driver_version: Option<String>,
    #[serde(default)]
    driver_capability: Option<String>,
    #[serde(default)]
    accelerators: Option<serde_json::Value>,
    cpu_millis: u64,
    memory_bytes: u64,
    #[serde(default)]
    disk_total_bytes: Option<u64>,
    #[serde(default)]
    disk_free_bytes: Option<u64>,
    #[serde(default)]
    network: Option<serde_json::Value>,
}

/// mercator's `ImageLocality`: Leasehold keeps the digest and how present it is.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Decoded to refuse what is not mercator's; not all of it is kept.
struct ImageWire {
    manifest_digest: String,
    state: Locality,
    #[serde(default)]
    platform: Option<serde_json::Value>,
    #[serde(default)]
    layer_digests: Option<Vec<String>>,
    #[serde(default)]
    layer_diff_ids: Option<Vec<String>>,
    #[serde(default)]
    missing_layer_digests: Option<Vec<String>>,
    #[serde(default)]
    missing_compressed_bytes: Option<u64>,
    #[serde(default)]
    unpacked: Option<bool>,
    #[serde(default)]
    last_verified_at: Option<DateTime<Utc>>,
}

/// Most images a node's facts may list.
const IMAGES_MAX: usize = 256;

impl Facts {
    /// The domain's facts, each text checked and named.
    pub(crate) fn checked(self) -> ApiResult<NodeFacts> {
        let text = |field: &str, value: String| {
            FactText::parse(field, value).map_err(ApiError::from_field)
        };
        if self.images.len() > IMAGES_MAX {
            return Err(ApiError::bad_input(format!("facts.images: at most {IMAGES_MAX}")));
        }
        let images = self
            .images
            .into_iter()
            .enumerate()
            .map(|(n, image)| {
                let digest = ManifestDigest::parse(
                    &format!("facts.images[{n}].manifest_digest"),
                    image.manifest_digest,
                )
                .map_err(ApiError::from_field)?;
                Ok(ImageFact { manifest_digest: digest, state: image.state })
            })
            .collect::<ApiResult<Vec<_>>>()?;
        Ok(NodeFacts {
            observed_at: self.observed_at,
            os: text("facts.host.os", self.host.os)?,
            architecture: text("facts.host.architecture", self.host.architecture)?,
            container_runtime: text("facts.host.container_runtime", self.host.container_runtime)?,
            cpu_millis: self.host.cpu_millis,
            memory_bytes: self.host.memory_bytes,
            disk_free_bytes: self.host.disk_free_bytes,
            images,
        })
    }
}

/// The agent version an enrollment names.
pub(crate) fn agent_version(text: String) -> ApiResult<AgentVersion> {
    AgentVersion::parse("agent_version", text).map_err(ApiError::from_field)
}

/// `POST /v1/node-agent/{node}/events`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventsRequest {
    /// Each decoded on its own: one malformed event is skipped, not the batch.
    pub(crate) events: Vec<serde_json::Value>,
}

/// One spooled event: its id is `<node_id>-<seq>`, so a replayed spool is deduplicated.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventWire {
    pub(crate) id: String,
    pub(crate) node_id: Uuid,
    /// mercator's tenancy (it overwrites what the node sends); Leasehold's is the node's.
    #[serde(default)]
    #[allow(dead_code)]
    pub(crate) workspace_id: Option<String>,
    pub(crate) kind: EventKind,
    /// The node's clock: kept, never ordering anything (rule 23).
    #[allow(dead_code)]
    pub(crate) observed_at: DateTime<Utc>,
    #[serde(default)]
    pub(crate) facts: Option<Facts>,
    #[serde(default)]
    pub(crate) workload: Option<WorkloadWire>,
}

/// An event's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EventKind {
    /// The node is alive (with its facts): its lease is renewed.
    Heartbeat,
    /// A look at one run's attempt.
    Workload,
}

/// A look at a run's attempt on the node.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkloadWire {
    run_id: Uuid,
    attempt_id: Uuid,
    phase: WorkloadPhase,
    observed_at: DateTime<Utc>,
    #[serde(default)]
    exit_code: Option<i32>,
    #[serde(default)]
    oom_killed: Option<bool>,
    /// The node's text: never recorded (it may name anything the workload printed).
    #[serde(default)]
    #[allow(dead_code)]
    failure_reason: Option<String>,
    #[serde(default)]
    started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    finished_at: Option<DateTime<Utc>>,
}

impl WorkloadWire {
    /// The domain's observation.
    pub(crate) fn observation(self) -> WorkloadObservation {
        WorkloadObservation {
            run: RunId(self.run_id),
            attempt: AttemptId(self.attempt_id),
            phase: self.phase,
            observed_at: self.observed_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
            exit_code: self.exit_code,
            oom_killed: self.oom_killed.unwrap_or(false),
        }
    }
}

/// `POST /v1/node-agent/{node}/results`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResultRequest {
    pub(crate) operation_id: Uuid,
    pub(crate) applied: bool,
    /// The node's text on a refusal: never recorded (operators read the node's own logs).
    #[serde(default)]
    #[allow(dead_code)]
    pub(crate) failure: Option<String>,
    /// The node had applied this operation before (it did not act again).
    #[serde(default)]
    #[allow(dead_code)]
    pub(crate) duplicate: bool,
    /// The node's clock.
    #[allow(dead_code)]
    pub(crate) reported_at: DateTime<Utc>,
}

/// `POST /v1/node-agent/{node}/reconciliation` (Leasehold's route: mercator builds it in
/// process only).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReconciliationRequest {
    pub(crate) applied_operation_ids: Vec<Uuid>,
    /// The `report_applied` command it answers (Leasehold's lookup), if any.
    #[serde(default)]
    pub(crate) lookup_operation_id: Option<Uuid>,
}

/// One command on the session stream.
#[derive(Debug, Serialize)]
pub(crate) struct CommandWire {
    pub(crate) operation_id: Uuid,
    pub(crate) node_id: Uuid,
    pub(crate) kind: &'static str,
    pub(crate) fencing_token: u64,
    pub(crate) issued_at: DateTime<Utc>,
    /// Base64 of the order's JSON.
    pub(crate) payload: String,
}

impl CommandWire {
    /// `operation` of `node`, ordered at `issued_at`, as the stream sends it.
    pub(crate) fn of(node: Uuid, operation: &NodeOperation, issued_at: DateTime<Utc>) -> Self {
        use base64::Engine as _;
        Self {
            operation_id: operation.operation.0,
            node_id: node,
            kind: operation.order.name(),
            fencing_token: operation.fencing_token,
            issued_at,
            payload: base64::engine::general_purpose::STANDARD
                .encode(order_json(&operation.order).to_string()),
        }
    }
}

/// The order's own fields (its kind is the command's `kind`).
fn order_json(order: &NodeOrder) -> serde_json::Value {
    let tagged = serde_json::to_value(order).expect("an order serializes");
    tagged.get(order.name()).cloned().unwrap_or(tagged)
}
