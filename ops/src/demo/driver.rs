//! What `serve --demo` does with its simulators: through the server's own GraphQL API, as the
//! demo tenant, its operator and its runner node's agent would, it registers the hosts and
//! the runner node, seeds a few workloads of each kind, then keeps a slow stream of lifecycle
//! events going (one step every [`STEP_EVERY`]), so a dashboard opened on it has something
//! to show. A step that fails is logged and skipped; the demo never stops the server.

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::Context as _;
use chrono::TimeDelta;
use leasehold_gateway::{JwtSecret, Role};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::sims::{HOSTS, PROVIDER_CONNECTION, RUNNER_NODE};

/// How often the demo takes one step.
pub const STEP_EVERY: Duration = Duration::from_secs(3);

/// How long the demo's tokens last: longer than any demo runs.
const TOKEN_TTL: TimeDelta = TimeDelta::days(30);

/// Most workloads of one kind the stream keeps alive; past it, it ends the oldest.
const ALIVE_MAX: usize = 3;

/// Most steps the stream waits on one workload (a run's outcome, a rental becoming ready, a
/// runner lease's launch) before it gives up on it and starts another: a workload stuck in
/// a state the demo does not move never stops its kind.
const WAITS_MAX: u32 = 20;

const SET_WORKLOAD_LIMITS: &str =
    "mutation($input: SetWorkloadLimitsInput!) { setWorkloadLimits(input: $input) { id } }";
const SET_SNAPSHOT_QUOTA: &str =
    "mutation($input: SnapshotQuotaInput!) { setSnapshotQuota(input: $input) { id } }";
const SET_RUNNER_LIMITS: &str =
    "mutation($input: SetRunnerLimitsInput!) { setRunnerLimits(input: $input) { id } }";
const REQUEST_LEASE: &str =
    "mutation($input: RequestLeaseInput!) { requestLease(input: $input) { id } }";
const RELEASE_LEASE: &str =
    "mutation($input: LeaseOperationInput!) { deprovisionLease(input: $input) { id } }";
const REGISTER_HOST: &str =
    "mutation($input: RegisterHostInput!) { registerHost(input: $input) { id } }";
const HOSTS_QUERY: &str = "{ hosts { id state } }";
const CREATE_VM: &str = "mutation($input: CreateVmInput!) { createVm(input: $input) { id } }";
const COMPLETE_VM_TASK: &str =
    "mutation($input: VmOperationInput!) { completeVmTask(input: $input) { id } }";
const VM_STATE: &str = "query($id: ID!) { vm(id: $id) { state } }";
const CREATE_SNAPSHOT: &str =
    "mutation($input: CreateSnapshotInput!) { createSnapshot(input: $input) { id } }";
const DELETE_SNAPSHOT: &str =
    "mutation($input: SnapshotOperationInput!) { deleteSnapshot(input: $input) { id } }";
const PROVISION_RENTAL: &str =
    "mutation($input: ProvisionRentalInput!) { provisionRental(input: $input) { id } }";
const RENTAL_STATE: &str = "query($id: ID!) { rental(id: $id) { state nodeState } }";
const SUBMIT_RUN: &str = "mutation($input: SubmitRunInput!) { submitRun(input: $input) { id } }";
const RUN_OUTCOME: &str = "query($id: ID!) { run(id: $id) { outcome } }";
const REGISTER_RUNNER_NODE: &str =
    "mutation($input: RegisterRunnerNodeInput!) { registerRunnerNode(input: $input) { id } }";
const REQUEST_RUNNER: &str =
    "mutation($input: RequestRunnerLeaseInput!) { requestRunnerLease(input: $input) { id } }";
const ASSIGN_RUNNER: &str =
    "mutation($input: AssignRunnerJobInput!) { assignRunnerJob(input: $input) { id } }";
const NODE_RUNNER_LEASES: &str = "{ nodeRunnerLeases { id epoch } }";
const RUNNER_PHASE: &str = "query($id: ID!) { runnerLease(id: $id) { phase } }";
const REPORT_RUNNER_PHASE: &str = "mutation($input: RunnerReportInput!, $phase: String!) { \
     reportRunnerPhase(input: $input, phase: $phase) { id } }";
const RELEASE_RUNNER: &str =
    "mutation($input: ReleaseRunnerLeaseInput!) { releaseRunnerLease(input: $input) { id } }";

/// Who the demo acts as.
struct Tokens {
    tenant: String,
    operator: String,
    runner_node: String,
}

/// The demo's client of the server's API, and the workloads it keeps alive.
struct Driver {
    http: reqwest::Client,
    endpoint: String,
    tokens: Tokens,
    leases: VecDeque<String>,
    vms: VecDeque<String>,
    snapshots: VecDeque<String>,
    rental: Option<String>,
    run: Option<String>,
    runner: Option<String>,
    /// Steps spent waiting on the rental, its run, and the runner lease.
    waits: Waits,
    step: usize,
}

/// Steps spent waiting, by what is waited on.
#[derive(Default)]
struct Waits {
    rental: u32,
    run: u32,
    runner: u32,
}

/// One more step waited on something; whether to give up on it.
fn waited_too_long(waits: &mut u32) -> bool {
    *waits += 1;
    if *waits > WAITS_MAX {
        *waits = 0;
        return true;
    }
    false
}

/// What the hosts' simulators are, for their registration.
pub struct Hosts {
    /// Each host's id and its agent's URL.
    pub agents: Vec<(String, String)>,
    /// The token they take.
    pub token: String,
}

/// Starts the demo against the server at `base`, signing its tokens with `secret`; it stops
/// when `stopped` turns true.
///
/// # Errors
/// When a token cannot be minted.
pub fn spawn(
    base: &str,
    secret: &JwtSecret,
    hosts: Hosts,
    mut stopped: watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let tenant = leasehold_domain::TenantId::parse(crate::serve::DEMO_TENANT)
        .map_err(|error| anyhow::anyhow!("{error}"))?;
    let node = leasehold_domain::runner::RunnerNodeName::parse("demo", RUNNER_NODE)
        .map_err(|error| anyhow::anyhow!("{error}"))?;
    let tokens = Tokens {
        tenant: secret.mint_for("demo-user", Role::Tenant, Some(&tenant), None, TOKEN_TTL),
        operator: secret.mint_for("demo-operator", Role::Operator, None, None, TOKEN_TTL),
        runner_node: secret.mint_runner_node_agent("demo-runner", &node, TOKEN_TTL),
    };
    let mut driver = Driver {
        http: reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?,
        endpoint: format!("{base}/graphql"),
        tokens,
        leases: VecDeque::new(),
        vms: VecDeque::new(),
        snapshots: VecDeque::new(),
        rental: None,
        run: None,
        runner: None,
        waits: Waits::default(),
        step: 0,
    };
    Ok(tokio::spawn(async move {
        tokio::select! {
            () = driver.run(hosts) => {}
            _ = stopped.wait_for(|stopped| *stopped) => {}
        }
    }))
}

/// A key no earlier request of this process or another used.
fn key(what: &str) -> String {
    format!("demo-{what}-{}", uuid::Uuid::now_v7().simple())
}

impl Driver {
    async fn run(&mut self, hosts: Hosts) {
        if let Err(error) = self.set_limits().await {
            tracing::warn!(error = format!("{error:#}"), "demo: setting limits failed");
        }
        if let Err(error) = self.set_up(&hosts).await {
            tracing::warn!(error = format!("{error:#}"), "demo: setting up failed");
        }
        let mut pace = tokio::time::interval(STEP_EVERY);
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            pace.tick().await;
            if let Err(error) = self.take_step().await {
                tracing::info!(error = format!("{error:#}"), "demo: a step was skipped");
            }
        }
    }

    /// Runs `query` as `token`; its data, or its first error with its code.
    async fn call(&self, token: &str, query: &str, variables: Value) -> anyhow::Result<Value> {
        let answer: Value = self
            .http
            .post(&self.endpoint)
            .bearer_auth(token)
            .json(&json!({ "query": query, "variables": variables }))
            .send()
            .await
            .context("the server did not answer")?
            .json()
            .await
            .context("the server's answer is not JSON")?;
        if let Some(error) = answer["errors"].get(0) {
            anyhow::bail!("{} ({})", error["message"], error["extensions"]["code"]);
        }
        Ok(answer["data"].clone())
    }

    /// Limits on the demo tenant's workloads, so that its quota usage shows against them.
    async fn set_limits(&self) -> anyhow::Result<()> {
        let tenant = crate::serve::DEMO_TENANT;
        let lease = json!([{ "resource": "count", "max": 10 }, { "resource": "sku.gpu.h100.1x", "max": 8 }]);
        let vm = json!([
            { "resource": "count", "max": 10 }, { "resource": "cpus", "max": 32 },
            { "resource": "ram_mb", "max": 65_536 },
        ]);
        let rental = json!([{ "resource": "count", "max": 4 }, { "resource": "gpus", "max": 4 }]);
        let kinds = [("lease", lease), ("vm", vm), ("rental", rental)];
        for (kind, limits) in kinds {
            let input = json!({ "input": {
                "tenantId": tenant, "kind": kind, "limits": limits, "operationKey": key("limits"),
            }});
            self.call(&self.tokens.operator, SET_WORKLOAD_LIMITS, input)
                .await
                .with_context(|| format!("setWorkloadLimits {kind}"))?;
        }
        let snapshots = json!({ "input": {
            "tenantId": tenant, "maxCount": 10, "maxBytes": 0, "operationKey": key("snapshot-quota"),
        }});
        self.call(&self.tokens.operator, SET_SNAPSHOT_QUOTA, snapshots)
            .await
            .context("setSnapshotQuota")?;
        let runners = json!({ "input": {
            "tenantId": tenant, "vcpu": 16, "memoryMb": 32_768, "macosSlots": 0,
            "tiers": [{ "tier": "linux-4x", "max": 2 }], "operationKey": key("runner-limits"),
        }});
        self.call(&self.tokens.operator, SET_RUNNER_LIMITS, runners)
            .await
            .context("setRunnerLimits")?;
        Ok(())
    }

    /// The hosts and the runner node registered, and a first workload of every kind.
    async fn set_up(&mut self, hosts: &Hosts) -> anyhow::Result<()> {
        for (host, url) in &hosts.agents {
            let input = json!({ "input": {
                "operationKey": key("host"), "hostId": host, "url": url, "token": hosts.token,
                "cpus": 32, "ramMb": 131_072, "storageGb": 2_000, "vmCount": 8,
                "labels": [{ "key": "zone", "value": "demo" }],
            }});
            self.call(&self.tokens.operator, REGISTER_HOST, input).await.context("registerHost")?;
        }
        let node = json!({ "input": {
            "operationKey": key("runner-node"), "provider": "docker", "guestOs": ["linux"],
            "accepts": ["trusted", "untrusted"], "vcpu": 64, "memoryMb": 262_144,
        }});
        self.call(&self.tokens.runner_node, REGISTER_RUNNER_NODE, node)
            .await
            .context("registerRunnerNode")?;
        self.request_lease().await?;
        self.request_lease().await?;
        self.wait_for_hosts().await?;
        self.create_vm().await?;
        self.create_vm().await?;
        self.provision_rental().await?;
        self.request_runner().await
    }

    /// Waits (bounded) until placement can see the hosts.
    async fn wait_for_hosts(&self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while tokio::time::Instant::now() < deadline {
            let data = self.call(&self.tokens.operator, HOSTS_QUERY, json!({})).await?;
            let seen = data["hosts"].as_array().map_or(0, |hosts| {
                hosts
                    .iter()
                    .filter(|host| HOSTS.contains(&host["id"].as_str().unwrap_or("")))
                    .count()
            });
            if seen == HOSTS.len() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        anyhow::bail!("the hosts were not projected within a minute")
    }

    /// One step of the stream, in turn: leases, VMs, snapshots, runs, runner leases.
    async fn take_step(&mut self) -> anyhow::Result<()> {
        self.step += 1;
        match self.step % 5 {
            0 => self.cycle_lease().await,
            1 => self.cycle_vm().await,
            2 => self.cycle_snapshot().await,
            3 => self.cycle_run().await,
            _ => self.cycle_runner().await,
        }
    }

    async fn request_lease(&mut self) -> anyhow::Result<()> {
        let input = json!({ "input": {
            "operationKey": key("lease"), "providerId": "00000000-0000-0000-0000-000000000007",
            "items": [{ "sku": "gpu.h100.1x", "quantity": 1 }], "payload": "image: trainer:1",
        }});
        let data = self.call(&self.tokens.tenant, REQUEST_LEASE, input).await?;
        self.leases.push_back(id_of(&data["requestLease"])?);
        Ok(())
    }

    /// A new lease, or the oldest released when enough are alive.
    async fn cycle_lease(&mut self) -> anyhow::Result<()> {
        if self.leases.len() < ALIVE_MAX {
            return self.request_lease().await;
        }
        let lease = self.leases.pop_front().expect("more than none");
        let input = json!({ "input": { "leaseId": lease, "operationKey": key("release") } });
        self.call(&self.tokens.tenant, RELEASE_LEASE, input).await.map(|_| ())
    }

    async fn create_vm(&mut self) -> anyhow::Result<()> {
        let input = json!({ "input": {
            "operationKey": key("vm"), "taskId": key("task"), "cpus": 2, "ramMb": 4096,
            "storageGb": 20,
        }});
        let data = self.call(&self.tokens.tenant, CREATE_VM, input).await?;
        self.vms.push_back(id_of(&data["createVm"])?);
        Ok(())
    }

    /// A new VM, or the oldest one's task completed (which destroys it) when enough are
    /// alive.
    async fn cycle_vm(&mut self) -> anyhow::Result<()> {
        if self.vms.len() < ALIVE_MAX {
            return self.create_vm().await;
        }
        let vm = self.vms.pop_front().expect("more than none");
        let input = json!({ "input": { "vmId": vm, "operationKey": key("complete") } });
        self.call(&self.tokens.tenant, COMPLETE_VM_TASK, input).await.map(|_| ())
    }

    /// A snapshot of the newest running VM, or the oldest snapshot deleted when enough are
    /// kept.
    async fn cycle_snapshot(&mut self) -> anyhow::Result<()> {
        if self.snapshots.len() >= ALIVE_MAX {
            let snapshot = self.snapshots.pop_front().expect("more than none");
            let input =
                json!({ "input": { "snapshotId": snapshot, "operationKey": key("delete") } });
            return self.call(&self.tokens.tenant, DELETE_SNAPSHOT, input).await.map(|_| ());
        }
        for vm in self.vms.iter().rev() {
            let data = self.call(&self.tokens.tenant, VM_STATE, json!({ "id": vm })).await?;
            if data["vm"]["state"] == "running" {
                let input = json!({ "input": { "operationKey": key("snapshot"), "vmId": vm, "kind": "DISK" } });
                let data = self.call(&self.tokens.tenant, CREATE_SNAPSHOT, input).await?;
                self.snapshots.push_back(id_of(&data["createSnapshot"])?);
                return Ok(());
            }
        }
        Ok(())
    }

    async fn provision_rental(&mut self) -> anyhow::Result<()> {
        let input = json!({ "input": {
            "operationKey": key("rental"), "connectionId": PROVIDER_CONNECTION,
            "offerId": "gpu-1x",
            "resources": { "cpuMillis": 8_000, "memoryMb": 32_768, "diskGb": 200, "gpus": 1 },
            "interruptible": false, "maxLifetimeSeconds": 7 * 24 * 3_600,
        }});
        let data = self.call(&self.tokens.tenant, PROVISION_RENTAL, input).await?;
        self.rental = Some(id_of(&data["provisionRental"])?);
        Ok(())
    }

    /// A run on the rental once its node is ready and its last run finished. A rental that
    /// ended, or never gets ready, is left for a new one.
    async fn cycle_run(&mut self) -> anyhow::Result<()> {
        let Some(rental) = self.rental.clone() else {
            return self.provision_rental().await;
        };
        if let Some(run) = &self.run {
            let data = self.call(&self.tokens.tenant, RUN_OUTCOME, json!({ "id": run })).await?;
            if data["run"]["outcome"].is_null() && !waited_too_long(&mut self.waits.run) {
                return Ok(());
            }
            self.run = None;
            self.waits.run = 0;
        }
        let data = self.call(&self.tokens.tenant, RENTAL_STATE, json!({ "id": rental })).await?;
        let state = data["rental"]["state"].as_str().unwrap_or_default();
        if matches!(state, "terminated" | "failed") {
            self.rental = None;
            return Ok(());
        }
        if state != "active" || data["rental"]["nodeState"] != "ready" {
            if waited_too_long(&mut self.waits.rental) {
                self.rental = None;
            }
            return Ok(());
        }
        self.waits.rental = 0;
        let digest = format!("sha256:{}", "c".repeat(64));
        let input = json!({ "input": {
            "operationKey": key("run"), "rentalId": rental, "manifestDigest": digest,
            "maxRuntimeSeconds": 600,
        }});
        let data = self.call(&self.tokens.tenant, SUBMIT_RUN, input).await?;
        self.run = Some(id_of(&data["submitRun"])?);
        Ok(())
    }

    async fn request_runner(&mut self) -> anyhow::Result<()> {
        let input = json!({ "input": {
            "operationKey": key("runner"), "tier": "linux-4x", "trust": "trusted",
            "guestOs": "linux", "resources": { "vcpu": 4, "memoryMb": 8_192 },
            "providers": ["docker"], "command": ["./run.sh", "--once"], "ttlSeconds": 600,
        }});
        let data = self.call(&self.tokens.tenant, REQUEST_RUNNER, input).await?;
        let lease = id_of(&data["requestRunnerLease"])?;
        let assign = json!({ "input": {
            "leaseId": lease, "operationKey": key("assign"),
            "requestId": uuid::Uuid::now_v7().to_string(), "runId": 1,
        }});
        self.call(&self.tokens.tenant, ASSIGN_RUNNER, assign).await?;
        self.runner = Some(lease);
        Ok(())
    }

    /// The runner lease's life, one phase a step, as its runner would report it: launched,
    /// online, busy, then released and a new one requested. One that ended, or waits too
    /// long for its launch, is left for a new one.
    async fn cycle_runner(&mut self) -> anyhow::Result<()> {
        let Some(lease) = self.runner.clone() else {
            return self.request_runner().await;
        };
        let data = self.call(&self.tokens.tenant, RUNNER_PHASE, json!({ "id": lease })).await?;
        let next = match data["runnerLease"]["phase"].as_str().unwrap_or_default() {
            "launching" => "online",
            "online" => "busy",
            "busy" => return self.release_runner(lease).await,
            "done" | "failed" | "quarantine" | "teardown" | "custody" => {
                self.runner = None;
                return Ok(());
            }
            // Not launched yet: the dispatcher has it.
            _ if waited_too_long(&mut self.waits.runner) => {
                return self.release_runner(lease).await;
            }
            _ => return Ok(()),
        };
        self.waits.runner = 0;
        let data = self.call(&self.tokens.runner_node, NODE_RUNNER_LEASES, json!({})).await?;
        let epoch = data["nodeRunnerLeases"]
            .as_array()
            .and_then(|leases| leases.iter().find(|seen| seen["id"] == lease.as_str()))
            .map(|seen| seen["epoch"].clone())
            .context("the launched lease on its node")?;
        let input = json!({
            "input": { "leaseId": lease, "epoch": epoch, "operationKey": key(next) },
            "phase": next,
        });
        self.call(&self.tokens.runner_node, REPORT_RUNNER_PHASE, input).await.map(|_| ())
    }

    /// Releases the runner lease (its instance is torn down); the next step requests another.
    async fn release_runner(&mut self, lease: String) -> anyhow::Result<()> {
        self.runner = None;
        self.waits.runner = 0;
        let input = json!({ "input": { "leaseId": lease, "operationKey": key("done"), "outcome": "done" } });
        self.call(&self.tokens.tenant, RELEASE_RUNNER, input).await.map(|_| ())
    }
}

/// The `id` of a mutation's result.
fn id_of(result: &Value) -> anyhow::Result<String> {
    result["id"].as_str().map(ToString::to_string).context("a result with an id")
}
