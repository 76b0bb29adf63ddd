//! The decider every aggregate implements, and what a command is decided with.
//!
//! An aggregate is its state. `decide` looks at the state and a command and answers with the
//! events to append (possibly none: an idempotent no-op) or a refusal; `evolve` folds one
//! event into the state and never fails. Both are pure and synchronous: the clock, new ids and
//! anything looked up elsewhere arrive in the [`Context`], so replaying the same events always
//! yields the same state and deciding the same command in the same context always yields the
//! same answer.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::{Actor, StreamId, TenantId};

/// What a refusal means to a caller, whatever the aggregate: the gateway turns each kind into
/// one `extensions.code`, and the command pipeline decides from it whether a retry can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusalKind {
    /// The input is malformed: retrying the same input can never succeed.
    BadInput,
    /// The aggregate (or something it refers to) does not exist for this tenant.
    NotFound,
    /// The command is not allowed in the aggregate's current state.
    InvalidState,
    /// The command comes from a stale actor (an old generation, maintenance or token).
    Fenced,
    /// The command contradicts what is recorded (for example a different shape than expected).
    Conflict,
    /// A quota of the tenant's does not allow it.
    QuotaExceeded,
    /// What it acts on cannot do this at all (a provider connection without stop, say):
    /// a routing bug, never retried.
    Unsupported,
}

/// A refusal by `decide`: a typed error that can say which [`RefusalKind`] it is.
pub trait Refusal: std::error::Error + Send + Sync + 'static {
    /// What the refusal means to a caller.
    fn kind(&self) -> RefusalKind;
}

/// Everything `decide` may know besides the state and the command.
#[derive(Debug, Clone, PartialEq)]
pub struct Context<F> {
    /// The time the command is decided at. Events that need a time take this one.
    pub now: DateTime<Utc>,
    /// The tenant the command acts for, from the verified token and nowhere else.
    pub tenant: TenantId,
    /// Who issued the command.
    pub actor: Actor,
    /// Fresh ids, consumed in order, for anything the command creates.
    pub new_ids: Vec<Uuid>,
    /// Facts looked up before deciding (other aggregates' states, configuration).
    pub facts: F,
}

impl<F> Context<F> {
    /// The `n`-th fresh id. The pipeline hands in [`Aggregate::NEW_IDS_PER_COMMAND`] of them.
    ///
    /// # Panics
    /// When fewer ids were handed in: that is a bug in the caller, not an operating error.
    #[must_use]
    pub fn new_id(&self, n: usize) -> Uuid {
        self.new_ids[n]
    }
}

/// A stored event of one aggregate: its name, its payload's shape version, and its payload.
pub trait DomainEvent: Sized {
    /// Every event type of the enum, as stored.
    const EVENT_TYPES: &'static [&'static str];
    /// The stored event type, stable once shipped (past tense, e.g. `LeaseProvisioned`).
    fn event_type(&self) -> &'static str;
    /// The stored payload.
    fn to_payload(&self) -> serde_json::Value;
    /// The event back from its stored type and payload.
    ///
    /// # Errors
    /// When the type is unknown or the payload does not have the type's shape.
    fn from_stored(event_type: &str, payload: &serde_json::Value)
    -> Result<Self, EventDecodeError>;
}

/// The stored payload of an event enum serialized as `#[serde(tag = "type", content =
/// "data")]`: its `data` (the type is the envelope's). Every kind's events use this shape.
pub fn tagged_payload<E: Serialize>(event: &E) -> serde_json::Value {
    let mut tagged = serde_json::to_value(event).expect("events serialize");
    tagged.get_mut("data").map(serde_json::Value::take).unwrap_or_default()
}

/// An event of such an enum back from its stored type and payload.
///
/// # Errors
/// When the type is unknown or the payload does not have the type's shape.
pub fn from_tagged<E: DeserializeOwned>(
    event_type: &str,
    payload: &serde_json::Value,
) -> Result<E, EventDecodeError> {
    let tagged = serde_json::json!({ "type": event_type, "data": payload });
    serde_json::from_value(tagged).map_err(|error| EventDecodeError {
        event_type: event_type.to_owned(),
        reason: without_values(&error.to_string()),
    })
}

/// A decoder's message with every value it quotes cut out: serde quotes what it could not
/// read (`invalid type: string "…", expected u64`), and a payload's values are tenants' data,
/// not for operators' logs. Field and variant names stay: they are the code's.
fn without_values(message: &str) -> String {
    let mut kept = String::with_capacity(message.len());
    let mut rest = message;
    // serde's `Unexpected` shows a string as `string "…"`, a number or char in backticks
    // after its kind (`integer `5``), and bytes as `byte array`; a string read as an enum it
    // is not one of is an `unknown variant `…``.
    let kinds = [
        "string \"",
        "integer `",
        "floating point `",
        "character `",
        "boolean `",
        "unknown variant `",
    ];
    while let Some((at, kind)) =
        kinds.iter().filter_map(|kind| rest.find(kind).map(|at| (at, *kind))).min()
    {
        let opened = at + kind.len();
        kept.push_str(&rest[..opened]);
        kept.push('…');
        let close = if kind.ends_with('"') { '"' } else { '`' };
        rest = &rest[opened + closing(&rest[opened..], close)..];
    }
    kept.push_str(rest);
    kept
}

/// Where the quoted value at the start of `text` ends: at its `close`, past any escaped one
/// (a string is shown with its quotes escaped); the end of `text` if it never closes.
fn closing(text: &str, close: char) -> usize {
    let mut escaped = false;
    for (at, c) in text.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            c if c == close && !escaped => return at,
            _ => escaped = false,
        }
    }
    text.len()
}

/// Implements [`DomainEvent`] for an event enum stored as `#[serde(tag = "type", content =
/// "data")]` whose event types are its variants' names: every kind's events are, so none
/// writes the codec again. A variant left out of the list fails to compile (the match is
/// exhaustive).
///
/// ```text
/// leasehold_domain::tagged_events!(BudgetEvent { BudgetOpened, BudgetReserved });
/// ```
#[macro_export]
macro_rules! tagged_events {
    ($event:ty { $($variant:ident),+ $(,)? }) => {
        impl $crate::DomainEvent for $event {
            const EVENT_TYPES: &'static [&'static str] = &[$(stringify!($variant)),+];

            fn event_type(&self) -> &'static str {
                match self {
                    $(Self::$variant { .. } => stringify!($variant),)+
                }
            }

            fn to_payload(&self) -> ::serde_json::Value {
                $crate::aggregate::tagged_payload(self)
            }

            fn from_stored(
                event_type: &str,
                payload: &::serde_json::Value,
            ) -> Result<Self, $crate::EventDecodeError> {
                $crate::aggregate::from_tagged(event_type, payload)
            }
        }
    };
}

/// A stored event this code cannot read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stored event {event_type} cannot be decoded: {reason}")]
pub struct EventDecodeError {
    /// The stored event type.
    pub event_type: String,
    /// Why not (the decoder's message; it never holds payload values).
    pub reason: String,
}

/// An aggregate: a consistency boundary whose state is a fold over its stream's events.
pub trait Aggregate: Clone + Sized + Serialize + DeserializeOwned {
    /// The stream type of its streams (`lease`, `vm`, ...).
    const STREAM_TYPE: &'static str;
    /// The shape version of the serialized state, for snapshots: a snapshot of another
    /// version is ignored and the state is rebuilt from the events.
    const STATE_SCHEMA: u32;
    /// What can be asked of it.
    type Command;
    /// What it records.
    type Event: DomainEvent;
    /// Why it refuses.
    type Error: Refusal;
    /// Looked-up facts `decide` needs besides the state.
    type Facts;
    /// How many fresh ids `decide` may take from [`Context::new_ids`] (minting one costs a
    /// system call, so none are minted for an aggregate that needs none).
    const NEW_IDS_PER_COMMAND: usize = 0;

    /// The state of a stream with no events.
    fn initial() -> Self;

    /// The events a command produces, or why it is refused. Never reads the clock.
    ///
    /// # Errors
    /// The aggregate's refusal when the command is not allowed.
    fn decide(
        &self,
        command: &Self::Command,
        ctx: &Context<Self::Facts>,
    ) -> Result<Vec<Self::Event>, Self::Error>;

    /// The state after one more event. Holds no rules, only assertions.
    #[must_use]
    fn evolve(self, event: &Self::Event) -> Self;

    /// Whether nothing can change it any more.
    fn is_terminal(&self) -> bool;

    /// Commands on other aggregates of the same kind that must commit together with the
    /// events `command` just produced (`events`, decided on `self`): each is decided on its
    /// own stream's state, and all the streams are appended atomically, or nothing is. A
    /// refusal of any refuses the whole command.
    fn linked(
        &self,
        _command: &Self::Command,
        _events: &[Self::Event],
    ) -> Vec<(StreamId, Self::Command)> {
        Vec::new()
    }

    /// Whether `command` creates the aggregate (so its stream is, all but surely, still empty:
    /// the pipeline may decide it without reading the stream first, and the append's expected
    /// version checks that belief).
    fn is_creation(_command: &Self::Command) -> bool {
        false
    }

    /// Whether `command` may be the first on its stream when another kind's command links it
    /// (`LinkedCommand`): decided on [`Aggregate::initial`] rather than refused as not found.
    /// A creation may; so may any command of an aggregate whose initial state means something
    /// (a tenant's quota with no limits and nothing counted).
    fn may_open(command: &Self::Command) -> bool {
        Self::is_creation(command)
    }

    /// The workload kind whose tenant quota its states charge (`workload_quota.rs`), if any:
    /// the command pipeline then links every change of [`Self::charge`] to the append that
    /// makes it.
    const WORKLOAD: Option<crate::workload_quota::WorkloadKind> = None;

    /// What this state holds of its tenant's workload quota; `None` when it holds nothing
    /// (always, for a kind with no [`Self::WORKLOAD`]).
    fn charge(&self) -> Option<crate::workload_quota::Charge> {
        None
    }

    /// The fencing generation its events are issued under, if it has one (stamped into each
    /// event's metadata).
    fn generation(&self) -> Option<u64> {
        None
    }

    /// The state after a sequence of events.
    #[must_use]
    fn replay<'a>(events: impl IntoIterator<Item = &'a Self::Event>) -> Self
    where
        Self::Event: 'a,
    {
        events.into_iter().fold(Self::initial(), Self::evolve)
    }
}
