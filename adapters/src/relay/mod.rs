//! The committed log published to Kafka, for the rest of a company's systems to read without
//! touching Leasehold's database.
//!
//! [`KafkaRelay`] reads the whole log with the projectors' gap-safe reader (events below the
//! horizon, in commit order) from its checkpoint in `relay_checkpoints`, and publishes each
//! event with an idempotent producer: key = stream id (one aggregate's events keep their
//! order within a partition), value = the event as an export writes it (every stored field,
//! the auditor's view), headers = id, cursor, type, stream type, tenant and schema version.
//! The checkpoint moves only past events the broker acknowledged, all of them up to it: a
//! restart publishes again at most what was in flight. Delivery is at least once; a consumer
//! drops a repeat by its event id or by its `(stream id, version)` ([`RelayedLog`] does).
//!
//! One relay a topic publishes at a time: a second one (another `leasehold relay`, or a
//! `serve` with `--relay-kafka-brokers`) stands by on the first one's advisory lock and takes
//! over from its checkpoint when it stops or dies.
//!
//! A broker that is down leaves the relay waiting, its checkpoint still, while the producer
//! retries with backoff; nothing is skipped. An event too large to publish stops the relay
//! with [`RelayError::TooLarge`] (or, refused by the broker, [`RelayError::RefusedAsTooLarge`]):
//! it is never dropped.

mod checkpoint;
mod consume;
mod lock;
mod publish;
mod settings;

pub use checkpoint::{RelayCheckpoint, relay_checkpoints};
pub use consume::{ConsumeError, RelayedLog};
pub use publish::{KafkaRelay, RelayConfig};
pub use settings::{KafkaSettings, SettingsError};

use leasehold_domain::{Cursor, StoreError};

/// Why the relay stopped.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The log or the checkpoint could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The topic's name is not one Kafka takes (1 to 249 of `A-Z a-z 0-9 . _ -`). Checked
    /// before anything is stored: the name is the checkpoint's and the metrics' label.
    #[error("{topic:?} is not a Kafka topic name (1 to 249 of A-Z, a-z, 0-9, '.', '_', '-')")]
    BadTopic {
        /// The name given.
        topic: String,
    },
    /// The producer could not be made (a bad setting; the message names the setting, never
    /// its value).
    #[error("the Kafka producer: {0}")]
    Producer(String),
    /// An event is larger than the producer may publish; the relay stops before it.
    #[error(
        "the event at cursor {cursor} is {bytes} bytes as published, over the {max}-byte \
         limit (message.max.bytes): the relay stops rather than skip it"
    )]
    TooLarge {
        /// The event.
        cursor: Cursor,
        /// Its message's size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// The broker (or the topic's `max.message.bytes`) refused an event as too large, under
    /// the producer's own limit; the relay stops before it.
    #[error(
        "the broker refused the event at cursor {cursor} ({bytes} bytes as published) as too \
         large for the topic (its max.message.bytes, or the broker's message.max.bytes): the \
         relay stops rather than skip it"
    )]
    RefusedAsTooLarge {
        /// The event.
        cursor: Cursor,
        /// Its message's size.
        bytes: usize,
    },
    /// The broker refused an event for good; the relay stops at the event before it.
    #[error("publishing the event at cursor {cursor} failed: {reason}")]
    Publish {
        /// The event.
        cursor: Cursor,
        /// The producer's error.
        reason: String,
    },
}

/// The name a relay to a Kafka topic keeps its checkpoint under.
#[must_use]
pub fn kafka_relay_name(topic: &str) -> String {
    format!("kafka:{topic}")
}

/// Whether Kafka takes `topic` as a topic's name.
fn is_topic_name(topic: &str) -> bool {
    (1..=249).contains(&topic.len())
        && topic.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_kafkas_topic_names_are_taken() {
        assert!(super::is_topic_name("leasehold.events"));
        assert!(super::is_topic_name("a-b_c.1"));
        for bad in ["", "a b", "a\"b", "a\nb", "é", &"x".repeat(250)] {
            assert!(!super::is_topic_name(bad), "{bad:?}");
        }
    }
}
