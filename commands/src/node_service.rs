//! The node's application service: a node agent enrolls with its bootstrap's token (or, to
//! resume, with the credential an earlier enrollment gave it), renews its session, beats,
//! and reports its operations' results and its workloads; every report after enrollment is
//! fenced by the fencing token its credential carries. Reports about a run's attempt are
//! recorded on the node's stream, which checks the token, and linked to the run's timeline
//! in the same append ([`run_follows`]).
//!
//! A node's stream belongs to its rental's tenant; a node never names a tenant, so the
//! service finds the owner from the stream. An enrollment that is refused (a spent, expired
//! or wrong token, or a node, rental or generation it was not issued for) appends nothing and
//! says nothing of why; the token itself is hashed at once and never logged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use leasehold_domain::node::{
    AgentVersion, EnrollProof, Locality, ManifestDigest, Node, NodeCommand, NodeError, NodeEvent,
    NodeFacts, NodeId, NodeIdentity, NodeOrder, OperationResult,
};
use leasehold_domain::rental::RentalId;
use leasehold_domain::run::{LaunchAnswer, Run, RunCommand, WorkloadObservation};
use leasehold_domain::values::OperationId;
use leasehold_domain::{Actor, Aggregate, RequestHash, TenantId};
use uuid::Uuid;

use crate::enrollment::{CredentialError, EnrollmentKey, NodeSession, token_hash};
use crate::{
    CommandError, CommandOutcome, CommandPipeline, CommandRequest, CommandStore, Link,
    LinkedCommand,
};

type Result<T> = std::result::Result<T, CommandError<NodeError>>;

/// What an enrollment gives the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enrollment {
    /// The node.
    pub node: NodeId,
    /// Its credential for this session: scoped to the node, rental, generation and fencing
    /// token (shown to the node once, never stored).
    pub credential: String,
    /// When the session ends unless renewed.
    pub session_expires: DateTime<Utc>,
    /// The fencing token its commands must carry.
    pub fencing_token: u64,
    /// When the node is lost unless it beats.
    pub lease_expires: DateTime<Utc>,
    /// The node identity and generation were enrolled before: a resume.
    pub duplicate: bool,
    /// What the pipeline answered.
    pub outcome: CommandOutcome,
}

/// What a node presents to enroll.
#[derive(Debug, Clone, Copy)]
pub enum Presented<'a> {
    /// Its bootstrap's enrollment token, with the rental and generation it claims.
    Token {
        /// The token (hashed at once).
        token: &'a str,
        /// The rental it claims.
        rental: RentalId,
        /// The generation it claims.
        generation: u64,
    },
    /// The credential of an earlier enrollment.
    Credential(&'a str),
}

/// Runs node commands.
#[derive(Debug, Clone)]
pub struct NodeService<S> {
    pipeline: CommandPipeline<S>,
    key: EnrollmentKey,
    /// Each node's owner and identity, which never change once invited: a report needs
    /// them before it is decided, and reading them from the stream on every heartbeat was a
    /// second round trip per beat.
    identities: Arc<Mutex<HashMap<NodeId, (TenantId, NodeIdentity)>>>,
}

/// Most node identities a service remembers (forgotten all at once past it).
const IDENTITIES_KEPT: usize = 100_000;

impl<S> NodeService<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    /// A service over `pipeline`, with the deployment's enrollment key.
    pub fn new(pipeline: CommandPipeline<S>, key: EnrollmentKey) -> Self {
        Self { pipeline, key, identities: Arc::default() }
    }

    /// The pipeline commands run through.
    pub fn pipeline(&self) -> &CommandPipeline<S> {
        &self.pipeline
    }

    /// Verifies a node credential's signature (its expiry is checked by [`Self::session`]).
    ///
    /// # Errors
    /// [`CredentialError::Invalid`].
    pub fn verify(&self, credential: &str) -> std::result::Result<NodeSession, CredentialError> {
        self.key.verify(credential)
    }

    /// A verified, unexpired session.
    ///
    /// # Errors
    /// [`CredentialError::Invalid`] when the credential is not signed here or has expired.
    pub fn session(&self, credential: &str) -> std::result::Result<NodeSession, CredentialError> {
        let session = self.key.verify(credential)?;
        if session.expires_at <= self.pipeline.clock().now() {
            return Err(CredentialError::Invalid);
        }
        Ok(session)
    }

    /// `node` enrolls. A first enrollment redeems the bootstrap's token; a later one (with
    /// the credential an earlier one gave) resumes, closing the previous session.
    ///
    /// # Errors
    /// `NotFound` (`EnrollmentRefused`, or no such node) whatever failed; the pipeline's.
    pub async fn enroll(
        &self,
        node: NodeId,
        presented: Presented<'_>,
        (agent_version, facts): (AgentVersion, NodeFacts),
    ) -> Result<Enrollment> {
        // The token this enrollment raises, when it is accepted: a first enrollment raises it
        // from 0, a resume from the credential's (which must be the node's current one).
        let mut given = 1;
        let proof = match presented {
            Presented::Token { token, rental, generation } => {
                EnrollProof::Token { token_hash: token_hash(token), rental, generation }
            }
            Presented::Credential(credential) => {
                let session = self.key.verify(credential).map_err(|_| refused())?;
                if session.node != node {
                    return Err(refused());
                }
                given = session.fencing_token.saturating_add(1);
                EnrollProof::Credential {
                    rental: session.rental,
                    generation: session.generation,
                    fencing_token: session.fencing_token,
                }
            }
        };
        let owner = self.owner(node).await.map_err(|_| refused())?;
        // Each enrollment is its own command: a retry of a lost answer enrolls again (a
        // resume), which is what a node that lost its answer must do anyway.
        let key = format!("enroll-{}", Uuid::now_v7());
        let command = NodeCommand::Enroll { proof, agent_version, facts };
        let request = self.request(owner, node, &key, command)?;
        let outcome = match self.pipeline.execute(request).await {
            // A retired node's enrollment is refused like any other: it confirms nothing.
            Err(CommandError::Refused(NodeError::Retired)) => return Err(refused()),
            other => other?,
        };
        let found = self.pipeline.state::<Node>(&node.stream_id()).await?;
        let (_, _, stored) = found.ok_or(CommandError::NotFound)?;
        if stored.status == leasehold_domain::node::NodeStatus::Retired {
            // Retired since: this session can never act.
            return Err(refused());
        }
        // Other events of the node may follow this enrollment's (an order under the token it
        // raised, its first heartbeat): only a later enrollment closes this session.
        if stored.fencing_token != given {
            let current = stored.fencing_token;
            return Err(CommandError::Refused(NodeError::Fenced { given, current }));
        }
        let identity = stored.identity.ok_or(CommandError::NotFound)?;
        let session = NodeSession {
            node,
            rental: identity.rental,
            generation: identity.generation,
            fencing_token: stored.fencing_token,
            expires_at: stored.session_expires.ok_or(CommandError::NotFound)?,
        };
        Ok(Enrollment {
            node,
            credential: self.key.credential(&session),
            session_expires: session.expires_at,
            fencing_token: stored.fencing_token,
            lease_expires: stored.lease_expires.ok_or(CommandError::NotFound)?,
            duplicate: stored.fencing_token > 1,
            outcome,
        })
    }

    /// The node renews its session: a new credential with a later expiry, the same token.
    ///
    /// # Errors
    /// `FENCED` for a closed session; the node's refusal; the pipeline's.
    pub async fn renew(&self, session: &NodeSession, key: &str) -> Result<(String, DateTime<Utc>)> {
        let command = NodeCommand::RenewSession { fencing_token: session.fencing_token };
        self.run(session, key, command, None).await?;
        let (_, _, stored) = self
            .pipeline
            .state::<Node>(&session.node.stream_id())
            .await?
            .ok_or(CommandError::NotFound)?;
        let expires_at = stored.session_expires.ok_or(CommandError::NotFound)?;
        let renewed = NodeSession { expires_at, ..*session };
        Ok((self.key.credential(&renewed), expires_at))
    }

    /// The node beats (with its facts, when it reports them).
    ///
    /// # Errors
    /// As [`Self::renew`].
    pub async fn heartbeat(
        &self,
        session: &NodeSession,
        key: &str,
        facts: Option<NodeFacts>,
    ) -> Result<CommandOutcome> {
        let said = reported(session.node, &("heartbeat", &facts));
        let command = NodeCommand::Heartbeat { fencing_token: session.fencing_token, facts };
        self.run(session, key, command, Some(said)).await
    }

    /// The node's answer to an operation.
    ///
    /// # Errors
    /// As [`Self::renew`]; a run's refusal of a launch answer it carries.
    pub async fn settle(
        &self,
        session: &NodeSession,
        key: &str,
        (operation, result): (OperationId, OperationResult),
    ) -> Result<CommandOutcome> {
        let said = reported(session.node, &("settle", operation, &result));
        let command =
            NodeCommand::Settle { operation, fencing_token: session.fencing_token, result };
        self.run(session, key, command, Some(said)).await
    }

    /// The node's account of the operations it applied, answering the lookup `answering`
    /// when it names one.
    ///
    /// # Errors
    /// As [`Self::settle`].
    pub async fn reconcile(
        &self,
        session: &NodeSession,
        key: &str,
        (applied, answering): (Vec<OperationId>, Option<OperationId>),
    ) -> Result<CommandOutcome> {
        let fencing_token = session.fencing_token;
        let command = NodeCommand::Reconcile { fencing_token, applied, answering };
        self.run(session, key, command, None).await
    }

    /// Asks `node` for its reconciliation (a `ReportApplied` order under its current fencing
    /// token), unless it is not ready to take orders: the lookup after a launch or stop whose
    /// answer was lost. The lookup's id is minted from `key`, so asking again under the same
    /// key is the same lookup.
    ///
    /// # Errors
    /// `NotFound` for no such node; the pipeline's.
    pub async fn ask_applied(&self, key: &str, node: NodeId) -> Result<Option<OperationId>> {
        let order = |_: &Node| Some((key.to_owned(), NodeOrder::ReportApplied {}));
        self.order_as(("node-lookup", "launch-reconciler"), node, order).await
    }

    /// Orders `node` to fetch and unpack `manifest_digest` ahead of a run waiting for it there
    /// (a prewarm: mercator's nodes accept preparation for a workload not yet launched), keyed
    /// by `key` and the node's session. `None` when the node cannot take orders now, already
    /// holds the image hot, or was ordered to prepare it in this session.
    ///
    /// # Errors
    /// As [`Self::ask_applied`].
    pub async fn prepare_image(
        &self,
        key: &str,
        node: NodeId,
        manifest_digest: &ManifestDigest,
    ) -> Result<Option<OperationId>> {
        let order = |stored: &Node| {
            let images = stored.facts.iter().flat_map(|facts| &facts.images);
            let hot = images
                .filter(|image| image.state == Locality::Hot)
                .any(|image| image.manifest_digest == *manifest_digest);
            let order =
                NodeOrder::PrepareImage { manifest_digest: manifest_digest.clone(), unpack: true };
            // Ordered in this session already (pending, or settled): nothing to ask again.
            let ordered = stored.operations.iter().any(|operation| {
                operation.order == order && operation.fencing_token == stored.fencing_token
            });
            (!hot && !ordered).then(|| (format!("{key}-{}", stored.fencing_token), order))
        };
        self.order_as(("node-prewarm", "run-dispatcher"), node, order).await
    }

    /// Orders of a ready `node` what `order` asks given its state (under which key), under
    /// its current fencing token, as the system actor `subject`; the operation's id is minted
    /// from `purpose` and the key, so that the order repeated is the recorded one.
    async fn order_as(
        &self,
        (purpose, subject): (&str, &str),
        node: NodeId,
        order: impl FnOnce(&Node) -> Option<(String, NodeOrder)>,
    ) -> Result<Option<OperationId>> {
        let (owner, stored) = self.owned(node).await?;
        if stored.status != leasehold_domain::node::NodeStatus::Ready {
            return Ok(None);
        }
        let Some((key, order)) = order(&stored) else { return Ok(None) };
        let operation = OperationId(crate::lease_service::minted_id(purpose, &owner, &key));
        let command = NodeCommand::Order { operation, fencing_token: stored.fencing_token, order };
        let actor = Actor { subject: subject.into(), role: "system".into() };
        let key = crate::lease_input::operation_key(Some(&key))?;
        let mut request =
            CommandRequest::<Node>::new(owner, actor, node.stream_id(), key, command, ());
        request.correlation_id = Some(Uuid::now_v7());
        self.pipeline.execute(request).await?;
        Ok(Some(operation))
    }

    /// The node's look at a run's attempt (Leasehold stamps the receipt time).
    ///
    /// # Errors
    /// As [`Self::settle`].
    pub async fn observe(
        &self,
        session: &NodeSession,
        key: &str,
        observation: WorkloadObservation,
    ) -> Result<CommandOutcome> {
        let said = reported(session.node, &("observe", &observation));
        let command =
            NodeCommand::ObserveWorkload { fencing_token: session.fencing_token, observation };
        self.run(session, key, command, Some(said)).await
    }

    /// The node's lease may have passed (the expiry reconciler's look): a ready node whose
    /// lease passed at the pipeline's clock is lost (its workloads unobserved, not dead); any
    /// other is left as it is.
    ///
    /// # Errors
    /// `NotFound` for no such node; the pipeline's.
    pub async fn expire(&self, key: &str, node: NodeId) -> Result<CommandOutcome> {
        let (owner, _) = self.identity(node).await?;
        // The system's command, in the system's key namespace (a node's own keys can never
        // meet it).
        let actor = Actor { subject: "node-expiry".into(), role: "system".into() };
        let key = crate::lease_input::operation_key(Some(key))?;
        let mut request = CommandRequest::<Node>::new(
            owner,
            actor,
            node.stream_id(),
            key,
            NodeCommand::Expire,
            (),
        );
        request.correlation_id = Some(Uuid::now_v7());
        let follows = run_follows::<S>();
        Box::pin(self.pipeline.execute_following(request, &[], &follows)).await
    }

    /// The node as stored now and its owner.
    ///
    /// # Errors
    /// [`CommandError::NotFound`] for no such node; a store failure.
    pub async fn owned(&self, node: NodeId) -> Result<(TenantId, Node)> {
        let found = self.pipeline.state::<Node>(&node.stream_id()).await?;
        let (owner, _, stored) = found.ok_or(CommandError::NotFound)?;
        Ok((owner, stored))
    }

    async fn owner(&self, node: NodeId) -> Result<TenantId> {
        Ok(self.owned(node).await?.0)
    }

    /// The node's owner and identity, remembered once read.
    async fn identity(&self, node: NodeId) -> Result<(TenantId, NodeIdentity)> {
        let remembered = self.identities.lock().expect("not poisoned").get(&node).cloned();
        if let Some(known) = remembered {
            return Ok(known);
        }
        let (owner, stored) = self.owned(node).await?;
        let identity = stored.identity.ok_or(CommandError::NotFound)?;
        let mut identities = self.identities.lock().expect("not poisoned");
        if identities.len() >= IDENTITIES_KEPT {
            identities.clear();
        }
        identities.insert(node, (owner.clone(), identity));
        Ok((owner, identity))
    }

    /// Runs a session's command. A report `said` (a heartbeat, a result, a look) is
    /// idempotent by what the node said, not by the session it said it in: a spool replayed
    /// after a re-enrollment is the recorded report, not a conflict.
    async fn run(
        &self,
        session: &NodeSession,
        key: &str,
        command: NodeCommand,
        said: Option<RequestHash>,
    ) -> Result<CommandOutcome> {
        // A session names its node, rental and generation; one that names no node, or
        // another scope, is refused as an enrollment is (a run or operation it reports that
        // does not exist is `NotFound`, the report's own fault).
        let (owner, identity) = self.identity(session.node).await.map_err(|error| match error {
            CommandError::NotFound => refused(),
            other => other,
        })?;
        let scoped = identity.rental == session.rental && identity.generation == session.generation;
        if !scoped {
            return Err(refused());
        }
        let mut request = self.request(owner, session.node, key, command)?;
        if let Some(said) = said {
            request = request.hashed_as(said);
        }
        let follows = run_follows::<S>();
        Box::pin(self.pipeline.execute_following(request, &[], &follows)).await
    }

    fn request(
        &self,
        owner: TenantId,
        node: NodeId,
        key: &str,
        command: NodeCommand,
    ) -> Result<CommandRequest<Node>> {
        let key = crate::lease_input::operation_key(Some(key))?;
        let actor = Actor { subject: format!("node:{}", node.0), role: "node".into() };
        let mut request =
            CommandRequest::<Node>::new(owner, actor, node.stream_id(), key, command, ());
        request.correlation_id = Some(Uuid::now_v7());
        Ok(request)
    }
}

/// The hash of what a node said of itself.
fn reported<T: serde::Serialize>(node: NodeId, said: &T) -> RequestHash {
    crate::caller_hash(<Node as Aggregate>::STREAM_TYPE, &node.stream_id(), said)
}

fn refused() -> CommandError<NodeError> {
    CommandError::Refused(NodeError::EnrollmentRefused)
}

/// The run commands a node's decision carries, linked on the runs' streams: a look at an
/// attempt onto its timeline, a launch's answer (applied, refused, or shown never applied by
/// the node's reconciliation) onto its attempt, a cancel's stop applied onto its run.
pub fn run_follows<S: CommandStore + Send + Sync + 'static>()
-> impl Fn(&Node, &[NodeEvent]) -> Vec<Box<dyn Link<S>>> + Send + Sync {
    move |before, events| {
        events
            .iter()
            .filter_map(|event| run_command(before, event))
            .map(|(run, command)| {
                Box::new(LinkedCommand::<Run>::new(run.stream_id(), command, ()))
                    as Box<dyn Link<S>>
            })
            .collect()
    }
}

fn run_command(
    before: &Node,
    event: &NodeEvent,
) -> Option<(leasehold_domain::run::RunId, RunCommand)> {
    let order_of = |operation: &OperationId| before.operation(*operation).map(|known| &known.order);
    match event {
        NodeEvent::NodeWorkloadObserved { observation, received_at } => Some((
            observation.run,
            RunCommand::Observe {
                node: before.identity?.node,
                observation: observation.clone(),
                received_at: *received_at,
            },
        )),
        NodeEvent::NodeOperationApplied { operation, .. } => match order_of(operation)? {
            NodeOrder::LaunchWorkload { run, attempt, .. } => Some((
                *run,
                RunCommand::LaunchAnswered { attempt: *attempt, answer: LaunchAnswer::Accepted },
            )),
            NodeOrder::StopWorkload { run, .. } => Some((*run, RunCommand::CancelAccepted)),
            _ => None,
        },
        NodeEvent::NodeOperationRefused { operation, .. }
        | NodeEvent::NodeOperationNotApplied { operation, .. }
            if matches!(order_of(operation)?, NodeOrder::StopWorkload { .. }) =>
        {
            let NodeOrder::StopWorkload { run, .. } = order_of(operation)? else { return None };
            Some((*run, RunCommand::StopFailed { operation: *operation }))
        }
        NodeEvent::NodeOperationRefused { operation, reason, .. } => match order_of(operation)? {
            NodeOrder::LaunchWorkload { run, attempt, .. } => Some((
                *run,
                RunCommand::LaunchAnswered {
                    attempt: *attempt,
                    answer: LaunchAnswer::Failed { reason: reason.clone() },
                },
            )),
            _ => None,
        },
        NodeEvent::NodeOperationNotApplied { operation, .. } => match order_of(operation)? {
            NodeOrder::LaunchWorkload { run, attempt, .. } => Some((
                *run,
                RunCommand::LaunchAnswered { attempt: *attempt, answer: LaunchAnswer::NotApplied },
            )),
            _ => None,
        },
        _ => None,
    }
}
