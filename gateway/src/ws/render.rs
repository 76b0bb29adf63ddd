//! Each live event rendered once per distinct (scope, selection), its bytes shared by every
//! socket that asked for the same thing.
//!
//! A `lifecycleEvents` subscription run through async-graphql executes its selection, seals
//! its cursor and serialises JSON for every subscriber and every event: at 1,000 subscribers
//! that is 1,000 executions of the same selection over the same event. Here a subscription of
//! the plain shape (one operation whose one root field is `lifecycleEvents`, no directive on
//! either) is still set up by async-graphql: the document is validated against the real
//! schema and the real resolver checks the caller, the filter and the cursor. But instead of
//! a stream for async-graphql to execute per event, the resolver hands its [`Feed`] over
//! ([`Handoff`]), and each event is rendered by a [`Selection`] shared among subscribers with
//! the same key: the caller's role and cursor scope (what `view_of` shows and seals), the
//! document, the operation and the variables the selection reads. The render itself is
//! async-graphql's: the selection is executed as a query over a one-field schema whose field
//! answers the event's view, so aliases, fragments, `__typename` and `@include` come out as
//! they would have. A document that schema does not take is simply not shared.
//!
//! Every subscriber keeps its own [`Feed`] (its scope, its position, its catch-up), so order,
//! gaps and duplicates are what they were; only the rendering is shared.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, OperationDefinition, OperationType, Selection as Item,
    SelectionSet,
};
use async_graphql::{
    Context, EmptyMutation, EmptySubscription, Json, Name, Object, PathSegment, Pos, Positioned,
    Request, Schema, Variables,
};
use leasehold_domain::{Cursor, RecordedEvent};
use tokio::sync::OnceCell;

use crate::auth::{Principal, Role};
use crate::cursor::CursorKey;
use crate::errors::{ApiError, with_codes};
use crate::live::feed::Feed;
use crate::schema::events::{LifecycleEvent, view_of};

/// The root field whose subscriptions are shared.
const FIELD: &str = "lifecycleEvents";

/// Events a [`Selection`] keeps rendered: subscribers of one key read the same events within
/// moments of each other; one far behind renders its own. At most this many a subscriber (a
/// late joiner still finds the last few), and this many in all.
const RECENT_PER_SHARER: usize = 16;
const RECENT_MAX: usize = 256;

/// Longest document shared: a larger one is executed per subscriber, as before (so a key
/// never holds much).
const SHARED_QUERY_BYTES_MAX: usize = 16 * 1024;

/// The shared selections by key, each removed when its last sharer goes.
type Shelf = Arc<Mutex<HashMap<Key, Weak<Selection>>>>;

/// What a rendering that cannot be serialised (never seen) is sent as: a typed error.
const UNRENDERABLE: &str = r#"{"errors":[{"message":"the event could not be rendered","extensions":{"code":"INTERNAL"}}]}"#;

/// The one-field schema a shared selection is rendered by.
type RenderSchema = Schema<RenderRoot, EmptyMutation, EmptySubscription>;

/// Answers `lifecycleEvents` with the event view the render was given.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RenderRoot;

#[Object]
impl RenderRoot {
    /// The event being rendered.
    async fn lifecycle_events<'a>(&self, ctx: &Context<'a>) -> &'a LifecycleEvent {
        ctx.data_unchecked::<LifecycleEvent>()
    }
}

/// The resolver's hand-over of its feed to the socket, in place of a stream to execute.
#[derive(Debug, Clone, Default)]
pub(crate) struct Handoff(Arc<Mutex<Option<Feed>>>);

impl Handoff {
    /// Called by the resolver once the subscription is accepted.
    pub(crate) fn give(&self, feed: Feed) {
        *lock(&self.0) = Some(feed);
    }

    /// The feed, once the set-up has run, if the resolver accepted the subscription.
    pub(crate) fn take(&self) -> Option<Feed> {
        lock(&self.0).take()
    }
}

/// Who shares a rendering: everything the rendered bytes depend on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    role: Role,
    scope: String,
    query: String,
    operation: Option<String>,
    /// The variables the selection reads, as JSON.
    variables: String,
}

/// The shared selections, by key; one per process.
pub(crate) struct Renderer {
    schema: RenderSchema,
    cursors: CursorKey,
    selections: Shelf,
    counts: Arc<Counts>,
}

/// A shareable subscription's selection, found or made, not yet on the shelf: it goes there
/// once async-graphql has accepted the subscription ([`Renderer::share`]).
pub(crate) struct Plan {
    key: Key,
    selection: Arc<Selection>,
}

/// What `/metrics` shows of the sharing.
#[derive(Debug, Default)]
struct Counts {
    /// Events rendered (once per event per shared selection).
    renders: AtomicU64,
    /// Renderings handed to a socket (once per event per subscriber).
    deliveries: AtomicU64,
}

impl std::fmt::Debug for Renderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys = lock(&self.selections).len();
        f.debug_struct("Renderer").field("keys", &keys).finish_non_exhaustive()
    }
}

impl Renderer {
    /// A renderer sealing cursors with `cursors`.
    pub(crate) fn new(cursors: CursorKey) -> Self {
        let schema = Schema::build(RenderRoot, EmptyMutation, EmptySubscription).finish();
        Self { schema, cursors, selections: Shelf::default(), counts: Arc::default() }
    }

    /// Selections shared now, events rendered and renderings delivered since the start.
    pub(crate) fn counts(&self) -> (usize, u64, u64) {
        let live = lock(&self.selections).len();
        let counts = &self.counts;
        (live, counts.renders.load(Ordering::Relaxed), counts.deliveries.load(Ordering::Relaxed))
    }

    /// The shared selection for `request` as `principal` sent it, or `None` when its shape is
    /// not one this shares (it then runs through async-graphql as any operation does).
    pub(crate) async fn plan(&self, principal: &Principal, request: &Request) -> Option<Plan> {
        if request.query.len() > SHARED_QUERY_BYTES_MAX {
            return None;
        }
        let shared = Shared::of(request)?;
        let key = Key {
            role: principal.role,
            scope: principal.cursor_scope(),
            query: request.query.clone(),
            operation: request.operation_name.clone(),
            variables: serde_json::to_string(&shared.variables).ok()?,
        };
        if let Some(found) = lock(&self.selections).get(&key).and_then(Weak::upgrade) {
            return Some(Plan { key, selection: found });
        }
        let selection = Arc::new(Selection {
            schema: self.schema.clone(),
            cursors: self.cursors.clone(),
            principal: principal.clone(),
            shared,
            recent: Mutex::default(),
            counts: self.counts.clone(),
            shelf: (self.selections.clone(), key.clone()),
        });
        // Rendered once now: a document the one-field schema refuses is not shared.
        selection.renders().await.then_some(Plan { key, selection })
    }

    /// `plan`'s selection, on the shelf for the next subscriber with its key (or the one a
    /// concurrent subscriber put there first).
    pub(crate) fn share(&self, plan: Plan) -> Arc<Selection> {
        let mut selections = lock(&self.selections);
        let kept = selections.entry(plan.key).or_default();
        match kept.upgrade() {
            Some(raced) => raced,
            None => {
                *kept = Arc::downgrade(&plan.selection);
                plan.selection
            }
        }
    }
}

/// Adds the names of the variables `arguments` (a node's arguments: the parser's values,
/// whose type it does not export) read to `used`. `into_const_with` calls back once per
/// variable, wherever it is nested.
macro_rules! arguments_in {
    ($arguments:expr, $used:expr) => {
        for (_, value) in $arguments {
            let _ = value.node.clone().into_const_with(|name| {
                $used.insert(name.to_string());
                Ok::<_, std::convert::Infallible>(async_graphql::Value::Null)
            });
        }
    };
}

/// What a shareable request renders with: the selected operation as a query of the one-field
/// schema, and the variables its selection reads.
#[derive(Debug)]
struct Shared {
    document: ExecutableDocument,
    operation: Option<String>,
    variables: Variables,
    /// Where the root field is, and its response key: an error names them.
    root: (Pos, String),
}

impl Shared {
    /// The render of `request`, if it is one operation whose one root field is
    /// `lifecycleEvents`, with no directive on either.
    fn of(request: &Request) -> Option<Self> {
        let document = async_graphql::parser::parse_query(&request.query).ok()?;
        let wanted = request.operation_name.as_deref();
        let mut chosen = document
            .operations
            .iter()
            .filter(|(name, _)| wanted.is_none() || name.map(Name::as_str) == wanted);
        let (name, operation) = chosen.next()?;
        if chosen.next().is_some() {
            return None;
        }
        let root = root_field(&operation.node)?;
        let mut used = HashSet::new();
        variables_in(&root.node.selection_set.node, &mut used);
        for fragment in document.fragments.values() {
            variables_in(&fragment.node.selection_set.node, &mut used);
            for directive in &fragment.node.directives {
                arguments_in!(&directive.node.arguments, used);
            }
        }
        let at = (root.pos, root.node.response_key().node.to_string());
        let mut field = root.node.clone();
        field.arguments.clear();
        let definition = OperationDefinition {
            ty: OperationType::Query,
            variable_definitions: operation
                .node
                .variable_definitions
                .iter()
                .filter(|definition| used.contains(definition.node.name.node.as_str()))
                .cloned()
                .collect(),
            directives: Vec::new(),
            selection_set: Positioned::new(
                SelectionSet {
                    items: vec![Positioned::new(
                        Item::Field(Positioned::new(field, root.pos)),
                        root.pos,
                    )],
                },
                operation.node.selection_set.pos,
            ),
        };
        let definition = Positioned::new(definition, operation.pos);
        let operations = match name {
            Some(name) => DocumentOperations::Multiple([(name.clone(), definition)].into()),
            None => DocumentOperations::Single(definition),
        };
        let mut variables = request.variables.clone();
        variables.retain(|name, _| used.contains(name.as_str()));
        Some(Self {
            root: at,
            document: ExecutableDocument { operations, fragments: document.fragments },
            operation: name.map(|name| name.to_string()),
            variables,
        })
    }
}

/// The operation's one root field, if it is a directive-free subscription of `lifecycleEvents`.
fn root_field(
    operation: &OperationDefinition,
) -> Option<&Positioned<async_graphql::parser::types::Field>> {
    if operation.ty != OperationType::Subscription || !operation.directives.is_empty() {
        return None;
    }
    let [item] = operation.selection_set.node.items.as_slice() else { return None };
    let Item::Field(field) = &item.node else { return None };
    (field.node.name.node == FIELD && field.node.directives.is_empty()).then_some(field)
}

/// Adds the names of the variables `set` reads (in arguments and directives) to `used`.
fn variables_in(set: &SelectionSet, used: &mut HashSet<String>) {
    for item in &set.items {
        let (directives, inner) = match &item.node {
            Item::Field(field) => {
                arguments_in!(&field.node.arguments, used);
                (&field.node.directives, Some(&field.node.selection_set.node))
            }
            Item::FragmentSpread(spread) => (&spread.node.directives, None),
            Item::InlineFragment(inline) => {
                (&inline.node.directives, Some(&inline.node.selection_set.node))
            }
        };
        for directive in directives {
            arguments_in!(&directive.node.arguments, used);
        }
        if let Some(inner) = inner {
            variables_in(inner, used);
        }
    }
}

/// One (scope, selection)'s renderings of recent events, shared by its subscribers.
pub(crate) struct Selection {
    schema: RenderSchema,
    cursors: CursorKey,
    /// The first subscriber's: the key guarantees every sharer's role and scope are the same.
    principal: Principal,
    shared: Shared,
    recent: Mutex<BTreeMap<Cursor, Arc<OnceCell<Arc<str>>>>>,
    counts: Arc<Counts>,
    /// Where it is kept for sharers, under which key: it takes itself off when dropped.
    shelf: (Shelf, Key),
}

impl Drop for Selection {
    fn drop(&mut self) {
        let (shelf, key) = &self.shelf;
        let mut selections = lock(shelf);
        // Only its own entry: another selection may hold the key by now.
        if selections.get(key).is_some_and(|kept| std::ptr::eq(kept.as_ptr(), self)) {
            selections.remove(key);
        }
    }
}

impl std::fmt::Debug for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selection")
            .field("operation", &self.shared.operation)
            .finish_non_exhaustive()
    }
}

impl Selection {
    /// The JSON of the response to `event` (the `next` message's payload), rendered by the
    /// first subscriber to ask and shared with the others.
    pub(crate) async fn render(self: &Arc<Self>, event: &RecordedEvent) -> Arc<str> {
        self.counts.deliveries.fetch_add(1, Ordering::Relaxed);
        // Each subscriber's stream holds one reference: the count is how many share it.
        let kept = (RECENT_PER_SHARER * Arc::strong_count(self)).min(RECENT_MAX);
        let cell = {
            let mut recent = lock(&self.recent);
            let cell = recent.entry(event.cursor).or_default().clone();
            while recent.len() > kept {
                recent.pop_first();
            }
            cell
        };
        cell.get_or_init(|| self.execute(view_of(&self.cursors, &self.principal, event.clone())))
            .await
            .clone()
    }

    /// The response reporting that the feed failed, as async-graphql reports a subscription
    /// stream's error: at the root field, with its code.
    pub(crate) fn failed(&self, error: ApiError) -> async_graphql::Response {
        let (pos, key) = &self.shared.root;
        let error = async_graphql::Error::from(error)
            .into_server_error(*pos)
            .with_path(vec![PathSegment::Field(key.clone())]);
        with_codes(async_graphql::Response::from_errors(vec![error]))
    }

    /// Whether the selection renders without errors (over a made-up event).
    async fn renders(&self) -> bool {
        let sample = LifecycleEvent {
            cursor: String::new(),
            stream_id: String::new(),
            stream_type: String::new(),
            version: 1,
            event_type: String::new(),
            recorded_at: chrono::DateTime::UNIX_EPOCH,
            payload: Json(serde_json::Value::Null),
            event_id: None,
            tenant_id: None,
            metadata: None,
            hash: None,
        };
        self.response(sample).await.1
    }

    async fn execute(&self, view: LifecycleEvent) -> Arc<str> {
        self.counts.renders.fetch_add(1, Ordering::Relaxed);
        self.response(view).await.0
    }

    /// The response's JSON, and whether it has no errors.
    async fn response(&self, view: LifecycleEvent) -> (Arc<str>, bool) {
        let shared = &self.shared;
        let mut request =
            Request::new(String::new()).variables(shared.variables.clone()).data(view);
        if let Some(operation) = &shared.operation {
            request = request.operation_name(operation.clone());
        }
        request.set_parsed_query(shared.document.clone());
        let response = with_codes(self.schema.execute(request).await);
        let ok = response.errors.is_empty();
        let json = serde_json::to_string(&response).unwrap_or_else(|_| UNRENDERABLE.to_owned());
        (json.into(), ok)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
