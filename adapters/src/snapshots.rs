//! Aggregate snapshots: an aggregate's state at a stream version, postcard-encoded, so a
//! loader reads the snapshot plus the tail of the stream instead of the whole stream.
//!
//! Each snapshot records the `state_schema` of the state type it encodes. A loader asking for
//! another schema gets nothing (it rebuilds from events); snapshots are a cache, never a source
//! of truth, and events never use this encoding.

use std::sync::atomic::{AtomicBool, Ordering};

use leasehold_domain::{StoreError, StreamId};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::store::{PgEventStore, to_i64};

/// A loaded snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot<T> {
    /// The stream version the state reflects.
    pub version: u64,
    /// The state.
    pub state: T,
}

impl PgEventStore {
    /// Stores `state` as the snapshot of `stream` at `version`, unless a snapshot of a later
    /// version of the same schema is already stored.
    pub async fn save_snapshot<T: Serialize>(
        &self,
        stream: &StreamId,
        version: u64,
        state_schema: u32,
        state: &T,
    ) -> Result<(), StoreError> {
        let bytes = postcard::to_stdvec(state)
            .map_err(|e| StoreError::Database { reason: format!("encoding a snapshot: {e}") })?;
        let schema = i32::try_from(state_schema).unwrap_or(i32::MAX);
        let version = to_i64(version);
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO snapshots (stream_id, version, state_schema, state) \
                 VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (stream_id) DO UPDATE \
                 SET version = excluded.version, state_schema = excluded.state_schema, \
                     state = excluded.state, taken_at = now() \
                 WHERE snapshots.version < excluded.version \
                    OR snapshots.state_schema <> excluded.state_schema",
                &[&stream.as_str(), &version, &schema, &bytes],
            )
            .await
            .map_err(|e| crate::store::from_driver(e, self.endpoint()))?;
        Ok(())
    }

    /// The snapshot of `stream`, if one of `state_schema` is stored.
    pub async fn load_snapshot<T: DeserializeOwned>(
        &self,
        stream: &StreamId,
        state_schema: u32,
    ) -> Result<Option<Snapshot<T>>, StoreError> {
        let schema = i32::try_from(state_schema).unwrap_or(i32::MAX);
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT version, state FROM snapshots WHERE stream_id = $1 AND state_schema = $2",
                &[&stream.as_str(), &schema],
            )
            .await
            .map_err(|e| crate::store::from_driver(e, self.endpoint()))?;
        let Some(row) = row else { return Ok(None) };
        let version = u64::try_from(row.get::<_, i64>(0)).unwrap_or_default();
        let bytes: &[u8] = row.get(1);
        match postcard::from_bytes(bytes) {
            Ok(state) => Ok(Some(Snapshot { version, state })),
            // The same schema number with bytes that do not decode: someone changed the
            // state's shape without bumping its schema (the golden-bytes tests exist to stop
            // that). A snapshot is only a cache: rebuild from the events rather than make the
            // stream unwritable, and say so once per process.
            Err(error) => {
                if !UNDECODABLE_REPORTED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        %stream, version, state_schema, %error,
                        "a snapshot does not decode: ignored, the state is rebuilt from events \
                         (further ones are not logged)"
                    );
                }
                Ok(None)
            }
        }
    }
}

/// Whether an undecodable snapshot was logged already.
static UNDECODABLE_REPORTED: AtomicBool = AtomicBool::new(false);

#[cfg(test)]
mod golden {
    //! Snapshots and projection views are postcard, which is positional: a state whose shape
    //! changes without a new `STATE_SCHEMA` would be misread silently. These tests pin the
    //! bytes of a fully populated state per schema version: a change of shape fails here
    //! until the schema is bumped and the new version's bytes are recorded beside the old.

    use chrono::{TimeZone as _, Utc};
    use leasehold_domain::Aggregate as _;
    use leasehold_domain::TenantId;
    use leasehold_domain::lease::{
        ChainState, Lease, LeaseId, LeaseItem, LeaseItems, LeaseStatus, LeaseTerms, Maintenance,
        MaintenanceId, MaintenanceKind, OperationId, OperatorDetail, PayloadHash, ProviderId,
        Reason, Retention, RetentionStatus, ServiceName, Sku, TenantMessage, TerminalBudget,
        TerminalVerdict,
    };
    use uuid::Uuid;

    /// The encoded `(TenantId, Lease)` of [`populated`], by `Lease::STATE_SCHEMA`.
    const LEASE_STATE_GOLDEN: &[(u32, &str)] = &[
        (1, include_str!("golden/lease_state_v1.hex")),
        (2, include_str!("golden/lease_state_v2.hex")),
    ];

    /// A state with every optional part present, so that every field is in the bytes.
    fn populated() -> (TenantId, Lease) {
        let at =
            |seconds: i64| Utc.timestamp_opt(1_800_000_000 + seconds, 0).single().expect("valid");
        let item = LeaseItem {
            sku: Sku::parse("sku", "gpu.h100.1x").expect("valid"),
            quantity: 2,
            service_name: Some(ServiceName::parse("service", "web").expect("valid")),
            custom_domain: None,
        };
        let terms = LeaseTerms {
            id: LeaseId(Uuid::from_u128(1)),
            provider: ProviderId(Uuid::from_u128(2)),
            items: LeaseItems::new(vec![item]).expect("valid"),
            payload_hash: Some(PayloadHash::parse("payload", "ab".repeat(32)).expect("valid")),
            backend: ServiceName::parse("backend", "east").expect("valid"),
            created_at: at(0),
            restored_from: Some(LeaseId(Uuid::from_u128(3))),
        };
        let lease = Lease {
            terms: Some(terms),
            status: LeaseStatus::Retained,
            chain: ChainState::Active,
            reason: Some(Reason::parse("reason", "oom_killed").expect("valid")),
            message: Some(TenantMessage::parse("message", "out of memory").expect("valid")),
            last_error: Some(OperatorDetail::new("exit 137")),
            fail_count: 3,
            generation: 4,
            operation: Some(OperationId(Uuid::from_u128(12))),
            pending: Some(Maintenance {
                id: MaintenanceId(Uuid::from_u128(5)),
                admitted_at: at(1),
                kind: MaintenanceKind::Update,
            }),
            last_settled: Some((MaintenanceId(Uuid::from_u128(6)), at(2))),
            retention: Some(Retention {
                status: RetentionStatus::Restoring { into: LeaseId(Uuid::from_u128(7)) },
                retained_until: Some(at(3)),
            }),
            terminal_budget: Some(TerminalBudget {
                verdict: TerminalVerdict::Exhausted,
                consecutive_failures: 8,
            }),
            release_count: 9,
            active_release: Some(10),
            deploying_release: Some(11),
            updated_at: Some(at(4)),
        };
        (TenantId::parse("acme").expect("valid"), lease)
    }

    #[test]
    fn the_lease_state_keeps_its_stored_shape_for_its_schema() {
        let encoded = hex::encode(postcard::to_stdvec(&populated()).expect("encodes"));
        let golden = LEASE_STATE_GOLDEN
            .iter()
            .find(|(schema, _)| *schema == Lease::STATE_SCHEMA)
            .map(|(_, bytes)| bytes.trim());
        assert_eq!(
            golden,
            Some(encoded.as_str()),
            "the stored shape of Lease changed (or schema {} has no golden bytes): bump \
             Lease::STATE_SCHEMA and add adapters/src/golden/lease_state_v<N>.hex with these \
             bytes, keeping the old file",
            Lease::STATE_SCHEMA
        );
        let decoded: (TenantId, Lease) =
            postcard::from_bytes(&hex::decode(&encoded).expect("hex")).expect("decodes");
        assert_eq!(decoded, populated());
    }
}
