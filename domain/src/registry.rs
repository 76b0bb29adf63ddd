//! The registry of aggregate kinds: one place that names every kind, its stream type and id
//! prefix, its event types, and for each event type what a tenant may see of its payload.
//!
//! What a tenant sees is **deny by default**: a payload shows a tenant only the fields its
//! event type's view lists; an event type without a view, or of a kind that is not
//! registered, shows an empty object. A new event type, or a new field of an existing one,
//! therefore shows tenants nothing until someone lists it. Each view also lists the fields it
//! withholds on purpose, so that a test can walk every event type of every kind and find any
//! field nobody decided about (`domain/tests/registry.rs`).
//!
//! Adding a kind: declare its `AggregateKind` beside its events (as `lease::KIND`) and add it
//! to [`KINDS`].

use serde_json::{Map, Value};

/// What a tenant may see of one event type's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventView {
    /// The event type.
    pub event_type: &'static str,
    /// The payload fields its tenant sees.
    pub tenant_fields: &'static [&'static str],
    /// The payload fields withheld from its tenant on purpose (operators and auditors see
    /// them): failure detail, generations, operation ids, ...
    pub withheld: &'static [&'static str],
}

/// One kind of aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AggregateKind {
    /// Its streams' type (`lease`), which is also its stream ids' prefix (`lease-<uuid>`).
    pub stream_type: &'static str,
    /// Every event type its streams may hold, each with its tenant view. Event types are
    /// unique across every kind.
    pub events: &'static [EventView],
}

impl AggregateKind {
    /// The view of `event_type`, if this kind records it.
    pub fn view(&self, event_type: &str) -> Option<&'static EventView> {
        self.events.iter().find(|view| view.event_type == event_type)
    }

    /// Its event types, in declaration order.
    pub fn event_types(&self) -> impl Iterator<Item = &'static str> {
        self.events.iter().map(|view| view.event_type)
    }
}

/// Every registered kind.
pub const KINDS: &[&AggregateKind] = &[&crate::lease::KIND];

/// The kind whose streams have type `stream_type`.
pub fn kind(stream_type: &str) -> Option<&'static AggregateKind> {
    KINDS.iter().copied().find(|kind| kind.stream_type == stream_type)
}

/// A payload as its tenant may see it: only the fields its event type's view lists; nothing
/// (`{}`) for an event type no view covers.
pub fn tenant_view(stream_type: &str, event_type: &str, payload: &Value) -> Value {
    let Some(view) = kind(stream_type).and_then(|kind| kind.view(event_type)) else {
        return Value::Object(Map::new());
    };
    let Some(fields) = payload.as_object() else {
        return Value::Object(Map::new());
    };
    let shown = fields
        .iter()
        .filter(|(name, _)| view.tenant_fields.contains(&name.as_str()))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    Value::Object(shown)
}
