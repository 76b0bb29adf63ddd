//! The lease's own validated inputs (the values every kind uses are in `crate::values`).

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::StreamId;
use crate::limits::LEASE_ITEMS_MAX;
use crate::values::{
    FieldError, HostName, OperationId, Problem, ServiceName, Sku, checked_string, uuid_type,
};

fn check_payload_hash(value: &str) -> Result<(), Problem> {
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() == 64 && value.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(Problem::BadFormat { expected: "64 lower-case hex digits (a SHA-256)" })
    }
}

checked_string!(
    /// The SHA-256 of the lease's manifest, 64 lower-case hex digits. The manifest itself never
    /// enters an event: it may hold the tenant's configuration values.
    PayloadHash,
    check_payload_hash
);

uuid_type!(
    /// A lease's id (fred's `lease_uuid`).
    LeaseId
);

uuid_type!(
    /// One restart or update command. Completions name it; with the admission stamp it
    /// decides whether a completion settles the pending command.
    MaintenanceId
);

impl From<MaintenanceId> for OperationId {
    fn from(maintenance: MaintenanceId) -> Self {
        Self(maintenance.0)
    }
}

impl LeaseId {
    /// The lease's stream: `lease-<uuid>`.
    pub fn stream_id(&self) -> StreamId {
        StreamId::parse(format!("lease-{}", self.0)).expect("a UUID makes a valid stream id")
    }
}

/// One rented item: a SKU, a count, and for stack leases the service it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseItem {
    /// What is rented.
    pub sku: Sku,
    /// How many, at least 1.
    pub quantity: u32,
    /// The service it runs (stack leases only).
    // Never skipped when absent: snapshots encode this type with postcard, whose layout is
    // positional.
    #[serde(default)]
    pub service_name: Option<ServiceName>,
    /// The host name the tenant routes to it, if any.
    #[serde(default)]
    pub custom_domain: Option<HostName>,
}

/// The items of a lease: at least one; every item names a service, or there is exactly one
/// item and it names none; service names are unique.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<LeaseItem>", into = "Vec<LeaseItem>")]
pub struct LeaseItems(Vec<LeaseItem>);

impl LeaseItems {
    /// Checks the list's shape (each item's values are already typed).
    ///
    /// # Errors
    /// [`FieldError`] on `items` or on the offending item.
    pub fn new(items: Vec<LeaseItem>) -> Result<Self, FieldError> {
        if items.is_empty() {
            return Err(FieldError::new("items", Problem::Missing));
        }
        if items.len() > LEASE_ITEMS_MAX {
            return Err(FieldError::new("items", Problem::TooLong { max: LEASE_ITEMS_MAX }));
        }
        let named = items.iter().filter(|item| item.service_name.is_some()).count();
        if named != 0 && named != items.len() {
            return Err(FieldError::new("items", Problem::MixedServiceNames));
        }
        if named == 0 && items.len() > 1 {
            return Err(FieldError::new("items", Problem::SeveralUnnamedItems));
        }
        let mut seen = BTreeSet::new();
        for (n, item) in items.iter().enumerate() {
            if item.quantity == 0 {
                let problem = Problem::OutOfRange { min: 1, max: u64::from(u32::MAX) };
                return Err(FieldError::new(format!("items[{n}].quantity"), problem));
            }
            if let Some(name) = &item.service_name
                && !seen.insert(name.as_str())
            {
                let problem = Problem::Duplicate { value: name.to_string() };
                return Err(FieldError::new(format!("items[{n}].serviceName"), problem));
            }
        }
        Ok(Self(items))
    }

    /// The items in the order given.
    pub fn as_slice(&self) -> &[LeaseItem] {
        &self.0
    }

    /// The index of the item a service name selects; `None` selects the only item.
    pub fn find(&self, service: Option<&ServiceName>) -> Option<usize> {
        match service {
            Some(name) => self.0.iter().position(|item| item.service_name.as_ref() == Some(name)),
            None => (self.0.len() == 1).then_some(0),
        }
    }

    /// The same items with one item's custom domain replaced.
    #[must_use]
    pub fn with_custom_domain(&self, index: usize, domain: Option<HostName>) -> Self {
        let mut items = self.0.clone();
        items[index].custom_domain = domain;
        Self(items)
    }

    /// The shape a restore must keep: each service with its quantity, in a stable order.
    pub fn shape(&self) -> Vec<(Option<&str>, u32)> {
        let mut shape: Vec<_> = self
            .0
            .iter()
            .map(|item| (item.service_name.as_ref().map(ServiceName::as_str), item.quantity))
            .collect();
        shape.sort_unstable();
        shape
    }

    /// The SKUs, each once, sorted.
    pub fn skus(&self) -> BTreeSet<&Sku> {
        self.0.iter().map(|item| &item.sku).collect()
    }
}

impl TryFrom<Vec<LeaseItem>> for LeaseItems {
    type Error = FieldError;
    fn try_from(items: Vec<LeaseItem>) -> Result<Self, FieldError> {
        Self::new(items)
    }
}

impl From<LeaseItems> for Vec<LeaseItem> {
    fn from(items: LeaseItems) -> Self {
        items.0
    }
}
