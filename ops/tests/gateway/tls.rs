//! TLS per backend, as fred's backends file sets it: `leasehold backend-sim` serves HTTPS with
//! a certificate from a CA made for the test and demands a client certificate (mutual TLS).
//! With the CA and the client certificate the lease's work goes through; without the client
//! certificate (the backend refuses us), or with it but trusting only the system's roots (we
//! refuse the backend), nothing reaches the backend and the work waits, recorded as failed
//! attempts.

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
use serde_json::{Value, json};

use crate::backend::*;
use crate::support::*;

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files in `dir`.
fn certificates(dir: &Path) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().expect("a key");
    let ca_cert = ca.self_signed(&ca_key).expect("a CA");
    let mut server = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
    server.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse().expect("an address")));
    let server_key = KeyPair::generate().expect("a key");
    let server_cert = server.signed_by(&server_key, &ca_cert, &ca_key).expect("signed");
    let client = CertificateParams::new(vec!["leasehold".to_string()]).expect("params");
    let client_key = KeyPair::generate().expect("a key");
    let client_cert = client.signed_by(&client_key, &ca_cert, &ca_key).expect("signed");
    let files = [
        ("ca.pem", ca_cert.pem()),
        ("server.pem", server_cert.pem()),
        ("server.key", server_key.serialize_pem()),
        ("client.pem", client_cert.pem()),
        ("client.key", client_key.serialize_pem()),
    ];
    for (name, pem) in files {
        std::fs::write(dir.join(name), pem).expect("written");
    }
}

/// A backends file naming `sim-1` at `url` with `tls` settings.
fn tls_backends_file(dir: &Path, url: &str, tls: &Value) -> std::path::PathBuf {
    let mut entry = json!({ "name": "sim-1", "url": url, "secret_file": "sim.secret" });
    for (key, value) in tls.as_object().expect("an object") {
        entry[key] = value.clone();
    }
    let file = dir.join("backends.json");
    std::fs::write(dir.join("sim.secret"), SIM_SECRET).expect("written");
    std::fs::write(&file, json!({ "backends": [entry] }).to_string()).expect("written");
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_behind_mutual_tls_is_reached_only_with_its_ca_and_our_certificate() {
    let dir = scratch();
    certificates(&dir.0);
    let pem = |name: &str| dir.0.join(name).to_str().expect("UTF-8").to_string();
    let tls_args = [
        "--tls-cert-file".to_string(),
        pem("server.pem"),
        "--tls-key-file".to_string(),
        pem("server.key"),
        "--tls-client-ca-file".to_string(),
        pem("ca.pem"),
    ];
    let tls_args: Vec<&str> = tls_args.iter().map(String::as_str).collect();
    let mut sim = Sim::start_args("127.0.0.1:0", &dir.0, &tls_args).await;
    assert!(sim.url.starts_with("https://127.0.0.1:"), "{}", sim.url);
    let read = |name: &str| std::fs::read(dir.0.join(name)).expect("readable");
    let identity = [read("client.pem"), read("client.key")].concat();
    sim.http = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&read("ca.pem")).expect("a CA"))
        .identity(reqwest::Identity::from_pem(&identity).expect("an identity"))
        .build()
        .expect("a client");
    let tenant = tenant_token("acme");

    // Without our certificate the handshake fails: nothing is sent, the attempt is recorded.
    let ca_only = json!({ "tls_ca_file": "ca.pem" });
    let file = tls_backends_file(&dir.0, &sim.url, &ca_only);
    let mut server = serve_dispatching(&file).await;
    let lease = request_lease(&server, &tenant, "req-1").await["id"].clone();
    wait_for_events(&server, &lease, "LeaseDispatchFailed", 1).await;
    assert_eq!(sim.received("provision").await, 0);

    // With our certificate but trusting only the system's roots, the backend's certificate
    // is not trusted: still nothing is sent.
    let no_ca =
        json!({ "tls_client_cert_file": "client.pem", "tls_client_key_file": "client.key" });
    let file = tls_backends_file(&dir.0, &sim.url, &no_ca);
    server.terminate().await;
    let failed = count(&stream_events(&server, &lease).await, "LeaseDispatchFailed");
    server.restart_with(&["--backend", "sim-1", "--backends-file", file.to_str().unwrap()]).await;
    wait_for_events(&server, &lease, "LeaseDispatchFailed", failed + 1).await;
    assert_eq!(sim.received("provision").await, 0);

    // With the CA and our certificate, the same work goes through and the lease is ready.
    let mutual = json!({
        "tls_ca_file": "ca.pem",
        "tls_client_cert_file": "client.pem",
        "tls_client_key_file": "client.key",
    });
    let file = tls_backends_file(&dir.0, &sim.url, &mutual);
    server.terminate().await;
    server.restart_with(&["--backend", "sim-1", "--backends-file", file.to_str().unwrap()]).await;
    wait_for_status(&server, &tenant, &lease, "READY").await;
    assert_eq!(sim.received("provision").await, 1);
    let detail: String = server
        .db
        .client()
        .await
        .query_one(
            "SELECT coalesce(last_error, '') FROM dispatch_outbox WHERE stream_id = $1",
            &[&format!("lease-{}", lease.as_str().expect("an id"))],
        )
        .await
        .expect("read")
        .get(0);
    assert!(!detail.contains("BEGIN"), "no key material in an error: {detail}");
}
