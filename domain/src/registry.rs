//! The registry of aggregate kinds: one place that names every kind, its stream type and id
//! prefix, its event types, and for each event type what a tenant may see of its payload.
//!
//! What a tenant sees is **deny by default**: a payload shows a tenant only the leaves its
//! event type's view lists; an event type without a view, or of a kind that is not
//! registered, shows an empty object. A new event type, or a new field of an existing one (at
//! any depth), therefore shows tenants nothing until someone lists it. Each view also lists
//! the paths it withholds on purpose, so that a test can walk every leaf of every event type
//! of every kind and find any leaf nobody decided about (`domain/tests/registry.rs`).
//!
//! Fields are named by **paths**, down to the leaves: `lease`, `items[].sku` (the `sku` of every
//! element of the array `items`), `limits.cpus`. A path shows a tenant a scalar (a string, a
//! number, a boolean or null) and nothing else: an object or an array shows only the paths
//! listed beneath it, so a field added inside a shown object (a new member of an item, say)
//! stays hidden too until someone lists it. A withheld path withholds everything beneath it.
//!
//! Adding a kind: declare its `AggregateKind` beside its events (as `lease::KIND`) and add it
//! to [`KINDS`].

use serde_json::{Map, Value};

/// What a tenant may see of one event type's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventView {
    /// The event type.
    pub event_type: &'static str,
    /// The paths of the payload's leaves its tenant sees (`lease`, `items[].sku`).
    pub tenant_fields: &'static [&'static str],
    /// The paths withheld from its tenant on purpose, each with everything beneath it
    /// (operators and auditors see them): failure detail, generations, operation ids, ...
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
///
/// A kind is listed here once its projection and GraphQL module exist (a test in `ops` holds
/// every listed kind to both); until it is, its events show tenants nothing at all.
pub const KINDS: &[&AggregateKind] = &[
    &crate::lease::KIND,
    &crate::vm::KIND,
    &crate::host::KIND,
    &crate::snapshot::KIND,
    &crate::quota::KIND,
    &crate::rental::KIND,
    &crate::node::KIND,
    &crate::run::KIND,
    &crate::runner::KIND,
    &crate::runner_capacity::KIND,
    &crate::runner_job::KIND,
    &crate::runner_node::KIND,
    &crate::workload_quota::KIND,
];

/// The kind whose streams have type `stream_type`.
pub fn kind(stream_type: &str) -> Option<&'static AggregateKind> {
    KINDS.iter().copied().find(|kind| kind.stream_type == stream_type)
}

/// A payload as its tenant may see it: only the leaves its event type's view lists (see the
/// module's doc for paths); nothing (`{}`) for an event type no view covers.
pub fn tenant_view(stream_type: &str, event_type: &str, payload: &Value) -> Value {
    let Some(view) = kind(stream_type).and_then(|kind| kind.view(event_type)) else {
        return Value::Object(Map::new());
    };
    match payload {
        Value::Object(fields) => Value::Object(shown_members(fields, view.tenant_fields)),
        _ => Value::Object(Map::new()),
    }
}

/// The members of an object that `paths` (relative to it) reach. A member whose name holds a
/// path's separators (`.`, `[`) is never shown: it could pose as a deeper path.
fn shown_members(fields: &Map<String, Value>, paths: &[&str]) -> Map<String, Value> {
    fields
        .iter()
        .filter(|(name, _)| !name.contains(['.', '[', ']']))
        .filter_map(|(name, value)| {
            shown(value, &beneath(paths, name)).map(|value| (name.clone(), value))
        })
        .collect()
}

/// What `paths` (relative to `value`; `""` names `value` itself) show of `value`, or `None`
/// when they show nothing of it.
fn shown(value: &Value, paths: &Paths<'_>) -> Option<Value> {
    match value {
        Value::Object(fields) if !paths.members.is_empty() => {
            Some(Value::Object(shown_members(fields, &paths.members)))
        }
        Value::Array(elements) if !paths.elements.is_empty() => {
            let each = Paths::split(&paths.elements);
            Some(Value::Array(
                elements.iter().filter_map(|element| shown(element, &each)).collect(),
            ))
        }
        Value::Object(_) | Value::Array(_) => None,
        scalar => paths.itself.then(|| scalar.clone()),
    }
}

/// The paths beneath one member, split by what they reach.
#[derive(Debug, Default)]
struct Paths<'a> {
    /// The member itself is listed (shown if it is a scalar).
    itself: bool,
    /// Paths into the member as an object, relative to it.
    members: Vec<&'a str>,
    /// Paths into each element of the member as an array, relative to the element.
    elements: Vec<&'a str>,
}

impl<'a> Paths<'a> {
    /// Splits paths relative to a value: `""` is the value, `.x` a member path, `[]…` an
    /// element path.
    fn split(relative: &[&'a str]) -> Paths<'a> {
        let mut paths = Paths::default();
        for path in relative {
            if path.is_empty() {
                paths.itself = true;
            } else if let Some(element) = path.strip_prefix("[]") {
                paths.elements.push(element);
            } else if let Some(member) = path.strip_prefix('.') {
                paths.members.push(member);
            }
        }
        paths
    }
}

/// The paths under the member `name`, relative to it.
fn beneath<'a>(paths: &[&'a str], name: &str) -> Paths<'a> {
    let relative: Vec<&'a str> = paths
        .iter()
        .filter_map(|path| path.strip_prefix(name))
        .filter(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with("[]"))
        .collect();
    Paths::split(&relative)
}
