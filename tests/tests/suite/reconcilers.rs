//! The reconcilers' runtime (`projections/src/reconciler.rs`) over a real PostgreSQL: a
//! reconciler defined here notes every `Happened` event it sees on a tally (an aggregate
//! defined here) through the command pipeline, and one reminder when its clock reaches a
//! time. Restarted mid-batch it never notes twice; two instances never both act; a controlled
//! clock drives its tick and reaches `decide`; `projections status` lists it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use leasehold_adapters::{PgEventStore, PgProjectionStore, PgReadModels};
use leasehold_commands::{CommandPipeline, CommandRequest, PipelineConfig};
use leasehold_domain::{
    Actor, Aggregate, Clock, Context, DomainEvent, EventStore, ExpectedVersion, OperationKey,
    Refusal, RefusalKind, StreamId, TenantId,
};
use leasehold_projections::{
    ManualClock, ReconcileError, Reconciler, ReconcilerConfig, ReconcilerRunner, Seen,
    operation_key,
};
use leasehold_tests::TestDb;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;

use crate::support::{TENANT, append, event, read_whole_stream, stream};

const WAIT: Duration = Duration::from_secs(60);

/// What the reconciler noted: one entry per source event, and reminders.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
struct Tally {
    noted: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
enum TallyCommand {
    Note { seen: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
enum TallyEvent {
    /// `at` is the time the command was decided at: the pipeline's clock.
    Noted { seen: String, at: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Never;

impl fmt::Display for Never {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("never")
    }
}

impl std::error::Error for Never {}

impl Refusal for Never {
    fn kind(&self) -> RefusalKind {
        RefusalKind::Conflict
    }
}

leasehold_domain::tagged_events!(TallyEvent { Noted });

impl Aggregate for Tally {
    const STREAM_TYPE: &'static str = "tally";
    const STATE_SCHEMA: u32 = 1;
    type Command = TallyCommand;
    type Event = TallyEvent;
    type Error = Never;
    type Facts = ();

    fn initial() -> Self {
        Self::default()
    }

    fn decide(&self, command: &TallyCommand, ctx: &Context<()>) -> Result<Vec<TallyEvent>, Never> {
        let TallyCommand::Note { seen } = command;
        Ok(vec![TallyEvent::Noted { seen: seen.clone(), at: ctx.now }])
    }

    fn evolve(mut self, _: &TallyEvent) -> Self {
        self.noted += 1;
        self
    }

    fn is_terminal(&self) -> bool {
        false
    }
}

/// Notes every `Happened` event, and once its clock reaches `remind_at`, a reminder.
struct Echo {
    pipeline: CommandPipeline<PgEventStore>,
    remind_at: DateTime<Utc>,
    /// Fails the next call with events after acting on them (as a process killed before its
    /// checkpoint).
    fail_after_acting: AtomicBool,
    /// Calls finished, for the test to wait on.
    calls: watch::Sender<u32>,
}

impl Echo {
    fn new(db: &TestDb, clock: Arc<dyn Clock>, remind_at: DateTime<Utc>) -> Self {
        let pipeline =
            CommandPipeline::new(db.store(), PipelineConfig::default()).with_clock(clock);
        let (calls, _) = watch::channel(0);
        Self { pipeline, remind_at, fail_after_acting: AtomicBool::new(false), calls }
    }

    async fn note(&self, key: OperationKey, seen: String) -> Result<(), ReconcileError> {
        let actor = Actor { subject: "echo".into(), role: "reconciler".into() };
        let tenant = TenantId::parse(TENANT).expect("a name");
        let command = TallyCommand::Note { seen };
        let request = CommandRequest::<Tally>::new(tenant, actor, tally(), key, command, ());
        self.pipeline.execute(request).await.map(|_| ()).map_err(|error| ReconcileError::Retry {
            action: "note".into(),
            reason: error.to_string(),
        })
    }
}

impl Reconciler for Echo {
    const NAME: &'static str = "echo";
    const VERSION: u32 = 1;

    async fn reconcile(&self, seen: Seen<'_>) -> Result<Option<DateTime<Utc>>, ReconcileError> {
        for event in seen.events.iter().filter(|e| e.event_type.as_str() == "Happened") {
            self.note(operation_key(Self::NAME, "note", event), event.stream_id.to_string())
                .await?;
        }
        if seen.now >= self.remind_at {
            // Keyed by what it saw (the reminder's time): repeated on every later call, and
            // recorded once.
            let key = format!("echo:remind:{}", self.remind_at.timestamp_micros());
            let key = OperationKey::parse(&key).expect("a name");
            self.note(key, "reminder".into()).await?;
        }
        if !seen.events.is_empty() && self.fail_after_acting.swap(false, Ordering::SeqCst) {
            return Err(ReconcileError::Retry { action: "test".into(), reason: "killed".into() });
        }
        self.calls.send_modify(|n| *n += 1);
        Ok((seen.now < self.remind_at).then_some(self.remind_at))
    }
}

fn tally() -> StreamId {
    stream("tally-1")
}

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).single().expect("a time")
}

/// A runner of `echo` over `db`, on `clock`, with its shutdown switch.
fn runner(
    db: &TestDb,
    echo: Echo,
    clock: &Arc<ManualClock>,
) -> (ReconcilerRunner<Echo, PgProjectionStore>, watch::Sender<bool>) {
    let mut config = ReconcilerConfig::new(Arc::clone(clock) as Arc<dyn Clock>);
    config.clock_moved = Some(clock.moved());
    config.retry_interval = Duration::from_millis(50);
    let runner = ReconcilerRunner::new(echo, PgProjectionStore::new(db.store()), config);
    (runner, watch::channel(false).0)
}

/// Appends one `Happened` event to each of `streams`, one append each.
async fn happen(store: &PgEventStore, streams: &[String]) {
    for name in streams {
        let happened = append(name, ExpectedVersion::Any, vec![event("Happened", json!({}))]);
        store.append(vec![happened]).await.unwrap();
    }
}

/// What the tally noted, in order.
async fn noted(store: &PgEventStore) -> Vec<(String, DateTime<Utc>)> {
    read_whole_stream(store, &tally(), 100)
        .await
        .iter()
        .map(|e| match TallyEvent::from_stored(e.event_type.as_str(), &e.payload).unwrap() {
            TallyEvent::Noted { seen, at } => (seen, at),
        })
        .collect()
}

async fn wait_for_calls(calls: &mut watch::Receiver<u32>, count: u32) {
    tokio::time::timeout(WAIT, calls.wait_for(|n| *n >= count))
        .await
        .unwrap_or_else(|_| panic!("the reconciler did not finish {count} calls within {WAIT:?}"))
        .unwrap();
}

#[tokio::test]
async fn a_reconciler_stopped_before_its_checkpoint_acts_again_but_its_commands_count_once() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let echo = Echo::new(&db, Arc::clone(&clock) as Arc<dyn Clock>, start() + TimeDelta::days(1));
    let mut calls = echo.calls.subscribe();
    let store = db.store();
    let sources: Vec<String> = (0..5).map(|n| format!("source-{n}")).collect();
    happen(&store, &sources).await;
    echo.fail_after_acting.store(true, Ordering::SeqCst);
    let (runner, stop) = runner(&db, echo, &clock);
    let (stats, mut checkpoints) = (runner.stats(), runner.checkpoints());
    let task = tokio::spawn(runner.run(stop.subscribe()));

    // A call acted on events and failed before its checkpoint moved; the next session saw
    // the same events again and issued the same commands. (How many events a call sees
    // depends on the horizon, which other tests' transactions hold back.)
    tokio::time::timeout(WAIT, async {
        while noted(&store).await.len() < sources.len() {
            calls.changed().await.unwrap();
        }
    })
    .await
    .expect("every source event noted");
    let last = read_whole_stream(&store, &tally(), 100).await.last().unwrap().cursor;
    tokio::time::timeout(WAIT, checkpoints.wait_for(|c| c.is_some_and(|c| c >= last)))
        .await
        .expect("the checkpoint passes the last note")
        .unwrap();
    assert_eq!(stats.failures.load(Ordering::Relaxed), 1);
    let noted = noted(&store).await;
    let seen: Vec<&str> = noted.iter().map(|(seen, _)| seen.as_str()).collect();
    assert_eq!(seen, sources.iter().map(String::as_str).collect::<Vec<_>>());
    stop.send_replace(true);
    task.await.unwrap();
}

#[tokio::test]
async fn one_instance_acts_at_a_time_and_the_other_takes_over_when_it_stops() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let later = start() + TimeDelta::days(1);
    let first = Echo::new(&db, Arc::clone(&clock) as Arc<dyn Clock>, later);
    let second = Echo::new(&db, Arc::clone(&clock) as Arc<dyn Clock>, later);
    let (mut first_calls, mut second_calls) = (first.calls.subscribe(), second.calls.subscribe());
    let store = db.store();
    let (first, stop_first) = runner(&db, first, &clock);
    let first_task = tokio::spawn(first.run(stop_first.subscribe()));
    // The first holds the lock once it has made a call (its session's opening tick).
    wait_for_calls(&mut first_calls, 1).await;
    let (second, stop_second) = runner(&db, second, &clock);
    let second_stats = second.stats();
    let second_task = tokio::spawn(second.run(stop_second.subscribe()));

    // The second has tried the lock and found it held.
    tokio::time::timeout(WAIT, second_stats.wait_for_lock_misses(1))
        .await
        .expect("the second instance tried the lock");
    let before: Vec<String> = (0..10).map(|n| format!("before-{n}")).collect();
    happen(&store, &before).await;
    tokio::time::timeout(WAIT, async {
        while noted(&store).await.len() < before.len() {
            first_calls.changed().await.unwrap();
        }
    })
    .await
    .expect("the first instance noted every event");
    assert_eq!(*second_calls.borrow(), 0, "the second instance acted while the first ran");
    assert_eq!(second_stats.batches.load(Ordering::Relaxed), 0);

    stop_first.send_replace(true);
    first_task.await.unwrap();
    let after: Vec<String> = (0..3).map(|n| format!("after-{n}")).collect();
    happen(&store, &after).await;
    tokio::time::timeout(WAIT, async {
        while noted(&store).await.len() < before.len() + after.len() {
            second_calls.changed().await.unwrap();
        }
    })
    .await
    .expect("the second instance took over");
    let noted = noted(&store).await;
    let seen: Vec<&str> = noted.iter().map(|(seen, _)| seen.as_str()).collect();
    let expected: Vec<&str> = before.iter().chain(&after).map(String::as_str).collect();
    assert_eq!(seen, expected, "every event noted once, in log order");
    stop_second.send_replace(true);
    second_task.await.unwrap();
}

#[tokio::test]
async fn the_tick_comes_from_the_controlled_clock_which_also_reaches_decide() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let remind_at = start() + TimeDelta::seconds(60);
    let echo = Echo::new(&db, Arc::clone(&clock) as Arc<dyn Clock>, remind_at);
    let mut calls = echo.calls.subscribe();
    let store = db.store();
    let (runner, stop) = runner(&db, echo, &clock);
    let mut checkpoints = runner.checkpoints();
    let task = tokio::spawn(runner.run(stop.subscribe()));
    wait_for_calls(&mut calls, 1).await;

    // 59 seconds on, an event arrives: it is noted at the clock's time, and no reminder yet.
    clock.advance(TimeDelta::seconds(59));
    happen(&store, &["early".to_string()]).await;
    tokio::time::timeout(WAIT, async {
        while noted(&store).await.is_empty() {
            calls.changed().await.unwrap();
        }
    })
    .await
    .expect("the early event is noted");
    let early = start() + TimeDelta::seconds(59);
    assert_eq!(noted(&store).await, [("early".to_string(), early)]);

    // One second more and the tick is due with no event at all.
    clock.advance(TimeDelta::seconds(1));
    tokio::time::timeout(WAIT, async {
        while noted(&store).await.len() < 2 {
            calls.changed().await.unwrap();
        }
    })
    .await
    .expect("the reminder is noted");
    assert_eq!(
        noted(&store).await,
        [("early".to_string(), early), ("reminder".to_string(), remind_at)]
    );

    // The reconciler shows in `projections status` as one; once its checkpoint passes the
    // last event it has applied all three (the early event and the tally's two notes).
    let last = read_whole_stream(&store, &tally(), 10).await.last().unwrap().cursor;
    tokio::time::timeout(WAIT, checkpoints.wait_for(|c| c.is_some_and(|c| c >= last)))
        .await
        .expect("the checkpoint passes the last note")
        .unwrap();
    let statuses = PgReadModels::of(&store).projection_status().await.unwrap();
    let echo = statuses.iter().find(|s| s.name == "echo").expect("the reconciler's status");
    assert_eq!((echo.kind.as_str(), echo.events_applied), ("reconciler", 3));
    stop.send_replace(true);
    task.await.unwrap();
}

#[tokio::test]
async fn a_reconciler_refuses_the_checkpoint_of_a_projection_of_the_same_name() {
    let db = TestDb::migrated().await;
    db.client()
        .await
        .batch_execute(
            "INSERT INTO projection_checkpoints (projection, version, log_epoch, tx_id, \
             position) VALUES ('echo', 1, 1, '1', 0)",
        )
        .await
        .unwrap();
    let clock = ManualClock::at(start());
    let echo = Echo::new(&db, Arc::clone(&clock) as Arc<dyn Clock>, start());
    let (runner, stop) = runner(&db, echo, &clock);
    let stats = runner.stats();
    let task = tokio::spawn(runner.run(stop.subscribe()));
    tokio::time::timeout(WAIT, stats.wait_for_failures(2)).await.expect("refused, again");
    let error = stats.last_error().unwrap_or_default();
    assert!(error.contains("echo is the name of a projection, not of a reconciler"), "{error}");
    assert!(noted(&db.store()).await.is_empty(), "it acted on another's checkpoint");
    stop.send_replace(true);
    task.await.unwrap();
}
