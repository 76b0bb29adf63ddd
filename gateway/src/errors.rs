//! The one place errors become what a client sees: a message and an `extensions.code` from a
//! fixed set. Internal detail (SQL, driver text, a failed invariant) is logged with a request
//! id and never returned; the client gets the id to quote.

use async_graphql::ErrorExtensions as _;
use leasehold_commands::{CommandError, ErrorClass};
use leasehold_domain::{Refusal, StoreError};

use crate::auth::AuthError;

/// The fixed set of `extensions.code` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// No valid token.
    Unauthenticated,
    /// A valid token whose role may not do this.
    Forbidden,
    /// Absent, or another tenant's.
    NotFound,
    /// Malformed input, a forged or foreign cursor, or an invalid document.
    BadUserInput,
    /// A concurrent change won; retry after reading again.
    Conflict,
    /// A stale completion or report: refused by the aggregate's fence.
    Fenced,
    /// The operation key was used before with a different request.
    IdempotencyConflict,
    /// Not allowed in the aggregate's current state.
    InvalidState,
    /// The tenant's quota does not allow it.
    QuotaExceeded,
    /// What the command acts on cannot do it at all (a provider connection without stop):
    /// never worth retrying.
    Unsupported,
    /// The read models did not reach the requested cursor in time.
    Stale,
    /// Too many requests.
    RateLimited,
    /// The lease exists but is not provisioned (yet, or any more): what it asked for lives at
    /// its backend only while it runs.
    NotProvisioned,
    /// An outside system Leasehold needs (a lease's backend, the database) did not answer:
    /// retry later.
    Unavailable,
    /// Our fault; the message carries a request id.
    Internal,
}

impl Code {
    /// Every code.
    pub const ALL: [Self; 15] = [
        Self::Unauthenticated,
        Self::Forbidden,
        Self::NotFound,
        Self::BadUserInput,
        Self::Conflict,
        Self::Fenced,
        Self::IdempotencyConflict,
        Self::InvalidState,
        Self::QuotaExceeded,
        Self::Unsupported,
        Self::Stale,
        Self::RateLimited,
        Self::NotProvisioned,
        Self::Unavailable,
        Self::Internal,
    ];

    /// The code `extensions.code` spells so.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|code| code.as_str() == text)
    }

    /// As it appears in `extensions.code`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::Forbidden => "FORBIDDEN",
            Self::NotFound => "NOT_FOUND",
            Self::BadUserInput => "BAD_USER_INPUT",
            Self::Conflict => "CONFLICT",
            Self::Fenced => "FENCED",
            Self::IdempotencyConflict => "IDEMPOTENCY_CONFLICT",
            Self::InvalidState => "INVALID_STATE",
            Self::QuotaExceeded => "QUOTA_EXCEEDED",
            Self::Unsupported => "UNSUPPORTED",
            Self::Stale => "STALE",
            Self::RateLimited => "RATE_LIMITED",
            Self::NotProvisioned => "NOT_PROVISIONED",
            Self::Unavailable => "UNAVAILABLE",
            Self::Internal => "INTERNAL",
        }
    }

    /// The HTTP status of an answer refused with this code: the backends' callbacks, and a
    /// GraphQL request answered as `application/graphql-response+json` that never executed
    /// (`media.rs`). Only `INTERNAL` is a 500; what passes (`UNAVAILABLE`, `RATE_LIMITED`)
    /// says so, so that a client retries it and nothing else.
    pub fn http_status(self) -> axum::http::StatusCode {
        use axum::http::StatusCode as S;
        match self {
            Self::Unauthenticated => S::UNAUTHORIZED,
            Self::Forbidden => S::FORBIDDEN,
            Self::NotFound => S::NOT_FOUND,
            Self::BadUserInput | Self::Unsupported => S::BAD_REQUEST,
            Self::Conflict
            | Self::Fenced
            | Self::IdempotencyConflict
            | Self::InvalidState
            | Self::QuotaExceeded
            | Self::Stale
            | Self::NotProvisioned => S::CONFLICT,
            Self::RateLimited => S::TOO_MANY_REQUESTS,
            Self::Unavailable => S::SERVICE_UNAVAILABLE,
            Self::Internal => S::INTERNAL_SERVER_ERROR,
        }
    }
}

/// An error a client may see. It deliberately does not implement `Display`: async-graphql
/// turns any `Display` type into an error without a code, and this one must keep its code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// What it means.
    pub code: Code,
    /// What to tell the client: never driver or SQL text.
    pub message: String,
}

impl ApiError {
    /// An error with a client-safe message.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    /// Not found (also for another tenant's anything).
    pub fn not_found(what: &str) -> Self {
        Self::new(Code::NotFound, format!("{what} not found"))
    }

    /// The role may not do this.
    pub fn forbidden(what: &str) -> Self {
        Self::new(Code::Forbidden, format!("your role may not {what}"))
    }

    /// Malformed input.
    pub fn bad_input(message: impl Into<String>) -> Self {
        Self::new(Code::BadUserInput, message)
    }

    /// Malformed input, naming the field.
    pub fn from_field(error: leasehold_domain::values::FieldError) -> Self {
        Self::bad_input(format!("invalid input: {error}"))
    }

    /// Logs `detail` under a fresh request id and returns an error that carries only the id.
    /// The database could not be reached: a retryable answer, its detail (the endpoint, the
    /// driver's words) only in the log.
    pub fn unavailable(detail: &dyn std::fmt::Display) -> Self {
        tracing::warn!(error = %detail, "the database is unreachable");
        Self::new(Code::Unavailable, "the database is unavailable: retry the request")
    }

    pub fn internal(detail: &dyn std::fmt::Display) -> Self {
        let request_id = uuid::Uuid::now_v7();
        tracing::error!(%request_id, error = %detail, "internal error");
        Self::new(Code::Internal, format!("internal error (request id {request_id})"))
    }
}

impl From<AuthError> for ApiError {
    fn from(error: AuthError) -> Self {
        Self::new(Code::Unauthenticated, error.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Invalid(invalid) => Self::bad_input(invalid.to_string()),
            unreachable @ StoreError::Unavailable { .. } => Self::unavailable(&unreachable),
            other => Self::internal(&other),
        }
    }
}

impl<E: Refusal> From<CommandError<E>> for ApiError {
    fn from(error: CommandError<E>) -> Self {
        let code = match error.class() {
            ErrorClass::BadInput => Code::BadUserInput,
            ErrorClass::NotFound => Code::NotFound,
            ErrorClass::InvalidState => Code::InvalidState,
            ErrorClass::Fenced => Code::Fenced,
            ErrorClass::Conflict => Code::Conflict,
            ErrorClass::IdempotencyConflict => Code::IdempotencyConflict,
            ErrorClass::QuotaExceeded => Code::QuotaExceeded,
            ErrorClass::Unsupported => Code::Unsupported,
            ErrorClass::Unavailable => return Self::unavailable(&error),
            ErrorClass::Internal => return Self::internal(&error),
        };
        Self::new(code, error.to_string())
    }
}

impl From<ApiError> for async_graphql::Error {
    fn from(error: ApiError) -> Self {
        let code = error.code.as_str();
        async_graphql::Error::new(error.message).extend_with(|_, extensions| {
            extensions.set("code", code);
        })
    }
}

/// Gives every error that left the executor without a code one: parse and validation errors
/// and malformed arguments are the client's (`BAD_USER_INPUT`); our resolvers always set one.
pub fn with_codes(mut response: async_graphql::Response) -> async_graphql::Response {
    for error in &mut response.errors {
        let extensions = error.extensions.get_or_insert_with(Default::default);
        if extensions.get("code").is_none() {
            extensions.set("code", Code::BadUserInput.as_str());
        }
    }
    response
}

/// A response made of one error raised before execution (so it has no location).
pub fn response_of(error: ApiError) -> async_graphql::Response {
    let code = error.code.as_str();
    let mut server_error = async_graphql::ServerError::new(error.message, None);
    let mut extensions = async_graphql::ErrorExtensionValues::default();
    extensions.set("code", code);
    server_error.extensions = Some(extensions);
    async_graphql::Response::from_errors(vec![server_error])
}

/// The result type of resolvers.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::Code;

    /// Every code; the match makes a new one a compile error here until it is listed in
    /// `Code::ALL`, and the count keeps it from being left out there.
    fn every() -> Vec<Code> {
        for code in Code::ALL {
            match code {
                Code::Unauthenticated
                | Code::Forbidden
                | Code::NotFound
                | Code::BadUserInput
                | Code::Conflict
                | Code::Fenced
                | Code::IdempotencyConflict
                | Code::InvalidState
                | Code::QuotaExceeded
                | Code::Unsupported
                | Code::Stale
                | Code::RateLimited
                | Code::NotProvisioned
                | Code::Unavailable
                | Code::Internal => {}
            }
        }
        Code::ALL.to_vec()
    }

    #[test]
    fn each_code_parses_from_its_spelling_alone() {
        for code in every() {
            assert_eq!(Code::parse(code.as_str()), Some(code));
        }
        assert_eq!(Code::parse("bad_user_input"), None);
    }

    #[test]
    fn an_unreachable_database_is_a_retryable_answer_that_names_nothing_of_it() {
        use leasehold_commands::CommandError;
        use leasehold_domain::StoreError;
        use leasehold_domain::lease::LeaseError;
        let unreachable = || StoreError::Unavailable {
            endpoint: "db.internal:5432".into(),
            reason: "connection refused".into(),
        };
        let from_command: super::ApiError = CommandError::<LeaseError>::Store(unreachable()).into();
        let from_store: super::ApiError = unreachable().into();
        for answer in [from_command, from_store] {
            assert_eq!(answer.code, Code::Unavailable);
            assert!(!answer.message.contains("db.internal"), "{}", answer.message);
            assert!(!answer.message.contains("refused"), "{}", answer.message);
            assert_eq!(answer.code.http_status().as_u16(), 503);
        }
    }

    #[test]
    fn only_internal_is_a_500_and_what_passes_says_so() {
        for code in every() {
            let status = code.http_status().as_u16();
            assert_eq!(status == 500, code == Code::Internal, "{}: {status}", code.as_str());
            assert!(status >= 400, "{}: {status}", code.as_str());
        }
        assert_eq!(Code::Unavailable.http_status().as_u16(), 503);
        assert_eq!(Code::RateLimited.http_status().as_u16(), 429);
        assert_eq!(Code::Forbidden.http_status().as_u16(), 403);
    }
}
