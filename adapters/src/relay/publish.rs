//! The relay's loop: read the log after the checkpoint, publish in commit order with at most
//! a window of events unacknowledged, move the checkpoint past each acknowledged prefix.

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use futures_util::FutureExt as _;
use leasehold_domain::{Cursor, RecordedEvent, StoreError};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::checkpoint::{failed, save, start};
use super::lock::RelayLock;
use super::settings::{KafkaSettings, refused_setting};
use super::{RelayError, is_topic_name, kafka_relay_name};
use crate::archive::EventLineRef;
use crate::store::PgEventStore;

/// How a relay publishes.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// `HOST:PORT[,…]`.
    pub brokers: String,
    /// The topic every event goes to.
    pub topic: String,
    /// Events published and not yet acknowledged, at most.
    pub in_flight_max: usize,
    /// The largest message the producer may publish (`message.max.bytes`).
    pub message_max_bytes: usize,
    /// How long the relay waits for the log to grow before it asks again.
    pub idle_wait: Duration,
    /// How often, at most, the checkpoint is written while events are acknowledged.
    pub checkpoint_every: Duration,
    /// librdkafka settings of the operator's own (TLS, SASL, ...), set before the relay's.
    pub settings: KafkaSettings,
    /// How long a stopping relay waits for the acknowledgements of what it has in flight
    /// (a broker that is down would hold it forever): what is still unacknowledged then is
    /// published again on the next start.
    pub drain_wait: Duration,
}

impl RelayConfig {
    /// A relay of every event to `topic` on `brokers`, with the defaults.
    #[must_use]
    pub fn new(brokers: &str, topic: &str) -> Self {
        Self {
            brokers: brokers.to_owned(),
            topic: topic.to_owned(),
            in_flight_max: 10_000,
            message_max_bytes: 1_000_000,
            idle_wait: Duration::from_secs(1),
            checkpoint_every: Duration::from_millis(200),
            drain_wait: Duration::from_secs(10),
            settings: KafkaSettings::default(),
        }
    }
}

/// Publishes the log to Kafka, from its checkpoint, until told to stop.
pub struct KafkaRelay {
    store: PgEventStore,
    producer: FutureProducer,
    config: RelayConfig,
    name: String,
}

impl std::fmt::Debug for KafkaRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaRelay").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The events published, oldest first, each with the future of its acknowledgement.
type InFlight = VecDeque<(Cursor, DeliveryFuture)>;

/// Why an event was not handed to the producer.
enum Unsent {
    /// librdkafka's queue is full: wait for an acknowledgement and hand it again.
    QueueFull,
    /// Never publishable as it is.
    Refused(RelayError),
}

/// Whether the loop goes on or was told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Going,
    Stopped,
}

/// A page of the log as the reader ahead read it.
type PageRead = Result<Vec<RecordedEvent>, StoreError>;

/// A task stopped when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How often a relay standing by asks whether the lock is free.
const STANDBY_POLL: Duration = Duration::from_secs(1);

/// What the loop has acknowledged and not yet written to its checkpoint, and the lock it
/// writes the checkpoint through.
struct Acknowledged {
    lock: RelayLock,
    cursor: Cursor,
    unsaved: u64,
    saved_at: Instant,
}

impl KafkaRelay {
    /// A relay of `store`'s log as `config` says. The producer is idempotent, never gives up
    /// on a message (a broker that is down is waited for), and acknowledges only what every
    /// in-sync replica holds.
    ///
    /// # Errors
    /// [`RelayError::Producer`] for settings librdkafka refuses.
    pub fn new(store: PgEventStore, mut config: RelayConfig) -> Result<Self, RelayError> {
        // A window of none would publish nothing and spin.
        config.in_flight_max = config.in_flight_max.max(1);
        if !is_topic_name(&config.topic) {
            return Err(RelayError::BadTopic { topic: config.topic });
        }
        let producer: FutureProducer = config
            .settings
            .client_config()
            .set("bootstrap.servers", &config.brokers)
            .set("enable.idempotence", "true")
            // A failure that could leave a gap is fatal: nothing after it is delivered.
            .set("enable.gapless.guarantee", "true")
            .set("acks", "all")
            .set("message.timeout.ms", "0")
            .set("message.max.bytes", config.message_max_bytes.to_string())
            .set("linger.ms", "5")
            .set("retry.backoff.ms", "100")
            .set("retry.backoff.max.ms", "2000")
            .create()
            .map_err(|error| RelayError::Producer(refused_setting(&error)))?;
        let name = kafka_relay_name(&config.topic);
        Ok(Self { store, producer, config, name })
    }

    /// Publishes until `stop` completes (the checkpoint then written) or a failure stops it
    /// (recorded in the checkpoint's row, the checkpoint where the last acknowledged prefix
    /// ends). While another relay of the same topic runs, this one stands by, publishing
    /// nothing, and takes over when that one stops.
    ///
    /// # Errors
    /// [`RelayError`]: the database, an event too large, a delivery refused for good.
    pub async fn run(&self, stop: impl Future<Output = ()>) -> Result<(), RelayError> {
        tokio::pin!(stop);
        let Some(lock) = self.stand_by(&mut stop).await? else { return Ok(()) };
        let start = start(&lock, &self.name).await?;
        let mut acked = Acknowledged { lock, cursor: start, unsaved: 0, saved_at: Instant::now() };
        let result = self.publish(&mut acked, stop).await;
        if let Err(error) = &result {
            tracing::error!(relay = %self.name, %error, "the relay stopped");
            if !matches!(error, RelayError::Store(_))
                && let Err(unrecorded) = failed(&acked.lock, &self.name, &error.to_string()).await
            {
                tracing::warn!(relay = %self.name, %unrecorded, "the failure was not recorded");
            }
        }
        result
    }

    /// The relay's lock, waited for while another relay holds it; `None` if told to stop
    /// first.
    async fn stand_by(
        &self,
        stop: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Option<RelayLock>, RelayError> {
        let lock = RelayLock::open(&self.store).await?;
        let mut told = false;
        while !lock.try_lock(&self.name).await? {
            if !told {
                tracing::info!(relay = %self.name, "another relay publishes to this topic: standing by");
                told = true;
            }
            tokio::select! {
                () = tokio::time::sleep(STANDBY_POLL) => {}
                () = stop.as_mut() => return Ok(None),
            }
        }
        if told {
            tracing::info!(relay = %self.name, "the other relay stopped: taking over");
        }
        Ok(Some(lock))
    }

    async fn publish(
        &self,
        acked: &mut Acknowledged,
        mut stop: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<(), RelayError> {
        let mut in_flight = InFlight::new();
        let (mut pages, _reading) = self.read_ahead(acked.cursor);
        loop {
            if in_flight.is_empty() {
                // Caught up, every event acknowledged: the checkpoint says so before waiting.
                self.checkpoint(acked, true).await?;
            }
            let page = match in_flight.front_mut() {
                None => tokio::select! {
                    page = pages.recv() => page,
                    () = &mut stop => return self.checkpoint(acked, true).await,
                },
                // A page if one comes first, else the oldest acknowledgement.
                Some((cursor, delivery)) => {
                    let cursor = *cursor;
                    tokio::select! {
                        biased;
                        page = pages.recv() => page,
                        delivered = delivery => {
                            in_flight.pop_front();
                            self.settled(cursor, delivered, acked).await?;
                            continue;
                        }
                        () = &mut stop => return self.drain(in_flight, acked).await,
                    }
                }
            };
            let page = page.ok_or_else(|| StoreError::Unavailable {
                endpoint: self.store.endpoint().to_owned(),
                reason: "the relay's reader of the log stopped".into(),
            })??;
            // A relay whose lock's session ended may have a successor already: it publishes
            // nothing more.
            acked.lock.still_held().await?;
            for event in &page {
                if self.publish_event(event, &mut in_flight, acked, &mut stop).await?
                    == Flow::Stopped
                {
                    return Ok(());
                }
            }
            self.take_acknowledged(&mut in_flight, acked).await?;
        }
    }

    /// Pages of the log after `after`, read by a task of their own so that reading the next
    /// page overlaps publishing this one: at most two pages ahead, each no larger than the
    /// window. The task ends when the receiver is dropped, or the guard is.
    fn read_ahead(&self, after: Cursor) -> (mpsc::Receiver<PageRead>, AbortOnDrop) {
        let (pages, receiver) = mpsc::channel(2);
        let store = self.store.clone();
        let (size, wait) = (self.config.in_flight_max.clamp(1, 1_000), self.config.idle_wait);
        let task = tokio::spawn(async move {
            let mut after = after;
            loop {
                let read = store.wait_for_log(after, size, wait).await.map(|page| page.events);
                match &read {
                    Ok(events) if events.is_empty() => continue,
                    Ok(events) => after = events.last().map_or(after, |event| event.cursor),
                    Err(_) => {}
                }
                let failed = read.is_err();
                if pages.send(read).await.is_err() || failed {
                    return;
                }
            }
        });
        (receiver, AbortOnDrop(task))
    }

    /// Publishes `event` once the window has room for it: while the window (or librdkafka's
    /// queue) is full, the oldest acknowledgement is waited for. A stop meanwhile drains what
    /// is in flight; an event that cannot be published drains what precedes it and stops
    /// the relay.
    async fn publish_event(
        &self,
        event: &RecordedEvent,
        in_flight: &mut InFlight,
        acked: &mut Acknowledged,
        stop: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Flow, RelayError> {
        let value = serde_json::to_vec(&EventLineRef::of(event)).map_err(|error| {
            RelayError::Publish { cursor: event.cursor, reason: format!("as JSON: {error}") }
        })?;
        loop {
            if in_flight.len() < self.config.in_flight_max {
                match self.send(event, &value) {
                    Ok(delivery) => {
                        in_flight.push_back((event.cursor, delivery));
                        return Ok(Flow::Going);
                    }
                    Err(Unsent::QueueFull) if !in_flight.is_empty() => {}
                    Err(Unsent::QueueFull) => {
                        // Full of messages no longer ours (a drain that gave up): they leave
                        // the queue as the broker takes them.
                        tokio::select! {
                            () = tokio::time::sleep(Duration::from_millis(10)) => continue,
                            () = stop.as_mut() => {
                                self.checkpoint(acked, true).await?;
                                return Ok(Flow::Stopped);
                            }
                        }
                    }
                    Err(Unsent::Refused(error)) => {
                        return self.drain(std::mem::take(in_flight), acked).await.and(Err(error));
                    }
                }
            }
            if self.wait_oldest(in_flight, acked, stop).await? == Flow::Stopped {
                return Ok(Flow::Stopped);
            }
        }
    }

    /// Hands `event`, as `value`, to the producer.
    fn send(&self, event: &RecordedEvent, value: &[u8]) -> Result<DeliveryFuture, Unsent> {
        let record = FutureRecord::to(&self.config.topic)
            .key(event.stream_id.as_str())
            .payload(value)
            .headers(headers(event));
        let cursor = event.cursor;
        match self.producer.send_result(record) {
            Ok(delivery) => Ok(delivery),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                Err(Unsent::QueueFull)
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge), _)) => {
                let (bytes, max) = (value.len(), self.config.message_max_bytes);
                Err(Unsent::Refused(RelayError::TooLarge { cursor, bytes, max }))
            }
            Err((error, _)) => {
                Err(Unsent::Refused(RelayError::Publish { cursor, reason: error.to_string() }))
            }
        }
    }

    /// Waits for the oldest event in flight to be acknowledged; a stop meanwhile drains
    /// what is in flight.
    async fn wait_oldest(
        &self,
        in_flight: &mut InFlight,
        acked: &mut Acknowledged,
        stop: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Flow, RelayError> {
        let Some((cursor, delivery)) = in_flight.front_mut() else { return Ok(Flow::Going) };
        let cursor = *cursor;
        tokio::select! {
            biased;
            delivered = delivery => {
                in_flight.pop_front();
                self.settled(cursor, delivered, acked).await?;
                Ok(Flow::Going)
            }
            () = stop.as_mut() => {
                self.drain(std::mem::take(in_flight), acked).await?;
                Ok(Flow::Stopped)
            }
        }
    }

    /// Takes the acknowledgements that have already come, oldest first.
    async fn take_acknowledged(
        &self,
        in_flight: &mut InFlight,
        acked: &mut Acknowledged,
    ) -> Result<(), RelayError> {
        while let Some((cursor, delivery)) = in_flight.front_mut() {
            let cursor = *cursor;
            let Some(delivered) = delivery.now_or_never() else { break };
            in_flight.pop_front();
            self.settled(cursor, delivered, acked).await?;
        }
        self.checkpoint(acked, false).await
    }

    /// Waits for the events in flight (stopping at one that fails, or at `drain_wait`) and
    /// writes the checkpoint: the relay stops past all that was acknowledged.
    async fn drain(&self, in_flight: InFlight, acked: &mut Acknowledged) -> Result<(), RelayError> {
        let deadline = Instant::now() + self.config.drain_wait;
        let total = in_flight.len();
        for (taken, (cursor, delivery)) in in_flight.into_iter().enumerate() {
            let Ok(delivered) = tokio::time::timeout_at(deadline, delivery).await else {
                let unacknowledged = total - taken;
                tracing::warn!(
                    relay = %self.name, unacknowledged,
                    "stopping with events the broker has not acknowledged: the next start \
                     publishes them again"
                );
                break;
            };
            self.settled(cursor, delivered, acked).await?;
        }
        self.checkpoint(acked, true).await
    }

    /// Takes the delivery report of the event at `cursor` (the oldest in flight): the
    /// checkpoint may move past it. A failed delivery stops the relay, the prefix
    /// acknowledged before it checkpointed first; nothing after it counts.
    async fn settled(
        &self,
        cursor: Cursor,
        delivered: Result<OwnedDeliveryResult, impl std::fmt::Debug>,
        acked: &mut Acknowledged,
    ) -> Result<(), RelayError> {
        if let Err(error) = delivered_or_failed(cursor, delivered) {
            self.checkpoint(acked, true).await?;
            return Err(error);
        }
        self.acknowledged(cursor, acked).await
    }

    async fn acknowledged(
        &self,
        cursor: Cursor,
        acked: &mut Acknowledged,
    ) -> Result<(), RelayError> {
        acked.cursor = cursor;
        acked.unsaved += 1;
        self.checkpoint(acked, false).await
    }

    /// Writes the checkpoint if events were acknowledged since, and it is time (or `now`).
    async fn checkpoint(&self, acked: &mut Acknowledged, now: bool) -> Result<(), RelayError> {
        let due = now || acked.saved_at.elapsed() >= self.config.checkpoint_every;
        if acked.unsaved == 0 || !due {
            return Ok(());
        }
        save(&acked.lock, &self.name, acked.cursor, acked.unsaved).await?;
        (acked.unsaved, acked.saved_at) = (0, Instant::now());
        Ok(())
    }
}

/// An event's headers: what a consumer routes or dedupes by without reading the value.
fn headers(event: &RecordedEvent) -> OwnedHeaders {
    let cursor = event.cursor.to_string();
    let event_id = event.event_id.as_uuid().to_string();
    let schema_version = event.schema_version.to_string();
    [
        ("event_id", event_id.as_str()),
        ("cursor", cursor.as_str()),
        ("event_type", event.event_type.as_str()),
        ("stream_type", event.stream_type.as_str()),
        ("tenant_id", event.tenant_id.as_str()),
        ("schema_version", schema_version.as_str()),
    ]
    .into_iter()
    .fold(OwnedHeaders::new(), |headers, (key, value)| {
        headers.insert(Header { key, value: Some(value) })
    })
}

/// The acknowledgement of the event at `cursor`, or why it will never come.
fn delivered_or_failed(
    cursor: Cursor,
    delivered: Result<OwnedDeliveryResult, impl std::fmt::Debug>,
) -> Result<(), RelayError> {
    use rdkafka::message::Message as _;
    match delivered {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((
            KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge),
            message,
        ))) => {
            let bytes = message.payload().map_or(0, <[u8]>::len);
            Err(RelayError::RefusedAsTooLarge { cursor, bytes })
        }
        Ok(Err((error, _))) => Err(RelayError::Publish { cursor, reason: error.to_string() }),
        Err(_) => Err(RelayError::Publish { cursor, reason: "the producer went away".into() }),
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::Timestamp;
    use rdkafka::message::OwnedMessage;

    use super::*;

    fn refused(code: RDKafkaErrorCode) -> Result<OwnedDeliveryResult, ()> {
        let message = OwnedMessage::new(
            Some(vec![0; 2_048]),
            Some(b"lease-1".to_vec()),
            "leasehold.events".into(),
            Timestamp::NotAvailable,
            0,
            -1,
            None,
        );
        Ok(Err((KafkaError::MessageProduction(code), message)))
    }

    #[test]
    fn a_delivery_refused_as_too_large_names_the_event_and_its_size() {
        let cursor = Cursor { log_epoch: 1, tx_id: 7, position: 42 };
        let error = delivered_or_failed(cursor, refused(RDKafkaErrorCode::MessageSizeTooLarge));
        let Err(RelayError::RefusedAsTooLarge { cursor: at, bytes }) = error else {
            panic!("{error:?}")
        };
        assert_eq!((at, bytes), (cursor, 2_048));
    }

    #[test]
    fn another_refusal_is_a_publish_failure_with_the_producers_reason() {
        let cursor = Cursor { log_epoch: 1, tx_id: 7, position: 42 };
        let error =
            delivered_or_failed(cursor, refused(RDKafkaErrorCode::TopicAuthorizationFailed));
        let Err(RelayError::Publish { reason, .. }) = error else { panic!("{error:?}") };
        assert!(reason.contains("authoriz"), "{reason}");
    }
}
