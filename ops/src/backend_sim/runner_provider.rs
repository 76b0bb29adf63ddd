//! `leasehold backend-sim --runner-provider`: a runner node's provider agent speaking the
//! protocol of `docs/billet-protocol.md` §1 (billet's `Provider` interface over HTTP), in
//! memory, and beside it a registration issuer answering GitHub's `generate-jitconfig`.
//!
//! Held to: `unknown` (or any other trust class) is never accepted; `--refuse-trust CLASS`
//! refuses one more (403 `refused`); a launch with an empty command, an empty registration or
//! a name that is not `billet-<lease id>` is 400; a second launch of a name already held is
//! 409 `EXISTS` (counted: a client that finds before it relaunches never sees one); `Find`
//! answers an explicit `found`; a destroy of an id already gone is success (`stopped`).
//! Faults: `--lose-launch-answers` (each name's first launch makes the instance and answers
//! 504, as a proxy that lost the answer), `--refuse-launches` (400 `NO_CAPACITY`, echoing the
//! registration as a careless backend would), `--teardown-requested-first` (an instance's
//! first destroy answers `requested`, the next `stopped`), `--find-misses N` (the first N
//! `Find`s of each name answer not found, as a backend whose listing lags), `--fail-destroys`
//! (every destroy answers 500). Its own routes, for tests: `GET
//! /sim/instances` (each with how often it was launched), `GET /sim/registrations` (every
//! registration minted, so a test can look for its bytes elsewhere), `POST
//! /sim/orphan/{name}` (an instance nobody launched), `GET /sim/requests`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use leasehold_adapters::runner_providers::wire::{
    FindAnswer, InstanceList, InstanceWire, JitRequest, KindAnswer, LaunchSpec, TeardownAnswer,
};
use leasehold_domain::runner::{RunnerLeaseId, TrustClass};
use serde::Deserialize;
use uuid::Uuid;

/// How the simulated backend behaves.
#[derive(Debug, Clone, Default)]
pub struct RunnerFaults {
    /// The kind it reports (`docker` by default).
    pub kind: String,
    /// A trust class it refuses, besides `unknown`.
    pub refuse_trust: Option<TrustClass>,
    /// Each name's first launch makes the instance and answers 504.
    pub lose_launch_answers: bool,
    /// Every launch is refused for good.
    pub refuse_launches: bool,
    /// An instance's first destroy answers `requested`.
    pub teardown_requested_first: bool,
    /// Every destroy fails (500).
    pub fail_destroys: bool,
    /// The first this many `Find`s of each name answer not found, as a backend whose
    /// listing lags.
    pub find_misses: u32,
}

#[derive(Debug, Clone)]
struct Instance {
    wire: InstanceWire,
    launches: u32,
    destroys: u32,
    finds: u32,
}

/// The simulated agent's state, shared by its handlers.
#[derive(Debug, Clone)]
pub struct RunnerProvider {
    gate: super::gate::Gate,
    faults: Arc<RunnerFaults>,
    instances: Arc<Mutex<BTreeMap<String, Instance>>>,
    registrations: Arc<Mutex<Vec<String>>>,
}

impl RunnerProvider {
    /// An agent wanting `token`, behaving as `faults` says.
    pub fn new(token: &str, faults: RunnerFaults) -> Self {
        Self {
            gate: super::gate::Gate::new(token),
            faults: Arc::new(faults),
            instances: Arc::default(),
            registrations: Arc::default(),
        }
    }

    fn instances(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Instance>> {
        self.instances.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts the request under `route` and says whether it carries the token.
    fn allows(&self, headers: &HeaderMap, route: &str) -> bool {
        self.gate.allows(headers, route)
    }
}

fn refused(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({ "code": code, "message": message });
    (status, axum::Json(body)).into_response()
}

fn unauthorized() -> Response {
    refused(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", "a bearer token is required")
}

fn ok<T: serde::Serialize>(status: StatusCode, body: &T) -> Response {
    (status, axum::Json(body)).into_response()
}

/// The agent's routes, and the issuer's.
pub fn router(provider: RunnerProvider) -> Router {
    Router::new()
        .route("/kind", get(kind))
        .route("/accepts", get(accepts))
        .route("/instances", post(launch).get(instances))
        .route("/instances/{id}", delete(destroy))
        .route("/orgs/{org}/actions/runners/generate-jitconfig", post(mint))
        .route("/sim/instances", get(sim_instances))
        .route("/sim/registrations", get(sim_registrations))
        .route("/sim/orphan/{name}", post(orphan))
        .route("/sim/requests", get(requests))
        .with_state(provider)
}

async fn kind(State(provider): State<RunnerProvider>, headers: HeaderMap) -> Response {
    if !provider.allows(&headers, "kind") {
        return unauthorized();
    }
    ok(StatusCode::OK, &KindAnswer { kind: provider.faults.kind.clone() })
}

#[derive(Deserialize)]
struct TrustQuery {
    trust: String,
}

async fn accepts(
    State(provider): State<RunnerProvider>,
    headers: HeaderMap,
    Query(query): Query<TrustQuery>,
) -> Response {
    if !provider.allows(&headers, "accepts") {
        return unauthorized();
    }
    // billet: every backend refuses the zero value, `unknown`; so does anything unnamed.
    let Ok(trust) = TrustClass::parse("trust", &query.trust) else {
        return refused(StatusCode::FORBIDDEN, "REFUSED", "an unclassified job is refused");
    };
    if provider.faults.refuse_trust == Some(trust) {
        return refused(StatusCode::FORBIDDEN, "REFUSED", "this backend refuses that trust class");
    }
    StatusCode::NO_CONTENT.into_response()
}

async fn launch(
    State(provider): State<RunnerProvider>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !provider.allows(&headers, "launch") {
        return unauthorized();
    }
    let spec: LaunchSpec = match serde_json::from_slice(&body) {
        Ok(spec) => spec,
        Err(_) => return refused(StatusCode::BAD_REQUEST, "INVALID_REQUEST", "not a launch"),
    };
    let ours = RunnerLeaseId::of_instance(&spec.name) == Some(RunnerLeaseId(spec.lease));
    if spec.command.is_empty() || spec.jit_config.expose().is_empty() || !ours {
        return refused(StatusCode::BAD_REQUEST, "INVALID_REQUEST", "an incomplete launch");
    }
    if provider.faults.refuse_launches {
        // Echoing the request, as careless backends do: its client must keep none of it.
        let echo = format!("no capacity for {} ({})", spec.name, spec.jit_config.expose());
        return refused(StatusCode::BAD_REQUEST, "NO_CAPACITY", &echo);
    }
    let mut instances = provider.instances();
    if let Some(held) = instances.get_mut(&spec.name) {
        held.launches += 1;
        return refused(StatusCode::CONFLICT, "EXISTS", "an instance of that name runs");
    }
    let wire = InstanceWire {
        id: format!("c-{}", Uuid::now_v7().simple()),
        name: spec.name.clone(),
        running: true,
        terminal: false,
    };
    instances.insert(
        spec.name.clone(),
        Instance { wire: wire.clone(), launches: 1, destroys: 0, finds: 0 },
    );
    if provider.faults.lose_launch_answers {
        return refused(StatusCode::GATEWAY_TIMEOUT, "TIMEOUT", "the answer was lost");
    }
    ok(StatusCode::CREATED, &wire)
}

#[derive(Deserialize)]
struct NameQuery {
    name: Option<String>,
}

async fn instances(
    State(provider): State<RunnerProvider>,
    headers: HeaderMap,
    Query(query): Query<NameQuery>,
) -> Response {
    let route = if query.name.is_some() { "find" } else { "list" };
    if !provider.allows(&headers, route) {
        return unauthorized();
    }
    let mut instances = provider.instances();
    match query.name {
        Some(name) => {
            let misses = provider.faults.find_misses;
            let instance = instances.get_mut(&name).and_then(|held| {
                held.finds += 1;
                (held.finds > misses).then(|| held.wire.clone())
            });
            ok(StatusCode::OK, &FindAnswer { found: instance.is_some(), instance })
        }
        None => {
            let listed = instances.values().map(|held| held.wire.clone()).collect();
            ok(StatusCode::OK, &InstanceList { instances: listed })
        }
    }
}

async fn destroy(
    State(provider): State<RunnerProvider>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if !provider.allows(&headers, "destroy") {
        return unauthorized();
    }
    let mut instances = provider.instances();
    let Some(held) = instances.values_mut().find(|held| held.wire.id == id) else {
        // Already gone is success.
        return ok(StatusCode::OK, &TeardownAnswer { teardown: "stopped".into() });
    };
    held.destroys += 1;
    if provider.faults.fail_destroys {
        return refused(StatusCode::INTERNAL_SERVER_ERROR, "DESTROY_FAILED", "the backend failed");
    }
    if provider.faults.teardown_requested_first && held.destroys == 1 {
        return ok(StatusCode::OK, &TeardownAnswer { teardown: "requested".into() });
    }
    held.wire.running = false;
    held.wire.terminal = true;
    ok(StatusCode::OK, &TeardownAnswer { teardown: "stopped".into() })
}

/// GitHub's `generate-jitconfig`: a fresh registration for the named runner.
async fn mint(
    State(provider): State<RunnerProvider>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !provider.allows(&headers, "mint") {
        return unauthorized();
    }
    let Ok(request) = serde_json::from_slice::<JitRequest>(&body) else {
        return refused(StatusCode::BAD_REQUEST, "INVALID_REQUEST", "not a runner request");
    };
    let registration = format!("jit-{}-{}", Uuid::new_v4().simple(), Uuid::new_v4().simple());
    provider
        .registrations
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(registration.clone());
    let body = serde_json::json!({
        "runner": { "id": 1, "name": request.name, "labels": request.labels },
        "encoded_jit_config": registration,
    });
    ok(StatusCode::CREATED, &body)
}

async fn sim_instances(State(provider): State<RunnerProvider>) -> Response {
    let instances: Vec<serde_json::Value> = provider
        .instances()
        .values()
        .map(|held| {
            serde_json::json!({
                "id": held.wire.id, "name": held.wire.name, "running": held.wire.running,
                "terminal": held.wire.terminal, "launches": held.launches,
                "destroys": held.destroys,
            })
        })
        .collect();
    ok(StatusCode::OK, &instances)
}

async fn sim_registrations(State(provider): State<RunnerProvider>) -> Response {
    let minted = provider.registrations.lock().unwrap_or_else(PoisonError::into_inner).clone();
    ok(StatusCode::OK, &minted)
}

async fn orphan(State(provider): State<RunnerProvider>, Path(name): Path<String>) -> Response {
    let wire = InstanceWire {
        id: format!("c-{}", Uuid::now_v7().simple()),
        name: name.clone(),
        running: true,
        terminal: false,
    };
    provider
        .instances()
        .insert(name, Instance { wire: wire.clone(), launches: 0, destroys: 0, finds: 0 });
    ok(StatusCode::OK, &wire)
}

async fn requests(State(provider): State<RunnerProvider>) -> Response {
    let counts = provider.gate.counts();
    ok(StatusCode::OK, &counts)
}
