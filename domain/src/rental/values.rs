//! A rental's own values: its id, the provider connection and offer it was rented through,
//! the resources asked for, the provider's declared capabilities, what the provider reports
//! of the machine, and the price it states.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::limits::{RENTAL_MAX_LIFETIME_SECONDS_MAX, RENTAL_NATIVE_REF_MAX_BYTES};
use crate::values::{FieldError, Problem, checked_string, uuid_type};

uuid_type!(
    /// A rental's id, minted by Leasehold from its tenant and the provision's operation key
    /// **before** any provider is called, so that an accepted answer that was lost can still
    /// be found again (by its id and ownership token).
    RentalId,
    stream = "rental"
);

/// A connection's name: lower-case letters, digits, '.', '_' and '-', from a letter or digit,
/// 1 to 64 bytes (the fleet's token rule).
fn check_slug(value: &str) -> Result<(), Problem> {
    crate::values::fleet::check_token(value, 64)
}

/// Printable ASCII without spaces, 1 to [`RENTAL_NATIVE_REF_MAX_BYTES`] bytes: a provider's
/// own names are its business, but never a control character or a huge value.
fn check_native(value: &str) -> Result<(), Problem> {
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() > RENTAL_NATIVE_REF_MAX_BYTES {
        return Err(Problem::TooLong { max: RENTAL_NATIVE_REF_MAX_BYTES });
    }
    if value.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(Problem::BadFormat { expected: "printable ASCII without spaces" })
    }
}

checked_string!(
    /// A provider connection: one configured account at one provider (`shadeform-eu`).
    ConnectionId,
    check_slug
);
checked_string!(
    /// The provider's offer a rental was made from, as the provider listed it.
    OfferId,
    check_native
);
checked_string!(
    /// The provider's own identifier for the machine.
    NativeRef,
    check_native
);

/// The mark Leasehold puts on the capacity it provisions, minted with the rental: a
/// reconciler acts only on capacity whose mark matches, never on a machine it merely
/// resembles. It proves ownership, it grants nothing, and tenants never see it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OwnershipToken(pub String);

/// What a rental asks of its machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// CPU in thousandths of a core.
    pub cpu_millis: u64,
    /// Memory in MiB.
    pub memory_mb: u64,
    /// Disk in GiB.
    pub disk_gb: u64,
    /// Accelerators (GPUs).
    pub gpus: u32,
}

/// How a provider answers a provision sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdempotentProvision {
    /// It deduplicates on the operation key Leasehold sends.
    OperationKey,
    /// It does not: a lost answer is found again only by listing owned capacity.
    None,
}

/// What a provider connection can actually do, as declared when it is registered: callers
/// negotiate against it instead of assuming stop, resume, persistent disk or spot capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CapacitySupport {
    /// Capacity can be suspended under the same identity.
    pub stop: bool,
    /// Stopped capacity can be brought back.
    pub resume: bool,
    /// A stopped machine keeps its disk.
    pub persistent_disk: bool,
    /// It can allocate interruptible capacity.
    pub spot: bool,
    /// It states a rate that can be billed against, not an estimate.
    pub exact_pricing: bool,
    /// How it answers a provision sent again.
    pub idempotent_provision: IdempotentProvision,
    /// It lists the capacity this connection allocated.
    pub list_owned: bool,
    /// A terminated machine stays observable: when it does not, not-found after a terminate
    /// confirms it.
    pub observe_after_terminate: bool,
}

/// Why a declared capability set cannot be registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SupportError {
    /// A provider that does not deduplicate provisions must list owned capacity, or a lost
    /// answer would leave a machine billing that nobody can find.
    #[error("a provider without idempotent provision must support list-owned")]
    NoWayToFindLostCapacity,
    /// Resuming needs something stopped.
    #[error("resume requires stop")]
    ResumeWithoutStop,
    /// A disk kept across a stop needs a stop.
    #[error("persistent disk requires stop")]
    PersistentDiskWithoutStop,
}

impl CapacitySupport {
    /// Checks the declaration's consistency (DOMAIN.md §1.5, rule 21).
    ///
    /// # Errors
    /// The first rule it breaks.
    pub fn validate(&self) -> Result<(), SupportError> {
        if self.idempotent_provision == IdempotentProvision::None && !self.list_owned {
            return Err(SupportError::NoWayToFindLostCapacity);
        }
        if self.resume && !self.stop {
            return Err(SupportError::ResumeWithoutStop);
        }
        if self.persistent_disk && !self.stop {
            return Err(SupportError::PersistentDiskWithoutStop);
        }
        Ok(())
    }
}

/// A machine's state as its provider reports it (mercator's `CapacityState`, spelled as it
/// spells them; only `terminated` is terminal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacityState {
    /// Asked for; not started yet.
    Requested,
    /// Booting.
    Starting,
    /// Running.
    Active,
    /// Being stopped.
    Stopping,
    /// Stopped (its identity kept).
    Stopped,
    /// Gone.
    Terminated,
    /// The provider could not say: an honest observation, never a reason to act.
    Unknown,
}

impl CapacityState {
    /// Every state.
    pub const ALL: [Self; 7] = [
        Self::Requested,
        Self::Starting,
        Self::Active,
        Self::Stopping,
        Self::Stopped,
        Self::Terminated,
        Self::Unknown,
    ];

    /// Its name, the one spelling the wire, events and read models use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Requested => "requested",
            Self::Starting => "starting",
            Self::Active => "active",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
            Self::Terminated => "terminated",
            Self::Unknown => "unknown",
        }
    }

    /// The state of `name`, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.name() == name)
    }
}

impl fmt::Display for CapacityState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A price the provider states, in millionths of the currency's unit per hour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pricing {
    /// ISO 4217 currency (`USD`).
    pub currency: String,
    /// Millionths of the currency per hour.
    pub micros_per_hour: u64,
    /// Whether it is a billable rate (the provider's `exact_pricing`) or an estimate.
    pub exact: bool,
}

/// A provider's answer to a provision: what it actually allocated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapacityReceipt {
    /// Its name for the machine.
    pub native_ref: NativeRef,
    /// The machine's state as it answered.
    pub state: CapacityState,
    /// When it accepted, on its clock.
    pub accepted_at: DateTime<Utc>,
    /// It had accepted this operation key before (the effect is not counted twice).
    pub duplicate: bool,
    /// Whether what it allocated is interruptible (it may differ from the request).
    pub interruptible: bool,
    /// What it charges.
    pub pricing: Pricing,
}

/// One look at a machine, as its provider reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapacityObservation {
    /// The provider's name for the machine.
    pub native_ref: NativeRef,
    /// Its state.
    pub state: CapacityState,
    /// When the provider says the machine entered that state, if it dates its transitions.
    pub state_since: Option<DateTime<Utc>>,
    /// When the provider looked, on its clock.
    pub observed_at: DateTime<Utc>,
    /// The provider reclaimed interruptible capacity (not an operator's stop).
    pub interrupted: bool,
}

/// Longest max lifetime a rental may ask for, checked at the edge.
///
/// # Errors
/// [`FieldError`] naming `field` when it is 0 or past the limit.
pub fn check_max_lifetime(field: &str, seconds: u64) -> Result<u64, FieldError> {
    if (60..=RENTAL_MAX_LIFETIME_SECONDS_MAX).contains(&seconds) {
        Ok(seconds)
    } else {
        Err(FieldError::new(
            field,
            Problem::OutOfRange { min: 60, max: RENTAL_MAX_LIFETIME_SECONDS_MAX },
        ))
    }
}
