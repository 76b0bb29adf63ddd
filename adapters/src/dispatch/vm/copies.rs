//! A copy's boot over fuse's contract: a fork (`POST /v1/vm/{source}/snapshot`, then
//! `POST /v1/vm/{source}/fork` on the source's host) and a migration (the snapshot on the
//! source's host; the target's agent pulls it from the source's with a grant minted with the
//! source host's token, `POST /v1/artifacts/{digest}/pull`; then `POST /v1/vm` on the target
//! with the snapshot as its seed). Each step's failure is the copy's boot failure, recorded as
//! a plain boot's is; the source is never touched by one (a migration's source is destroyed
//! only once its copy booted, by the VM service).
//!
//! A seeded VM's boot (`seed_on`): its host's own copy of the seed when it has one (the
//! seed, or its tenant's artifact of the same digest), else one its agent pulls from a
//! holder's first, the same way.
//!
//! A send repeated after a lost answer takes a second snapshot (fuse's agent has no route to
//! delete one: it stays in the host's store, as its own orchestrator's do) and then finds the
//! copy there (409), which it reads back.

use leasehold_commands::CommandStore;
use leasehold_commands::vm_service::{CredentialVault, HostCatalog};
use leasehold_domain::values::OperationId;
use leasehold_domain::values::fleet::{HostId, VmId};
use leasehold_domain::vm::{Vm, VmStatus};
use leasehold_projections::ReconcileError;

use super::seeds::{SeedPlan, pull_request, seed_plan};
use super::{BootAnswer, Sent, VmDispatch, Work, retry};
use crate::hosts::AgentTarget;
use crate::hosts::wire::{
    CreateVmRequest, ForkVmRequest, SnapshotRequest, SnapshotTaken, agent_name,
};

/// The source a copy's work names.
fn source_of(work: &Work) -> Result<VmId, ReconcileError> {
    serde_json::from_value::<uuid::Uuid>(work.request["source"].clone())
        .map(VmId)
        .map_err(|error| retry("decode a copy's source", &error))
}

fn boot_request(work: &Work) -> Result<CreateVmRequest, ReconcileError> {
    serde_json::from_value(work.request["agent"].clone())
        .map_err(|error| retry("decode a boot request", &error))
}

impl<S, C, V> VmDispatch<S, C, V>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    C: HostCatalog,
    V: CredentialVault,
{
    /// A fork: snapshot the source, fork from it, on the host both are on.
    pub(super) async fn fork(
        &self,
        work: &Work,
        named: (VmId, HostId, OperationId),
        agent: &AgentTarget,
    ) -> Result<Sent, ReconcileError> {
        let source = agent_name(source_of(work)?);
        let boot = boot_request(work)?;
        let comment = format!("leasehold fork {}", boot.name);
        let answer = match self.snapshot(agent, &source, comment).await {
            Ok(taken) => {
                let fork = ForkVmRequest {
                    name: boot.name.clone(),
                    snapshot_id: taken.snapshot_id,
                    cpus: boot.cpus,
                    memory_mb: boot.memory_mb,
                    storage_gb: boot.storage_gb,
                    region: boot.region.clone(),
                };
                let forked = self.agents.fork(agent, &source, &fork).await;
                self.read_back(agent, &boot.name, forked).await
            }
            Err(answer) => answer,
        };
        self.record_boot(work, named, answer).await
    }

    /// A migration: snapshot the source on its host, move the snapshot to the target's agent
    /// (unless both are one host), boot the copy there from it.
    pub(super) async fn migrate(
        &self,
        work: &Work,
        named: (VmId, HostId, OperationId),
        target: &AgentTarget,
    ) -> Result<Sent, ReconcileError> {
        let copy = named.0;
        let source = source_of(work)?;
        let (_, stored) = match self.vms.owned(source).await {
            Ok(found) => found,
            Err(leasehold_commands::CommandError::NotFound) => {
                let gone = BootAnswer::Failed("the migration's source does not exist".into());
                return self.record_boot(work, named, gone).await;
            }
            Err(error) => return Err(retry("read a migration's source", &error)),
        };
        let Some(source_host) = still_migrating(&stored, copy) else {
            let moot = "the source is no longer migrating to this VM (destroyed meanwhile)";
            return self.record_boot(work, named, BootAnswer::Failed(moot.into())).await;
        };
        let Some(source_agent) = self.target(&source_host).await? else {
            let detail = format!("host {source_host} has no registered agent token");
            return Ok(Sent::Failed { detail });
        };
        let mut boot = boot_request(work)?;
        let comment = format!("leasehold migration to {}", boot.name);
        let answer = match self.snapshot(&source_agent, &agent_name(source), comment).await {
            Err(answer) => answer,
            Ok(taken) => {
                match self.carry(&source_agent, target, (&named.1, &source_host), taken).await {
                    Err(answer) => answer,
                    Ok(seed) => {
                        boot.seed_snapshot = Some(seed);
                        boot.image = None;
                        let created = self.agents.create(target, &boot).await;
                        self.read_back(target, &boot.name, created).await
                    }
                }
            }
        };
        self.record_boot(work, named, answer).await
    }

    /// A disk snapshot of `vm` at `agent`.
    async fn snapshot(
        &self,
        agent: &AgentTarget,
        vm: &str,
        comment: String,
    ) -> Result<SnapshotTaken, BootAnswer> {
        let request = SnapshotRequest { comment, live: false };
        self.agents.snapshot(agent, vm, &request).await.map_err(BootAnswer::of_error)
    }

    /// Makes `taken` (on the source's host) bootable on the target's: there already when both
    /// are one host, else pulled by the target's agent from the source's. Answers the id the
    /// target files it under.
    async fn carry(
        &self,
        source: &AgentTarget,
        target: &AgentTarget,
        (target_host, source_host): (&HostId, &HostId),
        taken: SnapshotTaken,
    ) -> Result<String, BootAnswer> {
        if target_host == source_host {
            return Ok(taken.snapshot_id);
        }
        self.pull(source, target, (&taken.digest, &taken.snapshot_id)).await
    }
}

impl<S, C, V> VmDispatch<S, C, V>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    C: HostCatalog,
    V: CredentialVault,
{
    /// The id `host`'s store has `seed` under, as [`seed_plan`] says: its own copy, or one its
    /// agent pulls now (from each holder in turn). `Err` inside: the boot's answer (the VM
    /// found booted already by a send whose answer was lost, or a failed pull).
    pub(super) async fn seed_on(
        &self,
        work: &Work,
        (host, agent): (&HostId, &AgentTarget),
        (seed, name): (&str, &str),
    ) -> Result<Result<String, BootAnswer>, ReconcileError> {
        let plan = seed_plan((&self.vms, &self.tokens), (&work.tenant, host), seed).await?;
        if let SeedPlan::Local(local) = plan {
            return Ok(Ok(local));
        }
        // Sent before and its answer lost, the VM may be running already (the seed gone or
        // moved on since): never fail, or pull again for, a VM that booted.
        match self.agents.get(agent, name).await {
            Ok(Some(found)) => return Ok(Err(BootAnswer::Booted(found))),
            Ok(None) => {}
            Err(error) => return Ok(Err(BootAnswer::NoAnswer(error.to_string()))),
        }
        let (digest, from) = match plan {
            SeedPlan::Pull { digest, from } => (digest, from),
            SeedPlan::Unavailable(why) => return Ok(Err(BootAnswer::Failed(why))),
            SeedPlan::Local(_) => unreachable!("answered above"),
        };
        // Failed for good only if every holder refused it for good.
        let mut answers = Vec::new();
        for pull in &from {
            match self.agents.pull_artifact(agent, &digest, pull).await {
                Ok(pulled) => return Ok(Ok(pulled.snapshot_id)),
                Err(error) => answers.push(BootAnswer::of_error(error)),
            }
        }
        let transient = answers.iter().position(|answer| matches!(answer, BootAnswer::NoAnswer(_)));
        let last =
            answers.pop().unwrap_or_else(|| BootAnswer::NoAnswer("no pull was tried".into()));
        Ok(Err(match transient {
            Some(_) if matches!(last, BootAnswer::Failed(_)) => {
                BootAnswer::NoAnswer("a holder's agent did not answer the pull".into())
            }
            _ => last,
        }))
    }

    /// `target`'s agent pulls `digest` from `peer`'s, filed under `snapshot_id`.
    async fn pull(
        &self,
        peer: &AgentTarget,
        target: &AgentTarget,
        (digest, snapshot_id): (&str, &str),
    ) -> Result<String, BootAnswer> {
        let pull = pull_request(&peer.url, &peer.token, (digest, snapshot_id))
            .map_err(|error| BootAnswer::NoAnswer(error.to_string()))?;
        let pulled = self.agents.pull_artifact(target, digest, &pull).await;
        pulled.map(|pulled| pulled.snapshot_id).map_err(BootAnswer::of_error)
    }
}

/// The source's host, while it is still migrating to `copy` (running or draining).
fn still_migrating(source: &Vm, copy: VmId) -> Option<HostId> {
    let live = matches!(source.status, VmStatus::Running | VmStatus::Draining);
    let to_copy = source.migration.as_ref().is_some_and(|migration| migration.to == copy);
    (live && to_copy).then(|| source.host().cloned()).flatten()
}
