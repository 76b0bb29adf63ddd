//! What machine actors run on snapshots: a host's agent reports on the snapshots of its own
//! host (another host's snapshot is not found to it), each report naming the snapshot's
//! current operation (another operation is `FENCED` by the aggregate); retention GC deletes
//! the snapshots past their retention; the layer cache records its hits and evicts its least
//! recently used layers. Each runs as the snapshot's owner, with its quota consequence.

use leasehold_domain::TenantId;
use leasehold_domain::snapshot::{
    DeleteCause, ExportDestination, SnapshotCommand, SnapshotFacts, SnapshotId, Written,
};
use leasehold_domain::values::OperationId;
use leasehold_domain::values::OperatorDetail;
use leasehold_domain::values::fleet::HostId;

use super::{Result, SnapshotListing, SnapshotOutcome, SnapshotService};
use crate::lease_service::Caller;
use crate::{CommandError, CommandStore};

/// What a host's agent reports on a snapshot of its host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentReport {
    /// It wrote the snapshot of `operation`: what it wrote (kind, sizes, digest, store ref).
    Written {
        /// The creation's operation.
        operation: OperationId,
        /// What it wrote.
        written: Written,
    },
    /// It could not write it.
    WriteFailed {
        /// The creation's operation.
        operation: OperationId,
        /// Why (operators only).
        detail: OperatorDetail,
    },
    /// It restored it.
    Restored {
        /// The restore's operation.
        operation: OperationId,
    },
    /// It could not restore it; `missing` when its store no longer has it.
    RestoreFailed {
        /// The restore's operation.
        operation: OperationId,
        /// Whether the store no longer has it.
        missing: bool,
        /// Why.
        detail: OperatorDetail,
    },
    /// It deleted it, or had none (`not_found`: a deletion too).
    Deleted {
        /// The deletion's operation.
        operation: OperationId,
        /// Whether it answered not-found.
        not_found: bool,
    },
    /// It could not delete it.
    DeleteFailed {
        /// The deletion's operation.
        operation: OperationId,
        /// Why.
        detail: OperatorDetail,
    },
    /// The export to `destination` of `operation` was written, or failed.
    Exported {
        /// Where to.
        destination: ExportDestination,
        /// The export's operation (another request's is `FENCED`).
        operation: OperationId,
        /// Whether it was written.
        ready: bool,
        /// Why it failed.
        detail: Option<OperatorDetail>,
    },
}

impl AgentReport {
    /// The same report with its failure text redacted of `vm`'s credentials.
    async fn redacted(
        self,
        redactor: &dyn super::DetailRedactor,
        tenant: &TenantId,
        vm: leasehold_domain::values::fleet::VmId,
    ) -> Result<Self> {
        let redact = |detail: OperatorDetail| async move {
            redactor.redact(tenant, vm, &detail).await.map_err(CommandError::Store)
        };
        Ok(match self {
            Self::WriteFailed { operation, detail } => {
                Self::WriteFailed { operation, detail: redact(detail).await? }
            }
            Self::RestoreFailed { operation, missing, detail } => {
                Self::RestoreFailed { operation, missing, detail: redact(detail).await? }
            }
            Self::DeleteFailed { operation, detail } => {
                Self::DeleteFailed { operation, detail: redact(detail).await? }
            }
            Self::Exported { destination, operation, ready, detail: Some(detail) } => {
                let detail = Some(redact(detail).await?);
                Self::Exported { destination, operation, ready, detail }
            }
            other => other,
        })
    }

    fn command(self) -> SnapshotCommand {
        match self {
            Self::Written { operation, written } => SnapshotCommand::Confirm { operation, written },
            Self::WriteFailed { operation, detail } => SnapshotCommand::Fail { operation, detail },
            Self::Restored { operation } => SnapshotCommand::ConfirmRestore { operation },
            Self::RestoreFailed { operation, missing, detail } => {
                SnapshotCommand::FailRestore { operation, missing, detail }
            }
            Self::Deleted { operation, not_found } => {
                SnapshotCommand::ConfirmDeleted { operation, not_found }
            }
            Self::DeleteFailed { operation, detail } => {
                SnapshotCommand::FailDelete { operation, detail }
            }
            Self::Exported { destination, operation, ready, detail } => {
                SnapshotCommand::ReportExport { destination, operation, ready, detail }
            }
        }
    }
}

impl<S, L> SnapshotService<S, L>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    L: SnapshotListing,
{
    /// A host's agent reports on `snapshot`, one of its host's.
    ///
    /// # Errors
    /// [`CommandError::NotFound`] for a snapshot not on `host`; `FENCED` for a report of
    /// another operation than the snapshot's current one; otherwise as the pipeline.
    pub async fn report(
        &self,
        caller: &Caller,
        (host, key): (&HostId, &str),
        snapshot: SnapshotId,
        report: AgentReport,
    ) -> Result<SnapshotOutcome> {
        let (owner, stored) = self.owned(snapshot).await?;
        if stored.terms.as_ref().map(|terms| &terms.host) != Some(host) {
            return Err(CommandError::NotFound);
        }
        let facts = SnapshotFacts {
            gc_dead_letter_after: self.config.gc_dead_letter_after,
            ..SnapshotFacts::default()
        };
        let vm = stored.terms.as_ref().map(|terms| terms.vm);
        let report = match (vm, &self.redactor) {
            (Some(vm), Some(redactor)) => report.redacted(&**redactor, &owner, vm).await?,
            _ => report,
        };
        let request = self.request(caller, owner, snapshot, key, report.command(), facts)?;
        self.run(request, snapshot).await
    }

    /// Retention GC deletes `snapshot`: refused unless its retention passed, it is no build
    /// artifact, not its VM's latest and no parent of a live child.
    ///
    /// # Errors
    /// [`CommandError`]: the snapshot's refusal, or the pipeline's.
    pub async fn collect(
        &self,
        caller: &Caller,
        key: &str,
        snapshot: SnapshotId,
    ) -> Result<SnapshotOutcome> {
        let (owner, _) = self.owned(snapshot).await?;
        self.delete_as(caller, key, (owner, snapshot), DeleteCause::Gc).await
    }

    /// The layer cache evicts `snapshot` (its tenant's least recently used layer, over the
    /// cap).
    ///
    /// # Errors
    /// [`CommandError`]: the snapshot's refusal (`NotALayer`), or the pipeline's.
    pub async fn evict(
        &self,
        caller: &Caller,
        key: &str,
        snapshot: SnapshotId,
    ) -> Result<SnapshotOutcome> {
        let (owner, _) = self.owned(snapshot).await?;
        self.delete_as(caller, key, (owner, snapshot), DeleteCause::Evicted).await
    }

    /// Gives up on `snapshot`'s creation that no agent answered since `since`: recorded as
    /// the agent's failure of the current operation (its quota given back), with `detail` for
    /// operators. A snapshot no longer creating, or changed since (the listing that named it
    /// may lag), is left as it is. A stuck restore is not given up on: the snapshot is still
    /// whole at its host, and failing it would leave it unrestorable.
    ///
    /// # Errors
    /// [`CommandError`]: the pipeline's.
    pub async fn give_up(
        &self,
        caller: &Caller,
        key: &str,
        (snapshot, since, detail): (SnapshotId, chrono::DateTime<chrono::Utc>, OperatorDetail),
    ) -> Result<Option<SnapshotOutcome>> {
        use leasehold_domain::snapshot::SnapshotStatus;
        let (owner, stored) = self.owned(snapshot).await?;
        let unchanged = stored.updated_at.is_some_and(|at| at <= since);
        let (SnapshotStatus::Creating, Some(operation), true) =
            (stored.status, stored.operation, unchanged)
        else {
            return Ok(None);
        };
        let command = SnapshotCommand::Fail { operation, detail };
        let request =
            self.request(caller, owner, snapshot, key, command, SnapshotFacts::default())?;
        self.run(request, snapshot).await.map(Some)
    }

    /// A layer cache hit of `tenant`'s used `snapshot` (evicted last among its layers).
    ///
    /// # Errors
    /// [`CommandError`]: `NotFound` for another tenant's snapshot; `NotALayer`; the
    /// pipeline's.
    pub async fn use_layer(
        &self,
        caller: &Caller,
        key: &str,
        (tenant, snapshot): (&TenantId, SnapshotId),
    ) -> Result<SnapshotOutcome> {
        let command = SnapshotCommand::Use;
        let facts = SnapshotFacts::default();
        let request = self.request(caller, tenant.clone(), snapshot, key, command, facts)?;
        self.run(request, snapshot).await
    }
}
