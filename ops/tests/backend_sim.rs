//! Leasehold's backend client (`leasehold_adapters::backends`) against `leasehold backend-sim`
//! run as a separate process: signed requests, fred's answers and refusals, a signed callback
//! after a provision, keyset lookups, retentions, logs, custom domains, and the breaker opening
//! on a backend that refuses every signature.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Uri};
use leasehold_adapters::backends::wire::{LeaseItem, ProvisionRequest};
use leasehold_adapters::backends::{
    BackendClient, BackendConfig, BackendError, BreakerState, CallError, SIGNATURE_HEADER,
    SigningSecret,
};
use leasehold_commands::SystemClock;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use uuid::Uuid;

const SECRET: &str = "a-secret-shared-with-the-simulated-backend!";
const WAIT: Duration = Duration::from_secs(30);

/// The simulator, running until dropped.
struct Sim {
    url: String,
    _child: Child,
    _dir: std::path::PathBuf,
}

async fn start_sim() -> Sim {
    start_sim_with(&[]).await
}

async fn start_sim_with(extra: &[&str]) -> Sim {
    let dir = std::env::temp_dir().join(format!("leasehold-sim-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret_file = dir.join("secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["backend-sim", "--callback-delay-ms", "20", "--secret-file"])
        .arg(&secret_file)
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let stdout = child.stdout.take().expect("piped");
    let mut line = String::new();
    tokio::time::timeout(WAIT, BufReader::new(stdout).read_line(&mut line))
        .await
        .expect("the simulator says where it listens")
        .unwrap();
    let url = line.trim().strip_prefix("listening on ").expect("its first line").to_string();
    Sim { url, _child: child, _dir: dir }
}

fn client(sim: &Sim, secret: &str) -> BackendClient {
    let secret = SigningSecret::new(secret.as_bytes()).expect("long enough");
    BackendClient::new(BackendConfig::new("sim-1", &sim.url, secret), Arc::new(SystemClock))
        .expect("a client")
}

/// One callback as it arrived: the target, the signature header and the body.
type Received = (String, Option<String>, Bytes);

/// A control plane's callback endpoint: every POST is passed to the test and answered 200.
async fn callback_receiver() -> (String, mpsc::UnboundedReceiver<Received>) {
    let (sender, receiver) = mpsc::unbounded_channel();
    let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
        let sender = sender.clone();
        async move {
            let signature =
                headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
            let target = uri.path_and_query().map_or(uri.path(), |t| t.as_str()).to_string();
            let _ = sender.send((target, signature, body));
            "{}"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}"), receiver)
}

fn provision_request(lease: Uuid, callback_url: String) -> ProvisionRequest {
    ProvisionRequest {
        lease_uuid: lease,
        tenant: "acme".into(),
        provider_uuid: Uuid::from_u128(7),
        items: vec![LeaseItem {
            sku: "gpu.h100.1x".into(),
            quantity: 1,
            service_name: Some("web".into()),
            custom_domain: None,
        }],
        callback_url,
        payload: Some(br#"{"image":"nginx"}"#.to_vec()),
        payload_hash: None,
        lifecycle_callback_url: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provision_is_accepted_reported_by_a_signed_callback_and_then_readable() {
    let sim = start_sim().await;
    let backend = client(&sim, SECRET);
    let (base, mut callbacks) = callback_receiver().await;
    let lease = Uuid::now_v7();
    let path = format!("/callbacks/leases/{lease}/operations/{}", Uuid::now_v7());
    let request = provision_request(lease, format!("{base}{path}"));

    let accepted = backend.provision(&request).await.expect("accepted");
    assert_eq!(accepted.provision_id, lease.to_string());
    // Before it is ready, info is "not provisioned", which is no failure of the backend.
    if let Err(error) = backend.info(lease).await {
        assert_eq!(error, CallError::Backend(BackendError::NotProvisioned));
    }

    let (target, signature, body) =
        tokio::time::timeout(WAIT, callbacks.recv()).await.expect("a callback").unwrap();
    assert_eq!(target, path, "sent to the URL the provision named");
    let secret = SigningSecret::new(SECRET.as_bytes()).unwrap();
    secret
        .verify(signature.as_deref(), ("POST", &target, &body), chrono::Utc::now())
        .expect("the callback is signed with the shared secret");
    let report: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(report["lease_uuid"], lease.to_string());
    assert_eq!(
        (report["status"].as_str(), report["backend"].as_str()),
        (Some("success"), Some("sim-1"))
    );

    let info = backend.info(lease).await.expect("ready");
    assert_eq!(info.fqdn, Some(format!("{lease}.sim-1.sim.local")));
    assert_eq!(info.ports.unwrap()["80/tcp"].host_port, "8080");
    // A second provision of a live lease is refused as already provisioned.
    assert_eq!(
        backend.provision(&request).await,
        Err(CallError::Backend(BackendError::AlreadyProvisioned))
    );
    let listed = backend.list_provisions().await.expect("the inventory");
    assert_eq!(
        listed.iter().map(|p| (p.lease_uuid, p.status.as_str())).collect::<Vec<_>>(),
        [(lease, "ready")]
    );
    let unknown = Uuid::now_v7();
    let found = backend.lookup_provisions(&[unknown, lease]).await.expect("a lookup");
    assert_eq!(found.iter().map(|p| p.lease_uuid).collect::<Vec<_>>(), [lease]);

    backend.deprovision(lease).await.expect("released");
    // Deprovisioning again is still 200.
    backend.deprovision(lease).await.expect("released again");
    assert!(backend.lookup_provisions(&[lease]).await.expect("a lookup").is_empty());
    backend.health().await.expect("healthy");
    assert_eq!(backend.breaker_state(), BreakerState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_body_is_a_validation_refusal_and_a_wrong_secret_opens_the_breaker() {
    let sim = start_sim().await;
    let backend = client(&sim, SECRET);
    let mut empty = provision_request(Uuid::now_v7(), "http://127.0.0.1:9/cb".into());
    empty.items.clear();
    match backend.provision(&empty).await {
        Err(CallError::Backend(BackendError::Validation { code: None, message })) => {
            assert!(message.contains("items"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(backend.breaker_state(), BreakerState::Closed, "a refusal is no failure");

    // Signed with another secret: 401 every time, which counts; after five the breaker opens
    // and the sixth call is not sent.
    let stranger = client(&sim, "another-secret-of-at-least-thirty-two-bytes");
    for _ in 0..5 {
        let refused = stranger.info(Uuid::now_v7()).await;
        assert_eq!(refused, Err(CallError::Backend(BackendError::Unexpected { status: 401 })));
    }
    assert_eq!(stranger.breaker_state(), BreakerState::Open);
    assert!(matches!(stranger.info(Uuid::now_v7()).await, Err(CallError::CircuitOpen(_))));
    // Health is neither signed nor behind the breaker.
    stranger.health().await.expect("healthy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retentions_logs_and_custom_domains_answer_as_the_protocol_says() {
    let sim = start_sim_with(&["--retain"]).await;
    let backend = client(&sim, SECRET);
    let (base, mut callbacks) = callback_receiver().await;
    let mut leases: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
    for lease in &leases {
        let url = format!("{base}/callbacks/leases/{lease}/operations/{}", Uuid::now_v7());
        backend.provision(&provision_request(*lease, url)).await.expect("accepted");
    }
    for _ in &leases {
        tokio::time::timeout(WAIT, callbacks.recv()).await.expect("a callback").unwrap();
    }

    // Logs: each instance's last lines, by instance index.
    let logs = backend.logs(leases[0], 2).await.expect("logs");
    assert_eq!(logs.keys().collect::<Vec<_>>(), ["0"]);
    assert_eq!(logs["0"].lines().count(), 2);

    // A custom domain onto the running provision: 204, then listed on its item.
    let mut items = provision_request(leases[0], String::new()).items;
    items[0].custom_domain = Some("app.example.com".into());
    let request = leasehold_adapters::backends::wire::ReconcileCustomDomainRequest {
        lease_uuid: leases[0],
        items,
    };
    backend.reconcile_custom_domain(&request).await.expect("reconciled");
    let listed = backend.lookup_provisions(&[leases[0]]).await.expect("a lookup");
    let domain = listed[0].items.as_ref().and_then(|items| items[0].custom_domain.clone());
    assert_eq!(domain.as_deref(), Some("app.example.com"));

    // Released with the data kept: retained, and every one of them in the retention listing,
    // ascending by lease, complete.
    assert!(backend.list_retentions().await.expect("a listing").is_empty(), "never null");
    for lease in &leases {
        backend.deprovision(*lease).await.expect("released");
    }
    assert_eq!(backend.provision_info(leases[1]).await.expect("a record").status, "retained");
    let retained = backend.list_retentions().await.expect("a listing");
    leases.sort_by_key(ToString::to_string);
    assert_eq!(retained.iter().map(|r| r.lease_uuid).collect::<Vec<_>>(), leases);
    assert!(retained.iter().all(|r| r.tenant.as_deref() == Some("acme")));
    // A retained lease has no logs: nothing runs.
    assert_eq!(
        backend.logs(leases[0], 2).await,
        Err(CallError::Backend(BackendError::NotProvisioned))
    );
}
