//! Reading what the relay published: the reference for an outside consumer, and what the
//! tests check the topic with. Delivery is at least once, so a consumer keeps, per stream,
//! the last version it took: an event at or below it is a repeat and dropped; one past the
//! next is a gap, which the relay never makes.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message as _;

use super::settings::{KafkaSettings, refused_setting};
use crate::archive::EventLine;

/// Why reading the topic stopped.
#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    /// The consumer could not be made or could not read.
    #[error("the Kafka consumer: {0}")]
    Kafka(String),
    /// A message that is not an event as the relay publishes it.
    #[error(
        "a message at offset {offset} of partition {partition} is not a relayed event: {reason}"
    )]
    Malformed {
        /// Its partition.
        partition: i32,
        /// Its offset.
        offset: i64,
        /// What is wrong.
        reason: String,
    },
    /// A stream's events are not contiguous: one is missing.
    #[error("stream {stream_id}: version {found} after {last}; version {} is missing", last + 1)]
    Gap {
        /// The stream.
        stream_id: String,
        /// The last version taken.
        last: u64,
        /// The version that came.
        found: u64,
    },
    /// Nothing came for the time given.
    #[error("no event came in {0:?}")]
    Quiet(Duration),
}

/// The relayed log read from a topic: every event once, each stream's in order.
pub struct RelayedLog {
    consumer: StreamConsumer,
    last: HashMap<String, u64>,
    /// Whether a stream's first event must be its first (version 1): reading from the
    /// topic's start, as the tests do.
    from_the_start: bool,
    repeats: u64,
}

impl std::fmt::Debug for RelayedLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayedLog")
            .field("streams", &self.last.len())
            .field("repeats", &self.repeats)
            .finish_non_exhaustive()
    }
}

impl RelayedLog {
    /// Reads `topic` on `brokers` as consumer group `group`, from the topic's start when the
    /// group has no offsets yet. `from_the_start`: each stream's first event must be version 1.
    ///
    /// # Errors
    /// [`ConsumeError::Kafka`] when the consumer cannot be made or subscribe.
    pub fn subscribe(
        brokers: &str,
        topic: &str,
        group: &str,
        from_the_start: bool,
    ) -> Result<Self, ConsumeError> {
        Self::subscribe_with(brokers, topic, group, from_the_start, &KafkaSettings::default())
    }

    /// [`RelayedLog::subscribe`] with librdkafka settings of the operator's own (TLS, SASL,
    /// ...), as the relay takes them.
    ///
    /// # Errors
    /// [`ConsumeError::Kafka`] when the consumer cannot be made or subscribe.
    pub fn subscribe_with(
        brokers: &str,
        topic: &str,
        group: &str,
        from_the_start: bool,
        settings: &KafkaSettings,
    ) -> Result<Self, ConsumeError> {
        let consumer: StreamConsumer = settings
            .client_config()
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|error| ConsumeError::Kafka(refused_setting(&error)))?;
        consumer.subscribe(&[topic]).map_err(|error| ConsumeError::Kafka(error.to_string()))?;
        Ok(Self { consumer, last: HashMap::new(), from_the_start, repeats: 0 })
    }

    /// Repeats dropped so far.
    #[must_use]
    pub fn repeats(&self) -> u64 {
        self.repeats
    }

    /// The next event not taken before, waiting at most `wait` for one.
    ///
    /// # Errors
    /// [`ConsumeError`]: the consumer failed, a message is not an event, a gap, or nothing
    /// new came in `wait`.
    pub async fn next(&mut self, wait: Duration) -> Result<EventLine, ConsumeError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let received = tokio::time::timeout_at(deadline, self.consumer.recv()).await;
            let message = match received.map_err(|_| ConsumeError::Quiet(wait))? {
                Ok(message) => message,
                Err(error) if passing(&error) => {
                    // librdkafka reconnects by itself: a broker down or restarting is
                    // waited for, within `wait`.
                    tracing::warn!(%error, "the Kafka consumer waits for the broker");
                    continue;
                }
                Err(error) => return Err(ConsumeError::Kafka(error.to_string())),
            };
            let malformed = |reason: String| ConsumeError::Malformed {
                partition: message.partition(),
                offset: message.offset(),
                reason,
            };
            let payload = message.payload().ok_or_else(|| malformed("no value".into()))?;
            let event: EventLine =
                serde_json::from_slice(payload).map_err(|error| malformed(error.to_string()))?;
            if self.take(&event)? {
                return Ok(event);
            }
        }
    }

    /// Whether `event` is new; a repeat is counted, a gap is an error.
    fn take(&mut self, event: &EventLine) -> Result<bool, ConsumeError> {
        let first = if self.from_the_start { Some(0) } else { None };
        let last = self.last.get(&event.stream_id).copied().or(first);
        match last {
            Some(last) if event.version <= last => {
                self.repeats += 1;
                Ok(false)
            }
            Some(last) if event.version > last + 1 => Err(ConsumeError::Gap {
                stream_id: event.stream_id.clone(),
                last,
                found: event.version,
            }),
            _ => {
                self.last.insert(event.stream_id.clone(), event.version);
                Ok(true)
            }
        }
    }
}

/// Whether a consumer's error passes by itself: the broker or the network is down for a
/// while, or the group's coordinator or a partition's leader moves. Anything else (no such
/// topic, not authorised, a fatal error) ends the reading.
fn passing(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as Code;
    let KafkaError::MessageConsumption(code) = error else { return false };
    matches!(
        code,
        Code::BrokerTransportFailure
            | Code::AllBrokersDown
            | Code::Resolve
            | Code::OperationTimedOut
            | Code::RequestTimedOut
            | Code::NetworkException
            | Code::CoordinatorNotAvailable
            | Code::NotCoordinator
            | Code::CoordinatorLoadInProgress
            | Code::LeaderNotAvailable
            | Code::NotLeaderForPartition
    )
}
