//! The inventory reconciler (DOMAIN.md §3, rules 11–13): on a tick, it reads each backend's
//! complete inventory (`GET /provisions` then `GET /retentions`, keyset pages walked to the
//! end; `RefreshState` is a no-op for HTTP backends, as in fred) and compares it with the log.
//!
//! - **A backend that did not answer defers everything.** Any page that fails, times out or
//!   cannot be read makes the whole sweep of that backend deferred: no budget is read, no
//!   orphan released, no record confirmed gone. A fenced backend is never called.
//! - **The failure budget is read only from a complete, identity-bearing inventory**: every
//!   listed provision names its tenant, and the lease's own. Then a lease's budget is
//!   recorded (`ObserveTerminalBudget`), and an exhausted one closes a failed lease
//!   (the aggregate decides; `fail_count` never does). A point lookup never counts.
//! - **Orphans are reported**: provisions the backend lists that Leasehold does not hold
//!   there (an unknown lease, one placed elsewhere, one released or failed for good, one held
//!   as retained but listed otherwise, one of another tenant). A released or failed one is
//!   released at the backend only on a positive terminal fact, its lease's chain state re-read
//!   as closed, rejected or expired (rule 11); the others are never touched.
//! - **Live leases the listing lacks** are counted and reported, never re-provisioned.
//! - **Reaped retained data**: a record being reaped that the complete retention listing no
//!   longer holds, and whose point read is a 404, is confirmed destroyed (`ConfirmReaped`).
//! - **Custom domains** are reconciled onto the running provision
//!   (`POST /reconcile_custom_domain`, which restarts it and rolls back on failure): at once
//!   when a `LeaseCustomDomainSet` event arrives, and on every sweep for a ready lease whose
//!   listed items carry other domains than the lease's, at most three times for one set of
//!   domains (each restarts the provision; a backend that rolls back would be restarted for
//!   ever). A failure is logged; the backend's own rollback keeps what runs consistent, and the
//!   lease keeps the domains its tenant asked for.
//!
//! What operators see of each sweep is in `backend_status` (the `backends` query). Every
//! command is keyed by what the sweep saw (the lease's version, or the record), so a
//! restarted sweep issues the same commands and the pipeline answers them from its record.

use std::collections::HashSet;
use std::sync::Mutex;

use chrono::{DateTime, TimeDelta, Utc};
use leasehold_commands::CommandStore;
use leasehold_commands::lease_service::{Caller, LeaseService};
use leasehold_domain::lease::{
    ChainState, Lease, LeaseCommand, LeaseId, LeaseItems, LeaseStatus, TerminalBudget,
    TerminalVerdict,
};
use leasehold_domain::{Actor, RecordedEvent, StoreError};
use leasehold_projections::{ReconcileError, Reconciler, Seen};
use uuid::Uuid;

use crate::backends::status::{Orphan, PgBackendStatus, Sweep};
use crate::backends::wire::{ProvisionInfo, ReconcileCustomDomainRequest};
use crate::backends::{BackendClient, BackendError, CallError};
use crate::dispatch::{Backends, wire_items};
use crate::store::{PgEventStore, from_driver, from_pool};

/// How many times one set of custom domains is asked for before the reconciler stops asking
/// (the backend restarts the provision for it and rolls back when that fails: asking on
/// every sweep would restart it for ever). A change of the domains asks again.
const DOMAIN_TRIES_MAX: u32 = 3;

/// Statuses of a lease the backend should list (a provisioning one may not be sent yet).
const SHOULD_BE_LISTED: [&str; 5] = ["ready", "failing", "failed", "restarting", "updating"];

/// The inventory reconciler.
#[derive(Debug)]
pub struct Inventory<S> {
    service: LeaseService<S>,
    backends: Backends,
    log: PgEventStore,
    every: TimeDelta,
    next_sweep: Mutex<Option<DateTime<Utc>>>,
    /// Per lease: the custom domains last asked for, and how many times.
    domain_tries: Mutex<std::collections::HashMap<Uuid, (String, u32)>>,
}

impl<S: CommandStore + Clone + Send + Sync + 'static> Inventory<S> {
    /// Sweeps `backends` every `every`, reading the read models in `log`'s database and
    /// issuing commands through `service`.
    pub fn new(
        service: LeaseService<S>,
        backends: Backends,
        log: PgEventStore,
        every: TimeDelta,
    ) -> Self {
        Self {
            service,
            backends,
            log,
            every,
            next_sweep: Mutex::new(None),
            domain_tries: Mutex::default(),
        }
    }

    /// Sweeps one backend: its complete listing, or deferred.
    async fn sweep(
        &self,
        backend: &str,
        client: &BackendClient,
        began: DateTime<Utc>,
    ) -> Result<Sweep, ReconcileError> {
        if client.config().fenced {
            return Ok(Sweep::Deferred { error: "fenced by an operator: never called".into() });
        }
        if client.config().subscribes {
            return Ok(Sweep::Deferred { error: "subscribes to its work: never called".into() });
        }
        let listed = match client.list_provisions().await {
            Ok(listed) => listed,
            Err(error) => {
                return Ok(Sweep::Deferred { error: format!("GET /provisions: {error}") });
            }
        };
        let retained = match client.list_retentions().await {
            Ok(retained) => retained,
            Err(error) => {
                return Ok(Sweep::Deferred { error: format!("GET /retentions: {error}") });
            }
        };
        let identity_bearing = listed.iter().all(|p| p.tenant.is_some());
        let mut orphans = Vec::new();
        for provision in &listed {
            if let Some(orphan) = self.check(backend, client, provision, identity_bearing).await? {
                tracing::warn!(backend, lease = %orphan.lease, why = orphan.why, "orphan provision");
                orphans.push(orphan);
            }
        }
        let listed: HashSet<Uuid> = listed.iter().map(|p| p.lease_uuid).collect();
        let missing =
            self.placed_here(backend).await?.iter().filter(|l| !listed.contains(l)).count();
        let retained: HashSet<Uuid> = retained.iter().map(|r| r.lease_uuid).collect();
        for lease in self.reaping_here(backend, began).await? {
            // Absent from the listing, and the backend's own record of it gone: the data is.
            let gone = matches!(
                client.provision_info(lease).await,
                Err(CallError::Backend(BackendError::NotProvisioned))
            );
            if !retained.contains(&lease) && gone {
                self.command(
                    LeaseId(lease),
                    format!("inventory:reaped:{lease}"),
                    LeaseCommand::ConfirmReaped,
                )
                .await?;
            }
        }
        Ok(Sweep::Complete { provisions: listed.len(), identity_bearing, missing, orphans })
    }

    /// Compares one listed provision with its lease: an orphan, or its budget recorded.
    async fn check(
        &self,
        backend: &str,
        client: &BackendClient,
        provision: &ProvisionInfo,
        identity_bearing: bool,
    ) -> Result<Option<Orphan>, ReconcileError> {
        let lease = LeaseId(provision.lease_uuid);
        let orphan = |why: &str, released: bool| {
            Some(Orphan {
                lease: lease.0,
                status: provision.status.clone(),
                why: why.into(),
                released,
            })
        };
        let found =
            self.service.pipeline().state::<Lease>(&lease.stream_id()).await.map_err(|error| {
                ReconcileError::Retry { action: "load a lease".into(), reason: error.to_string() }
            })?;
        let Some((owner, version, state)) = found else { return Ok(orphan("unknown", false)) };
        let Some(terms) = &state.terms else { return Ok(orphan("unknown", false)) };
        if terms.backend.as_str() != backend {
            return Ok(orphan("elsewhere", false));
        }
        if provision.tenant.as_deref().is_some_and(|tenant| tenant != owner.as_str()) {
            return Ok(orphan("foreign", false));
        }
        // Held as released, or failed for good (its chain closed, rejected or expired: a
        // lapsed provision the backend finished late): what the backend still runs is an
        // orphan, released on that positive terminal fact (rule 11), re-read just now.
        let held_gone = state.status == LeaseStatus::Deprovisioned
            || (state.status == LeaseStatus::Failed && state.chain.is_terminal());
        if held_gone && provision.status != "deprovisioning" {
            let release = state.chain.is_terminal() && self.release(backend, client, lease).await;
            return Ok(orphan("released", release));
        }
        // Held as retained, listed otherwise: reported only, since the data may be what a
        // restore needs.
        if state.status == LeaseStatus::Retained && provision.status != "retained" {
            return Ok(orphan("retained", false));
        }
        if !state.status.is_live() {
            return Ok(None);
        }
        if state.status == LeaseStatus::Ready {
            if domains_match(provision, &terms.items) {
                let mut tries =
                    self.domain_tries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                tries.remove(&lease.0);
            } else {
                self.reconcile_domains(backend, client, lease, &terms.items).await;
            }
        }
        let identified = identity_bearing && provision.tenant.is_some();
        let Some(budget) = budget_of(provision).filter(|_| identified) else { return Ok(None) };
        // Recorded when it changed, and again while it should close the lease and has not
        // (the budget may have been seen before the failure was).
        let closes = budget.verdict == TerminalVerdict::Exhausted
            && budget.consecutive_failures >= 1
            && state.status == LeaseStatus::Failed
            && state.chain == ChainState::Active;
        if state.terminal_budget != Some(budget) || closes {
            let command = LeaseCommand::ObserveTerminalBudget {
                verdict: budget.verdict,
                consecutive_failures: budget.consecutive_failures,
                complete_inventory: true,
            };
            let verdict = match budget.verdict {
                TerminalVerdict::Exhausted => "exhausted",
                TerminalVerdict::Available => "available",
            };
            let key = format!(
                "inventory:budget:{}:{version}:{verdict}:{}",
                lease.0, budget.consecutive_failures
            );
            self.command(lease, key, command).await?;
        }
        Ok(None)
    }

    /// Asks `backend` to put the lease's custom domains on its running provision.
    async fn reconcile_domains(
        &self,
        backend: &str,
        client: &BackendClient,
        lease: LeaseId,
        items: &LeaseItems,
    ) {
        let request =
            ReconcileCustomDomainRequest { lease_uuid: lease.0, items: wire_items(items) };
        if !self.may_ask_domains(backend, lease, &request) {
            return;
        }
        if let Err(error) = client.reconcile_custom_domain(&request).await {
            tracing::warn!(backend, lease = %lease.0, %error, "reconciling custom domains failed");
        }
    }

    /// Whether these domains may be asked for once more (counting this time).
    fn may_ask_domains(
        &self,
        backend: &str,
        lease: LeaseId,
        request: &ReconcileCustomDomainRequest,
    ) -> bool {
        let desired = serde_json::to_string(&request.items).unwrap_or_default();
        let mut tries = self.domain_tries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = tries.entry(lease.0).or_insert_with(|| (desired.clone(), 0));
        if entry.0 != desired {
            *entry = (desired, 0);
        }
        if entry.1 >= DOMAIN_TRIES_MAX {
            return false;
        }
        entry.1 += 1;
        if entry.1 == DOMAIN_TRIES_MAX {
            tracing::warn!(backend, lease = %lease.0, "custom domains asked for {DOMAIN_TRIES_MAX} times; not again until they change");
        }
        true
    }

    /// Reconciles the custom domains of every ready lease among `events`' domain changes.
    async fn domains_changed(&self, events: &[RecordedEvent]) -> Result<(), ReconcileError> {
        let mut leases: Vec<LeaseId> = Vec::new();
        for event in events.iter().filter(|e| e.event_type.as_str() == "LeaseCustomDomainSet") {
            let Some(id) = event.stream_id.as_str().strip_prefix("lease-") else { continue };
            match id.parse::<Uuid>() {
                Ok(id) if !leases.contains(&LeaseId(id)) => leases.push(LeaseId(id)),
                _ => {}
            }
        }
        for lease in leases {
            let found = self.service.pipeline().state::<Lease>(&lease.stream_id()).await.map_err(
                |error| ReconcileError::Retry {
                    action: "load a lease".into(),
                    reason: error.to_string(),
                },
            )?;
            let Some((_, _, state)) = found else { continue };
            let Some(terms) = state.terms.as_ref().filter(|_| state.status == LeaseStatus::Ready)
            else {
                continue;
            };
            let backend = terms.backend.as_str();
            match self.backends.get(backend) {
                Some(client) if !client.config().fenced && !client.config().subscribes => {
                    self.reconcile_domains(backend, client, lease, &terms.items).await;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Asks `backend` to release an orphan; whether it did (a failure is logged, and the next
    /// sweep asks again).
    async fn release(&self, backend: &str, client: &BackendClient, lease: LeaseId) -> bool {
        match client.deprovision(lease.0).await {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(backend, lease = %lease.0, %error, "releasing an orphan failed");
                false
            }
        }
    }

    /// Runs `command` on `lease` for its owner. A refusal is its answer (the lease moved on).
    async fn command(
        &self,
        lease: LeaseId,
        key: String,
        command: LeaseCommand,
    ) -> Result<(), ReconcileError> {
        use leasehold_commands::CommandError;
        match self.service.for_owner(&inventory(), &key, lease, command).await {
            Ok(_) | Err(CommandError::Refused(_) | CommandError::NotFound) => Ok(()),
            // The same key with another command: what it stood for was decided already.
            Err(CommandError::IdempotencyConflict) => {
                tracing::warn!(lease = %lease.0, %key, "an inventory observation's key was used");
                Ok(())
            }
            Err(error) => Err(ReconcileError::Retry {
                action: "record an inventory observation".into(),
                reason: error.to_string(),
            }),
        }
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        let endpoint = self.log.endpoint();
        self.log.pool().get().await.map_err(|error| from_pool(error, endpoint))
    }

    /// Leases placed on `backend` that it should list, as the read models hold them.
    async fn placed_here(&self, backend: &str) -> Result<Vec<Uuid>, StoreError> {
        let statuses: Vec<&str> = SHOULD_BE_LISTED.to_vec();
        let rows = self
            .client()
            .await?
            .query(
                "SELECT l.lease_id FROM leases l JOIN lease_diagnostics d USING (lease_id) \
                 WHERE d.backend_name = $1 AND l.status = ANY($2)",
                &[&backend, &statuses],
            )
            .await
            .map_err(|error| from_driver(error, self.log.endpoint()))?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    /// Retained records on `backend` being reaped since before `began`.
    async fn reaping_here(
        &self,
        backend: &str,
        began: DateTime<Utc>,
    ) -> Result<Vec<Uuid>, StoreError> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT r.lease_id FROM retained_leases r JOIN lease_diagnostics d \
                 USING (lease_id) WHERE d.backend_name = $1 AND r.status = 'reaping' \
                 AND r.updated_at <= $2",
                &[&backend, &began],
            )
            .await
            .map_err(|error| from_driver(error, self.log.endpoint()))?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }
}

impl<S: CommandStore + Clone + Send + Sync + 'static> Reconciler for Inventory<S> {
    const NAME: &'static str = "lease-inventory";
    const VERSION: u32 = 1;

    async fn reconcile(&self, seen: Seen<'_>) -> Result<Option<DateTime<Utc>>, ReconcileError> {
        self.domains_changed(seen.events).await?;
        let scheduled = *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if scheduled.is_some_and(|at| seen.now < at) {
            return Ok(scheduled);
        }
        let status = PgBackendStatus::new(self.log.clone());
        let mut backends: Vec<_> = self.backends.iter().collect();
        backends.sort_by(|a, b| a.0.cmp(b.0));
        for (name, client) in backends {
            // One backend's trouble never holds the others' sweeps back.
            let sweep = match self.sweep(name, client, seen.now).await {
                Ok(sweep) => sweep,
                Err(ReconcileError::Retry { action, reason }) => {
                    Sweep::Deferred { error: format!("{action}: {reason}") }
                }
                Err(error) => return Err(error),
            };
            if let Sweep::Deferred { error } = &sweep {
                tracing::warn!(backend = %name, %error, "inventory deferred");
            }
            status.record_sweep(name, &sweep, seen.now).await?;
        }
        let next = seen.now + self.every;
        *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(next);
        Ok(Some(next))
    }
}

/// The failure budget a listed provision reports, if it reports one Leasehold knows.
fn budget_of(provision: &ProvisionInfo) -> Option<TerminalBudget> {
    let budget = provision.terminal_budget.as_ref()?;
    let verdict = match budget.verdict.as_str() {
        "exhausted" => TerminalVerdict::Exhausted,
        "available" => TerminalVerdict::Available,
        _ => return None,
    };
    Some(TerminalBudget { verdict, consecutive_failures: budget.consecutive_failures })
}

/// Whether the backend lists the lease's items with the lease's custom domains (a listing
/// without items cannot tell: it is reconciled, which is cheap and idempotent).
fn domains_match(provision: &ProvisionInfo, items: &LeaseItems) -> bool {
    let Some(listed) = &provision.items else { return false };
    let domains = |items: &[crate::backends::wire::LeaseItem]| {
        let mut pairs: Vec<(Option<String>, Option<String>)> = items
            .iter()
            .map(|item| (item.service_name.clone(), item.custom_domain.clone()))
            .collect();
        pairs.sort();
        pairs
    };
    domains(listed) == domains(&wire_items(items))
}

/// The inventory reconciler, as the events' metadata names it.
fn inventory() -> Caller {
    Caller {
        actor: Actor { subject: "lease-inventory".into(), role: "system".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}
