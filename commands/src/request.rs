//! A command as the pipeline receives it: the aggregate's command plus who sent it, its
//! operation key and the tracing context.

use leasehold_domain::{
    Actor, Aggregate, KeyNamespace, OperationKey, RequestHash, StreamId, TenantId,
};
use serde::Serialize;
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// One command for aggregate `A`.
#[derive(Debug, Clone)]
pub struct CommandRequest<A: Aggregate> {
    /// The tenant, from the verified token and nowhere else.
    pub tenant: TenantId,
    /// Who sent it.
    pub actor: Actor,
    /// The aggregate's stream.
    pub stream: StreamId,
    /// Whose keys `operation_key` is one of: by default the actor's (see
    /// [`KeyNamespace::of_actor`]).
    pub namespace: KeyNamespace,
    /// The caller's idempotency key.
    pub operation_key: OperationKey,
    /// The version the caller read, if it wants the command refused when the stream moved on.
    /// Without it, a command that loses a race is decided again on the new state.
    pub expected_version: Option<u64>,
    /// The command.
    pub command: A::Command,
    /// Facts looked up for `decide`.
    pub facts: A::Facts,
    /// Ties together everything one outside request caused.
    pub correlation_id: Option<Uuid>,
    /// The event or command that caused this one.
    pub causation_id: Option<Uuid>,
    /// The distributed trace.
    pub trace_id: Option<String>,
    /// The hash of the caller's own request, when the service derived the command (and its
    /// links) from it with decisions a retry may make differently: a VM's placement is decided
    /// anew on every attempt, and a retry of the same request must still be one. Without it
    /// the request hash covers the command and its links.
    pub caller_hash: Option<RequestHash>,
}

impl<A: Aggregate> CommandRequest<A> {
    /// A request with no expected version and no tracing context; set those fields after.
    pub fn new(
        tenant: TenantId,
        actor: Actor,
        stream: StreamId,
        operation_key: OperationKey,
        command: A::Command,
        facts: A::Facts,
    ) -> Self {
        Self {
            tenant,
            namespace: KeyNamespace::of_actor(&actor),
            actor,
            stream,
            operation_key,
            expected_version: None,
            command,
            facts,
            correlation_id: None,
            causation_id: None,
            trace_id: None,
            caller_hash: None,
        }
    }

    /// The same request, its idempotency decided by `caller_hash` (see the field).
    #[must_use]
    pub fn hashed_as(mut self, caller_hash: RequestHash) -> Self {
        self.caller_hash = Some(caller_hash);
        self
    }
}

/// The hash of what a caller asked, as a service that derives commands from it names it:
/// the kind, the stream, and the request's own fields as JSON.
pub fn caller_hash<T: Serialize>(aggregate: &str, stream: &StreamId, request: &T) -> RequestHash {
    let hashed = serde_json::json!({
        "aggregate": aggregate,
        "caller": request,
        "stream": stream.as_str(),
    });
    let text = serde_json::to_vec(&hashed).expect("requests serialize");
    RequestHash(Sha256::digest(text).into())
}

impl<A: Aggregate> CommandRequest<A>
where
    A::Command: Serialize,
{
    /// The request's hash: the aggregate, the stream, the expected version and the command, as
    /// JSON. The same request always hashes the same, whoever sends it when: fields serialize
    /// in declaration order and the commands hold no maps.
    pub fn request_hash(&self) -> RequestHash {
        #[derive(Serialize)]
        struct Hashed<'a, C> {
            aggregate: &'static str,
            command: &'a C,
            expected_version: Option<u64>,
            stream: &'a str,
        }
        let hashed = Hashed {
            aggregate: A::STREAM_TYPE,
            command: &self.command,
            expected_version: self.expected_version,
            stream: self.stream.as_str(),
        };
        let text = serde_json::to_vec(&hashed).expect("commands serialize");
        RequestHash(Sha256::digest(text).into())
    }
}
