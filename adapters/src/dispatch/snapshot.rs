//! The snapshot kind of dispatcher work: a snapshot's request, restore and deletion go to its
//! host's agent over fuse's contract (`crate::hosts`), and the agent's answer is recorded as
//! the agent's report through the snapshot service, fenced by the operation the work names:
//! a snapshot's answer (`POST /v1/vm/{id}/snapshot`) as written, with the kind and size the
//! agent reports (its size is the honest one, memory included); a restore's
//! (`POST /v1/vm/{id}/restore`) as restored, or failed (a 404: missing from the store); a
//! deletion's (`DELETE /v1/vm/{id}/snapshots/{snapshot}`, fuse's orchestrator's call, which
//! fuse's agent answers 404 whatever: the bytes stay on the host) as deleted, a not-found
//! included.
//!
//! At least once: a snapshot sent again after a lost answer takes a second one at the agent
//! (fuse's agent cannot delete the first). Work the snapshot no longer awaits (another
//! operation, or settled) is never sent. An export goes to Leasehold's own route,
//! `POST /v1/vm/{id}/snapshots/{snapshot}/export` (fuse's agent has none: its 404 is the
//! export's error, never sent again); an agent that answers 202 reports it later through
//! `reportSnapshotExport`, naming the export's operation. fuse's agent writes no diffs: a diff
//! is asked as live and recorded as written in full.

use std::time::Duration;

use chrono::{DateTime, Utc};
use leasehold_commands::CommandStore;
use leasehold_commands::lease_service::Caller;
use leasehold_commands::snapshot_service::{AgentReport, SnapshotListing, SnapshotService};
use leasehold_domain::snapshot::{
    Digest, Export, ExportStatus, ReportedSizes, RequestedKind, Snapshot, SnapshotEvent,
    SnapshotId, SnapshotKind, SnapshotStatus, Written,
};
use leasehold_domain::values::fleet::HostId;
use leasehold_domain::values::{OperationId, OperatorDetail};
use leasehold_domain::vm::SnapshotRef;
use leasehold_domain::{Actor, DomainEvent, RecordedEvent};
use leasehold_projections::ReconcileError;

use super::vm::{NO_TOKEN_WAIT, host_target, retry};
use super::{DispatchKind, Intent, Sent, Work};
use crate::hosts::wire::{ExportRequest, RestoreRequest, SnapshotRequest, agent_name};
use crate::hosts::{AgentError, AgentTarget, Deleted, Exported, HostAgentClient};
use crate::vault::PgCredentialVault;

/// How long a host's agent that took an export on (202) has to report it, by default.
pub const EXPORT_ANSWER_WITHIN: chrono::TimeDelta = chrono::TimeDelta::hours(6);

/// The snapshot kind's dispatch: snapshots, restores and deletions sent to host agents.
#[derive(Debug, Clone)]
pub struct SnapshotDispatch<S, L> {
    snapshots: SnapshotService<S, L>,
    agents: HostAgentClient,
    tokens: PgCredentialVault,
    timeout: Duration,
    export_within: chrono::TimeDelta,
}

impl<S, L> SnapshotDispatch<S, L> {
    /// Sends the work of `snapshots`'s snapshots with `agents` (whose exchanges take at most
    /// `timeout`, a snapshot's and a restore's longer), finding each host's token in `tokens`.
    pub fn new(
        snapshots: SnapshotService<S, L>,
        (agents, timeout): (HostAgentClient, Duration),
        tokens: PgCredentialVault,
    ) -> Self {
        Self { snapshots, agents, tokens, timeout, export_within: EXPORT_ANSWER_WITHIN }
    }

    /// The same dispatch, giving an agent that took an export on `within` to report it.
    #[must_use]
    pub fn with_export_within(self, within: chrono::TimeDelta) -> Self {
        Self { export_within: within, ..self }
    }
}

/// The work an event of a snapshot starts: its action and operation.
fn started_work(event: &SnapshotEvent) -> Option<(&'static str, OperationId)> {
    match event {
        SnapshotEvent::SnapshotRequested { operation, .. } => Some(("create", *operation)),
        SnapshotEvent::SnapshotRestoring { operation, .. } => Some(("restore", *operation)),
        SnapshotEvent::SnapshotDeleting { operation, .. } => Some(("delete", *operation)),
        SnapshotEvent::SnapshotExportRequested { operation: Some(operation), .. } => {
            Some(("export", *operation))
        }
        _ => None,
    }
}

/// The export of `operation` still pending on `stored` (a deleted snapshot has none).
fn pending_export(stored: &Snapshot, operation: OperationId) -> Option<&Export> {
    let held = stored.status != SnapshotStatus::Deleted;
    stored.exports.iter().filter(|_| held).find(|export| {
        export.operation == Some(operation) && export.status == ExportStatus::Pending
    })
}

/// Whether `stored` still awaits the work `action` of `operation`.
fn awaits(stored: &Snapshot, action: &str, operation: OperationId) -> bool {
    if action == "export" {
        // Sent whatever the snapshot went through since it was asked (a deletion under way
        // may fail and leave it whole): its answer, or its deadline, settles it.
        return pending_export(stored, operation).is_some();
    }
    let status = match action {
        "create" => SnapshotStatus::Creating,
        "restore" => SnapshotStatus::Restoring,
        "delete" => SnapshotStatus::Deleting,
        _ => return false,
    };
    stored.status == status && stored.operation == Some(operation)
}

/// The dispatcher as a caller of the snapshot service.
fn dispatcher() -> Caller {
    Caller {
        actor: Actor { subject: "snapshot-dispatcher".into(), role: "system".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

/// A definite answer of fuse's agent: 500 (it failed and rolled back) or a refusal (4xx); a
/// 502, 503, 504 or no answer says nothing.
fn definite(error: &AgentError) -> bool {
    matches!(error, AgentError::Failed { status: 500, .. } | AgentError::Refused { .. })
}

/// What the agent reported it took, as the snapshot's written record; why not, when its id
/// is none the store could be asked for again.
fn written_of(taken: crate::hosts::wire::SnapshotTaken) -> Result<Written, String> {
    let kind = if taken.kind == "live" { SnapshotKind::Live } else { SnapshotKind::Disk };
    let store_ref = SnapshotRef::parse("snapshot_id", taken.snapshot_id)
        .map_err(|error| format!("the agent answered an unreadable snapshot id: {error}"))?;
    Ok(Written {
        kind,
        // fuse's agent answers one size, memory included: the honest size of either kind.
        sizes: ReportedSizes { disk_bytes: taken.size_bytes, memory_bytes: 0 },
        digest: Digest::parse("digest", taken.digest).ok(),
        store_ref,
        diff_of: None,
    })
}

impl<S, L> SnapshotDispatch<S, L>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    L: SnapshotListing,
{
    /// What the agent's answer to `work` is, as a report; `Err` with the detail for no
    /// answer (sent again).
    async fn exchange(
        &self,
        work: &Work,
        stored: &Snapshot,
        (agent, operation): (&AgentTarget, OperationId),
    ) -> Result<Result<AgentReport, String>, ReconcileError> {
        let vm = work.request["vm"].as_str().unwrap_or_default();
        let store_ref = stored.written.as_ref().map(|written| written.store_ref.to_string());
        let detail = |error: &AgentError| OperatorDetail::new(&error.to_string());
        Ok(match work.action.as_str() {
            "create" => {
                let live = work.request["live"].as_bool().unwrap_or(false);
                let comment = format!("leasehold {}", work.stream);
                let taken =
                    self.agents.snapshot(agent, vm, &SnapshotRequest { comment, live }).await;
                match taken {
                    // An answer whose id cannot be read is a definite failure: sent again, it
                    // would only take another snapshot.
                    Ok(taken) => Ok(match written_of(taken) {
                        Ok(written) => AgentReport::Written { operation, written },
                        Err(unreadable) => AgentReport::WriteFailed {
                            operation,
                            detail: OperatorDetail::new(&unreadable),
                        },
                    }),
                    Err(error) if definite(&error) || matches!(error, AgentError::NotFound) => {
                        Ok(AgentReport::WriteFailed { operation, detail: detail(&error) })
                    }
                    Err(error) => Err(error.to_string()),
                }
            }
            "restore" => {
                let Some(snapshot_id) = store_ref else {
                    let detail = OperatorDetail::new("the snapshot was never written");
                    return Ok(Ok(AgentReport::RestoreFailed { operation, missing: true, detail }));
                };
                match self.agents.restore(agent, vm, &RestoreRequest { snapshot_id }).await {
                    Ok(()) => Ok(AgentReport::Restored { operation }),
                    Err(error @ AgentError::NotFound) => Ok(AgentReport::RestoreFailed {
                        operation,
                        missing: true,
                        detail: detail(&error),
                    }),
                    Err(error) if definite(&error) => Ok(AgentReport::RestoreFailed {
                        operation,
                        missing: false,
                        detail: detail(&error),
                    }),
                    Err(error) => Err(error.to_string()),
                }
            }
            "delete" => {
                // Never written (its creation failed): the host holds nothing of it.
                let Some(snapshot_id) = store_ref else {
                    return Ok(Ok(AgentReport::Deleted { operation, not_found: true }));
                };
                match self.agents.delete_snapshot(agent, vm, &snapshot_id).await {
                    Ok(deleted) => {
                        let not_found = deleted == Deleted::AlreadyGone;
                        Ok(AgentReport::Deleted { operation, not_found })
                    }
                    Err(error) if definite(&error) => {
                        Ok(AgentReport::DeleteFailed { operation, detail: detail(&error) })
                    }
                    Err(error) => Err(error.to_string()),
                }
            }
            _ => Err(format!("no such snapshot work: {}", work.action)),
        })
    }

    /// An export's exchange: written (or failed) as the agent answers; accepted, no report
    /// yet (`Ok(None)`: the agent reports it later, naming the operation). fuse's agent has no
    /// export route: its 404 is the export's error, never sent again.
    async fn export(
        &self,
        stored: &Snapshot,
        (agent, vm, operation): (&AgentTarget, &str, OperationId),
    ) -> Result<Option<AgentReport>, String> {
        let failed = |destination, detail: String| AgentReport::Exported {
            destination,
            operation,
            ready: false,
            detail: Some(OperatorDetail::new(&detail)),
        };
        let Some(export) = pending_export(stored, operation) else { return Ok(None) };
        let destination = export.destination.clone();
        let Some(written) = stored.written.as_ref() else {
            return Ok(Some(failed(destination, "the snapshot was never written".into())));
        };
        let request =
            ExportRequest { destination: destination.to_string(), operation_id: operation.0 };
        let store_ref = written.store_ref.to_string();
        match self.agents.export_snapshot(agent, (vm, &store_ref), &request).await {
            Ok(Exported::Written) => Ok(Some(AgentReport::Exported {
                destination,
                operation,
                ready: true,
                detail: None,
            })),
            Ok(Exported::Accepted) => Ok(None),
            Err(error @ AgentError::NotFound) => Ok(Some(failed(
                destination,
                format!("{error} (or no export route: fuse's agent has none)"),
            ))),
            Err(error) if definite(&error) => Ok(Some(failed(destination, error.to_string()))),
            Err(error) => Err(error.to_string()),
        }
    }
}

impl<S, L> DispatchKind for SnapshotDispatch<S, L>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    L: SnapshotListing + 'static,
{
    const NAME: &'static str = "snapshot-dispatcher";
    const VERSION: u32 = 1;
    // Each export is its own request: a later one (another destination) or a restore never
    // supersedes it, or it would stay pending with nothing left to send it.
    const BESIDE: &'static [&'static str] = &["export"];

    async fn intent(&self, event: &RecordedEvent) -> Result<Option<Intent>, ReconcileError> {
        if event.stream_type.as_str() != "snapshot" {
            return Ok(None);
        }
        let Ok(decoded) = SnapshotEvent::from_stored(event.event_type.as_str(), &event.payload)
        else {
            return Ok(None);
        };
        let Some((action, operation)) = started_work(&decoded) else { return Ok(None) };
        let Some(snapshot) = SnapshotId::of_stream(&event.stream_id) else { return Ok(None) };
        let (_, stored) = match self.snapshots.owned(snapshot).await {
            Ok(found) => found,
            Err(leasehold_commands::CommandError::NotFound) => return Ok(None),
            Err(error) => return Err(retry("read a snapshot", &error)),
        };
        let Some(terms) = stored.terms.as_ref().filter(|_| awaits(&stored, action, operation))
        else {
            return Ok(None);
        };
        Ok(Some(Intent {
            stream: event.stream_id.clone(),
            // One piece of work per event: its version names it on the stream.
            generation: event.version,
            event_id: event.event_id,
            tenant: event.tenant_id.clone(),
            target: terms.host.to_string(),
            action,
            request: serde_json::json!({
                "operation": operation.0,
                "vm": agent_name(terms.vm),
                "live": terms.requested != RequestedKind::Disk,
            }),
        }))
    }

    async fn send(&self, work: &Work, _now: DateTime<Utc>) -> Result<Sent, ReconcileError> {
        let snapshot = SnapshotId::of_stream(&work.stream)
            .ok_or_else(|| retry("read a snapshot's id", &"not a snapshot stream"))?;
        let host = HostId::parse("host", work.target.as_str())
            .map_err(|error| retry("read a host's id", &error))?;
        let operation: uuid::Uuid = serde_json::from_value(work.request["operation"].clone())
            .map_err(|error| retry("decode an operation", &error))?;
        let operation = OperationId(operation);
        let Some(agent) = host_target(self.snapshots.pipeline(), &self.tokens, &host).await? else {
            let detail = format!("host {host} has no registered agent token");
            return Ok(Sent::NotSent { detail, wait: NO_TOKEN_WAIT });
        };
        let stored = match self.snapshots.owned(snapshot).await {
            Ok((_, stored)) if awaits(&stored, &work.action, operation) => stored,
            Ok(_) | Err(leasehold_commands::CommandError::NotFound) => return Ok(Sent::Moot),
            Err(error) => return Err(retry("read a snapshot", &error)),
        };
        let answer = if work.action == "export" {
            let vm = work.request["vm"].as_str().unwrap_or_default();
            self.export(&stored, (&agent, vm, operation)).await
        } else {
            self.exchange(work, &stored, (&agent, operation)).await?.map(Some)
        };
        let report = match answer {
            Ok(Some(report)) => report,
            // Taken on by the agent, which reports it itself.
            Ok(None) => return Ok(Sent::Delivered),
            Err(detail) => return Ok(Sent::Failed { detail }),
        };
        let refused = matches!(
            report,
            AgentReport::WriteFailed { .. }
                | AgentReport::RestoreFailed { .. }
                | AgentReport::DeleteFailed { .. }
                | AgentReport::Exported { ready: false, .. }
        );
        let key = format!("snapshot-dispatch:{}:{}", snapshot.0, work.generation);
        let caller = dispatcher();
        let recorded = self.snapshots.report(&caller, (&host, &key), snapshot, report).await;
        match recorded {
            // The snapshot moved on meanwhile (GC gave up on its creation, another operation
            // started): the answer is no longer its to take, and the work is moot.
            Err(
                leasehold_commands::CommandError::Refused(_)
                | leasehold_commands::CommandError::NotFound,
            ) => return Ok(Sent::Moot),
            Err(error) => return Err(retry("record a snapshot agent's answer", &error)),
            Ok(_) => {}
        }
        Ok(if refused { Sent::Refused } else { Sent::Delivered })
    }

    /// An export the agent took on (202) has this long to be reported.
    fn answer_within(&self, action: &str) -> Option<chrono::TimeDelta> {
        (action == "export").then_some(self.export_within)
    }

    /// An export taken on and never reported by its deadline is the export's error (it may be
    /// asked again); one settled meanwhile is left as it is.
    async fn lapsed(&self, work: &Work, _now: DateTime<Utc>) -> Result<bool, ReconcileError> {
        let (Some(snapshot), Ok(host)) =
            (SnapshotId::of_stream(&work.stream), HostId::parse("host", work.target.as_str()))
        else {
            return Ok(false);
        };
        let operation: uuid::Uuid = serde_json::from_value(work.request["operation"].clone())
            .map_err(|error| retry("decode an operation", &error))?;
        let operation = OperationId(operation);
        let destination = match self.snapshots.owned(snapshot).await {
            Ok((_, stored)) => pending_export(&stored, operation).map(|e| e.destination.clone()),
            Err(leasehold_commands::CommandError::NotFound) => None,
            Err(error) => return Err(retry("read a snapshot", &error)),
        };
        let Some(destination) = destination else { return Ok(false) };
        let detail = OperatorDetail::new("the host's agent took the export and never reported it");
        let report =
            AgentReport::Exported { destination, operation, ready: false, detail: Some(detail) };
        let key = format!("snapshot-dispatch:{}:{}:lapsed", snapshot.0, work.generation);
        let caller = dispatcher();
        match self.snapshots.report(&caller, (&host, &key), snapshot, report).await {
            Ok(_) => Ok(true),
            // Settled meanwhile (the agent's report won the race): nothing lapsed.
            Err(
                leasehold_commands::CommandError::Refused(_)
                | leasehold_commands::CommandError::NotFound,
            ) => Ok(false),
            Err(error) => Err(retry("record an export's lapse", &error)),
        }
    }

    /// A send is one exchange (a snapshot's or a restore's with their longer limit) and the
    /// recording of its answer.
    fn claim_hold(&self) -> Duration {
        Duration::from_secs(crate::limits::HOST_AGENT_SNAPSHOT_SECONDS) + self.timeout
    }
}
