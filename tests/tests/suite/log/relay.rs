//! The log relayed to Kafka (a real broker, tansu, on loopback): every event arrives, each
//! stream's in order; a relay killed mid-stream resumes from its checkpoint, repeating only
//! what was unacknowledged; a broker that stops answering for a while is waited for.

use std::time::Duration;

use leasehold_adapters::PgEventStore;
use leasehold_adapters::relay::{KafkaRelay, RelayConfig, RelayedLog, relay_checkpoints};
use leasehold_domain::{EventStore, ExpectedVersion, StreamAppend, StreamId, StreamType, TenantId};
use leasehold_tests::TestDb;
use leasehold_tests::kafka::Broker;
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
                let events = (0..10)
                    .map(|n| {
                        event(
                            "LeaseDispatchFailed",
                            json!({ "attempt": batch * 10 + n, "round": round }),
                        )
                    })
                    .collect();
                let append = StreamAppend {
                    stream_id: StreamId::parse(format!("lease-{stream}")).unwrap(),
                    stream_type: StreamType::parse("lease").unwrap(),
                    tenant_id: TenantId::parse("acme").unwrap(),
                    expected: ExpectedVersion::Any,
                    events,
                };
                store.append(vec![append]).await.unwrap();
            }
        })
    });
    for writer in writers.collect::<Vec<_>>() {
        writer.await.unwrap();
    }
}

/// A relay running on its own task until the sender is dropped or sent to.
fn relay(
    store: &PgEventStore,
    broker: &Broker,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let mut config = RelayConfig::new(&broker.address, TOPIC);
    config.in_flight_max = 500;
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
