//! What a backend's answer means, by route and status, exactly as fred's client reads it
//! (the facts and their sources: `docs/issue-10-research.md` §3 and §5).
//!
//! The error envelope `{"error", "validation_code"?, "code"?}` is read only where fred reads
//! it: a 400 from provision, update or restore, and a 409 or 422 from restore. Everywhere
//! else the status alone decides. A body that should be an envelope and is not (not JSON, no
//! non-empty `error` string, a field of the wrong type) is [`BackendError::MalformedErrorBody`]:
//! never a tenant validation failure, so it never refuses or closes a lease, and it counts
//! against the backend's circuit breaker. Nothing of a malformed body reaches a tenant; the
//! `error` of a well-formed one does, cut to 512 bytes with control characters removed.

use serde_json::Value;

/// Longest tenant-visible detail relayed from a backend's `error` (fred's
/// `maxTenantDetailBytes`).
pub const TENANT_DETAIL_BYTES_MAX: usize = 512;

/// A call to a backend, named by its route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /provision`.
    Provision,
    /// `POST /restart`.
    Restart,
    /// `POST /update`.
    Update,
    /// `POST /restore`.
    Restore,
    /// `POST /deprovision`.
    Deprovision,
    /// `POST /reconcile_custom_domain`.
    ReconcileCustomDomain,
    /// `GET /info/{lease}`, `/provisions[/{lease}]`, `/logs/{lease}`, `/releases/{lease}`,
    /// `/retentions`, `/stats`.
    Read,
    /// `GET /health`.
    Health,
}

/// Which validation rule a backend says a request broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValidationCode {
    /// `unknown_sku`.
    UnknownSku,
    /// `invalid_manifest`.
    InvalidManifest,
    /// `image_not_allowed`.
    ImageNotAllowed,
}

/// A backend's answer that is not success.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The lease is not provisioned there (or not ready yet).
    #[error("not provisioned on the backend")]
    NotProvisioned,
    /// The backend refused the request as invalid; `message` is tenant-visible.
    #[error("refused as invalid: {message}")]
    Validation {
        /// The rule, if the backend named a known one.
        code: Option<ValidationCode>,
        /// The backend's `error`, bounded.
        message: String,
    },
    /// The backend has no room for it now.
    #[error("insufficient resources on the backend")]
    InsufficientResources,
    /// The lease is already provisioned there.
    #[error("already provisioned on the backend")]
    AlreadyProvisioned,
    /// The lease is in a state that does not allow the request.
    #[error("invalid state on the backend")]
    InvalidState,
    /// No retained data exists for the lease to restore from.
    #[error("no retained data on the backend")]
    NotRetained,
    /// The retained data does not fit the smaller tier asked for.
    #[error("the retained data exceeds the tier: {message}")]
    DemoteExceedsTier {
        /// The backend's `error`, bounded.
        message: String,
    },
    /// The restore was refused for a reason this version does not know.
    #[error("restore refused: {message}")]
    RestoreRefused {
        /// The backend's `error`, bounded.
        message: String,
    },
    /// An error body that should have been the envelope and is not.
    #[error("the backend answered {status} with an unusable error body")]
    MalformedErrorBody {
        /// The HTTP status.
        status: u16,
    },
    /// A status the route does not expect.
    #[error("the backend answered {status}")]
    Unexpected {
        /// The HTTP status.
        status: u16,
    },
    /// `GET /health` did not answer 200.
    #[error("backend unhealthy: status {status}")]
    Unhealthy {
        /// The HTTP status.
        status: u16,
    },
}

impl BackendError {
    /// Whether it counts as a failure of the backend for its circuit breaker (fred's
    /// `IsSuccessful` is the opposite): the backend answered and meant it, or it did not.
    pub fn counts_toward_breaker(&self) -> bool {
        matches!(
            self,
            Self::MalformedErrorBody { .. } | Self::Unexpected { .. } | Self::Unhealthy { .. }
        )
    }
}

/// What `status` and `body` from `route` mean: `Ok` for the route's success statuses.
///
/// # Errors
/// The refusal or failure the answer is.
pub fn classify(route: Route, status: u16, body: &[u8]) -> Result<(), BackendError> {
    use BackendError as E;
    match (route, status) {
        (Route::Provision | Route::Restart | Route::Update | Route::Restore, 202)
        | (Route::Deprovision | Route::Read | Route::Health, 200)
        | (Route::ReconcileCustomDomain, 202 | 204) => Ok(()),
        (Route::Provision | Route::Update | Route::Restore | Route::ReconcileCustomDomain, 400) => {
            Err(validation(status, body))
        }
        (Route::Provision, 409) => Err(E::AlreadyProvisioned),
        (Route::Provision | Route::Restore, 503) => Err(E::InsufficientResources),
        (Route::Restore, 409 | 422) => Err(restore_refusal(status, body)),
        (Route::Restart | Route::Update | Route::ReconcileCustomDomain | Route::Read, 404) => {
            Err(E::NotProvisioned)
        }
        (Route::Restart | Route::Update | Route::ReconcileCustomDomain, 409) => {
            Err(E::InvalidState)
        }
        (Route::Health, _) => Err(E::Unhealthy { status }),
        _ => Err(E::Unexpected { status }),
    }
}

/// A well-formed envelope: an object whose `error` is a non-empty string, and whose
/// `validation_code` and `code`, when present, are strings.
struct Envelope {
    error: String,
    validation_code: Option<String>,
    code: Option<String>,
}

fn envelope(body: &[u8]) -> Option<Envelope> {
    let Value::Object(fields) = serde_json::from_slice::<Value>(body).ok()? else {
        return None;
    };
    let text = |name: &str| match fields.get(name) {
        None | Some(Value::Null) => Some(None),
        Some(Value::String(text)) => Some(Some(text.clone())),
        Some(_) => None,
    };
    let error = text("error")?.filter(|error| !error.is_empty())?;
    Some(Envelope { error, validation_code: text("validation_code")?, code: text("code")? })
}

fn validation(status: u16, body: &[u8]) -> BackendError {
    let Some(envelope) = envelope(body) else {
        return BackendError::MalformedErrorBody { status };
    };
    let code = match envelope.validation_code.as_deref() {
        Some("unknown_sku") => Some(ValidationCode::UnknownSku),
        Some("invalid_manifest") => Some(ValidationCode::InvalidManifest),
        Some("image_not_allowed") => Some(ValidationCode::ImageNotAllowed),
        _ => None,
    };
    BackendError::Validation { code, message: tenant_detail(&envelope.error) }
}

/// A restore's 409 or 422: an empty body is the plain status; an envelope's `code` refines it.
fn restore_refusal(status: u16, body: &[u8]) -> BackendError {
    let conflict = status == 409;
    if body.trim_ascii().is_empty() {
        return if conflict { BackendError::InvalidState } else { BackendError::NotRetained };
    }
    let Some(envelope) = envelope(body) else {
        return BackendError::MalformedErrorBody { status };
    };
    let message = tenant_detail(&envelope.error);
    match (conflict, envelope.code.as_deref()) {
        (true, Some("already_provisioned")) => BackendError::AlreadyProvisioned,
        (true, _) => BackendError::InvalidState,
        (false, None) => BackendError::NotRetained,
        (false, Some("demote_exceeds_tier")) => BackendError::DemoteExceedsTier { message },
        (false, Some(_)) => BackendError::RestoreRefused { message },
    }
}

/// A backend's `error` as a tenant may see it: control characters removed, at most
/// [`TENANT_DETAIL_BYTES_MAX`] bytes, cut on a character boundary.
pub fn tenant_detail(error: &str) -> String {
    let mut detail = String::with_capacity(error.len().min(TENANT_DETAIL_BYTES_MAX));
    for c in error.chars().filter(|c| !c.is_control()) {
        if detail.len() + c.len_utf8() > TENANT_DETAIL_BYTES_MAX {
            break;
        }
        detail.push(c);
    }
    detail
}

#[cfg(test)]
mod tests {
    use super::*;

    /// fred's `TestHTTPClientRestore_UnreadableBodyIsNotBareStatus`, row by row.
    #[test]
    fn restore_refusals_read_as_freds_client_reads_them() {
        use BackendError as E;
        let message = |text: &str| text.to_string();
        let rows: Vec<(u16, &str, BackendError)> = vec![
            (422, "", E::NotRetained),
            (422, "  \n", E::NotRetained),
            (422, r#"{"error":"nope"}"#, E::NotRetained),
            (
                422,
                r#"{"error":"too big","code":"demote_exceeds_tier"}"#,
                E::DemoteExceedsTier { message: message("too big") },
            ),
            (409, r#"{"error":"dup","code":"already_provisioned"}"#, E::AlreadyProvisioned),
            (422, "<html>422 /var/lib/fred/x</html>", E::MalformedErrorBody { status: 422 }),
            (422, r#"{"error":"/var/lib/fred/x"#, E::MalformedErrorBody { status: 422 }),
            (422, "null", E::MalformedErrorBody { status: 422 }),
            (422, "{}", E::MalformedErrorBody { status: 422 }),
            (
                422,
                r#"{"message":"proxy error: /var/lib/fred/x"}"#,
                E::MalformedErrorBody { status: 422 },
            ),
            (422, r#"{"code":"demote_exceeds_tier"}"#, E::MalformedErrorBody { status: 422 }),
            (409, "", E::InvalidState),
            (409, "<html>conflict</html>", E::MalformedErrorBody { status: 409 }),
            (409, r#"{"message":"x"}"#, E::MalformedErrorBody { status: 409 }),
            (409, r#"{"code":"already_provisioned"}"#, E::MalformedErrorBody { status: 409 }),
            (
                422,
                r#"{"error":"retention subsystem is draining","code":"draining"}"#,
                E::RestoreRefused { message: message("retention subsystem is draining") },
            ),
            (
                422,
                r#"{"error":"lease already provisioned","code":"already_provisioned"}"#,
                E::RestoreRefused { message: message("lease already provisioned") },
            ),
            (409, r#"{"error":"lease is migrating","code":"draining"}"#, E::InvalidState),
            (409, r#"{"error":"too big","code":"demote_exceeds_tier"}"#, E::InvalidState),
            (503, "", E::InsufficientResources),
        ];
        for (status, body, expected) in rows {
            let got = classify(Route::Restore, status, body.as_bytes());
            assert_eq!(got, Err(expected), "{status} {body:?}");
        }
        assert_eq!(classify(Route::Restore, 202, br#"{"status":"restoring"}"#), Ok(()));
    }

    /// fred's `TestHTTPClient_MalformedErrorBody_IsNeverForwarded` and `…ForeignJSON…`: on a
    /// 400, every one of these is malformed (never a validation failure), and not a byte of
    /// it is in the error.
    #[test]
    fn a_malformed_400_is_never_a_validation_failure_and_never_forwarded() {
        let secret_looking = "/var/lib/fred/secret-path";
        for body in [
            format!("plain text {secret_looking}"),
            format!("<html><body>{secret_looking}</body></html>"),
            format!(r#"{{"error":"{secret_looking}"#),
            format!(r#"["{secret_looking}"]"#),
            "null".to_string(),
            "{}".to_string(),
            format!(r#"{{"message":"{secret_looking}"}}"#),
            r#"{"error":""}"#.to_string(),
            r#"{"error":{"nested":"x"}}"#.to_string(),
            r#"{"validation_code":"invalid_manifest"}"#.to_string(),
            String::new(),
        ] {
            for route in [Route::Provision, Route::Update, Route::Restore] {
                let error = classify(route, 400, body.as_bytes()).expect_err("refused");
                assert_eq!(error, BackendError::MalformedErrorBody { status: 400 }, "{body:?}");
                assert!(error.counts_toward_breaker());
                assert!(!error.to_string().contains("fred"), "{error}");
            }
        }
    }

    #[test]
    fn validation_codes_and_tenant_detail() {
        let refused = |body: &str| classify(Route::Provision, 400, body.as_bytes());
        let code = |body: &str| match refused(body) {
            Err(BackendError::Validation { code, .. }) => code,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            code(r#"{"error":"no such sku","validation_code":"unknown_sku"}"#),
            Some(ValidationCode::UnknownSku)
        );
        assert_eq!(
            code(r#"{"error":"bad","validation_code":"invalid_manifest"}"#),
            Some(ValidationCode::InvalidManifest)
        );
        assert_eq!(
            code(r#"{"error":"no","validation_code":"image_not_allowed"}"#),
            Some(ValidationCode::ImageNotAllowed)
        );
        // An unknown or missing code with a good `error` is a generic validation failure.
        assert_eq!(code(r#"{"error":"bad","validation_code":"new_rule"}"#), None);
        assert_eq!(code(r#"{"error":"bad"}"#), None);
        let long = format!(r#"{{"error":"a\u0007b{}"}}"#, "é".repeat(400));
        let Err(BackendError::Validation { message, .. }) = refused(&long) else {
            panic!("a validation failure")
        };
        assert!(message.starts_with("ab") && message.len() <= TENANT_DETAIL_BYTES_MAX);
        assert!(message.len() > TENANT_DETAIL_BYTES_MAX - 2, "cut on a character boundary");
        assert!(!refused(r#"{"error":"bad"}"#).unwrap_err().counts_toward_breaker());
    }

    #[test]
    fn other_routes_read_the_status_alone() {
        use BackendError as E;
        let json_error = br#"{"error":"x","validation_code":"unknown_sku"}"#;
        assert_eq!(classify(Route::Provision, 409, json_error), Err(E::AlreadyProvisioned));
        assert_eq!(classify(Route::Provision, 503, b""), Err(E::InsufficientResources));
        assert_eq!(classify(Route::Restart, 400, json_error), Err(E::Unexpected { status: 400 }));
        assert_eq!(classify(Route::Restart, 404, b""), Err(E::NotProvisioned));
        assert_eq!(classify(Route::Update, 409, json_error), Err(E::InvalidState));
        assert_eq!(classify(Route::ReconcileCustomDomain, 204, b""), Ok(()));
        assert_eq!(classify(Route::ReconcileCustomDomain, 409, b""), Err(E::InvalidState));
        assert_eq!(classify(Route::Read, 404, b""), Err(E::NotProvisioned));
        // Deprovision accepts only 200: a 404 is a failure, and counts.
        let gone = classify(Route::Deprovision, 404, b"").unwrap_err();
        assert!(gone.counts_toward_breaker());
        assert_eq!(classify(Route::Health, 503, b""), Err(E::Unhealthy { status: 503 }));
        assert!(!E::NotProvisioned.counts_toward_breaker());
        assert!(E::Unexpected { status: 500 }.counts_toward_breaker());
    }
}
