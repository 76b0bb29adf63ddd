//! Outside input for lease commands, parsed into typed commands before anything is decided.
//! Every refusal names the field as the caller spelled it (`items[1].quantity`).

use leasehold_domain::OperationKey;
use leasehold_domain::lease::{
    FieldError, HostName, LeaseCommand, LeaseId, LeaseItem, LeaseItems, MaintenanceId,
    MaintenanceKind, MaintenanceOutcome, OperationId, OperatorDetail, PayloadHash, Problem,
    ProviderId, Reason, ServiceName, Sku, TenantMessage,
};
use leasehold_domain::limits::LEASE_QUANTITY_DEFAULT_MAX;
use uuid::Uuid;

/// Limits an operator may configure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseInputLimits {
    /// Most of one SKU one item may rent.
    pub quantity_max: u32,
}

impl Default for LeaseInputLimits {
    fn default() -> Self {
        Self { quantity_max: LEASE_QUANTITY_DEFAULT_MAX }
    }
}

/// One item as a caller sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemInput {
    /// The SKU.
    pub sku: String,
    /// How many.
    pub quantity: i64,
    /// The service, for stack leases.
    pub service_name: Option<String>,
}

/// A lease request as a caller sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestLeaseInput {
    /// The provider's UUID.
    pub provider_id: String,
    /// The items.
    pub items: Vec<ItemInput>,
    /// The manifest's SHA-256, hex.
    pub payload_hash: String,
}

/// The operation key (`operationKey`), required on every command.
///
/// # Errors
/// When absent, empty or malformed.
pub fn operation_key(raw: Option<&str>) -> Result<OperationKey, FieldError> {
    const FIELD: &str = "operationKey";
    let raw = raw.filter(|raw| !raw.is_empty()).ok_or(FieldError::new(FIELD, Problem::Missing))?;
    OperationKey::parse(raw).map_err(|_| {
        let expected = "1-200 characters from A-Z, a-z, 0-9, '.', '_', ':' and '-'";
        FieldError::new(FIELD, Problem::BadFormat { expected })
    })
}

/// A UUID field.
///
/// # Errors
/// When it is not a UUID.
pub fn uuid(field: &str, raw: &str) -> Result<Uuid, FieldError> {
    if raw.is_empty() {
        return Err(FieldError::new(field, Problem::Missing));
    }
    Uuid::parse_str(raw)
        .map_err(|_| FieldError::new(field, Problem::BadFormat { expected: "a UUID" }))
}

/// The items of a request or a restore.
///
/// # Errors
/// The first malformed item field, or the list's shape.
pub fn items(raw: &[ItemInput], limits: LeaseInputLimits) -> Result<LeaseItems, FieldError> {
    let mut items = Vec::with_capacity(raw.len());
    for (n, item) in raw.iter().enumerate() {
        let sku = Sku::parse(&format!("items[{n}].sku"), item.sku.as_str())?;
        let max = limits.quantity_max;
        let quantity = u32::try_from(item.quantity)
            .ok()
            .filter(|quantity| (1..=max).contains(quantity))
            .ok_or_else(|| {
                let problem = Problem::OutOfRange { min: 1, max: u64::from(max) };
                FieldError::new(format!("items[{n}].quantity"), problem)
            })?;
        let service_name = match &item.service_name {
            Some(name) => {
                Some(ServiceName::parse(&format!("items[{n}].serviceName"), name.as_str())?)
            }
            None => None,
        };
        items.push(LeaseItem { sku, quantity, service_name, custom_domain: None });
    }
    LeaseItems::new(items)
}

/// `RequestProvision` for lease `lease`, whose reports will name `operation`.
///
/// # Errors
/// The first malformed field.
pub fn request_provision(
    lease: LeaseId,
    operation: OperationId,
    input: &RequestLeaseInput,
    limits: LeaseInputLimits,
) -> Result<LeaseCommand, FieldError> {
    Ok(LeaseCommand::RequestProvision {
        lease,
        provider: ProviderId(uuid("providerId", &input.provider_id)?),
        items: items(&input.items, limits)?,
        payload_hash: PayloadHash::parse("payloadHash", input.payload_hash.as_str())?,
        operation,
    })
}

/// `SetCustomDomain`: an empty or absent domain removes it.
///
/// # Errors
/// A malformed service name or host name.
pub fn set_custom_domain(
    service: Option<&str>,
    domain: Option<&str>,
) -> Result<LeaseCommand, FieldError> {
    let service = service.map(|name| ServiceName::parse("serviceName", name)).transpose()?;
    let domain = domain
        .filter(|domain| !domain.is_empty())
        .map(|domain| HostName::parse("customDomain", domain))
        .transpose()?;
    Ok(LeaseCommand::SetCustomDomain { service, domain })
}

/// A restart, identified by `maintenance`.
pub fn restart(maintenance: Uuid) -> LeaseCommand {
    LeaseCommand::Restart { maintenance_id: MaintenanceId(maintenance) }
}

/// A failure report on `operation`: the reason defaults to `Unknown` when none was authored.
///
/// # Errors
/// A malformed reason or message.
pub fn report_failed(
    operation: OperationId,
    reason: Option<&str>,
    message: &str,
    detail: &str,
) -> Result<LeaseCommand, FieldError> {
    let reason = match reason.filter(|reason| !reason.is_empty()) {
        Some(reason) => Reason::parse("reason", reason)?,
        None => Reason::unknown(),
    };
    Ok(LeaseCommand::ReportFailed {
        operation,
        reason,
        message: TenantMessage::parse("message", message)?,
        detail: OperatorDetail::new(detail),
    })
}

/// What a tenant sees when a restart or update failed: the backend's own words are
/// operator-only.
const MAINTENANCE_FAILED_MESSAGE: &str = "the restart or update failed";

/// A restart's or update's outcome as a backend reports it: succeeded, or failed with its
/// error kept as operator-only detail.
/// A failed restart or update as its backend reports it. A backend that rolled back to what
/// ran before (fred always does for a restart; for an update it says so with `rolled_back`)
/// leaves the lease running its previous release: recovered, not failed. The reason is the
/// backends' own (`RestartFailed`, `UpdateFailed`); the backend's error text is for operators.
pub fn failed_maintenance(
    kind: MaintenanceKind,
    rolled_back: Option<bool>,
    error: Option<&str>,
) -> MaintenanceOutcome {
    let detail = OperatorDetail::new(error.unwrap_or_default());
    let text = |text: &str| TenantMessage::parse("message", text).expect("a fixed, valid message");
    let (reason, rolled_back) = match kind {
        MaintenanceKind::Restart => ("RestartFailed", rolled_back.unwrap_or(true)),
        MaintenanceKind::Update => ("UpdateFailed", rolled_back.unwrap_or(false)),
    };
    let reason = Reason::parse("reason", reason).expect("a fixed, valid reason");
    match (kind, rolled_back) {
        (MaintenanceKind::Restart, true) => MaintenanceOutcome::Recovered {
            reason,
            message: text("the restart failed; the lease runs as it did before"),
            detail,
        },
        (MaintenanceKind::Update, true) => MaintenanceOutcome::Recovered {
            reason,
            message: text("the update failed; the lease runs its previous release"),
            detail,
        },
        (MaintenanceKind::Restart, false) => {
            MaintenanceOutcome::Failed { reason, message: text("the restart failed"), detail }
        }
        (MaintenanceKind::Update, false) => {
            MaintenanceOutcome::Failed { reason, message: text("the update failed"), detail }
        }
    }
}

/// An agent's completion report: succeeded, or failed for a reason it did not name.
pub fn maintenance_outcome(success: bool, error: Option<&str>) -> MaintenanceOutcome {
    if success {
        return MaintenanceOutcome::Succeeded;
    }
    MaintenanceOutcome::Failed {
        reason: Reason::unknown(),
        message: TenantMessage::parse("message", MAINTENANCE_FAILED_MESSAGE)
            .expect("a fixed, valid message"),
        detail: OperatorDetail::new(error.unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(sku: &str, quantity: i64, service: Option<&str>) -> ItemInput {
        ItemInput { sku: sku.into(), quantity, service_name: service.map(Into::into) }
    }

    fn field_of(result: Result<impl std::fmt::Debug, FieldError>) -> String {
        result.expect_err("refused").field
    }

    #[test]
    fn every_bad_input_names_its_field() {
        let limits = LeaseInputLimits { quantity_max: 8 };
        assert_eq!(field_of(items(&[], limits)), "items");
        assert_eq!(field_of(items(&[item("gpu.h100.1x", 0, None)], limits)), "items[0].quantity");
        assert_eq!(field_of(items(&[item("gpu.h100.1x", 9, None)], limits)), "items[0].quantity");
        assert_eq!(field_of(items(&[item("GPU H100", 1, None)], limits)), "items[0].sku");
        let mixed = [item("a.b", 1, Some("web")), item("a.b", 1, None)];
        assert_eq!(field_of(items(&mixed, limits)), "items");
        assert_eq!(field_of(set_custom_domain(None, Some("not a host"))), "customDomain");
        assert_eq!(field_of(operation_key(None)), "operationKey");
        assert_eq!(field_of(operation_key(Some(""))), "operationKey");
        assert_eq!(field_of(operation_key(Some("has space"))), "operationKey");
        let input = RequestLeaseInput {
            provider_id: "nope".into(),
            items: vec![item("a.b", 1, None)],
            payload_hash: "ab".repeat(32),
        };
        let lease = LeaseId(Uuid::nil());
        let operation = OperationId(Uuid::nil());
        assert_eq!(field_of(request_provision(lease, operation, &input, limits)), "providerId");
    }

    #[test]
    fn good_input_becomes_a_command() {
        let input = RequestLeaseInput {
            provider_id: Uuid::nil().to_string(),
            items: vec![item("gpu.h100.1x", 2, Some("trainer"))],
            payload_hash: "ab".repeat(32),
        };
        let operation = OperationId(Uuid::nil());
        let limits = LeaseInputLimits::default();
        let command = request_provision(LeaseId(Uuid::nil()), operation, &input, limits);
        assert!(matches!(command, Ok(LeaseCommand::RequestProvision { .. })));
        let reported = report_failed(operation, None, "it failed", "exit 1").expect("valid");
        let LeaseCommand::ReportFailed { reason, .. } = reported else { panic!("a report") };
        assert_eq!(reason.as_str(), "Unknown");
        let removed = set_custom_domain(Some("web"), Some("")).expect("valid");
        assert!(matches!(removed, LeaseCommand::SetCustomDomain { domain: None, .. }));
    }
}
