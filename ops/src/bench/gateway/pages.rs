//! Pages of 50 with a filter, walking `endCursor`s, over HTTP, at a million rows: leases by
//! status, and workloads of every kind by kind and state; the baseline sends the same keyset
//! SELECT straight to PostgreSQL.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use leasehold_adapters::DatabaseUrl;
use serde_json::{Value, json};
use uuid::Uuid;

use super::{Gateway, TENANT, latency_measures};
use crate::bench::Measure;

/// Pages walked before starting again from the first (a mix of first and deep pages).
const PAGES_PER_WALK: usize = 20;

/// One paged list: its GraphQL query and root field, and the raw keyset SELECT it makes.
pub struct Walk {
    /// The measures' prefix (`leases_page`).
    pub name: &'static str,
    /// The query, with `$after`.
    pub query: &'static str,
    /// Its root field.
    pub field: &'static str,
    /// The raw SELECT: `$1` the tenant, then `filter`, then the position (created, id).
    pub raw_sql: &'static str,
    /// The raw SELECT's filter values.
    pub filter: &'static [&'static str],
    /// The columns of the position in the raw rows (created, id).
    pub position: (usize, usize),
    /// Whether the raw SELECT always takes a position (the first page's beyond every row),
    /// rather than `NULL` for the first page.
    pub always_after: bool,
}

/// Ready leases, 50 a page.
pub const LEASES: Walk = Walk {
    name: "leases_page",
    query: "query($after: String) { leases(first: 50, after: $after, \
        filter: { status: READY }) { edges { node { id status items { sku quantity } createdAt } } \
        pageInfo { hasNextPage endCursor } } }",
    field: "leases",
    raw_sql: "SELECT lease_id, provider_id, status, chain_state, reason, message, \
        items, fail_count, created_at, updated_at, retained_until, restored_from FROM leases \
        WHERE tenant_id = $1 AND status = $2 \
        AND ($3::timestamptz IS NULL OR (created_at, lease_id) < ($3, $4::uuid)) \
        ORDER BY created_at DESC, lease_id DESC LIMIT 51",
    filter: &["ready"],
    position: (8, 0),
    always_after: false,
};

/// Busy runner leases among workloads of every kind, 50 a page.
pub const WORKLOADS: Walk = Walk {
    name: "workloads_page",
    query: "query($after: String) { workloads(first: 50, after: $after, \
        filter: { kind: \"runner\", state: \"busy\" }) { edges { node { id kind state \
        resources { sku quantity } createdAt updatedAt } } pageInfo { hasNextPage endCursor } } }",
    field: "workloads",
    raw_sql: "SELECT kind, workload_id, status, backend_name, items, created_at, updated_at \
        FROM workloads WHERE tenant_id = $1 AND kind = $2 AND status = $3 \
        AND (created_at, workload_id) < ($4, $5) \
        ORDER BY created_at DESC, workload_id DESC LIMIT 51",
    filter: &["runner", "busy"],
    position: (5, 1),
    always_after: true,
};

/// Writes `count` leases of the bench tenant straight into the read model, a fifth of them
/// ready, one second apart.
pub async fn fill(url: &DatabaseUrl, count: u64) -> anyhow::Result<()> {
    let client = url.connect().await?;
    let count = i64::try_from(count)?;
    client
        .execute(
            "INSERT INTO leases (lease_id, tenant_id, provider_id, status, chain_state, items, \
             fail_count, created_at, updated_at) \
             SELECT gen_random_uuid(), $1, '00000000-0000-0000-0000-000000000007', \
             (ARRAY['provisioning','ready','failed','deprovisioned','retained'])[1 + n % 5], \
             'active', '[{\"sku\":\"gpu.h100.1x\",\"quantity\":1}]', 0, \
             now() - n * interval '1 second', now() FROM generate_series(1::bigint, $2::bigint) AS n",
            &[&TENANT, &count],
        )
        .await
        .context("filling leases")?;
    client.batch_execute("ANALYZE leases").await?;
    Ok(())
}

/// Writes `count` workloads of the bench tenant straight into `workloads`, one second apart,
/// of the five kinds in uneven shares (lease 40 %, VM 30 %, rental 15 %, run 14 %, runner
/// 1 %), each in one of five states of its own in turn: the busy runner leases `WORKLOADS`
/// walks are one workload in 500, a rare kind and state.
pub async fn fill_workloads(url: &DatabaseUrl, count: u64) -> anyhow::Result<()> {
    let client = url.connect().await?;
    let count = i64::try_from(count)?;
    client
        .execute(
            "INSERT INTO workloads (kind, workload_id, tenant_id, status, backend_name, items, \
             created_at, updated_at) \
             SELECT (ARRAY['lease','vm','rental','run','runner'])[pick.k], gen_random_uuid(), \
             $1, (ARRAY[ \
                 ARRAY['provisioning','ready','failed','deprovisioned','retained'], \
                 ARRAY['provisioning','scheduled','running','destroying','destroyed'], \
                 ARRAY['requested','active','stopped','terminating','terminated'], \
                 ARRAY['booked','launching','running','succeeded','failed'], \
                 ARRAY['assigned','launching','busy','teardown','done']])[pick.k][1 + (n / 100) % 5], \
             NULL, '[{\"sku\":\"runner.vcpu\",\"quantity\":4}]', \
             now() - n * interval '1 second', now() \
             FROM generate_series(1::bigint, $2::bigint) AS n \
             CROSS JOIN LATERAL (SELECT CASE WHEN n % 100 < 40 THEN 1 WHEN n % 100 < 70 THEN 2 \
               WHEN n % 100 < 85 THEN 3 WHEN n % 100 < 99 THEN 4 ELSE 5 END AS k) AS pick",
            &[&TENANT, &count],
        )
        .await
        .context("filling workloads")?;
    client.batch_execute("ANALYZE workloads").await?;
    Ok(())
}

/// p50/p99 of `walk`'s page over HTTP, beside the raw SELECT's.
pub async fn measure(
    url: &DatabaseUrl,
    gateway: &Gateway,
    (walk, duration): (&Walk, Duration),
) -> anyhow::Result<Vec<Measure>> {
    let raw = raw_pages(url, walk, duration).await?;
    let served = served_pages(gateway, walk, duration).await?;
    Ok(latency_measures(walk.name, served, raw))
}

async fn served_pages(
    gateway: &Gateway,
    walk: &Walk,
    duration: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let http = reqwest::Client::new();
    let endpoint = format!("{}/graphql", gateway.base);
    let deadline = Instant::now() + duration;
    let mut samples = Vec::new();
    let mut after = Value::Null;
    while Instant::now() < deadline {
        let body = json!({ "query": walk.query, "variables": { "after": after } });
        let started = Instant::now();
        let answer: Value = http
            .post(&endpoint)
            .bearer_auth(&gateway.token)
            .json(&body)
            .send()
            .await?
            .json()
            .await?;
        samples.push(started.elapsed());
        let page = &answer["data"][walk.field];
        anyhow::ensure!(
            page["edges"].as_array().is_some_and(|edges| edges.len() == 50),
            "a full page: {answer}"
        );
        after = if samples.len() % PAGES_PER_WALK == 0 {
            Value::Null
        } else {
            page["pageInfo"]["endCursor"].clone()
        };
    }
    Ok(samples)
}

async fn raw_pages(
    url: &DatabaseUrl,
    walk: &Walk,
    duration: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let client = url.connect().await?;
    let statement = client.prepare(walk.raw_sql).await?;
    let deadline = Instant::now() + duration;
    let mut samples = Vec::new();
    // The first page's position: none, or beyond every row.
    let start: (Option<DateTime<Utc>>, Option<Uuid>) = if walk.always_after {
        (Some(Utc::now() + chrono::TimeDelta::days(1)), Some(Uuid::max()))
    } else {
        (None, None)
    };
    let mut after = start;
    while Instant::now() < deadline {
        let started = Instant::now();
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&TENANT];
        params.extend(
            walk.filter.iter().map(|value| value as &(dyn tokio_postgres::types::ToSql + Sync)),
        );
        params.extend([&after.0 as &(dyn tokio_postgres::types::ToSql + Sync), &after.1]);
        let rows = client.query(&statement, &params).await?;
        samples.push(started.elapsed());
        let last = rows.get(49).context("a full page")?;
        after = if samples.len() % PAGES_PER_WALK == 0 {
            start
        } else {
            (Some(last.get(walk.position.0)), Some(last.get(walk.position.1)))
        };
    }
    Ok(samples)
}
