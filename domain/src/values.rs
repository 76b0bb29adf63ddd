//! Validated values every aggregate kind uses: once a value has one of these types it is known
//! to be good, so `decide` never sees a malformed SKU, host name or message. A kind's own
//! values live in its folder (the lease's in `lease/values.rs`).

pub mod fleet;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::limits::{
    LEASE_OPERATOR_DETAIL_MAX_BYTES, LEASE_REASON_MAX_BYTES, LEASE_SKU_MAX_BYTES,
    LEASE_TENANT_MESSAGE_MAX_CHARS,
};

/// What is wrong with one input field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// The field was absent or empty.
    #[error("is required")]
    Missing,
    /// The value is longer than allowed.
    #[error("is longer than {max}")]
    TooLong {
        /// The limit (bytes or characters, as the field's rule says).
        max: usize,
    },
    /// The value does not have the required form.
    #[error("must be {expected}")]
    BadFormat {
        /// The form it must have, in words.
        expected: &'static str,
    },
    /// The number is outside its range.
    #[error("must be between {min} and {max}")]
    OutOfRange {
        /// Smallest allowed.
        min: u64,
        /// Largest allowed.
        max: u64,
    },
    /// The value repeats one given before.
    #[error("repeats {value:?}")]
    Duplicate {
        /// The repeated value.
        value: String,
    },
    /// Some items name a service and others do not.
    #[error("must name a service on every item or on none")]
    MixedServiceNames,
    /// Items without service names describe one workload, so there can be only one.
    #[error("may hold only one item when items name no service")]
    SeveralUnnamedItems,
}

/// A refused input, naming the field (`items[1].quantity`, `customDomain`, ...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {problem}")]
pub struct FieldError {
    /// The field's path in the input.
    pub field: String,
    /// What is wrong with it.
    pub problem: Problem,
}

impl FieldError {
    /// A refusal of `field`.
    pub fn new(field: impl Into<String>, problem: Problem) -> Self {
        Self { field: field.into(), problem }
    }
}

/// Declares a string newtype whose values passed `check`, stored and read back through it.
macro_rules! checked_string {
    ($(#[$doc:meta])* $name:ident, $check:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Parses the value, refusing it with the field's name when it is malformed.
            ///
            /// # Errors
            /// [`FieldError`] naming `field`.
            pub fn parse(field: &str, value: impl Into<String>) -> Result<Self, FieldError> {
                let value = value.into();
                $check(&value).map_err(|problem| FieldError::new(field, problem))?;
                Ok(Self(value))
            }

            /// The value as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = FieldError;
            fn try_from(value: String) -> Result<Self, FieldError> {
                Self::parse(stringify!($name), value)
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

fn check_sku(value: &str) -> Result<(), Problem> {
    const EXPECTED: &str = "lower-case letters and digits in parts joined by '.', '-' or '_' \
                            (e.g. gpu.h100.1x)";
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() > LEASE_SKU_MAX_BYTES {
        return Err(Problem::TooLong { max: LEASE_SKU_MAX_BYTES });
    }
    let part_ok = |part: &str| {
        !part.is_empty() && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    if value.split(['.', '-', '_']).all(part_ok) {
        Ok(())
    } else {
        Err(Problem::BadFormat { expected: EXPECTED })
    }
}

/// An RFC 1123 label: lower-case letters, digits and inner hyphens, 1 to 63 bytes.
pub(crate) fn is_dns_label(label: &str) -> bool {
    let bytes = label.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

fn check_service_name(value: &str) -> Result<(), Problem> {
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if is_dns_label(value) {
        Ok(())
    } else {
        Err(Problem::BadFormat {
            expected: "a DNS label: 1-63 lower-case letters, digits or inner hyphens",
        })
    }
}

fn check_host_name(value: &str) -> Result<(), Problem> {
    const EXPECTED: &str =
        "a lower-case host name of at least two dot-separated DNS labels, at most 253 bytes";
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() > 253 {
        return Err(Problem::TooLong { max: 253 });
    }
    let labels: Vec<&str> = value.split('.').collect();
    let top_level_alphabetic =
        labels.last().is_some_and(|top| top.bytes().any(|b| b.is_ascii_lowercase()));
    if labels.len() >= 2 && labels.iter().all(|l| is_dns_label(l)) && top_level_alphabetic {
        Ok(())
    } else {
        Err(Problem::BadFormat { expected: EXPECTED })
    }
}

fn check_reason(value: &str) -> Result<(), Problem> {
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() > LEASE_REASON_MAX_BYTES {
        return Err(Problem::TooLong { max: LEASE_REASON_MAX_BYTES });
    }
    let mut bytes = value.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphabetic());
    if first_ok && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        Ok(())
    } else {
        Err(Problem::BadFormat { expected: "a letter, then letters, digits or '_'" })
    }
}

fn check_tenant_message(value: &str) -> Result<(), Problem> {
    if value.chars().count() > LEASE_TENANT_MESSAGE_MAX_CHARS {
        return Err(Problem::TooLong { max: LEASE_TENANT_MESSAGE_MAX_CHARS });
    }
    if value.chars().any(char::is_control) {
        return Err(Problem::BadFormat { expected: "text without control characters" });
    }
    Ok(())
}
checked_string!(
    /// A stock-keeping unit naming what is rented (`gpu.h100.1x`).
    Sku,
    check_sku
);
checked_string!(
    /// The name of one service of a stack lease: a DNS label.
    ServiceName,
    check_service_name
);
checked_string!(
    /// A fully qualified host name a tenant routes to one item (`app.example.com`).
    HostName,
    check_host_name
);
checked_string!(
    /// A tenant-safe failure reason from an open, add-only set (`ImagePullFailed`).
    Reason,
    check_reason
);
checked_string!(
    /// A tenant-safe failure message: curated text, never raw backend output.
    TenantMessage,
    check_tenant_message
);

impl Reason {
    /// The reason a failed lease reads when no one authored one.
    pub fn unknown() -> Self {
        Self("Unknown".to_owned())
    }
}

/// Verbose failure detail for operators only (exec output, host paths). Never shown to a
/// tenant. Longer text is cut at [`LEASE_OPERATOR_DETAIL_MAX_BYTES`] rather than refused,
/// so that a chatty backend's report is still recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OperatorDetail(String);

impl OperatorDetail {
    /// The detail, cut to the limit at a character boundary.
    pub fn new(value: &str) -> Self {
        let mut end = value.len().min(LEASE_OPERATOR_DETAIL_MAX_BYTES);
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        Self(value[..end].to_owned())
    }

    /// The detail as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Declares a UUID newtype; with `stream = "prefix"`, also its stream id (`prefix-<uuid>`)
/// and the way back from one, so that a new kind's id is one declaration.
macro_rules! uuid_type {
    ($(#[$doc:meta])* $name:ident, stream = $prefix:literal) => {
        $crate::values::uuid_type!($(#[$doc])* $name);

        impl $name {
            #[doc = concat!("Its stream: `", $prefix, "-<uuid>`.")]
            pub fn stream_id(&self) -> $crate::StreamId {
                $crate::StreamId::parse(format!(concat!($prefix, "-{}"), self.0))
                    .expect("a UUID makes a valid stream id")
            }

            #[doc = concat!("The id of `stream`, if it is a `", $prefix, "` stream.")]
            pub fn of_stream(stream: &$crate::StreamId) -> Option<Self> {
                let id = stream.as_str().strip_prefix(concat!($prefix, "-"))?;
                ::uuid::Uuid::parse_str(id).ok().map(Self)
            }
        }
    };
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(
            Debug,
            Clone,
            Copy,
            PartialEq,
            Eq,
            PartialOrd,
            Ord,
            Hash,
            ::serde::Serialize,
            ::serde::Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub ::uuid::Uuid);

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

uuid_type!(
    /// A provider that rents capacity out (a lease's, a rental's).
    ProviderId
);

uuid_type!(
    /// One piece of work a machine actor carries out and reports on (for a lease: a
    /// provision, a restore, or a restart or update, whose operation id is its maintenance
    /// id). The actor is given it with the request (in a callback URL) and every report names
    /// it, so a report of an older operation can never settle a newer one and a new
    /// operation's report is never taken for a redelivery of an older one.
    OperationId
);

pub(crate) use {checked_string, uuid_type};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skus_host_names_and_service_names_are_checked() {
        assert!(Sku::parse("sku", "gpu.h100.1x").is_ok());
        assert!(Sku::parse("sku", "cpu-standard_4x").is_ok());
        for bad in ["", "GPU", "gpu..x", ".gpu", "gpu.", "gpu h100"] {
            assert!(Sku::parse("sku", bad).is_err(), "{bad:?} should be refused");
        }
        assert!(HostName::parse("d", "app.example.com").is_ok());
        for bad in ["example", "-a.example.com", "a..com", "App.example.com", "a.b.123", ""] {
            assert!(HostName::parse("d", bad).is_err(), "{bad:?} should be refused");
        }
        assert!(ServiceName::parse("s", "web-1").is_ok());
        assert!(ServiceName::parse("s", "web_1").is_err());
    }

    #[test]
    fn a_refusal_names_its_field() {
        let error = Sku::parse("items[2].sku", "Bad SKU").unwrap_err();
        assert_eq!(error.field, "items[2].sku");
        assert!(matches!(error.problem, Problem::BadFormat { .. }));
    }

    #[test]
    fn operator_detail_is_cut_at_a_character_boundary() {
        let long = "é".repeat(LEASE_OPERATOR_DETAIL_MAX_BYTES);
        let detail = OperatorDetail::new(&long);
        assert!(detail.as_str().len() <= LEASE_OPERATOR_DETAIL_MAX_BYTES);
        assert!(detail.as_str().chars().all(|c| c == 'é'));
    }
}
