//! Group commit: appends that arrive while others are being committed share one call of
//! `leasehold_append`, one transaction and one WAL flush. Each append stays atomic on its own:
//! the function accepts or refuses it whole, whatever happens to the others.
//!
//! `committers` worker tasks take turns at the queue. A worker takes every waiting append up
//! to a limit, leaving for the next group any append whose streams (or ledger key) are already
//! in this one (so each member chains from heads no other member moves), and commits the group. An append
//! the group cannot settle (a stale head, or a group that failed as a whole) is retried on
//! its own, so one bad append never fails its neighbours.

use std::collections::HashSet;
use std::sync::Arc;

use futures_util::StreamExt as _;
use leasehold_domain::{AppendOutcome, LedgerEntry, StoreError, StreamAppend};
use tokio::sync::{Mutex, mpsc, oneshot};

use super::PgEventStore;
use super::append::Answer;
use super::prepare::{Member, Prepared, Rendered};
use crate::limits::{
    GROUP_ALONE_CONCURRENCY_MAX, GROUP_APPENDS_MAX, GROUP_LINGER_YIELDS as LINGER_YIELDS,
    GROUP_QUEUE_MAX,
};

/// An append waiting for a group, and where its answer goes.
#[derive(Debug)]
pub(crate) struct Request {
    appends: Vec<StreamAppend>,
    rendered: Rendered,
    ledger: Option<LedgerEntry>,
    reply: oneshot::Sender<Result<AppendOutcome, StoreError>>,
}

/// The queue the workers share.
type Queue = Arc<Mutex<mpsc::Receiver<Request>>>;

fn stopped() -> StoreError {
    StoreError::Database { reason: "the group committer stopped".into() }
}

impl PgEventStore {
    /// Queues `appends` for the next group and waits for its answer.
    pub(super) async fn append_grouped(
        &self,
        appends: Vec<StreamAppend>,
        rendered: Rendered,
        ledger: Option<LedgerEntry>,
    ) -> Result<AppendOutcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        let queue = self.group.get_or_init(|| self.start_committers());
        queue.send(Request { appends, rendered, ledger, reply }).await.map_err(|_| stopped())?;
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Spawns the workers. They hold a handle without the queue's sender, so they stop once
    /// every handle of this store is dropped.
    fn start_committers(&self) -> mpsc::Sender<Request> {
        let (sender, receiver) = mpsc::channel(GROUP_QUEUE_MAX);
        let queue: Queue = Arc::new(Mutex::new(receiver));
        for _ in 0..self.config.committers {
            let worker = self.without_committers();
            let queue = Arc::clone(&queue);
            tokio::spawn(async move { worker.commit_groups(queue).await });
        }
        sender
    }

    async fn commit_groups(self, queue: Queue) {
        let mut carried: Vec<Request> = Vec::new();
        loop {
            let Some(group) = next_group(&queue, &mut carried).await else { return };
            self.commit_group(group).await;
        }
    }

    async fn commit_group(&self, requests: Vec<Request>) {
        let (mut replies, mut appends, mut rendered, mut ledgers) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for request in requests {
            replies.push(request.reply);
            appends.push(request.appends);
            rendered.push(request.rendered);
            ledgers.push(request.ledger);
        }
        let prepared: Vec<Prepared<'_>> = appends
            .iter()
            .zip(rendered)
            .zip(&ledgers)
            .map(|((a, r), l)| Prepared::new(a, r).with_ledger(l.as_ref()))
            .collect();
        let mut results: Vec<Option<Result<AppendOutcome, StoreError>>> =
            prepared.iter().map(|_| None).collect();
        if prepared.len() > 1 {
            self.try_together(&prepared, &mut results).await;
        }
        // Every member the group settled is answered now, as its transaction has committed;
        // the others are retried on their own, a few at a time (each takes a pooled
        // connection), each answered when it settles, so one that waits (for a lock, bounded
        // by the function's lock_timeout) delays no one else.
        let mut alone = Vec::new();
        for ((reply, result), prepared) in replies.into_iter().zip(results).zip(&prepared) {
            match result {
                Some(result) => {
                    let _ = reply.send(result);
                }
                None => alone.push(async move {
                    let _ = reply.send(self.append_alone(prepared).await);
                }),
            }
        }
        let mut settling =
            futures_util::stream::iter(alone).buffer_unordered(GROUP_ALONE_CONCURRENCY_MAX);
        while settling.next().await.is_some() {}
    }

    /// Commits the members whose heads are known in one call; fills in what it settles.
    async fn try_together(
        &self,
        prepared: &[Prepared<'_>],
        results: &mut [Option<Result<AppendOutcome, StoreError>>],
    ) {
        let Ok(client) = self.client().await else { return };
        let mut members: Vec<Member<'_>> = Vec::new();
        let mut numbers = Vec::new();
        for (number, p) in prepared.iter().enumerate() {
            if let Some(heads) = self.remembered_heads(p) {
                members.push((p, heads));
                numbers.push(number);
            }
        }
        if members.len() < 2 {
            return;
        }
        tracing::trace!(members = members.len(), "group commit");
        let Ok(answers) = self.attempt_group(&client, &members, false).await else { return };
        let mut appended = false;
        for (number, answer) in numbers.into_iter().zip(answers) {
            results[number] = match answer {
                Ok(Answer::Settled(outcome)) => {
                    appended |= !outcome.duplicate;
                    Some(Ok(outcome))
                }
                Ok(Answer::Stale) => None,
                Err(error) => Some(Err(error)),
            };
        }
        if appended {
            self.notify_appended();
        }
    }
}

/// Waits for the first request, then takes what else is waiting, up to the limit. A request
/// touching a stream already in the group waits for the next one. A worker holding such
/// requests never waits for the queue: another worker may be parked on it until new work comes.
async fn next_group(queue: &Queue, carried: &mut Vec<Request>) -> Option<Vec<Request>> {
    let mut waiting = std::mem::take(carried);
    let receiver = if waiting.is_empty() {
        let mut receiver = queue.lock().await;
        waiting.push(receiver.recv().await?);
        // Writers answered by the previous group come back within microseconds: let them
        // reach the queue, so that they share this group instead of each starting a small one.
        for _ in 0..LINGER_YIELDS {
            tokio::task::yield_now().await;
        }
        Some(receiver)
    } else {
        queue.try_lock().ok()
    };
    if let Some(mut receiver) = receiver {
        while waiting.len() < GROUP_APPENDS_MAX {
            match receiver.try_recv() {
                Ok(request) => waiting.push(request),
                Err(_) => break,
            }
        }
    }
    let mut taken: HashSet<String> = HashSet::new();
    let mut group = Vec::with_capacity(waiting.len());
    for request in waiting {
        let claims = claims(&request);
        if claims.iter().any(|claim| taken.contains(claim)) {
            carried.push(request);
        } else {
            taken.extend(claims);
            group.push(request);
        }
    }
    Some(group)
}

/// What no two members of a group may share: their streams, and their ledger keys (the
/// function could not tell which of two appends with one key took it).
fn claims(request: &Request) -> Vec<String> {
    let mut claims: Vec<String> =
        request.appends.iter().map(|a| format!("s{}", a.stream_id)).collect();
    if let Some(entry) = &request.ledger {
        claims.push(format!(
            "k{}\u{0}{}\u{0}{}",
            entry.tenant,
            entry.namespace.as_str(),
            entry.operation_key
        ));
    }
    claims
}
