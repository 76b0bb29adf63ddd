//! Queries over rented capacity's read models: rentals (each beside its current node's state,
//! lease expiry and facts' receipt time), nodes and the run timeline. Every query is scoped to
//! one tenant in SQL, or to none for operators (`Scope::Every`); the columns read are the
//! tenant-safe ones (the tables hold no token, hash, credential or operation id).

use chrono::{DateTime, Utc};
use leasehold_domain::{StoreError, TenantId};
use tokio_postgres::Row;
use uuid::Uuid;

use super::{PAGE_ROWS_MAX, PgReadModels};

/// Whose rows a query reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// One tenant's (another tenant's rows are simply not found).
    Tenant(&'a TenantId),
    /// Every tenant's (operators).
    Every,
}

impl<'a> Scope<'a> {
    /// The tenant to filter by (none: every tenant).
    pub fn param(self) -> Option<&'a str> {
        match self {
            Scope::Tenant(tenant) => Some(tenant.as_str()),
            Scope::Every => None,
        }
    }
}

/// A rental with its current node, as its tenant sees it.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // The columns of `rentals`, and of its node's row in `nodes`.
pub struct RentalSummary {
    pub rental_id: Uuid,
    pub tenant_id: String,
    pub connection_id: String,
    pub offer_id: String,
    pub state: String,
    pub generation: i64,
    pub node_id: Option<Uuid>,
    pub resources: serde_json::Value,
    pub interruptible_requested: bool,
    pub interruptible_allocated: Option<bool>,
    pub pricing: Option<serde_json::Value>,
    pub max_lifetime_seconds: i64,
    pub observed_state: Option<String>,
    pub state_since: Option<DateTime<Utc>>,
    pub observed_at: Option<DateTime<Utc>>,
    pub received_at: Option<DateTime<Utc>>,
    pub running_run: Option<Uuid>,
    pub queued_runs: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub node_state: Option<String>,
    pub node_lease_expires: Option<DateTime<Utc>>,
    pub node_facts_received_at: Option<DateTime<Utc>>,
}

/// A node, as its rental's tenant sees it.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // The columns of `nodes`.
pub struct NodeSummary {
    pub node_id: Uuid,
    pub rental_id: Uuid,
    pub generation: i64,
    pub state: String,
    pub agent_version: Option<String>,
    pub facts: Option<serde_json::Value>,
    pub facts_received_at: Option<DateTime<Utc>>,
    pub enrolled_at: Option<DateTime<Utc>>,
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    pub lease_expires: Option<DateTime<Utc>>,
    pub pending_operations: i32,
    pub updated_at: DateTime<Utc>,
}

/// A run's timeline, as its tenant sees it.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // The columns of `run_timeline`.
pub struct RunSummary {
    pub run_id: Uuid,
    pub rental_id: Option<Uuid>,
    pub booking_id: Option<Uuid>,
    pub status: String,
    pub node_id: Option<Uuid>,
    pub attempts: serde_json::Value,
    pub cancel_requested: bool,
    pub outcome: Option<String>,
    pub exit_code: Option<i32>,
    pub failure: Option<String>,
    pub cleanup: Option<String>,
    pub last_received_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The state of its current attempt's node, from `nodes`.
    pub node_state: Option<String>,
    /// Its booking on its rental's schedule: `running`, `queued` or `released` (from
    /// `rentals`: the run its schedule runs now).
    pub booking_state: Option<String>,
}

impl RunSummary {
    /// Its workload is unobserved: its node was lost (its lease passed) while the run was
    /// under way. Not a failure (rule 10): the run's outcome is only what the node reports.
    pub fn unobserved(&self) -> bool {
        let under_way = matches!(self.status.as_str(), "launching" | "indeterminate" | "running");
        under_way && self.node_state.as_deref() == Some("lost")
    }
}

/// A filter and a position for listing rentals or runs, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RentedListing {
    /// Only this state (a rental's `state`, a run's `status`).
    pub state: Option<String>,
    /// Only runs on this rental (runs only).
    pub rental: Option<Uuid>,
    /// Continue after this (created_at, id).
    pub after: Option<(DateTime<Utc>, Uuid)>,
    /// Rows wanted, capped at [`PAGE_ROWS_MAX`] + 1.
    pub first: usize,
}

const RENTAL_COLUMNS: &str = "r.rental_id, r.tenant_id, r.connection_id, r.offer_id, r.state, \
     r.generation, r.node_id, r.resources, r.interruptible_requested, \
     r.interruptible_allocated, r.pricing, r.max_lifetime_seconds, r.observed_state, \
     r.state_since, r.observed_at, r.received_at, r.running_run, r.queued_runs, r.created_at, \
     r.updated_at, n.state, n.lease_expires, n.facts_received_at";

/// The rental's current node, of the same tenant.
const RENTAL_FROM: &str = "rentals r LEFT JOIN nodes n \
     ON n.node_id = r.node_id AND n.tenant_id = r.tenant_id";

const NODE_COLUMNS: &str = "node_id, rental_id, generation, state, agent_version, facts, \
     facts_received_at, enrolled_at, last_heartbeat_at, lease_expires, pending_operations, \
     updated_at";

const RUN_COLUMNS: &str = "t.run_id, t.rental_id, t.booking_id, t.status, t.node_id, \
     t.attempts, t.cancel_requested, t.outcome, t.exit_code, t.failure, t.cleanup, \
     t.last_received_at, t.created_at, t.updated_at, n.state, \
     CASE WHEN t.booking_id IS NULL THEN NULL WHEN t.status = 'closed' THEN 'released' \
     WHEN r.running_run = t.run_id THEN 'running' ELSE 'queued' END";

/// The run's current attempt's node and its rental, of the same tenant.
const RUN_FROM: &str = "run_timeline t LEFT JOIN nodes n \
     ON n.node_id = t.node_id AND n.tenant_id = t.tenant_id \
     LEFT JOIN rentals r ON r.rental_id = t.rental_id AND r.tenant_id = t.tenant_id";

impl PgReadModels {
    /// One rental in `scope`.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn rental(
        &self,
        scope: Scope<'_>,
        rental: Uuid,
    ) -> Result<Option<RentalSummary>, StoreError> {
        let sql = format!(
            "SELECT {RENTAL_COLUMNS} FROM {RENTAL_FROM} \
             WHERE ($1::text IS NULL OR r.tenant_id = $1) AND r.rental_id = $2"
        );
        let rows = self.query(&sql, &[&scope.param(), &rental]).await?;
        Ok(rows.first().map(rental_of))
    }

    /// A page of the rentals in `scope`, newest first.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn rentals(
        &self,
        scope: Scope<'_>,
        listing: &RentedListing,
    ) -> Result<Vec<RentalSummary>, StoreError> {
        let (limit, after_at, after_id) = page_of(listing);
        let sql = format!(
            "SELECT {RENTAL_COLUMNS} FROM {RENTAL_FROM} \
             WHERE ($1::text IS NULL OR r.tenant_id = $1) \
             AND ($2::text IS NULL OR r.state = $2) \
             AND ($3::timestamptz IS NULL OR (r.created_at, r.rental_id) < ($3, $4::uuid)) \
             ORDER BY r.created_at DESC, r.rental_id DESC LIMIT $5"
        );
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&scope.param(), &listing.state, &after_at, &after_id, &limit];
        let rows = self.query(&sql, &params).await?;
        Ok(rows.iter().map(rental_of).collect())
    }

    /// Every node of a rental in `scope`, newest generation first.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn rental_nodes(
        &self,
        scope: Scope<'_>,
        rental: Uuid,
    ) -> Result<Vec<NodeSummary>, StoreError> {
        let sql = format!(
            "SELECT {NODE_COLUMNS} FROM nodes WHERE ($1::text IS NULL OR tenant_id = $1) \
             AND rental_id = $2 ORDER BY generation DESC LIMIT {PAGE_ROWS_MAX}"
        );
        let rows = self.query(&sql, &[&scope.param(), &rental]).await?;
        Ok(rows.iter().map(node_of).collect())
    }

    /// One run in `scope`.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn run(&self, scope: Scope<'_>, run: Uuid) -> Result<Option<RunSummary>, StoreError> {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM {RUN_FROM} \
             WHERE ($1::text IS NULL OR t.tenant_id = $1) AND t.run_id = $2"
        );
        let rows = self.query(&sql, &[&scope.param(), &run]).await?;
        Ok(rows.first().map(run_of))
    }

    /// A page of the runs in `scope`, newest first.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn runs(
        &self,
        scope: Scope<'_>,
        listing: &RentedListing,
    ) -> Result<Vec<RunSummary>, StoreError> {
        let (limit, after_at, after_id) = page_of(listing);
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM {RUN_FROM} \
             WHERE ($1::text IS NULL OR t.tenant_id = $1) \
             AND ($2::text IS NULL OR t.status = $2) \
             AND ($3::uuid IS NULL OR t.rental_id = $3) \
             AND ($4::timestamptz IS NULL OR (t.created_at, t.run_id) < ($4, $5::uuid)) \
             ORDER BY t.created_at DESC, t.run_id DESC LIMIT $6"
        );
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
            [&scope.param(), &listing.state, &listing.rental, &after_at, &after_id, &limit];
        let rows = self.query(&sql, &params).await?;
        Ok(rows.iter().map(run_of).collect())
    }
}

/// A rental past its max lifetime, for the lifetime reconciler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifetimePassed {
    /// The rental.
    pub rental: Uuid,
    /// Its tenant.
    pub tenant: String,
    /// Its generation as last projected.
    pub generation: i64,
}

impl PgReadModels {
    /// The ready nodes whose lease passed by `now` (at most 500, oldest lease first), each
    /// with its lease's expiry.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn nodes_past_lease(
        &self,
        now: DateTime<Utc>,
    ) -> Result<Vec<(Uuid, DateTime<Utc>)>, StoreError> {
        let rows = self
            .query(
                "SELECT node_id, lease_expires FROM nodes WHERE state = 'ready' \
                 AND lease_expires <= $1 ORDER BY lease_expires, node_id LIMIT 500",
                &[&now],
            )
            .await?;
        Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
    }

    /// The rentals not terminating whose max lifetime passed by `now` (at most 500, oldest
    /// first).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn rentals_past_lifetime(
        &self,
        now: DateTime<Utc>,
    ) -> Result<Vec<LifetimePassed>, StoreError> {
        let rows = self
            .query(
                "SELECT rental_id, tenant_id, generation FROM rentals \
                 WHERE state NOT IN ('terminating', 'terminated') \
                 AND created_at + make_interval(secs => max_lifetime_seconds) <= $1 \
                 ORDER BY created_at, rental_id LIMIT 500",
                &[&now],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| LifetimePassed {
                rental: row.get(0),
                tenant: row.get(1),
                generation: row.get(2),
            })
            .collect())
    }

    /// The runs whose launch has had no answer since `before` (launching or indeterminate,
    /// unchanged since), in id order after `after`, at most `limit`, each with its tenant: a
    /// sweep pages through them all in turn, so runs that stay unsettled (their node lost)
    /// never keep the others from being looked at.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn launches_unanswered(
        &self,
        before: DateTime<Utc>,
        (after, limit): (Option<Uuid>, i64),
    ) -> Result<Vec<(Uuid, String)>, StoreError> {
        let rows = self
            .query(
                "SELECT run_id, tenant_id FROM run_timeline \
                 WHERE status IN ('launching', 'indeterminate') AND updated_at <= $1 \
                 AND ($2::uuid IS NULL OR run_id > $2) ORDER BY run_id LIMIT $3",
                &[&before, &after, &limit],
            )
            .await?;
        Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
    }

    /// The rentals a provider holds a machine for (starting to terminating), in id order
    /// after `after`, at most `limit`: a sweep pages through them all in turn, so rentals
    /// whose provider does not answer never keep the others from being looked at.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn rentals_to_observe(
        &self,
        (after, limit): (Option<Uuid>, i64),
    ) -> Result<Vec<Uuid>, StoreError> {
        let rows = self
            .query(
                "SELECT rental_id FROM rentals \
                 WHERE state IN ('starting', 'active', 'stopping', 'stopped', 'terminating') \
                 AND ($1::uuid IS NULL OR rental_id > $1) ORDER BY rental_id LIMIT $2",
                &[&after, &limit],
            )
            .await?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }
}

pub(super) fn page_of(listing: &RentedListing) -> (i64, Option<DateTime<Utc>>, Option<Uuid>) {
    let limit = i64::try_from(listing.first.clamp(1, PAGE_ROWS_MAX + 1)).unwrap_or(1);
    let (at, id) = listing.after.map_or((None, None), |(at, id)| (Some(at), Some(id)));
    (limit, at, id)
}

fn rental_of(row: &Row) -> RentalSummary {
    RentalSummary {
        rental_id: row.get(0),
        tenant_id: row.get(1),
        connection_id: row.get(2),
        offer_id: row.get(3),
        state: row.get(4),
        generation: row.get(5),
        node_id: row.get(6),
        resources: row.get(7),
        interruptible_requested: row.get(8),
        interruptible_allocated: row.get(9),
        pricing: row.get(10),
        max_lifetime_seconds: row.get(11),
        observed_state: row.get(12),
        state_since: row.get(13),
        observed_at: row.get(14),
        received_at: row.get(15),
        running_run: row.get(16),
        queued_runs: row.get(17),
        created_at: row.get(18),
        updated_at: row.get(19),
        node_state: row.get(20),
        node_lease_expires: row.get(21),
        node_facts_received_at: row.get(22),
    }
}

fn node_of(row: &Row) -> NodeSummary {
    NodeSummary {
        node_id: row.get(0),
        rental_id: row.get(1),
        generation: row.get(2),
        state: row.get(3),
        agent_version: row.get(4),
        facts: row.get(5),
        facts_received_at: row.get(6),
        enrolled_at: row.get(7),
        last_heartbeat_at: row.get(8),
        lease_expires: row.get(9),
        pending_operations: row.get(10),
        updated_at: row.get(11),
    }
}

fn run_of(row: &Row) -> RunSummary {
    RunSummary {
        run_id: row.get(0),
        rental_id: row.get(1),
        booking_id: row.get(2),
        status: row.get(3),
        node_id: row.get(4),
        attempts: row.get(5),
        cancel_requested: row.get(6),
        outcome: row.get(7),
        exit_code: row.get(8),
        failure: row.get(9),
        cleanup: row.get(10),
        last_received_at: row.get(11),
        created_at: row.get(12),
        updated_at: row.get(13),
        node_state: row.get(14),
        booking_state: row.get(15),
    }
}
