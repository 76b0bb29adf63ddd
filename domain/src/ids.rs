//! Identifiers parsed at the edge: once a value has one of these types it is known to be valid.

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::limits::NAME_LENGTH_MAX_BYTES;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The name was empty.
    #[error("{kind} must not be empty")]
    Empty {
        /// Which kind of name it was (`stream id`, `event type`, ...).
        kind: &'static str,
    },
    /// The name was longer than [`NAME_LENGTH_MAX_BYTES`].
    #[error("{kind} is {length} bytes long; at most {max} are allowed")]
    TooLong {
        /// Which kind of name it was.
        kind: &'static str,
        /// Its length in bytes.
        length: usize,
        /// The limit.
        max: usize,
    },
    /// The name held a character outside `[A-Za-z0-9._:-]`.
    #[error("{kind} {value:?} may only contain A-Z, a-z, 0-9, '.', '_', ':' and '-'")]
    BadCharacter {
        /// Which kind of name it was.
        kind: &'static str,
        /// The refused value, cut to the length limit so an error never carries a huge input.
        value: String,
    },
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')
}

/// Checks one name against the shared rule `[A-Za-z0-9._:-]{1,200}`.
fn check_name(kind: &'static str, value: &str) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty { kind });
    }
    if value.len() > NAME_LENGTH_MAX_BYTES {
        return Err(IdError::TooLong { kind, length: value.len(), max: NAME_LENGTH_MAX_BYTES });
    }
    if !value.chars().all(is_name_char) {
        let value = value.chars().take(NAME_LENGTH_MAX_BYTES).collect();
        return Err(IdError::BadCharacter { kind, value });
    }
    Ok(())
}

/// Declares a validated string newtype sharing the name rule.
macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Parses a name, refusing anything outside `[A-Za-z0-9._:-]{1,200}`.
            pub fn parse(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                check_name($kind, &value)?;
                Ok(Self(value))
            }

            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, IdError> {
                Self::parse(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

name_type!(
    /// The id of one stream: one aggregate instance's ordered history (`lease-<uuid>`).
    StreamId,
    "stream id"
);
name_type!(
    /// The kind of aggregate a stream belongs to (`lease`, `vm`, ...).
    StreamType,
    "stream type"
);
name_type!(
    /// The tenant that owns a stream. Taken from authentication, never from a request body.
    TenantId,
    "tenant id"
);
name_type!(
    /// A caller's idempotency key: the same key with the same request is one command, however
    /// often it is sent.
    OperationKey,
    "operation key"
);
name_type!(
    /// The name of an event, past tense and stable once shipped (`LeaseProvisioned`).
    EventType,
    "event type"
);

/// The id of one event: a UUID chosen by the writer (v7, so ids sort by creation time).
/// Writing an event id that is already stored is an idempotent retry, never a second row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EventId(Uuid);

impl EventId {
    /// Wraps a UUID minted by the caller (the domain never mints ids itself).
    pub fn from_uuid(id: Uuid) -> Self {
        Self(id)
    }

    /// The UUID.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_whole_alphabet() {
        let id = StreamId::parse("lease-AZaz09._:-").unwrap();
        assert_eq!(id.as_str(), "lease-AZaz09._:-");
    }

    #[test]
    fn refuses_empty_long_and_foreign_names() {
        assert_eq!(StreamId::parse(""), Err(IdError::Empty { kind: "stream id" }));
        let long = "a".repeat(201);
        assert!(matches!(StreamId::parse(long), Err(IdError::TooLong { length: 201, .. })));
        assert!(StreamId::parse("a".repeat(200)).is_ok());
        for bad in ["a b", "a/b", "é", "a\0", "a\"b"] {
            assert!(
                matches!(StreamId::parse(bad), Err(IdError::BadCharacter { .. })),
                "{bad:?} was accepted"
            );
        }
        assert_eq!(EventType::parse(""), Err(IdError::Empty { kind: "event type" }));
    }

    #[test]
    fn deserialising_validates() {
        let ok: Result<TenantId, _> = serde_json::from_str("\"acme\"");
        assert!(ok.is_ok());
        let bad: Result<TenantId, _> = serde_json::from_str("\"ac me\"");
        assert!(bad.is_err());
    }
}
