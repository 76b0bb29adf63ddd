//! A runner node: a host running one provider backend (docker, ec2, firecracker, tart) that
//! launches runner instances for every tenant's leases (DOMAIN.md §1.8, billet's node). Its
//! stream `runner-node-<uuid>` (the id minted from its name by the command service) belongs
//! to the fleet, as hosts do.
//!
//! A registration says what the node may run (its provider, guest OSes, the trust classes its
//! backend accepts, its size) and, when the node knows it, its **inventory**: the leases whose
//! instances it runs now. Every registration is a new **node epoch**: the leases bound to the
//! node then move to a new epoch of their own (the service links `NodeReregistered` to each),
//! so whatever the node's earlier process held is fenced. An inventory reported under an
//! older node epoch is `Fenced`: it describes a process that is gone. An inventory is a list
//! whose absence and emptiness mean opposite things: none is "I do not know", an empty one
//! "I run nothing".
//!
//! | from | command | to | events | guard |
//! |---|---|---|---|---|
//! | none, registered | Register(registration, inventory?) | registered | RunnerNodeRegistered{node_epoch + 1} | — |
//! | registered | ReportInventory(node_epoch, leases) | registered | RunnerInventoryReported | node epoch (`Fenced`) |
//! | registered | Retire | retired | RunnerNodeRetired | — |
//! | registered, retired | DeadLetterOrphan(name, attempts, detail) | unchanged | RunnerOrphanDeadLettered | — (the orphan sweep gave up destroying an instance nobody is charged for, rule 35) |
//! | retired | Retire | retired | — | — |
//! | retired | Register, ReportInventory | retired | refused | `Retired` |
//! | none | ReportInventory, Retire | none | refused | `NotFound` |

mod events;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregate::{Aggregate, Context, Refusal, RefusalKind};
use crate::runner::{GuestOs, NodePolicy, ProviderKind, RunnerLeaseId, RunnerNodeName, TrustClass};

pub use events::{KIND, RunnerNodeEvent};

crate::values::uuid_type!(
    /// A runner node's id, minted from its name by the command service.
    RunnerNodeId,
    stream = "runner-node"
);

/// What a node registers as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// Its name.
    pub node: RunnerNodeName,
    /// Its provider backend.
    pub provider: ProviderKind,
    /// The guest OSes it runs.
    pub guest_os: Vec<GuestOs>,
    /// The trust classes its backend accepts.
    pub accepts: Vec<TrustClass>,
    /// Its vCPUs.
    pub vcpu: u32,
    /// Its memory in MiB.
    pub memory_mb: u64,
}

/// Where a runner node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    /// Never registered.
    None,
    /// Registered.
    Registered,
    /// Retired for good.
    Retired,
}

/// The runner node aggregate's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerNode {
    /// Where it stands.
    pub status: NodeStatus,
    /// Its last registration.
    pub registration: Option<Registration>,
    /// One more at every registration.
    pub node_epoch: u64,
    /// When it last registered.
    pub registered_at: Option<DateTime<Utc>>,
    /// When it last changed.
    pub updated_at: Option<DateTime<Utc>>,
}

/// What can be asked of a runner node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunnerNodeCommand {
    /// Registers it (again).
    Register {
        /// What it registers as.
        registration: Registration,
        /// The leases whose instances it runs, when it knows.
        inventory: Option<Vec<RunnerLeaseId>>,
    },
    /// Its inventory, from a sweep.
    ReportInventory {
        /// The registration it reports under.
        node_epoch: u64,
        /// The leases whose instances it runs.
        leases: Vec<RunnerLeaseId>,
    },
    /// Retires it (operators).
    Retire,
    /// Records that an orphan instance on the node could not be destroyed after `attempts`
    /// tries in a row (the orphan sweep's dead letter).
    DeadLetterOrphan {
        /// The instance's name at the node (`billet-<lease id>`).
        name: String,
        /// Tries in a row.
        attempts: u32,
        /// The last failure (operators only).
        detail: crate::values::OperatorDetail,
    },
}

/// Why a runner node refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunnerNodeError {
    /// Never registered.
    #[error("no such runner node")]
    NotFound,
    /// Retired.
    #[error("the runner node is retired")]
    Retired,
    /// A report of an earlier registration.
    #[error("the report names node epoch {given}; the node is at {current}")]
    Fenced {
        /// The epoch the report names.
        given: u64,
        /// The node's.
        current: u64,
    },
}

impl Refusal for RunnerNodeError {
    fn kind(&self) -> RefusalKind {
        match self {
            Self::NotFound => RefusalKind::NotFound,
            Self::Retired => RefusalKind::InvalidState,
            Self::Fenced { .. } => RefusalKind::Fenced,
        }
    }
}

impl Aggregate for RunnerNode {
    const STREAM_TYPE: &'static str = "runner-node";
    const STATE_SCHEMA: u32 = 1;
    type Command = RunnerNodeCommand;
    type Event = RunnerNodeEvent;
    type Error = RunnerNodeError;
    type Facts = ();

    fn initial() -> Self {
        Self {
            status: NodeStatus::None,
            registration: None,
            node_epoch: 0,
            registered_at: None,
            updated_at: None,
        }
    }

    fn decide(
        &self,
        command: &RunnerNodeCommand,
        ctx: &Context<()>,
    ) -> Result<Vec<RunnerNodeEvent>, RunnerNodeError> {
        use NodeStatus as S;
        use RunnerNodeCommand as C;
        use RunnerNodeEvent as E;
        let at = ctx.now;
        match (self.status, command) {
            (S::Registered | S::Retired, C::DeadLetterOrphan { name, attempts, detail }) => {
                Ok(vec![E::RunnerOrphanDeadLettered {
                    name: name.clone(),
                    attempts: *attempts,
                    detail: detail.clone(),
                    at,
                }])
            }
            (S::Retired, C::Retire) => Ok(Vec::new()),
            (S::Retired, _) => Err(RunnerNodeError::Retired),
            (_, C::Register { registration, inventory }) => Ok(vec![E::RunnerNodeRegistered {
                registration: registration.clone(),
                inventory: inventory.clone(),
                node_epoch: self.node_epoch + 1,
                at,
            }]),
            (S::None, _) => Err(RunnerNodeError::NotFound),
            (S::Registered, C::ReportInventory { node_epoch, leases }) => {
                if *node_epoch != self.node_epoch {
                    return Err(RunnerNodeError::Fenced {
                        given: *node_epoch,
                        current: self.node_epoch,
                    });
                }
                let node = self.registration.as_ref().map(|r| r.node.clone());
                Ok(vec![E::RunnerInventoryReported {
                    node: node.ok_or(RunnerNodeError::NotFound)?,
                    node_epoch: *node_epoch,
                    leases: leases.clone(),
                    at,
                }])
            }
            (S::Registered, C::Retire) => Ok(vec![E::RunnerNodeRetired { at }]),
        }
    }

    fn evolve(mut self, event: &RunnerNodeEvent) -> Self {
        match event {
            RunnerNodeEvent::RunnerNodeRegistered { registration, node_epoch, at, .. } => {
                self.status = NodeStatus::Registered;
                self.registration = Some(registration.clone());
                self.node_epoch = *node_epoch;
                self.registered_at = Some(*at);
                self.updated_at = Some(*at);
            }
            RunnerNodeEvent::RunnerInventoryReported { at, .. }
            | RunnerNodeEvent::RunnerOrphanDeadLettered { at, .. } => self.updated_at = Some(*at),
            RunnerNodeEvent::RunnerNodeRetired { at } => {
                self.status = NodeStatus::Retired;
                self.updated_at = Some(*at);
            }
        }
        self
    }

    fn is_terminal(&self) -> bool {
        self.status == NodeStatus::Retired
    }

    fn generation(&self) -> Option<u64> {
        Some(self.node_epoch)
    }
}

impl RunnerNode {
    /// Its policy now, as a lease's decision reads it (none before its first registration).
    pub fn policy(&self) -> Option<NodePolicy> {
        let registration = self.registration.as_ref()?;
        Some(NodePolicy {
            node: registration.node.clone(),
            provider: registration.provider,
            guest_os: registration.guest_os.clone(),
            accepts: registration.accepts.clone(),
            active: self.status == NodeStatus::Registered,
        })
    }
}
