//! Subscriptions: `lifecycleEvents` delivers the log in order from a cursor, handing over from
//! the log to the live hub with no gap and no duplicate (see `live::feed`).

use std::sync::Arc;

use async_graphql::{Context, Subscription};
use futures_util::Stream;
use leasehold_domain::EventStore as _;

use super::events::{EventFilter, LifecycleEvent, after_of, scope_of, view_of};
use super::{caller, shared};
use crate::errors::ApiError;
use crate::live::feed::Feed;
use crate::ws::render::Handoff;

/// The subscriptions over every kind at once.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogSubscription;

#[Subscription]
impl LogSubscription {
    /// Events in log order, each with its `cursor`. With `after` (a cursor you were given),
    /// every later event is replayed first; without it, events from now on. A consumer that
    /// falls behind is caught up from the log, never skipped.
    async fn lifecycle_events(
        &self,
        ctx: &Context<'_>,
        after: Option<String>,
        filter: Option<EventFilter>,
    ) -> Result<impl Stream<Item = Result<LifecycleEvent, ApiError>> + use<>, ApiError> {
        let principal = caller(ctx)?.clone();
        let scope = scope_of(&principal, filter)?;
        let state = shared(ctx);
        // Subscribed to the hub before the start is fixed, so nothing falls between.
        let live = state.hub.subscribe();
        let start = match after_of(ctx, after.as_deref())? {
            Some(cursor) => cursor,
            None => state.store.head().await?,
        };
        let feed = Feed::new(state.store.clone(), live, scope, start);
        // A socket that renders this selection once for all its sharers takes the feed over
        // (`ws::render`); the stream left to async-graphql is then empty.
        let feed = match ctx.data_opt::<Handoff>() {
            Some(handoff) => {
                handoff.give(feed);
                None
            }
            None => Some(feed),
        };
        let cursors = state.cursors.clone();
        Ok(futures_util::stream::unfold(feed, move |feed| {
            let (cursors, principal) = (cursors.clone(), principal.clone());
            async move {
                let mut feed = feed?;
                match feed.next().await {
                    Ok(Some(event)) => {
                        let event = Arc::unwrap_or_clone(event);
                        Some((Ok(view_of(&cursors, &principal, event)), Some(feed)))
                    }
                    Ok(None) => None,
                    // Reported once; the client resumes from its last cursor.
                    Err(error) => Some((Err(ApiError::from(error)), None)),
                }
            }
        }))
    }
}
