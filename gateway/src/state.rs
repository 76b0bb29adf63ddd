//! What every request shares: the store, the command pipeline, the secrets, the settings and
//! a view of how far the projections have got.

use std::sync::Arc;
use std::time::Duration;

use leasehold_adapters::{PgEventStore, PgReadModels};
use leasehold_commands::enrollment::EnrollmentKey;
use leasehold_commands::lease_input::LeaseInputLimits;
use leasehold_commands::lease_service::LeaseService;
use leasehold_commands::node_service::NodeService;
use leasehold_commands::rental_service::{Connections, RentalConfig, RentalService};
use leasehold_commands::run_service::RunService;
use leasehold_commands::runner_service::RunnerService;
use leasehold_commands::{CommandPipeline, PipelineConfig};
use leasehold_domain::lease::BackendName;
use leasehold_domain::{Cursor, EventStore as _};
use tokio::sync::watch;

use crate::auth::JwtSecret;
use crate::callbacks::CallbackSecret;
use crate::cursor::CursorKey;
use crate::errors::{ApiError, Code};
use crate::live::hub::Hub;
use crate::metrics::Metrics;
use crate::reads::Reads;

/// How long VM placement keeps its picture of the fleet (the host catalog's answer, with this
/// process's own appends always over it): a create refused for want of a host is placed again
/// over a fresh read first, and a host another process filled meanwhile refuses its Reserve.
pub const VM_CATALOG_MAX_AGE: std::time::Duration = std::time::Duration::from_millis(250);

/// How often a wait for the projections re-reads the checkpoint when no in-process projector
/// publishes it (and a wait for the log, its head).
const CHECKPOINT_POLL: Duration = Duration::from_millis(20);

/// The gateway's settings.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// The backend every SKU routes to (none: every lease request is refused as unroutable).
    pub backend: Option<BackendName>,
    /// Limits on lease input.
    pub lease_limits: LeaseInputLimits,
    /// Longest a read-your-writes query waits for the projections before answering `STALE`.
    pub consistency_wait: Duration,
    /// Largest request body accepted, in bytes.
    pub body_bytes_max: usize,
    /// Deepest query accepted.
    pub depth_max: usize,
    /// Most complex query accepted (lists count `first` times their fields).
    pub complexity_max: usize,
    /// Most operations in one batched request.
    pub batch_max: usize,
    /// How often the live hub looks for other processes' appends.
    pub live_poll: Duration,
    /// How long a WebSocket may take to send `connection_init` (then 4408).
    pub ws_init_wait: Duration,
    /// How often the server pings an idle WebSocket.
    pub ws_ping_every: Duration,
    /// How long one message may take to reach a client before its socket is closed (1013)
    /// and it must resume from its last cursor.
    pub ws_send_wait: Duration,
    /// Most subscriptions one socket may hold.
    pub ws_subscriptions_max: usize,
    /// How long a released lease's data is kept after the lease was created (its
    /// `retained_until`); `None`: no deadline.
    pub retention_max_age: Option<chrono::TimeDelta>,
    /// How VMs are placed among the hosts that fit.
    pub placement_policy: leasehold_domain::vm::PlacementPolicy,
    /// Snapshots' default retention and GC's dead-letter threshold.
    pub snapshots: leasehold_commands::snapshot_service::SnapshotConfig,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            backend: None,
            lease_limits: LeaseInputLimits::default(),
            consistency_wait: Duration::from_secs(5),
            body_bytes_max: 1024 * 1024,
            depth_max: 10,
            complexity_max: 2_000,
            batch_max: 5,
            live_poll: Duration::from_millis(200),
            ws_init_wait: Duration::from_secs(3),
            ws_ping_every: Duration::from_secs(15),
            retention_max_age: None,
            ws_send_wait: Duration::from_secs(10),
            ws_subscriptions_max: 100,
            placement_policy: leasehold_domain::vm::PlacementPolicy::Spread,
            snapshots: leasehold_commands::snapshot_service::SnapshotConfig::default(),
        }
    }
}

/// The VM service as the gateway runs it: placement over the host projection's catalog,
/// credentials in the sealed vault.
pub type VmService = leasehold_commands::vm_service::VmService<
    PgEventStore,
    leasehold_adapters::PgHostCatalog,
    leasehold_adapters::vault::PgCredentialVault,
>;

/// The snapshot service as the gateway runs it: listing facts from the snapshot projection.
pub type SnapshotService =
    leasehold_commands::snapshot_service::SnapshotService<PgEventStore, PgReadModels>;

/// The snapshot service over `pipeline`, its listing facts from the snapshot projection, agents'
/// failure texts redacted of the VM's credentials by `vms`.
fn snapshots_over(
    pipeline: &CommandPipeline<PgEventStore>,
    store: &PgEventStore,
    (config, vms): (leasehold_commands::snapshot_service::SnapshotConfig, &VmService),
) -> SnapshotService {
    SnapshotService::new(pipeline.clone(), PgReadModels::of(store), config)
        .with_redactor(Arc::new(vms.clone()))
}

/// The services of rented capacity.
#[derive(Debug, Clone)]
pub struct Rented {
    /// Rentals: tenants' provisions, stops, resumes and terminations, providers' reports.
    pub rentals: RentalService<PgEventStore>,
    /// Nodes: enrollments and fenced reports.
    pub nodes: NodeService<PgEventStore>,
    /// Runs: tenants' submissions and cancels, the run dispatcher's attempts.
    pub runs: RunService<PgEventStore>,
    /// Runner leases: tenants' requests, assignments and releases; runner nodes'
    /// registrations and reports; the runner dispatcher's launches; operators' forces and
    /// limits.
    pub runners: RunnerService<PgEventStore>,
}

impl Rented {
    /// The services over `pipeline`, renting through `config`'s connections.
    pub fn new(pipeline: &CommandPipeline<PgEventStore>, config: RentalConfig) -> Self {
        Self {
            nodes: NodeService::new(pipeline.clone(), config.key.clone()),
            runs: RunService::new(pipeline.clone()),
            runners: RunnerService::new(pipeline.clone()),
            rentals: RentalService::new(pipeline.clone(), config),
        }
    }
}

/// Until [`AppState::with_rentals`] names the connections and the enrollment key: none, and a
/// key derived from the JWT secret (its own domain), so a gateway without rental providers
/// still answers rental queries and refuses provisions as naming no connection.
fn default_rentals(jwt_secret: &[u8]) -> RentalConfig {
    use sha2::Digest as _;
    let mut derived = sha2::Sha256::new();
    derived.update(b"leasehold/default-enrollment-key\0");
    derived.update(jwt_secret.trim_ascii());
    let key = EnrollmentKey::new(&derived.finalize()).expect("32 bytes");
    RentalConfig {
        connections: Connections::default(),
        control_plane_url: "http://127.0.0.1:8080".into(),
        agent_version: NODE_AGENT_VERSION.into(),
        key,
    }
}

/// The node agent build the bootstraps Leasehold hands providers pin.
pub const NODE_AGENT_VERSION: &str = "1";

/// Shared by every request; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) store: PgEventStore,
    /// The read models' queries (and the projections' progress).
    pub(crate) read_models: PgReadModels,
    /// Every lease command runs through it (resolvers and callbacks alike).
    pub(crate) leases: LeaseService<PgEventStore>,
    /// Every VM command runs through it, over the same pipeline.
    pub(crate) vms: VmService,
    /// The vault VM credentials and host tokens are sealed in (the VM service's own).
    pub(crate) vault: leasehold_adapters::vault::PgCredentialVault,
    /// Every host command runs through it, over the same pipeline.
    pub(crate) hosts: leasehold_commands::host_service::HostService<PgEventStore>,
    /// Every snapshot command runs through it, over the same pipeline.
    pub(crate) snapshots: SnapshotService,
    /// Every rental, node and run command runs through these, over the same pipeline.
    pub(crate) rented: Rented,
    /// Operators' limits on tenants' workload quotas, over the same pipeline.
    pub(crate) quotas: leasehold_commands::quota::WorkloadQuotas<PgEventStore>,
    pub(crate) jwt: JwtSecret,
    pub(crate) cursors: CursorKey,
    pub(crate) config: GatewayConfig,
    pub(crate) projections: ProjectionProgress,
    pub(crate) hub: Hub,
    /// Renders each live event once per (scope, selection) for the sockets that share it.
    pub(crate) renderer: crate::ws::render::Renderer,
    /// Turns true when the server stops: sockets close with 1012 and the hub stops.
    pub(crate) stopping: watch::Sender<bool>,
    /// Open WebSockets.
    pub(crate) sockets: Gauge,
    /// Verifies backend callbacks; `None` disables them.
    pub(crate) callback_secret: Option<CallbackSecret>,
    /// Each backend's own secret, by name: a callback on a lease placed on one of these is
    /// verified with its backend's secret, never with another's.
    pub(crate) backend_secrets: std::collections::HashMap<String, CallbackSecret>,
    /// Where manifests are kept sealed for the dispatcher (`None`: they are not kept).
    pub(crate) manifests: Option<leasehold_adapters::dispatch::ManifestVault>,
    /// The backends file's routing, whose backends `/metrics` reports on.
    pub(crate) router: Option<Arc<leasehold_adapters::backends::Router>>,
    /// The callback URLs handed to backends that subscribe to their work (`None`: the `work`
    /// subscription is unavailable).
    pub(crate) callback_urls: Option<leasehold_adapters::dispatch::CallbackUrls>,
    /// Starts projection rebuilds (`None`: this server runs no projections).
    pub(crate) rebuilds: Option<Arc<dyn crate::schema::projections::Rebuilds>>,
    /// Operations running on WebSockets.
    pub(crate) subscriptions: Gauge,
    /// Request counts and latencies.
    pub(crate) metrics: Metrics,
}

/// A count of things open now (WebSockets), which can be awaited to reach zero.
#[derive(Debug, Clone, Default)]
pub(crate) struct Gauge(Arc<watch::Sender<usize>>);

/// Counts one open thing until dropped.
#[derive(Debug)]
pub(crate) struct Opened(Gauge);

impl Gauge {
    /// Counts one more until the guard is dropped.
    pub(crate) fn open(&self) -> Opened {
        self.0.send_modify(|open| *open += 1);
        Opened(self.clone())
    }

    /// How many are open.
    pub(crate) fn count(&self) -> usize {
        *self.0.borrow()
    }

    /// Returns once none is open.
    pub(crate) async fn closed(&self) {
        let _ = self.0.subscribe().wait_for(|open| *open == 0).await;
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        self.0.0.send_modify(|open| *open -= 1);
    }
}

impl AppState {
    /// The state over `store`. `jwt_secret` verifies tokens and (through a derived key) signs
    /// cursors. Starts the live hub, so it must be called inside a Tokio runtime.
    pub fn new(
        store: PgEventStore,
        jwt_secret: &[u8],
        config: GatewayConfig,
        projections: ProjectionProgress,
    ) -> Result<Self, crate::auth::AuthError> {
        let jwt = JwtSecret::new(jwt_secret)?;
        let pipeline = CommandPipeline::new(store.clone(), PipelineConfig::default());
        let cursors = CursorKey::derive(jwt_secret.trim_ascii());
        let (stopping, stopped) = watch::channel(false);
        let hub = Hub::start(store.clone(), config.live_poll, stopped);
        let catalog = leasehold_adapters::PgHostCatalog::new(store.clone());
        // Until `with_vm_credentials_key` names the vault's own key, one derived from the JWT
        // secret (a domain of its own: the vault derives its AES key from it again).
        let vault = leasehold_adapters::vault::PgCredentialVault::new(store.clone(), jwt_secret);
        let sockets = Gauge::default();
        let vms =
            VmService::new(pipeline.clone(), (catalog, vault.clone()), config.placement_policy)
                .with_catalog_max_age(VM_CATALOG_MAX_AGE);
        let snapshots = snapshots_over(&pipeline, &store, (config.snapshots, &vms));
        let rented = Rented::new(&pipeline, default_rentals(jwt_secret));
        let inner = Inner {
            rented,
            quotas: leasehold_commands::quota::WorkloadQuotas::new(pipeline.clone()),
            read_models: PgReadModels::of(&store),
            store,
            vms,
            vault,
            hosts: leasehold_commands::host_service::HostService::new(pipeline.clone()),
            snapshots,
            leases: LeaseService::new(pipeline, config.backend.clone(), config.lease_limits)
                .with_retention_max_age(config.retention_max_age),
            jwt,
            renderer: crate::ws::render::Renderer::new(cursors.clone()),
            cursors,
            config,
            projections,
            hub,
            stopping,
            sockets,
            callback_secret: None,
            backend_secrets: std::collections::HashMap::new(),
            router: None,
            callback_urls: None,
            manifests: None,
            rebuilds: None,
            subscriptions: Gauge::default(),
            metrics: Metrics::default(),
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The command pipeline the gateway's commands go through. The process's reconcilers share
    /// it (a clone shares its state cache), so a command decided on a lease another part of
    /// the process just wrote needs no read of it.
    pub fn pipeline(&self) -> &CommandPipeline<PgEventStore> {
        self.inner.leases.pipeline()
    }

    /// Lets operators start projection rebuilds through `rebuildProjection`. Call before
    /// [`crate::app`].
    #[must_use]
    pub fn with_rebuilds(
        mut self,
        rebuilds: Arc<dyn crate::schema::projections::Rebuilds>,
    ) -> Self {
        Arc::get_mut(&mut self.inner).expect("called before the app is built").rebuilds =
            Some(rebuilds);
        self
    }

    /// Seals VMs' credentials under a key derived from `secret` (kept outside the database,
    /// apart from the JWT secret). Call before [`crate::app`].
    #[must_use]
    pub fn with_vm_credentials_key(mut self, secret: &[u8]) -> Self {
        let inner = Arc::get_mut(&mut self.inner).expect("configured before sharing");
        let vault = leasehold_adapters::vault::PgCredentialVault::new(inner.store.clone(), secret);
        let catalog = leasehold_adapters::PgHostCatalog::new(inner.store.clone());
        let pipeline = inner.leases.pipeline().clone();
        inner.vms = VmService::new(
            pipeline.clone(),
            (catalog, vault.clone()),
            inner.config.placement_policy,
        )
        .with_catalog_max_age(VM_CATALOG_MAX_AGE);
        inner.snapshots =
            snapshots_over(&pipeline, &inner.store, (inner.config.snapshots, &inner.vms));
        inner.vault = vault;
        self
    }

    /// The VM service the gateway's VM commands go through (the VM dispatcher shares it).
    pub fn vms(&self) -> &VmService {
        &self.inner.vms
    }

    /// The snapshot service the gateway's snapshot commands go through (the snapshot
    /// reconcilers share it).
    pub fn snapshots(&self) -> &SnapshotService {
        &self.inner.snapshots
    }

    /// Rents through `config`'s provider connections, with its enrollment key. Call before
    /// [`crate::app`].
    #[must_use]
    pub fn with_rentals(mut self, config: RentalConfig) -> Self {
        let inner = Arc::get_mut(&mut self.inner).expect("configured before sharing");
        inner.rented = Rented::new(inner.leases.pipeline(), config);
        self
    }

    /// The services of rented capacity (the rented reconcilers share them).
    pub fn rented(&self) -> &Rented {
        &self.inner.rented
    }

    /// The vault VM credentials and host agents' tokens are sealed in.
    pub fn vault(&self) -> &leasehold_adapters::vault::PgCredentialVault {
        &self.inner.vault
    }

    /// Enables backend callbacks, verified with `secret`. Call before [`crate::app`].
    ///
    /// # Errors
    /// When the secret is shorter than 32 bytes.
    pub fn with_callback_secret(mut self, secret: &[u8]) -> Result<Self, crate::auth::AuthError> {
        let secret = CallbackSecret::new(secret)?;
        Arc::get_mut(&mut self.inner).expect("configured before sharing").callback_secret =
            Some(secret);
        Ok(self)
    }

    /// Verifies callbacks on leases placed on each of these backends with that backend's own
    /// secret (the backends file's). Call before [`crate::app`].
    #[must_use]
    pub fn with_backend_secrets(
        mut self,
        secrets: impl IntoIterator<Item = (String, leasehold_adapters::backends::SigningSecret)>,
    ) -> Self {
        let inner = Arc::get_mut(&mut self.inner).expect("configured before sharing");
        inner.backend_secrets =
            secrets.into_iter().map(|(name, secret)| (name, CallbackSecret::of(secret))).collect();
        self
    }

    /// Places new leases where `router` says (the backends file's routing) instead of on the
    /// configured backend. Call before [`crate::app`].
    #[must_use]
    pub fn with_router(mut self, router: Arc<leasehold_adapters::backends::Router>) -> Self {
        let inner = Arc::get_mut(&mut self.inner).expect("configured before sharing");
        inner.leases = inner.leases.clone().with_router(router.clone());
        inner.router = Some(router);
        self
    }

    /// Keeps every requested or updated lease's manifest sealed in `vault`, for the dispatcher
    /// to send to its backend. Call before [`crate::app`].
    #[must_use]
    pub fn with_manifests(mut self, vault: leasehold_adapters::dispatch::ManifestVault) -> Self {
        Arc::get_mut(&mut self.inner).expect("configured before sharing").manifests = Some(vault);
        self
    }

    /// Hands backends that subscribe to their work callback URLs under `base` (the URL
    /// backends reach this gateway at). Call before [`crate::app`].
    #[must_use]
    pub fn with_callback_base(mut self, base: &str) -> Self {
        let inner = Arc::get_mut(&mut self.inner).expect("configured before sharing");
        inner.callback_urls = Some(leasehold_adapters::dispatch::CallbackUrls::new(base));
        self
    }

    /// Tells sockets to close (1012) and the live hub to stop.
    pub fn stop(&self) {
        self.inner.stopping.send_replace(true);
    }

    /// The token verifier.
    pub fn jwt(&self) -> &JwtSecret {
        &self.inner.jwt
    }
}

/// How far the read models have got, for read-your-writes: every projection's progress.
#[derive(Debug, Clone, Default)]
pub struct ProjectionProgress {
    projections: Vec<Watched>,
}

/// One projection's progress.
#[derive(Debug, Clone)]
struct Watched {
    name: &'static str,
    /// Published by an in-process runner; without one, the checkpoint is polled.
    published: Option<watch::Receiver<Option<Cursor>>>,
}

impl ProjectionProgress {
    /// No projection yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// With projection `name`, whose in-process runner publishes its checkpoints.
    #[must_use]
    pub fn published(
        mut self,
        name: &'static str,
        checkpoints: watch::Receiver<Option<Cursor>>,
    ) -> Self {
        self.projections.push(Watched { name, published: Some(checkpoints) });
        self
    }

    /// With projection `name`, run elsewhere: its checkpoint is read from the database.
    #[must_use]
    pub fn polled(mut self, name: &'static str) -> Self {
        self.projections.push(Watched { name, published: None });
        self
    }

    /// The projections watched.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.projections.iter().map(|watched| watched.name)
    }

    /// Returns once the log's readers can read up to `cursor` and every projection `reads`
    /// names has applied everything up to it.
    ///
    /// # Errors
    /// `STALE` when one has not within `wait`; `INTERNAL` when a checkpoint cannot be read.
    pub(crate) async fn reached(
        &self,
        (log, read_models): (&PgEventStore, &PgReadModels),
        cursor: Cursor,
        wait: Duration,
        reads: &Reads,
    ) -> Result<(), ApiError> {
        let awaited: Vec<&Watched> = self
            .projections
            .iter()
            .filter(|watched| match reads {
                Reads::Some(names) => names.contains(&watched.name),
                Reads::All => true,
            })
            .collect();
        let waited = tokio::time::timeout(wait, async {
            // A projection's checkpoint at the cursor implies the log's readers got there too;
            // a query of the log alone waits for the horizon to let the cursor through.
            if awaited.is_empty() {
                let mut poll = tokio::time::interval(CHECKPOINT_POLL);
                loop {
                    poll.tick().await;
                    if log.head().await? >= cursor {
                        break;
                    }
                }
            }
            for watched in awaited {
                watched.reached(read_models, cursor).await?;
            }
            Ok::<_, ApiError>(())
        })
        .await;
        waited.unwrap_or_else(|_| {
            let message = format!("the read models did not reach the cursor within {wait:?}");
            Err(ApiError::new(Code::Stale, message))
        })
    }
}

impl Watched {
    async fn reached(&self, read_models: &PgReadModels, cursor: Cursor) -> Result<(), ApiError> {
        let reached = |checkpoint: &Option<Cursor>| checkpoint.is_some_and(|at| at >= cursor);
        if let Some(published) = &self.published {
            let mut published = published.clone();
            if published.wait_for(reached).await.is_ok() {
                return Ok(());
            }
            // The runner stopped publishing; its checkpoint is still in the database.
        }
        let mut poll = tokio::time::interval(CHECKPOINT_POLL);
        loop {
            poll.tick().await;
            if reached(&read_models.checkpoint(self.name).await?) {
                return Ok(());
            }
        }
    }
}
