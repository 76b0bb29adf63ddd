//! The log relayed to Kafka (a real broker, tansu, on loopback): every event arrives, each
//! stream's in order; a relay killed mid-stream resumes from its checkpoint, repeating only
//! what was unacknowledged; a broker that stops answering for a while, or is stopped and
//! restarted, is waited for.

use std::time::Duration;

use leasehold_adapters::PgEventStore;
use leasehold_adapters::relay::{
    KafkaRelay, RelayConfig, RelayError, RelayedLog, relay_checkpoints,
};
use leasehold_domain::{EventStore, ExpectedVersion, StreamAppend, StreamId, StreamType, TenantId};
use leasehold_tests::TestDb;
use leasehold_tests::kafka::{Broker, ten_lease_events};
use serde_json::json;
use tokio::sync::oneshot;

use crate::support::event;

const TOPIC: &str = "leasehold.events";

/// `per_stream` events in each of `streams` streams, appended at once by one writer a stream,
/// ten events an append.
async fn write(store: &PgEventStore, streams: usize, per_stream: usize, round: usize) {
    let writers = (0..streams).map(|stream| {
        let store = store.clone();
        tokio::spawn(async move {
            for batch in 0..per_stream / 10 {
                let append = ten_lease_events(stream, batch, round);
                store.append(vec![append]).await.unwrap();
            }
        })
    });
    for writer in writers.collect::<Vec<_>>() {
        writer.await.unwrap();
    }
}

/// Events a test relay publishes ahead of acknowledgements, at most.
const WINDOW: usize = 500;

/// A relay running on its own task until the sender is dropped or sent to; it writes its
/// checkpoint each time acknowledgements come.
fn relay(
    store: &PgEventStore,
    broker: &Broker,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let mut config = RelayConfig::new(&broker.address, TOPIC);
    config.in_flight_max = WINDOW;
    config.checkpoint_every = Duration::ZERO;
    let relay = KafkaRelay::new(store.clone(), config).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    (stop, task)
}

/// Takes `count` new events from the topic (each wait bounded), checking each stream's
/// versions follow one another.
async fn take(log: &mut RelayedLog, count: usize) -> Vec<leasehold_adapters::archive::EventLine> {
    let mut taken = Vec::with_capacity(count);
    while taken.len() < count {
        taken.push(log.next(Duration::from_secs(60)).await.unwrap());
    }
    taken
}

#[tokio::test]
async fn ten_thousand_events_of_fifty_streams_written_at_once_all_arrive_each_stream_in_order() {
    let (db, broker) = (TestDb::migrated().await, Broker::start().await);
    broker.create_topic(TOPIC, 4).await;
    let store = db.store();
    let (stop, task) = relay(&store, &broker);
    write(&store, 50, 200, 0).await;

    let mut log = RelayedLog::subscribe(&broker.address, TOPIC, "check", true).unwrap();
    let taken = take(&mut log, 10_000).await;
    let mut by_stream = std::collections::HashMap::<String, Vec<u64>>::new();
    for event in &taken {
        by_stream.entry(event.stream_id.clone()).or_default().push(event.version);
    }
    assert_eq!(by_stream.len(), 50);
    for (stream, versions) in &by_stream {
        assert_eq!(versions, &(1..=200).collect::<Vec<u64>>(), "{stream}");
    }
    // Every event's id once: the log's.
    let ids: std::collections::HashSet<_> = taken.iter().map(|e| e.event_id).collect();
    assert_eq!(ids.len(), 10_000);

    stop.send(()).unwrap();
    task.await.unwrap();
    let checkpoint = relay_checkpoints(&store, Some("kafka:leasehold.events")).await.unwrap();
    assert_eq!(checkpoint[0].published, 10_000);
    assert_eq!(checkpoint[0].cursor, store.head().await.unwrap());
}

#[tokio::test]
async fn a_relay_killed_mid_stream_resumes_from_its_checkpoint_repeating_only_its_window() {
    let (db, broker) = (TestDb::migrated().await, Broker::start().await);
    broker.create_topic(TOPIC, 4).await;
    let store = db.store();
    let writing = tokio::spawn({
        let store = store.clone();
        async move { write(&store, 50, 200, 0).await }
    });
    let (_stop, first) = relay(&store, &broker);
    let mut log = RelayedLog::subscribe(&broker.address, TOPIC, "check", true).unwrap();
    let mut taken = take(&mut log, 3_000).await;
    writing.await.unwrap();

    // Mid-stream for sure: the broker stops acknowledging, a round more is written, and the
    // relay fills its window with it before it is killed.
    let written = db.settled_head().await;
    broker.pause();
    write(&store, 10, 100, 1).await;
    lag_shows(&store, written, 1_000).await;
    // Killed: its task dropped where it stands, producer and all, no last checkpoint.
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    let killed_at = relay_checkpoints(&store, Some("kafka:leasehold.events")).await.unwrap();
    assert!(killed_at[0].cursor < db.settled_head().await, "killed mid-stream");
    broker.resume();

    let (stop, second) = relay(&store, &broker);
    taken.extend(take(&mut log, 8_000).await);
    let ids: std::collections::HashSet<_> = taken.iter().map(|e| e.event_id).collect();
    assert_eq!(ids.len(), 11_000, "every event once, each stream's in order (no gap)");
    // Repeated: at most what was published after the checkpoint, the window in flight.
    assert!(log.repeats() <= WINDOW as u64, "{} repeats", log.repeats());
    stop.send(()).unwrap();
    second.await.unwrap();
    let checkpoint = relay_checkpoints(&store, Some("kafka:leasehold.events")).await.unwrap();
    assert_eq!(checkpoint[0].cursor, db.settled_head().await);
}

#[tokio::test]
async fn a_second_relay_of_the_topic_stands_by_and_takes_over_when_the_first_stops() {
    let (db, broker) = (TestDb::migrated().await, Broker::start().await);
    broker.create_topic(TOPIC, 2).await;
    let store = db.store();
    let (stop_first, first) = relay(&store, &broker);
    let mut log = RelayedLog::subscribe(&broker.address, TOPIC, "check", true).unwrap();
    write(&store, 10, 20, 0).await;
    let mut taken = take(&mut log, 200).await;

    // The second relay starts beside the first: the first alone publishes what comes.
    let (stop_second, second) = relay(&store, &broker);
    write(&store, 10, 20, 1).await;
    taken.extend(take(&mut log, 200).await);
    let head = db.settled_head().await;
    let first_at = |checkpoint: &[leasehold_adapters::relay::RelayCheckpoint]| {
        checkpoint.first().is_some_and(|checkpoint| checkpoint.cursor >= head)
    };
    checkpoint_until(&store, first_at).await;
    stop_first.send(()).unwrap();
    first.await.unwrap();

    // Stopped, the first hands over: the second publishes from its checkpoint.
    write(&store, 10, 20, 2).await;
    taken.extend(take(&mut log, 200).await);
    let ids: std::collections::HashSet<_> = taken.iter().map(|e| e.event_id).collect();
    assert_eq!(ids.len(), 600);
    let head = db.settled_head().await;
    checkpoint_until(&store, |checkpoint| checkpoint[0].cursor >= head).await;
    stop_second.send(()).unwrap();
    second.await.unwrap();
    read_to_the_end(&mut log).await;
    assert_eq!(log.repeats(), 0, "nothing published twice");
    let checkpoint = relay_checkpoints(&store, Some("kafka:leasehold.events")).await.unwrap();
    assert_eq!(checkpoint[0].published, 600);
}

#[tokio::test]
async fn a_relay_whose_lock_session_ends_publishes_nothing_more_and_the_standby_takes_over() {
    let (db, broker) = (TestDb::migrated().await, Broker::start().await);
    broker.create_topic(TOPIC, 2).await;
    let store = db.store();
    let first = KafkaRelay::new(store.clone(), RelayConfig::new(&broker.address, TOPIC));
    let first = first.unwrap();
    let first = tokio::spawn(async move { first.run(std::future::pending()).await });
    let mut log = RelayedLog::subscribe(&broker.address, TOPIC, "check", true).unwrap();
    write(&store, 10, 20, 0).await;
    let mut taken = take(&mut log, 200).await;
    let (stop_second, second) = relay(&store, &broker);

    // The server ends the first relay's lock session (an operator, a failover, a network
    // cut): the next page is not published by it, and it stops.
    let client = db.client().await;
    let ended = "SELECT pg_terminate_backend(l.pid) FROM pg_locks l \
                 JOIN pg_database d ON d.oid = l.database AND d.datname = current_database() \
                 WHERE l.locktype = 'advisory' AND l.classid = x'4c52'::int AND l.granted";
    assert_eq!(client.query(ended, &[]).await.unwrap().len(), 1, "one relay holds the lock");
    let gone = "SELECT count(*) FROM pg_locks l \
                JOIN pg_database d ON d.oid = l.database AND d.datname = current_database() \
                WHERE l.locktype = 'advisory' AND l.classid = x'4c52'::int AND l.granted";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while client.query_one(gone, &[]).await.unwrap().get::<_, i64>(0) > 0 {
        assert!(tokio::time::Instant::now() < deadline, "the session did not end in 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    write(&store, 10, 20, 1).await;
    let stopped = tokio::time::timeout(Duration::from_secs(60), first).await.expect("stopped");
    let error = stopped.unwrap().expect_err("a relay that lost its lock stops");
    assert!(matches!(error, RelayError::Store(_)), "{error:?}");

    taken.extend(take(&mut log, 200).await);
    let ids: std::collections::HashSet<_> = taken.iter().map(|e| e.event_id).collect();
    assert_eq!(ids.len(), 400);
    let head = db.settled_head().await;
    checkpoint_until(&store, |checkpoint| checkpoint[0].cursor >= head).await;
    stop_second.send(()).unwrap();
    second.await.unwrap();
    read_to_the_end(&mut log).await;
    assert_eq!(log.repeats(), 0, "the second round published once, by the standby");
}

/// Reads what is left on the topic (it holds nothing new: every repeat is counted), until
/// nothing has come for two seconds.
async fn read_to_the_end(log: &mut RelayedLog) {
    match log.next(Duration::from_secs(2)).await {
        Err(leasehold_adapters::relay::ConsumeError::Quiet(_)) => {}
        other => panic!("nothing new was left to read: {other:?}"),
    }
}

/// Waits (at most 60 s) until the relay's checkpoint row satisfies `done`.
async fn checkpoint_until(
    store: &PgEventStore,
    done: impl Fn(&[leasehold_adapters::relay::RelayCheckpoint]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let checkpoint = relay_checkpoints(store, Some("kafka:leasehold.events")).await.unwrap();
        if done(&checkpoint) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "not in 60 s: {checkpoint:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_broker_that_stops_answering_is_waited_for_and_nothing_is_lost() {
    let (db, broker) = (TestDb::migrated().await, Broker::start().await);
    broker.create_topic(TOPIC, 2).await;
    let store = db.store();
    let (stop, task) = relay(&store, &broker);
    let mut log = RelayedLog::subscribe(&broker.address, TOPIC, "check", true).unwrap();
    write(&store, 10, 100, 0).await;
    let mut taken = take(&mut log, 1_000).await;

    let first_round = store.head().await.unwrap();
    broker.pause();
    write(&store, 10, 100, 1).await;
    lag_shows(&store, first_round, 1_000).await;
    broker.resume();

    taken.extend(take(&mut log, 1_000).await);
    let ids: std::collections::HashSet<_> = taken.iter().map(|e| e.event_id).collect();
    assert_eq!(ids.len(), 2_000);
    stop.send(()).unwrap();
    task.await.unwrap();
    let checkpoint = relay_checkpoints(&store, Some("kafka:leasehold.events")).await.unwrap();
    assert_eq!(checkpoint[0].cursor, store.head().await.unwrap());
    assert_eq!(checkpoint[0].published, 2_000);
}

#[tokio::test]
async fn a_relay_told_to_stop_while_the_broker_is_not_answering_stops_in_bounded_time() {
    let (db, broker) = (TestDb::migrated().await, Broker::start().await);
    broker.create_topic(TOPIC, 2).await;
    let store = db.store();
    let mut config = RelayConfig::new(&broker.address, TOPIC);
    config.drain_wait = Duration::from_secs(1);
    let draining = KafkaRelay::new(store.clone(), config).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        draining
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
    let mut log = RelayedLog::subscribe(&broker.address, TOPIC, "check", true).unwrap();
    write(&store, 10, 10, 0).await;
    let mut taken = take(&mut log, 100).await;
    let first_round = db.settled_head().await;
    checkpoint_until(&store, |checkpoint| checkpoint[0].cursor >= first_round).await;

    broker.pause();
    write(&store, 10, 10, 1).await;
    lag_shows(&store, first_round, 100).await;
    stop.send(()).unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(30), task).await;
    stopped.expect("stopped within its drain wait").unwrap().expect("a clean stop");
    let checkpoint = relay_checkpoints(&store, Some("kafka:leasehold.events")).await.unwrap();
    assert_eq!(checkpoint[0].cursor, first_round, "nothing unacknowledged checkpointed");

    // Started again with the broker back: the second round arrives.
    broker.resume();
    let (stop, task) = relay(&store, &broker);
    taken.extend(take(&mut log, 100).await);
    let ids: std::collections::HashSet<_> = taken.iter().map(|e| e.event_id).collect();
    assert_eq!(ids.len(), 200);
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn a_broker_stopped_and_restarted_is_waited_for_and_nothing_is_lost() {
    let (db, mut broker) = (TestDb::migrated().await, Broker::start_durable().await);
    broker.create_topic(TOPIC, 2).await;
    let store = db.store();
    let (stop, task) = relay(&store, &broker);
    let mut log = RelayedLog::subscribe(&broker.address, TOPIC, "check", true).unwrap();
    write(&store, 10, 100, 0).await;
    let mut taken = take(&mut log, 1_000).await;

    let first_round = db.settled_head().await;
    broker.stop().await;
    write(&store, 10, 100, 1).await;
    lag_shows(&store, first_round, 1_000).await;
    broker.restart().await;

    // The same consumer, reconnected by itself, reads on: the broker kept the first round.
    taken.extend(take(&mut log, 1_000).await);
    let ids: std::collections::HashSet<_> = taken.iter().map(|e| e.event_id).collect();
    assert_eq!(ids.len(), 2_000);
    stop.send(()).unwrap();
    task.await.unwrap();
    let checkpoint = relay_checkpoints(&store, Some("kafka:leasehold.events")).await.unwrap();
    assert_eq!(checkpoint[0].cursor, db.settled_head().await);
    assert_eq!(checkpoint[0].published, 2_000);
}

/// Waits (at most 60 s) until the relay's lag counts at least `behind` events, its checkpoint
/// held at or before `held`, where the broker stopped acknowledging. The lag shows once the
/// events are readable: another test's open transaction can hold the log's horizon back a
/// while.
async fn lag_shows(store: &PgEventStore, held: leasehold_domain::Cursor, behind: u64) {
    let reads = leasehold_adapters::read_models::PgReadModels::of(store);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let checkpoint = relay_checkpoints(store, Some("kafka:leasehold.events")).await.unwrap();
        assert!(checkpoint[0].cursor <= held, "acknowledged by a broker that is not answering?");
        let (events_behind, _) = reads.behind_cursor(checkpoint[0].cursor).await.unwrap();
        if events_behind >= behind {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "the lag never showed: {events_behind}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_event_too_large_to_publish_stops_the_relay_before_it_and_says_why() {
    let (db, broker) = (TestDb::migrated().await, Broker::start().await);
    broker.create_topic(TOPIC, 1).await;
    let store = db.store();
    write(&store, 1, 10, 0).await;
    let big = event("LeaseDispatchFailed", json!({ "detail": "x".repeat(4_000) }));
    let append = StreamAppend {
        stream_id: StreamId::parse("lease-big").unwrap(),
        stream_type: StreamType::parse("lease").unwrap(),
        tenant_id: TenantId::parse("acme").unwrap(),
        expected: ExpectedVersion::Any,
        events: vec![big],
    };
    let big_at = store.append(vec![append]).await.unwrap().cursor;
    write(&store, 1, 10, 1).await;

    let mut config = RelayConfig::new(&broker.address, TOPIC);
    config.message_max_bytes = 2_000;
    let relay = KafkaRelay::new(store.clone(), config).unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(60), relay.run(std::future::pending()));
    let error = stopped.await.expect("the relay stops by itself").unwrap_err();
    let RelayError::TooLarge { cursor, bytes, max } = &error else { panic!("{error:?}") };
    assert_eq!((*cursor, *max), (big_at, 2_000));
    assert!(*bytes > 4_000, "{bytes}");

    // The ten events before it are published and checkpointed; the failure is recorded.
    let mut log = RelayedLog::subscribe(&broker.address, TOPIC, "check", true).unwrap();
    assert_eq!(take(&mut log, 10).await.len(), 10);
    let checkpoint = relay_checkpoints(&store, Some("kafka:leasehold.events")).await.unwrap();
    assert_eq!(checkpoint[0].published, 10);
    assert!(checkpoint[0].cursor < big_at);
    assert_eq!(checkpoint[0].publish_errors, 1);
    assert_eq!(checkpoint[0].last_error.as_deref(), Some(error.to_string().as_str()));
}
