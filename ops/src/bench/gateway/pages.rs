//! Pages of 50 leases with a status filter, walking `endCursor`s, over HTTP, at a million
//! leases; the baseline sends the same keyset SELECT straight to PostgreSQL.

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

const PAGE_QUERY: &str = "query($after: String) { leases(first: 50, after: $after, \
     filter: { status: READY }) { edges { node { id status items { sku quantity } createdAt } } \
     pageInfo { hasNextPage endCursor } } }";

const RAW_PAGE_SQL: &str = "SELECT lease_id, provider_id, status, chain_state, reason, message, \
     items, fail_count, created_at, updated_at, retained_until, restored_from FROM leases \
     WHERE tenant_id = $1 AND status = $2 \
     AND ($3::timestamptz IS NULL OR (created_at, lease_id) < ($3, $4::uuid)) \
     ORDER BY created_at DESC, lease_id DESC LIMIT 51";

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

/// p50/p99 of a page over HTTP, beside the raw SELECT's.
pub async fn measure(
    url: &DatabaseUrl,
    gateway: &Gateway,
    duration: Duration,
) -> anyhow::Result<Vec<Measure>> {
    let raw = raw_pages(url, duration).await?;
    let served = served_pages(gateway, duration).await?;
    Ok(latency_measures("leases_page", served, raw))
}

async fn served_pages(gateway: &Gateway, duration: Duration) -> anyhow::Result<Vec<Duration>> {
    let http = reqwest::Client::new();
    let endpoint = format!("{}/graphql", gateway.base);
    let deadline = Instant::now() + duration;
    let mut samples = Vec::new();
    let mut after = Value::Null;
    while Instant::now() < deadline {
        let body = json!({ "query": PAGE_QUERY, "variables": { "after": after } });
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
        let page = &answer["data"]["leases"];
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

async fn raw_pages(url: &DatabaseUrl, duration: Duration) -> anyhow::Result<Vec<Duration>> {
    let client = url.connect().await?;
    let statement = client.prepare(RAW_PAGE_SQL).await?;
    let deadline = Instant::now() + duration;
    let mut samples = Vec::new();
    let mut after: (Option<DateTime<Utc>>, Option<Uuid>) = (None, None);
    while Instant::now() < deadline {
        let started = Instant::now();
        let rows = client.query(&statement, &[&TENANT, &"ready", &after.0, &after.1]).await?;
        samples.push(started.elapsed());
        let last = rows.get(49).context("a full page")?;
        after = if samples.len() % PAGES_PER_WALK == 0 {
            (None, None)
        } else {
            (Some(last.get(8)), Some(last.get(0)))
        };
    }
    Ok(samples)
}
