//! librdkafka settings of the operator's own, for a cluster that needs them: TLS, SASL,
//! a client id, timeouts. They come from a properties file (`key=value` lines, as `kcat -F`
//! and the Kafka tools read), so that a password is never on a command line; and no value is
//! ever printed (`Debug` shows the keys only). Only settings that say how to reach and trust
//! the cluster, and how to batch, are taken: the relay's guarantees rest on the rest (acks,
//! idempotence, timeouts, the partitioner that keeps a stream in one partition, the queue
//! its window is sized against), and a file that sets one is refused.

use std::path::Path;

use rdkafka::ClientConfig;

/// The settings a file may give: exact keys, or prefixes ending in `.`.
const TAKEN: &[&str] = &[
    "security.protocol",
    "ssl.",
    "sasl.",
    "enable.ssl.certificate.verification",
    "https.",
    "client.id",
    "client.rack",
    "client.dns.lookup",
    "socket.",
    "reconnect.",
    "connections.max.idle.ms",
    "broker.address.family",
    "broker.address.ttl",
    "metadata.max.age.ms",
    "topic.metadata.refresh.interval.ms",
    "api.version.request",
    "api.version.request.timeout.ms",
    "linger.ms",
    "batch.num.messages",
    "batch.size",
    "compression.type",
    "compression.codec",
    "retry.backoff.ms",
    "retry.backoff.max.ms",
    "debug",
    "log_level",
];

/// Whether a file may give setting `key`.
fn taken(key: &str) -> bool {
    TAKEN.iter().any(
        |&allowed| {
            if allowed.ends_with('.') { key.starts_with(allowed) } else { key == allowed }
        },
    )
}

/// Why a settings file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file could not be read.
    #[error("reading the Kafka settings {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A line is not `key=value`.
    #[error("Kafka settings line {line}: not key=value")]
    NotASetting {
        /// Its number, from 1.
        line: usize,
    },
    /// A line sets what the relay does not take.
    #[error(
        "Kafka settings line {line}: {key} is not one the relay takes (security, connection \
         and batching settings only: its guarantees rest on the others)"
    )]
    NotTaken {
        /// Its number, from 1.
        line: usize,
        /// The setting.
        key: String,
    },
}

/// librdkafka settings, applied to a producer or a consumer before the relay's own.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaSettings(Vec<(String, String)>);

impl std::fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys only: a value may be a password.
        f.debug_list().entries(self.0.iter().map(|(key, _)| key)).finish()
    }
}

impl KafkaSettings {
    /// Reads a properties file: `key=value` lines; blank lines and lines starting with `#`
    /// or `!` are skipped; spaces around the key and the value are trimmed.
    ///
    /// # Errors
    /// [`SettingsError`]: the file cannot be read, a line is not a setting, or a setting is
    /// not one the relay takes.
    pub fn read(path: &Path) -> Result<Self, SettingsError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| SettingsError::Read { path: path.display().to_string(), source })?;
        Self::parse(&text)
    }

    /// Parses the text of a properties file, as [`KafkaSettings::read`].
    ///
    /// # Errors
    /// [`SettingsError`]: a line is not a setting, or a setting is not one the relay takes.
    pub fn parse(text: &str) -> Result<Self, SettingsError> {
        let mut settings = Vec::new();
        for (at, line) in text.lines().enumerate() {
            let line_no = at + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                return Err(SettingsError::NotASetting { line: line_no });
            };
            let key = key.trim();
            if key.is_empty() {
                return Err(SettingsError::NotASetting { line: line_no });
            }
            if !taken(key) {
                return Err(SettingsError::NotTaken { line: line_no, key: key.to_owned() });
            }
            settings.push((key.to_owned(), value.trim().to_owned()));
        }
        Ok(Self(settings))
    }

    /// The settings' keys, in the file's order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(key, _)| key.as_str())
    }

    /// A client configuration holding these settings, for the relay's own to be set on.
    pub(super) fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (key, value) in &self.0 {
            config.set(key, value);
        }
        config
    }
}

/// A client's creation error, told without the setting's value (librdkafka's own text
/// repeats it, and it may be a password).
pub(super) fn refused_setting(error: &rdkafka::error::KafkaError) -> String {
    match error {
        rdkafka::error::KafkaError::ClientConfig(_, description, key, value) => {
            let description = if value.is_empty() {
                description.clone()
            } else {
                description.replace(value.as_str(), "(hidden)")
            };
            format!("setting {key}: {description}")
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_properties_file_gives_its_settings_and_shows_no_value() {
        let text = "# a SASL cluster\n\nsecurity.protocol = SASL_SSL\n! old style comment\n\
                    sasl.password=s3cr=t\n";
        let settings = KafkaSettings::parse(text).unwrap();
        assert_eq!(settings.keys().collect::<Vec<_>>(), ["security.protocol", "sasl.password"]);
        assert_eq!(settings.0[1].1, "s3cr=t", "only the first = splits");
        assert!(!format!("{settings:?}").contains("s3cr"), "{settings:?}");
    }

    #[test]
    fn a_setting_librdkafka_refuses_is_named_without_its_value() {
        let settings = KafkaSettings::parse("security.protocol=s3cret-value").unwrap();
        let made = settings.client_config().create::<rdkafka::producer::BaseProducer>();
        let error = made.err().expect("an unknown protocol is refused");
        let told = refused_setting(&error);
        assert!(told.contains("security.protocol") && !told.contains("s3cret"), "{told}");
    }

    #[test]
    fn a_line_that_is_not_a_setting_or_not_one_the_relay_takes_is_refused_by_number() {
        let not = KafkaSettings::parse("client.id=a\nsecurity.protocol\n").unwrap_err();
        assert!(matches!(not, SettingsError::NotASetting { line: 2 }), "{not:?}");
        for key in ["acks", "partitioner", "queue.buffering.max.messages", "enable.idempotence"] {
            let owned = KafkaSettings::parse(&format!("{key}=1\n")).unwrap_err();
            assert!(matches!(owned, SettingsError::NotTaken { line: 1, key: ref k } if k == key));
        }
        let taken = "ssl.ca.location=/ca.pem\nsasl.username=u\nclient.id=c\nlinger.ms=1\n";
        assert_eq!(KafkaSettings::parse(taken).unwrap().keys().count(), 4);
        assert!(matches!(
            KafkaSettings::parse("=x").unwrap_err(),
            SettingsError::NotASetting { line: 1 }
        ));
    }
}
