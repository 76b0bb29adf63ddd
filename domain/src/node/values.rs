//! A node's own values: its id, the hashes of its secrets, its agent's version, the facts it
//! reports, and the orders Leasehold gives it.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::limits::NODE_FACT_IMAGES_MAX;
use crate::run::{AttemptId, BookingId, RunId};
use crate::values::{FieldError, Problem, checked_string, uuid_type};

uuid_type!(
    /// A node: the agent on one rented machine for one generation of its rental. Leasehold
    /// mints it (from the rental and the generation); the node never chooses it.
    NodeId,
    stream = "node"
);

/// The SHA-256 of a secret a node presents (its enrollment token): the secret itself is never
/// recorded, only this, which cannot be presented in its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash(pub [u8; 32]);

impl Serialize for TokenHash {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        serializer.serialize_str(&hex)
    }
}

impl<'de> Deserialize<'de> for TokenHash {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let hex = String::deserialize(deserializer)?;
        let bad = || serde::de::Error::custom("a token hash is 64 hex digits");
        if hex.len() != 64 {
            return Err(bad());
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Self(bytes))
    }
}

fn check_version(value: &str) -> Result<(), Problem> {
    const MAX: usize = 64;
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() > MAX {
        return Err(Problem::TooLong { max: MAX });
    }
    if value.bytes().all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b)) {
        Ok(())
    } else {
        Err(Problem::BadFormat { expected: "letters, digits, '.', '_', '+' or '-'" })
    }
}

fn check_fact_text(value: &str) -> Result<(), Problem> {
    const MAX: usize = 128;
    if value.len() > MAX {
        return Err(Problem::TooLong { max: MAX });
    }
    if value.chars().any(char::is_control) {
        return Err(Problem::BadFormat { expected: "text without control characters" });
    }
    Ok(())
}

fn check_digest(value: &str) -> Result<(), Problem> {
    let Some(hex) = value.strip_prefix("sha256:") else {
        return Err(Problem::BadFormat { expected: "sha256:<64 lower-case hex digits>" });
    };
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        Ok(())
    } else {
        Err(Problem::BadFormat { expected: "sha256:<64 lower-case hex digits>" })
    }
}

checked_string!(
    /// The node agent build actually running (`1.4.2`).
    AgentVersion,
    check_version
);
checked_string!(
    /// A short fact a node reports about its host (its OS, kernel, runtime).
    FactText,
    check_fact_text
);
checked_string!(
    /// An OCI content digest (`sha256:…`): the identity a run is pinned to, never a tag.
    ManifestDigest,
    check_digest
);

/// How much of an image a node holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Locality {
    /// Assembled: a container can start on it now.
    Hot,
    /// Some of it is here.
    Partial,
    /// None of it.
    Cold,
    /// The runtime could not tell.
    Unknown,
}

/// One image a node reports holding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageFact {
    /// The digest it was pulled by.
    pub manifest_digest: ManifestDigest,
    /// How much of it is here.
    pub state: Locality,
}

/// What a node reports about its host. `observed_at` is the node's clock: kept, shown, never
/// used to order anything (rule 23); the age shown is from Leasehold's receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFacts {
    /// When the node looked, on its clock.
    pub observed_at: DateTime<Utc>,
    /// Its OS.
    pub os: FactText,
    /// Its CPU architecture.
    pub architecture: FactText,
    /// Its container runtime and version.
    pub container_runtime: FactText,
    /// CPU in thousandths of a core.
    pub cpu_millis: u64,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// Free disk in bytes, when it knows.
    pub disk_free_bytes: Option<u64>,
    /// The images it holds (at most [`NODE_FACT_IMAGES_MAX`]).
    pub images: Vec<ImageFact>,
}

impl NodeFacts {
    /// Checks the bounded lists at the edge.
    ///
    /// # Errors
    /// [`FieldError`] naming `field` when too many images are listed.
    pub fn check(self, field: &str) -> Result<Self, FieldError> {
        if self.images.len() > NODE_FACT_IMAGES_MAX {
            return Err(FieldError::new(
                format!("{field}.images"),
                Problem::TooLong { max: NODE_FACT_IMAGES_MAX },
            ));
        }
        Ok(self)
    }
}

/// What Leasehold orders a node to do. Credentials (a registry pull's, an artifact read's)
/// are minted when the order is sent and are never part of it. Externally tagged (`{"launch_workload":
/// {...}}`): a node's stored state holds its orders, and the snapshot encoding (postcard)
/// cannot read an internally tagged enum back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeOrder {
    /// Fetch (and unpack) an image pinned by digest.
    PrepareImage {
        /// What to fetch.
        manifest_digest: ManifestDigest,
        /// Make it ready to run, not merely fetched.
        unpack: bool,
    },
    /// Fetch an immutable artifact by its content digest.
    PrepareArtifact {
        /// The artifact's content digest.
        content_digest: ManifestDigest,
        /// Its size.
        size_bytes: u64,
    },
    /// Start a run's attempt.
    LaunchWorkload {
        /// The run.
        run: RunId,
        /// The attempt.
        attempt: AttemptId,
        /// The booking it runs under.
        booking: BookingId,
        /// Exactly what runs.
        manifest_digest: ManifestDigest,
        /// How long it may run.
        max_runtime_seconds: u64,
    },
    /// Stop a run's attempt.
    StopWorkload {
        /// The run.
        run: RunId,
        /// The attempt.
        attempt: AttemptId,
        /// How long it gets to exit before it is killed.
        grace_seconds: u64,
    },
    /// Answer with the node's reconciliation (the operations it applied), naming this order:
    /// Leasehold's lookup after a launch or stop whose answer was lost. The node takes its
    /// commands in order, so its answer settles every operation ordered before this one.
    /// (Last, so that the stored snapshots' variant numbers of the others stay as they were.)
    ReportApplied {},
}

impl NodeOrder {
    /// Its name, as the node's wire and events spell it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::PrepareImage { .. } => "prepare_image",
            Self::PrepareArtifact { .. } => "prepare_artifact",
            Self::LaunchWorkload { .. } => "launch_workload",
            Self::StopWorkload { .. } => "stop_workload",
            Self::ReportApplied {} => "report_applied",
        }
    }

    /// Whether a failure to send it may still have left its effect (launch and stop): such
    /// an order is never sent again blindly, only after the node's reconciliation (rule 20).
    pub fn may_leave_effect(&self) -> bool {
        matches!(self, Self::LaunchWorkload { .. } | Self::StopWorkload { .. })
    }
}

/// Where a node operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperationState {
    /// Ordered; the node has not answered.
    Pending,
    /// The node applied it.
    Applied,
    /// The node refused it.
    Refused,
    /// The node's reconciliation shows it was never applied (it may be ordered again).
    NotApplied,
}

impl OperationState {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Applied => "applied",
            Self::Refused => "refused",
            Self::NotApplied => "not_applied",
        }
    }
}

impl fmt::Display for OperationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
