//! GraphQL over HTTP's media types (the GraphQL-over-HTTP specification): a request body must
//! be `application/json`; the answer is `application/graphql-response+json` for a client
//! that accepts it, with the status codes that type gives (a request that never executed is a
//! 4xx or 5xx with no `data` entry), and `application/json` otherwise, as before: 200 for every
//! well-formed request.

use async_graphql::{BatchResponse, Response as GraphQLResponse};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::errors::Code;

/// The current media type of a GraphQL response.
pub const GRAPHQL_RESPONSE: &str = "application/graphql-response+json";

/// The legacy one, the answer to a client that names neither.
pub const JSON: &str = "application/json";

/// The media type an answer is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// `application/json`: 200 for every well-formed request, `data` always present.
    Json,
    /// `application/graphql-response+json`: a request that did not execute is answered with
    /// its error's status and no `data`.
    GraphQLResponse,
}

impl Answer {
    /// The type `headers`' `Accept` prefers: the current one when it weighs at least as much
    /// as `application/json`. Without an `Accept`, with only wildcards, or with neither type,
    /// `application/json` (the specification's default while clients move over).
    pub fn accepted(headers: &HeaderMap) -> Self {
        let (mut current, mut legacy) = (0.0_f32, 0.0_f32);
        let ranges = headers.get_all(header::ACCEPT).iter().filter_map(|value| value.to_str().ok());
        for range in ranges.flat_map(|value| value.split(',')) {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
            // A weight that does not parse leaves the range out, as if it were not there.
            let Some(weight) = weight_of(parts) else { continue };
            match media.as_str() {
                GRAPHQL_RESPONSE => current = current.max(weight),
                JSON => legacy = legacy.max(weight),
                _ => {}
            }
        }
        if current > 0.0 && current >= legacy { Self::GraphQLResponse } else { Self::Json }
    }

    fn content_type(self) -> &'static str {
        match self {
            Self::Json => JSON,
            Self::GraphQLResponse => GRAPHQL_RESPONSE,
        }
    }

    /// `response` in this type, with `status` for answers outside GraphQL's execution (a
    /// refused token, an unreadable body); `None` for an executed request's status, which the
    /// response itself decides.
    pub fn write(self, status: Option<StatusCode>, response: &BatchResponse) -> Response {
        let (status, body) = match (self, response) {
            (Self::Json, _) => (status.unwrap_or(StatusCode::OK), to_json(response)),
            (Self::GraphQLResponse, BatchResponse::Single(single)) => {
                let status = status.unwrap_or_else(|| status_of(single));
                (status, without_data_unless_executed(single))
            }
            // Batches are outside the specification: 200, each entry as a single answer.
            (Self::GraphQLResponse, BatchResponse::Batch(responses)) => {
                let entries = responses.iter().map(without_data_unless_executed).collect();
                (status.unwrap_or(StatusCode::OK), serde_json::Value::Array(entries))
            }
        };
        let body = serde_json::to_vec(&body).expect("responses serialize");
        (status, [(header::CONTENT_TYPE, self.content_type())], body).into_response()
    }
}

/// A media range's weight (`q`, any case, 0 to 1), 1 when it names none; `None` when it is
/// not a weight.
fn weight_of<'a>(parameters: impl Iterator<Item = &'a str>) -> Option<f32> {
    for parameter in parameters {
        let Some((name, value)) = parameter.split_once('=') else { continue };
        if name.trim().eq_ignore_ascii_case("q") {
            return value.trim().parse::<f32>().ok().filter(|q| (0.0..=1.0).contains(q));
        }
    }
    Some(1.0)
}

/// Whether a request body's `Content-Type` is JSON (the only body GraphQL over HTTP defines
/// for a POST). A POST without one is refused, as the specification asks.
pub fn is_json_body(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case(JSON))
}

/// Whether execution began: it gave data, or an error of a field (which has a path). A
/// document that does not parse or validate, variables that do not coerce, and refusals
/// before execution give neither.
fn executed(response: &GraphQLResponse) -> bool {
    response.data != async_graphql::Value::Null
        || response.errors.iter().any(|error| !error.path.is_empty())
}

/// An executed request is a 200 whatever its field errors; one that never executed answers
/// its first error's status (400 for the document's or variables' faults).
fn status_of(response: &GraphQLResponse) -> StatusCode {
    if executed(response) {
        return StatusCode::OK;
    }
    response
        .errors
        .first()
        .and_then(|error| error.extensions.as_ref()?.get("code").cloned())
        .and_then(|code| match code {
            async_graphql::Value::String(code) => Code::parse(&code),
            _ => None,
        })
        .map_or(StatusCode::BAD_REQUEST, Code::http_status)
}

fn without_data_unless_executed(response: &GraphQLResponse) -> serde_json::Value {
    let mut body = to_json(response);
    if !executed(response)
        && let Some(object) = body.as_object_mut()
    {
        object.remove("data");
    }
    body
}

fn to_json(response: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(response).expect("responses serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> Answer {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, value.parse().expect("a header"));
        Answer::accepted(&headers)
    }

    #[test]
    fn the_current_type_is_chosen_when_it_weighs_at_least_as_much_as_json() {
        assert_eq!(accept(GRAPHQL_RESPONSE), Answer::GraphQLResponse);
        assert_eq!(
            accept("application/graphql-response+json, application/json;q=0.9"),
            Answer::GraphQLResponse
        );
        assert_eq!(
            accept("application/json, application/graphql-response+json"),
            Answer::GraphQLResponse
        );
        assert_eq!(
            accept("Application/GraphQL-Response+JSON; charset=utf-8"),
            Answer::GraphQLResponse
        );
        assert_eq!(
            accept("application/json;q=1, application/graphql-response+json;q=0.5"),
            Answer::Json
        );
        assert_eq!(accept("application/graphql-response+json;q=0"), Answer::Json);
        assert_eq!(
            accept("application/json, application/graphql-response+json;Q=0.5"),
            Answer::Json
        );
        assert_eq!(accept("application/graphql-response+json;q=high"), Answer::Json);
        assert_eq!(accept("application/graphql-response+json;q=2"), Answer::Json);
        assert_eq!(accept("*/*"), Answer::Json);
        assert_eq!(accept("text/html"), Answer::Json);
        assert_eq!(Answer::accepted(&HeaderMap::new()), Answer::Json);
    }

    #[test]
    fn only_a_json_body_is_taken() {
        let mut headers = HeaderMap::new();
        assert!(!is_json_body(&headers));
        for (value, json) in [
            ("application/json", true),
            ("application/json; charset=utf-8", true),
            ("APPLICATION/JSON", true),
            ("text/plain", false),
            ("application/graphql", false),
            ("application/x-www-form-urlencoded", false),
        ] {
            headers.insert(header::CONTENT_TYPE, value.parse().expect("a header"));
            assert_eq!(is_json_body(&headers), json, "{value}");
        }
    }
}
