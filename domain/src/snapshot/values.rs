//! A snapshot's own values: its id, mode, kinds, layer key, digest, and export records.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::values::{FieldError, Problem, checked_string, uuid_type};

uuid_type!(
    /// A snapshot's id, minted by Leasehold from its tenant and the create's operation key.
    SnapshotId,
    stream = "snapshot"
);

/// Who took a snapshot and what for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotMode {
    /// A tenant asked for it (the default).
    #[default]
    Manual,
    /// An automated process took it.
    Auto,
    /// A build artifact: a durable rootfs to seed later VMs. Retention GC and the snapshot
    /// quota both skip it; with a layer key it is cache-addressable.
    Build,
}

impl SnapshotMode {
    /// Its name, the one spelling events, read models and clients use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Manual => "manual",
            Self::Auto => "auto",
            Self::Build => "build",
        }
    }

    /// Whether the tenant's snapshot quota counts it (build artifacts are not counted).
    pub fn counts_for_quota(self) -> bool {
        self != Self::Build
    }
}

/// What a create asks the host's agent to capture.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestedKind {
    /// The rootfs only.
    #[default]
    Disk,
    /// The rootfs and the guest's memory (the guest pauses while memory is written).
    Live,
    /// The pages and blocks changed since the VM's last live snapshot (its parent): live,
    /// and never restorable on its own.
    Diff,
}

impl RequestedKind {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Disk => "disk",
            Self::Live => "live",
            Self::Diff => "diff",
        }
    }
}

/// What the host's agent reports it actually wrote: a live request served as disk is filed
/// as disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    /// The rootfs only.
    #[default]
    Disk,
    /// The rootfs and the guest's memory.
    Live,
}

impl SnapshotKind {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Disk => "disk",
            Self::Live => "live",
        }
    }
}

/// The sizes a host's agent reports for a snapshot it wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportedSizes {
    /// The rootfs (or, for a diff, the changed blocks), in bytes.
    pub disk_bytes: u64,
    /// The guest memory written beside it (live snapshots), in bytes: the full image, with no
    /// sparseness.
    pub memory_bytes: u64,
}

impl ReportedSizes {
    /// The honest size a snapshot of `kind` occupies: its disk, and its memory when live.
    pub fn honest(self, kind: SnapshotKind) -> u64 {
        match kind {
            SnapshotKind::Disk => self.disk_bytes,
            SnapshotKind::Live => self.disk_bytes.saturating_add(self.memory_bytes),
        }
    }
}

fn check_layer_key(value: &str) -> Result<(), Problem> {
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() > 128 {
        return Err(Problem::TooLong { max: 128 });
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-:".contains(c);
    if value.chars().all(allowed) {
        Ok(())
    } else {
        Err(Problem::BadFormat { expected: "1-128 letters, digits, '.', '_', '-' or ':'" })
    }
}

fn check_digest(value: &str) -> Result<(), Problem> {
    let hex = value.len() == 64
        && value.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if hex {
        Ok(())
    } else {
        Err(Problem::BadFormat { expected: "64 lower-case hex digits (a sha256)" })
    }
}

fn check_snapshot_name(value: &str) -> Result<(), Problem> {
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.chars().count() > 128 {
        return Err(Problem::TooLong { max: 128 });
    }
    if value.chars().any(char::is_control) {
        return Err(Problem::BadFormat { expected: "text without control characters" });
    }
    Ok(())
}

fn check_destination(value: &str) -> Result<(), Problem> {
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() > 512 {
        return Err(Problem::TooLong { max: 512 });
    }
    // An object-storage URL names a bucket and key, never credentials.
    let Some((scheme, rest)) = value.split_once("://") else {
        return Err(Problem::BadFormat { expected: "an s3://, gs:// or https:// URL" });
    };
    let known = matches!(scheme, "s3" | "gs" | "https");
    // A query or fragment could carry a presigned credential (`?X-Amz-Signature=...`).
    let carries = rest.contains(['@', '?', '#']) || value.chars().any(char::is_whitespace);
    if !known || rest.is_empty() || carries {
        return Err(Problem::BadFormat {
            expected: "an s3://, gs:// or https:// URL without credentials",
        });
    }
    Ok(())
}

checked_string!(
    /// The derived cache key of a build step: only a build artifact has one, and it is the
    /// only thing that makes an artifact cache-addressable (with the building host's arch).
    LayerKey,
    check_layer_key
);
checked_string!(
    /// The hex sha256 of an artifact's rootfs: an integrity check only, never an identity
    /// (nothing is deduplicated or looked up as "the same build" by it).
    Digest,
    check_digest
);
checked_string!(
    /// A tenant's name for a snapshot.
    SnapshotName,
    check_snapshot_name
);
checked_string!(
    /// Where an export of a snapshot goes (an object-storage URL, never with credentials).
    ExportDestination,
    check_destination
);

/// Where an export stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExportStatus {
    /// Asked for; the host's agent has not reported.
    Pending,
    /// Written at its destination.
    Ready,
    /// The agent reported a failure.
    Error,
}

impl ExportStatus {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Ready => "ready",
            Self::Error => "error",
        }
    }
}

/// One export of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Export {
    /// Where it goes.
    pub destination: ExportDestination,
    /// Where it stands.
    pub status: ExportStatus,
    /// When it was asked for.
    pub requested_at: chrono::DateTime<chrono::Utc>,
    /// When it last changed.
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// The agent's failure (operators only; redacted before it is recorded).
    pub last_error: Option<crate::values::OperatorDetail>,
    /// The request's operation, which the agent's report must name (none: recorded before
    /// exports had operations, when a report was matched by its destination alone).
    pub operation: Option<crate::values::OperationId>,
}
