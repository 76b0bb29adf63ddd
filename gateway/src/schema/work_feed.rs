//! A work subscription's stream, for every kind that hands its work to agents that take it
//! (`lease/work.rs`, `vm/work.rs`): the log's feed from a cursor, each event turned into the
//! kind's item by `item_of` (nothing, for an event that starts no work for this subscriber or
//! work no longer awaited), an error reported once and the stream ended there (the agent
//! resumes from its last cursor).

use std::future::Future;
use std::sync::Arc;

use futures_util::Stream;
use leasehold_domain::RecordedEvent;

use crate::AppState;
use crate::errors::{ApiError, ApiResult};
use crate::live::feed::Feed;

/// The items `item_of` makes of `feed`'s events for `subscriber`.
pub(crate) fn items<S, T, F, Fut>(
    feed: Feed,
    app: AppState,
    subscriber: S,
    item_of: F,
) -> impl Stream<Item = Result<T, ApiError>> + use<S, T, F, Fut>
where
    S: Clone + Send + Sync + 'static,
    T: Send + 'static,
    F: Fn(AppState, S, Arc<RecordedEvent>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ApiResult<Option<T>>> + Send,
{
    futures_util::stream::unfold(Some(feed), move |feed| {
        let (app, subscriber, item_of) = (app.clone(), subscriber.clone(), item_of.clone());
        async move {
            let mut feed = feed?;
            loop {
                let event = match feed.next().await {
                    Ok(Some(event)) => event,
                    Ok(None) => return None,
                    Err(error) => return Some((Err(ApiError::from(error)), None)),
                };
                match item_of(app.clone(), subscriber.clone(), event).await {
                    Ok(Some(item)) => return Some((Ok(item), Some(feed))),
                    Ok(None) => {}
                    Err(error) => return Some((Err(error), None)),
                }
            }
        }
    })
}
