//! `leasehold backend-sim --provider`: a rental provider's agent speaking Leasehold's provider
//! protocol (`docs/mercator-protocol.md` §1, `leasehold_adapters::providers::wire`), in
//! memory, holding to the capabilities it declares (`--capabilities`, the providers file's
//! JSON; every one by default): an undeclared operation is `501 UNSUPPORTED`, a command
//! stamped with a superseded generation `409 FENCED`, an operation key used again with the
//! same request answers its receipt `duplicate` (with another request `409 CONFLICT`) when
//! provision is idempotent by key, and a provider that declares terminated capacity
//! unobservable forgets a machine once terminated (404).
//!
//! A machine moves one step at each look: a provision or start leaves it `starting` (active
//! at the next look), a stop `stopping` (then stopped). Every state change is dated
//! (`state_since`). Its own routes, for tests: `POST /sim/interrupt/{native_ref}` reclaims a
//! machine as a spot provider does (stopped, or terminated without stop, `interrupted`);
//! `POST /sim/unknown/{native_ref}` makes its looks answer `unknown` (until it is
//! interrupted); `GET /sim/machines`
//! lists every machine with its bootstrap (as user data on the machine would hold it);
//! with `--nodes`, each machine runs a simulated node agent (`node.rs`) from its bootstrap,
//! and `POST /sim/silence/{native_ref}` cuts its node off (nothing it sends arrives: it is
//! lost and stays so);
//! `GET /sim/requests` counts requests per route. `--fail-provisions` answers every
//! provision 500 (no machine), `--refuse-provisions` 400 (`NO_CAPACITY`, for good),
//! `--lose-provision-answers` makes each rental's first machine and answers 504.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use leasehold_adapters::providers::wire::{
    CapacityCommand, CapacityRef, NodeBootstrap, ObservationWire, OwnedCapacity, OwnedList,
    OwnershipQuery, ProviderRefusal, ProvisionCommand, ReceiptWire,
};
use leasehold_domain::rental::{
    CapacityState, CapacitySupport, IdempotentProvision, NativeRef, Pricing,
};
use serde::Serialize;
use uuid::Uuid;

use super::node::{self, NodeHandle, NodeOptions};

/// How the provider misbehaves.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProviderFaults {
    /// Every provision answers 500 and allocates nothing.
    pub fail_provisions: bool,
    /// Every provision is refused for good (400).
    pub refuse_provisions: bool,
    /// Each rental's first provision makes its machine and answers 504, as a proxy that
    /// lost the answer.
    pub lose_first_answers: bool,
}

/// Every capability, provision idempotent by operation key.
pub fn every_capability() -> CapacitySupport {
    CapacitySupport {
        stop: true,
        resume: true,
        persistent_disk: true,
        spot: true,
        exact_pricing: true,
        idempotent_provision: IdempotentProvision::OperationKey,
        list_owned: true,
        observe_after_terminate: false,
    }
}

/// One machine.
#[derive(Debug, Clone, Serialize)]
struct Machine {
    native_ref: String,
    rental_id: Uuid,
    workspace_id: String,
    connection_id: String,
    generation: u64,
    ownership_token: String,
    state: CapacityState,
    /// What it becomes at the next look.
    #[serde(skip)]
    next: Option<CapacityState>,
    state_since: DateTime<Utc>,
    interrupted: bool,
    /// Its looks answer `unknown`.
    unknown: bool,
    interruptible: bool,
    created_at: DateTime<Utc>,
    bootstrap: NodeBootstrap,
}

/// The provider's state.
#[derive(Debug, Clone)]
pub struct Provider {
    gate: super::gate::Gate,
    support: CapacitySupport,
    faults: ProviderFaults,
    machines: Arc<Mutex<BTreeMap<String, Machine>>>,
    /// Each operation key's request hash and the receipt it was answered with.
    keys: Arc<Mutex<BTreeMap<String, (String, ReceiptWire)>>>,
    /// With `--nodes`: how each machine's node agent behaves.
    nodes: Option<NodeOptions>,
    /// Each machine's running node agent, by native ref.
    agents: Arc<Mutex<BTreeMap<String, NodeHandle>>>,
}

impl Provider {
    /// The same provider, running a node agent on each machine from its bootstrap
    /// (`--nodes`): a machine's node enrolls once it is provisioned or started, and stops
    /// with it.
    #[must_use]
    pub fn with_nodes(self, options: NodeOptions) -> Self {
        Self { nodes: Some(options), ..self }
    }

    /// Starts (or restarts, for a new bootstrap) the node agent of `machine`.
    fn boot_node(&self, machine: &Machine) {
        let Some(options) = self.nodes else { return };
        let handle = node::spawn(machine.bootstrap.clone(), options);
        self.agents().insert(machine.native_ref.clone(), handle);
    }

    /// Stops the node agent of the machine `native_ref`.
    fn halt_node(&self, native_ref: &str) {
        self.agents().remove(native_ref);
    }

    fn agents(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, NodeHandle>> {
        self.agents.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A provider wanting `token`, declaring `support`.
    pub fn new(token: &str, support: CapacitySupport, faults: ProviderFaults) -> Self {
        Self {
            gate: super::gate::Gate::new(token),
            support,
            faults,
            machines: Arc::default(),
            keys: Arc::default(),
            nodes: None,
            agents: Arc::default(),
        }
    }

    fn machines(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Machine>> {
        self.machines.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (String, ReceiptWire)>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts the request under `route` and says whether it carries the token.
    fn allows(&self, headers: &HeaderMap, route: &str) -> bool {
        self.gate.allows(headers, route)
    }

    /// The receipt of a key used before with the same request, or the refusal of one used
    /// with another; `None` for a new key (or a provider that does not dedupe by key).
    fn replayed(&self, key: &str, hash: &str) -> Option<Response> {
        if self.support.idempotent_provision != IdempotentProvision::OperationKey {
            return None;
        }
        let (first, receipt) = self.keys().get(key).cloned()?;
        if first != hash {
            return Some(refused(StatusCode::CONFLICT, "CONFLICT", "the key was used before"));
        }
        Some(ok(&ReceiptWire { duplicate: true, ..receipt }))
    }

    fn remember(&self, key: &str, hash: &str, receipt: &ReceiptWire) {
        self.keys().insert(key.to_owned(), (hash.to_owned(), receipt.clone()));
    }
}

fn refused(status: StatusCode, code: &str, message: &str) -> Response {
    let body = ProviderRefusal { code: code.into(), message: message.into() };
    (status, axum::Json(body)).into_response()
}

fn ok<T: Serialize>(body: &T) -> Response {
    (StatusCode::OK, axum::Json(body)).into_response()
}

fn unauthorized() -> Response {
    refused(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", "a bearer token is required")
}

fn unsupported(what: &str) -> Response {
    refused(StatusCode::NOT_IMPLEMENTED, "UNSUPPORTED", &format!("{what} is not supported"))
}

fn not_found() -> Response {
    refused(StatusCode::NOT_FOUND, "NOT_FOUND", "no such machine")
}

/// A body decoded strictly, or 400.
fn decoded<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Box<Response>> {
    serde_json::from_slice(body).map_err(|error| {
        Box::new(refused(StatusCode::BAD_REQUEST, "INVALID_REQUEST", &error.to_string()))
    })
}

fn receipt_of(machine: &Machine) -> ReceiptWire {
    ReceiptWire {
        native_ref: NativeRef::parse("native_ref", machine.native_ref.as_str()).expect("valid"),
        state: machine.state,
        accepted_at: Utc::now(),
        duplicate: false,
        interruptible: machine.interruptible,
        pricing: Pricing { currency: "USD".into(), micros_per_hour: 1_250_000, exact: true },
    }
}

/// The provider's routes.
pub fn router(provider: Provider) -> Router {
    Router::new()
        .route("/v1/capacity/provision", post(provision))
        .route("/v1/capacity/observe", post(observe))
        .route("/v1/capacity/stop", post(stop))
        .route("/v1/capacity/start", post(start))
        .route("/v1/capacity/terminate", post(terminate))
        .route("/v1/capacity/owned", post(owned))
        .route("/sim/interrupt/{native_ref}", post(interrupt))
        .route("/sim/unknown/{native_ref}", post(unknown))
        .route("/sim/silence/{native_ref}", post(silence))
        .route("/sim/machines", get(machines))
        .route("/sim/requests", get(requests))
        .with_state(provider)
}

async fn provision(
    State(provider): State<Provider>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !provider.allows(&headers, "provision") {
        return unauthorized();
    }
    let command: ProvisionCommand = match decoded(&body) {
        Ok(command) => command,
        Err(refusal) => return *refusal,
    };
    if provider.faults.fail_provisions {
        return refused(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", "the provider failed");
    }
    if provider.faults.refuse_provisions {
        // Echoing the request, as careless providers do: its client must keep none of it.
        let echo = format!(
            "no capacity for {} (token {})",
            command.offer_snapshot_id, command.bootstrap.enrollment_token
        );
        return refused(StatusCode::BAD_REQUEST, "NO_CAPACITY", &echo);
    }
    if let Some(answer) = provider.replayed(&command.operation_key, &command.request_hash) {
        return answer;
    }
    let now = Utc::now();
    let machine = Machine {
        native_ref: format!("i-{}", Uuid::now_v7().simple()),
        rental_id: command.rental_id,
        workspace_id: command.workspace_id,
        connection_id: command.connection_id,
        generation: command.generation,
        ownership_token: command.ownership_token,
        state: CapacityState::Starting,
        next: Some(CapacityState::Active),
        state_since: now,
        interrupted: false,
        unknown: false,
        interruptible: command.interruptible && provider.support.spot,
        created_at: now,
        bootstrap: command.bootstrap,
    };
    let receipt = receipt_of(&machine);
    provider.remember(&command.operation_key, &command.request_hash, &receipt);
    provider.boot_node(&machine);
    let mut machines = provider.machines();
    let first = !machines.values().any(|held| held.rental_id == machine.rental_id);
    machines.insert(machine.native_ref.clone(), machine);
    if provider.faults.lose_first_answers && first {
        return refused(StatusCode::GATEWAY_TIMEOUT, "TIMEOUT", "the answer was lost");
    }
    ok(&receipt)
}

/// The machine `capacity` names (by its native ref, or by rental and ownership token before a
/// receipt named it).
fn find<'a>(
    machines: &'a mut BTreeMap<String, Machine>,
    capacity: &CapacityRef,
) -> Option<&'a mut Machine> {
    if !capacity.native_ref.is_empty() {
        return machines.get_mut(&capacity.native_ref);
    }
    machines.values_mut().find(|machine| {
        machine.rental_id == capacity.rental_id
            && machine.ownership_token == capacity.ownership_token
    })
}

async fn observe(
    State(provider): State<Provider>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !provider.allows(&headers, "observe") {
        return unauthorized();
    }
    let capacity: CapacityRef = match decoded(&body) {
        Ok(capacity) => capacity,
        Err(refusal) => return *refusal,
    };
    let mut machines = provider.machines();
    let Some(machine) = find(&mut machines, &capacity) else { return not_found() };
    let now = Utc::now();
    if let Some(next) = machine.next.take() {
        machine.state = next;
        machine.state_since = now;
    }
    let (state, state_since) = if machine.unknown {
        (CapacityState::Unknown, None)
    } else {
        (machine.state, Some(machine.state_since))
    };
    ok(&ObservationWire {
        native_ref: NativeRef::parse("native_ref", machine.native_ref.as_str()).expect("valid"),
        state,
        state_since,
        observed_at: now,
        interrupted: machine.interrupted,
        endpoint: Some("203.0.113.7:22".into()),
        native_json: Some(r#"{"api_key":"provider-private"}"#.into()),
    })
}

/// Applies a stop, start or termination to the machine it names.
fn act(
    provider: &Provider,
    command: &CapacityCommand,
    apply: impl FnOnce(&mut Machine, DateTime<Utc>),
) -> Response {
    if let Some(answer) = provider.replayed(&command.operation_key, &command.request_hash) {
        return answer;
    }
    let mut machines = provider.machines();
    let Some(machine) = find(&mut machines, &command.capacity) else { return not_found() };
    if command.generation < machine.generation {
        return refused(StatusCode::CONFLICT, "FENCED", "a superseded generation");
    }
    apply(machine, Utc::now());
    let receipt = receipt_of(machine);
    match machine.state {
        // A start's new bootstrap: its node enrolls; the previous generation's node is gone.
        CapacityState::Starting => provider.boot_node(machine),
        _ => provider.halt_node(&machine.native_ref),
    }
    drop(machines);
    provider.remember(&command.operation_key, &command.request_hash, &receipt);
    ok(&receipt)
}

async fn stop(
    State(provider): State<Provider>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !provider.allows(&headers, "stop") {
        return unauthorized();
    }
    if !provider.support.stop {
        return unsupported("stop");
    }
    let command: CapacityCommand = match decoded(&body) {
        Ok(command) => command,
        Err(refusal) => return *refusal,
    };
    act(&provider, &command, |machine, now| {
        machine.state = CapacityState::Stopping;
        machine.next = Some(CapacityState::Stopped);
        machine.state_since = now;
        machine.interrupted = false;
    })
}

async fn start(
    State(provider): State<Provider>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !provider.allows(&headers, "start") {
        return unauthorized();
    }
    if !provider.support.resume {
        return unsupported("resume");
    }
    let command: CapacityCommand = match decoded(&body) {
        Ok(command) => command,
        Err(refusal) => return *refusal,
    };
    let Some(bootstrap) = command.bootstrap.clone() else {
        return refused(StatusCode::BAD_REQUEST, "INVALID_REQUEST", "start needs a bootstrap");
    };
    act(&provider, &command, |machine, now| {
        machine.generation = command.generation;
        machine.bootstrap = bootstrap;
        machine.state = CapacityState::Starting;
        machine.next = Some(CapacityState::Active);
        machine.state_since = now;
        machine.interrupted = false;
    })
}

async fn terminate(
    State(provider): State<Provider>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !provider.allows(&headers, "terminate") {
        return unauthorized();
    }
    let command: CapacityCommand = match decoded(&body) {
        Ok(command) => command,
        Err(refusal) => return *refusal,
    };
    let answer = act(&provider, &command, |machine, now| {
        machine.state = CapacityState::Terminated;
        machine.next = None;
        machine.state_since = now;
    });
    if !provider.support.observe_after_terminate {
        // Terminated capacity is not observable here: the machine is forgotten.
        provider.machines().retain(|_, machine| machine.state != CapacityState::Terminated);
    }
    answer
}

async fn owned(
    State(provider): State<Provider>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !provider.allows(&headers, "owned") {
        return unauthorized();
    }
    if !provider.support.list_owned {
        return unsupported("list owned");
    }
    let query: OwnershipQuery = match decoded(&body) {
        Ok(query) => query,
        Err(refusal) => return *refusal,
    };
    let capacity = provider
        .machines()
        .values()
        .filter(|m| query.workspace_id.as_ref().is_none_or(|w| w == &m.workspace_id))
        .map(|machine| OwnedCapacity {
            native_ref: NativeRef::parse("native_ref", machine.native_ref.as_str()).expect("ok"),
            connection_id: machine.connection_id.clone(),
            workspace_id: machine.workspace_id.clone(),
            rental_id: Some(machine.rental_id),
            generation: Some(machine.generation),
            ownership_token: Some(machine.ownership_token.clone()),
            state: machine.state,
            created_at: machine.created_at,
            interruptible: machine.interruptible,
            pricing: Some(receipt_of(machine).pricing),
        })
        .collect();
    ok(&OwnedList { capacity })
}

async fn interrupt(State(provider): State<Provider>, Path(native_ref): Path<String>) -> Response {
    let stops = provider.support.stop;
    let mut machines = provider.machines();
    let Some(machine) = machines.get_mut(&native_ref) else { return not_found() };
    machine.state = if stops { CapacityState::Stopped } else { CapacityState::Terminated };
    machine.next = None;
    machine.state_since = Utc::now();
    machine.interrupted = true;
    machine.unknown = false;
    provider.halt_node(&native_ref);
    StatusCode::NO_CONTENT.into_response()
}

async fn unknown(State(provider): State<Provider>, Path(native_ref): Path<String>) -> Response {
    let mut machines = provider.machines();
    let Some(machine) = machines.get_mut(&native_ref) else { return not_found() };
    machine.unknown = true;
    StatusCode::NO_CONTENT.into_response()
}

async fn silence(State(provider): State<Provider>, Path(native_ref): Path<String>) -> Response {
    match provider.agents().get(&native_ref) {
        Some(agent) => {
            agent.silence();
            StatusCode::NO_CONTENT.into_response()
        }
        None => not_found(),
    }
}

async fn machines(State(provider): State<Provider>) -> Response {
    let machines: Vec<Machine> = provider.machines().values().cloned().collect();
    ok(&machines)
}

async fn requests(State(provider): State<Provider>) -> Response {
    let requests = provider.gate.counts();
    ok(&requests)
}
