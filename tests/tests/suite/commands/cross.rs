//! Commands that link aggregates of different kinds (`commands/src/cross.rs`): a lease's
//! request and a reservation on its tenant's budget (a kind defined here for the test, as a
//! snapshot's quota or a host's capacity will be) commit in one atomic multi-stream append
//! with an expected version on each stream, or not at all.

use std::fmt;

use futures_util::future::join_all;
use leasehold_commands::{CommandError, ErrorClass, Link, LinkedCommand, PipelineConfig};
use leasehold_domain::lease::LeaseId;
use leasehold_domain::{Aggregate, Context, EventStore as _, Refusal, RefusalKind, StreamId};
use leasehold_tests::TestDb;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::support::{new_lease, pipeline_with, provision, request, routed};

/// A tenant's budget of leases: opened with a limit, each reservation takes one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Budget {
    limit: Option<u32>,
    used: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
enum BudgetCommand {
    Open { limit: u32 },
    Reserve { lease: Uuid },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
enum BudgetEvent {
    BudgetOpened { limit: u32 },
    BudgetReserved { lease: Uuid },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum BudgetError {
    Exceeded,
    NotOpen,
}

impl fmt::Display for BudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Exceeded => "the budget is used up",
            Self::NotOpen => "the budget is not open",
        })
    }
}

impl std::error::Error for BudgetError {}

impl Refusal for BudgetError {
    fn kind(&self) -> RefusalKind {
        match self {
            Self::Exceeded => RefusalKind::Conflict,
            Self::NotOpen => RefusalKind::InvalidState,
        }
    }
}

leasehold_domain::tagged_events!(BudgetEvent { BudgetOpened, BudgetReserved });

impl Aggregate for Budget {
    const STREAM_TYPE: &'static str = "budget";
    const STATE_SCHEMA: u32 = 1;
    type Command = BudgetCommand;
    type Event = BudgetEvent;
    type Error = BudgetError;
    type Facts = ();

    fn initial() -> Self {
        Self { limit: None, used: 0 }
    }

    fn decide(
        &self,
        command: &BudgetCommand,
        _: &Context<()>,
    ) -> Result<Vec<BudgetEvent>, BudgetError> {
        match (command, self.limit) {
            (BudgetCommand::Open { limit }, None) => {
                Ok(vec![BudgetEvent::BudgetOpened { limit: *limit }])
            }
            (BudgetCommand::Open { .. }, Some(_)) => Ok(Vec::new()),
            (BudgetCommand::Reserve { .. }, None) => Err(BudgetError::NotOpen),
            (BudgetCommand::Reserve { .. }, Some(limit)) if self.used >= limit => {
                Err(BudgetError::Exceeded)
            }
            (BudgetCommand::Reserve { lease }, Some(_)) => {
                Ok(vec![BudgetEvent::BudgetReserved { lease: *lease }])
            }
        }
    }

    fn evolve(mut self, event: &BudgetEvent) -> Self {
        match event {
            BudgetEvent::BudgetOpened { limit } => self.limit = Some(*limit),
            BudgetEvent::BudgetReserved { .. } => self.used += 1,
        }
        self
    }

    fn is_terminal(&self) -> bool {
        false
    }

    fn is_creation(command: &BudgetCommand) -> bool {
        matches!(command, BudgetCommand::Open { .. })
    }
}

type Pipeline = super::support::Pipeline;

fn budget_stream(tenant: &str) -> StreamId {
    StreamId::parse(format!("budget-{tenant}")).expect("valid")
}

async fn open_budget(pipeline: &Pipeline, tenant: &str, limit: u32) {
    let open = leasehold_commands::CommandRequest::<Budget>::new(
        super::support::tenant(tenant),
        leasehold_domain::Actor { subject: "ops".into(), role: "operator".into() },
        budget_stream(tenant),
        leasehold_domain::OperationKey::parse(format!("open-{tenant}")).expect("valid"),
        BudgetCommand::Open { limit },
        (),
    );
    pipeline.execute(open).await.expect("opened");
}

fn reservation(
    budget: &StreamId,
    lease: LeaseId,
) -> Vec<Box<dyn Link<leasehold_adapters::PgEventStore>>> {
    let command = BudgetCommand::Reserve { lease: lease.0 };
    vec![Box::new(LinkedCommand::<Budget>::new(budget.clone(), command, ()))]
}

/// A lease requested by `tenant` with a reservation on `budget`.
async fn request_reserving(
    pipeline: &Pipeline,
    tenant: &str,
    budget: &StreamId,
    key: &str,
) -> (
    LeaseId,
    Result<leasehold_commands::CommandOutcome, CommandError<leasehold_domain::lease::LeaseError>>,
) {
    let lease = new_lease();
    let primary = request(tenant, lease, key, provision(lease, 1), routed());
    (lease, pipeline.execute_linked(primary, &reservation(budget, lease)).await)
}

#[tokio::test]
async fn a_linked_command_of_another_kind_commits_with_the_command_or_refuses_it_whole() {
    let db = TestDb::migrated().await;
    let pipeline = pipeline_with(&db, PipelineConfig::default());
    open_budget(&pipeline, "acme", 2).await;
    let budget = budget_stream("acme");
    for n in 0..2 {
        let (lease, outcome) =
            request_reserving(&pipeline, "acme", &budget, &format!("req-{n}")).await;
        let outcome = outcome.expect("within the budget");
        // One transaction: the lease's event and the reservation share it.
        let reserved = db.store().read_stream(&budget, 2 + n, 1).await.expect("readable");
        assert_eq!(reserved[0].event_type.as_str(), "BudgetReserved");
        assert_eq!(Some(reserved[0].cursor.tx_id), outcome.cursor.map(|c| c.tx_id));
        assert_eq!(reserved[0].payload["lease"], lease.0.to_string());
    }
    // Over the budget: the whole command is refused, the lease's stream stays empty.
    let (lease, refused) = request_reserving(&pipeline, "acme", &budget, "req-2").await;
    let refused = refused.expect_err("over the budget");
    assert!(
        matches!(&refused, CommandError::LinkedRefused { kind: RefusalKind::Conflict, .. }),
        "{refused:?}"
    );
    assert_eq!(refused.class(), ErrorClass::Conflict);
    assert!(db.store().read_stream(&lease.stream_id(), 1, 10).await.expect("readable").is_empty());
    assert_eq!(db.store().read_stream(&budget, 1, 10).await.expect("readable").len(), 3);
    // Another tenant's budget is not found, and a missing one too.
    open_budget(&pipeline, "globex", 5).await;
    let (_, foreign) =
        request_reserving(&pipeline, "acme", &budget_stream("globex"), "req-3").await;
    assert!(matches!(foreign, Err(CommandError::NotFound)), "{foreign:?}");
    let (_, missing) =
        request_reserving(&pipeline, "acme", &budget_stream("nobody"), "req-4").await;
    assert!(matches!(missing, Err(CommandError::NotFound)), "{missing:?}");
    // So is a stream of another kind named as a budget.
    let (taken, _) = request_reserving(&pipeline, "acme", &budget_stream("globex"), "req-5").await;
    let (_, wrong_kind) = request_reserving(&pipeline, "acme", &taken.stream_id(), "req-6").await;
    assert!(matches!(wrong_kind, Err(CommandError::NotFound)), "{wrong_kind:?}");
}

#[tokio::test]
async fn a_retry_answers_its_outcome_and_the_same_key_with_another_link_conflicts() {
    let db = TestDb::migrated().await;
    let pipeline = pipeline_with(&db, PipelineConfig::default());
    open_budget(&pipeline, "acme", 5).await;
    open_budget(&pipeline, "acme-b", 5).await;
    let lease = new_lease();
    let budget = budget_stream("acme");
    let first = request("acme", lease, "req-1", provision(lease, 1), routed());
    let first = pipeline.execute_linked(first, &reservation(&budget, lease)).await.expect("ok");
    let again = request("acme", lease, "req-1", provision(lease, 1), routed());
    let again =
        pipeline.execute_linked(again, &reservation(&budget, lease)).await.expect("a retry");
    assert!(again.duplicate);
    assert_eq!(again.cursor, first.cursor);
    // The links are part of the request: the same key reserving elsewhere is not a retry.
    let other = request("acme", lease, "req-1", provision(lease, 1), routed());
    let other = pipeline.execute_linked(other, &reservation(&budget_stream("acme-b"), lease)).await;
    assert!(matches!(other, Err(CommandError::IdempotencyConflict)), "{other:?}");
}

/// Concurrent commands from separate pipelines (as separate processes would be) never take
/// more than the budget: every reservation's append expects the budget's version. (A command
/// loses a race only to another's reservation, so at most LIMIT times before it sees the
/// budget used up: fewer than the pipeline's retries.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_linked_commands_never_exceed_the_budget() {
    const LIMIT: usize = 5;
    const REQUESTS: usize = 12;
    let db = TestDb::migrated().await;
    open_budget(&pipeline_with(&db, PipelineConfig::default()), "acme", LIMIT as u32).await;
    let budget = budget_stream("acme");
    let attempts = (0..REQUESTS).map(|n| {
        let pipeline = pipeline_with(&db, PipelineConfig::default());
        let budget = budget.clone();
        async move { request_reserving(&pipeline, "acme", &budget, &format!("req-{n}")).await.1 }
    });
    let outcomes = join_all(attempts).await;
    let accepted = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
    let refused = outcomes
        .iter()
        .filter(|outcome| {
            matches!(outcome, Err(CommandError::LinkedRefused { kind: RefusalKind::Conflict, .. }))
        })
        .count();
    assert_eq!((accepted, refused), (LIMIT, REQUESTS - LIMIT), "{outcomes:?}");
    let reserved = db.store().read_stream(&budget, 2, 100).await.expect("readable");
    assert_eq!(reserved.len(), LIMIT);
}
