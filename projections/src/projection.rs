//! A projection: a pure function from events (and the view each one touches) to typed
//! read-model changes. The runtime loads the views a batch touches, folds the batch's events
//! through [`Projection::project`], and commits the changes with the checkpoint.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;

use leasehold_domain::RecordedEvent;

/// A stored event a projection cannot read. The projection stops at it (nothing is skipped)
/// until the code that reads it is deployed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("projection {projection} cannot apply the event at position {position}: {reason}")]
pub struct ProjectionError {
    /// The projection.
    pub projection: &'static str,
    /// The event's log position.
    pub position: u64,
    /// Why not.
    pub reason: String,
}

/// `event` decoded as one of a kind's events, or the error that stops `projection` at it.
///
/// # Errors
/// [`ProjectionError`] when the payload is not an event of that kind this code reads.
pub fn decoded<E: leasehold_domain::DomainEvent>(
    projection: &'static str,
    event: &RecordedEvent,
) -> Result<E, ProjectionError> {
    E::from_stored(event.event_type.as_str(), &event.payload).map_err(|error| ProjectionError {
        projection,
        position: event.cursor.position,
        reason: error.to_string(),
    })
}

/// A projection of the log into read models.
pub trait Projection: Send + Sync + 'static {
    /// Its name, the key of its checkpoint and of its lock.
    const NAME: &'static str;
    /// Its version: a new version rebuilds from the start of the log.
    const VERSION: u32;
    /// The stream types (aggregate kinds, as the domain's registry names them) whose events
    /// it projects; a test in `ops` holds every registered kind to having a projection.
    const STREAM_TYPES: &'static [&'static str];
    /// What a view is found by (a lease's id, ...).
    type Key: Eq + Hash + Clone + Debug + Send + Sync;
    /// The working state of one key, from which its rows are written.
    type View: Clone + Debug + Send + Sync;
    /// A typed change to the read-model tables.
    type Change: Debug + Send + Sync;

    /// The key an event touches, or `None` if the projection ignores it.
    fn key(&self, event: &RecordedEvent) -> Option<Self::Key>;

    /// The view after `event`, pushing any change that is not a write of the view itself
    /// (a history row, a counter) onto `changes`.
    ///
    /// # Errors
    /// When the event cannot be read.
    fn project(
        &self,
        view: Option<&Self::View>,
        event: &RecordedEvent,
        changes: &mut Vec<Self::Change>,
    ) -> Result<Self::View, ProjectionError>;

    /// The change that writes a touched view's rows.
    fn put(&self, key: &Self::Key, view: &Self::View) -> Self::Change;
}

/// Folds a batch of events over the views they touch and returns every change, in order:
/// first each event's own changes, then one write per touched view (in first-touch order).
///
/// # Errors
/// The first event the projection cannot read; nothing of the batch is returned.
pub fn apply_batch<P: Projection>(
    projection: &P,
    mut views: HashMap<P::Key, P::View>,
    events: &[RecordedEvent],
) -> Result<Vec<P::Change>, ProjectionError> {
    let mut changes = Vec::new();
    let touched = keys_of(projection, events);
    for event in events {
        let Some(key) = projection.key(event) else { continue };
        let view = projection.project(views.get(&key), event, &mut changes)?;
        views.insert(key, view);
    }
    for key in &touched {
        changes.push(projection.put(key, &views[key]));
    }
    Ok(changes)
}

/// The keys a batch touches, each once.
pub fn keys_of<P: Projection>(projection: &P, events: &[RecordedEvent]) -> Vec<P::Key> {
    let mut seen = HashSet::new();
    events
        .iter()
        .filter_map(|event| projection.key(event))
        .filter(|key| seen.insert(key.clone()))
        .collect()
}
