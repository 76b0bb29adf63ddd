//! The host's application service: operators register, cordon, drain, uncordon and remove
//! hosts; a host's agent beats its heart. Every host stream belongs to the fleet tenant
//! ([`fleet_tenant`]), whoever runs the command: no tenant owns a host.

use leasehold_domain::host::{Host, HostCommand, HostError, HostSpec};
use leasehold_domain::values::fleet::{HostId, fleet_tenant};
use leasehold_domain::{Actor, KeyNamespace};

use crate::{CommandError, CommandOutcome, CommandPipeline, CommandRequest, CommandStore};

type Result<T> = std::result::Result<T, CommandError<HostError>>;

/// Who runs a host command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCaller {
    /// Who, for the events' metadata.
    pub actor: Actor,
    /// Whose operation keys these are (default: the actor's own namespace).
    pub namespace: Option<KeyNamespace>,
}

/// Runs host commands.
#[derive(Debug, Clone)]
pub struct HostService<S> {
    pipeline: CommandPipeline<S>,
}

impl<S: CommandStore + Clone + Send + Sync + 'static> HostService<S> {
    /// A service over `pipeline`.
    pub fn new(pipeline: CommandPipeline<S>) -> Self {
        Self { pipeline }
    }

    /// The pipeline commands run through.
    pub fn pipeline(&self) -> &CommandPipeline<S> {
        &self.pipeline
    }

    /// An operator registers `host`, or refreshes what it declares.
    ///
    /// # Errors
    /// [`CommandError`]: the host's refusal, or the pipeline's.
    pub async fn register(
        &self,
        caller: &HostCaller,
        key: &str,
        host: &HostId,
        spec: HostSpec,
    ) -> Result<CommandOutcome> {
        let command = HostCommand::Register { id: host.clone(), spec };
        self.run(caller, key, host, command).await
    }

    /// Any other command on `host` (an operator's cordon, drain, uncordon or remove; its
    /// agent's heartbeat).
    ///
    /// # Errors
    /// [`CommandError`]: the host's refusal, or the pipeline's.
    pub async fn run(
        &self,
        caller: &HostCaller,
        key: &str,
        host: &HostId,
        command: HostCommand,
    ) -> Result<CommandOutcome> {
        let operation_key = crate::lease_input::operation_key(Some(key))?;
        let mut request = CommandRequest::<Host>::new(
            fleet_tenant(),
            caller.actor.clone(),
            host.stream_id(),
            operation_key,
            command,
            (),
        );
        if let Some(namespace) = &caller.namespace {
            request.namespace = namespace.clone();
        }
        self.pipeline.execute(request).await
    }

    /// The host as stored now, if it was ever registered.
    ///
    /// # Errors
    /// A store failure.
    pub async fn host(&self, host: &HostId) -> Result<Option<Host>> {
        let found = self.pipeline.state::<Host>(&host.stream_id()).await?;
        Ok(found.map(|(_, _, host)| host))
    }
}
