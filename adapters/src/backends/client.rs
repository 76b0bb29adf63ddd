//! A client of one backend: every route of the protocol, each request signed, each answer
//! size-capped and read by [`classify`], all behind the backend's circuit breaker (except
//! `GET /health`, which fred neither signs nor counts).
//!
//! Signatures carry the machine's time, whatever clock the breaker is driven by: the backend
//! checks them against its own clock.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use leasehold_domain::Clock;
use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::breaker::{BreakerState, CircuitOpen, SharedBreaker};
use super::refusal::{BackendError, Route, classify};
use super::signature::{SIGNATURE_HEADER, SigningSecret};
use super::wire::{
    DeprovisionRequest, LeaseInfo, ProvisionAccepted, ProvisionInfo, ProvisionRequest,
    ProvisionsPage, ReconcileCustomDomainRequest, ReleaseInfo, RestartRequest, RestoreRequest,
    RetainedLease, RetentionsPage, UpdateRequest,
};
use crate::limits::{
    BACKEND_ERROR_BODY_BYTES_MAX, BACKEND_INFO_BYTES_MAX, BACKEND_LOGS_BYTES_MAX,
    BACKEND_LOOKUP_UUIDS_MAX, BACKEND_PAGE_LIMIT, BACKEND_PAGES_MAX, BACKEND_PROVISIONS_BYTES_MAX,
    BACKEND_RELEASES_BYTES_MAX, BACKEND_RETENTIONS_BYTES_MAX, BACKEND_TIMEOUT_DEFAULT_SECONDS,
};

/// How to reach one backend.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    /// Its name (routing, metrics, logs).
    pub name: String,
    /// Its base URL; paths are appended to it as they are (`{url}/provision`).
    pub url: String,
    /// The secret requests to it are signed with.
    pub secret: SigningSecret,
    /// How long one exchange may take, body included.
    pub timeout: Duration,
    /// How long its breaker stays open once 5 failures in a row opened it (fred's: 60 s).
    pub breaker_open: Duration,
    /// The SKUs it serves (exact matches; routing).
    pub skus: Vec<String>,
    /// Whether SKUs no backend lists go to it (routing).
    pub default: bool,
    /// Fenced by an operator: never chosen, never called, reported unhealthy.
    pub fenced: bool,
    /// It cannot be called (behind NAT): it subscribes to its work instead (the `work`
    /// subscription) and is never called, swept or probed.
    pub subscribes: bool,
    /// How its TLS is verified and how Leasehold presents itself (fred's `tls_*` settings).
    pub tls: TlsSettings,
}

/// A backend's TLS settings: PEM bytes read from the backends file's files.
#[derive(Clone, Default)]
pub struct TlsSettings {
    /// The CA that signed the backend's certificate (`tls_ca_file`): only it is trusted.
    /// Without it, the system's roots are.
    pub ca_pem: Option<Vec<u8>>,
    /// Leasehold's client certificate chain and key for mutual TLS (`tls_client_cert_file`
    /// and `tls_client_key_file`, one PEM). Never shown.
    pub client_identity_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("ca", &self.ca_pem.is_some())
            .field("client_identity", &self.client_identity_pem.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

impl BackendConfig {
    /// A backend with the default timeout (30 s).
    pub fn new(name: &str, url: &str, secret: SigningSecret) -> Self {
        let timeout = Duration::from_secs(BACKEND_TIMEOUT_DEFAULT_SECONDS);
        let breaker_open = super::BREAKER_OPEN.to_std().expect("a positive duration");
        let url = url.trim_end_matches('/').to_string();
        Self {
            name: name.to_string(),
            url,
            secret,
            timeout,
            breaker_open,
            skus: Vec::new(),
            default: false,
            fenced: false,
            subscribes: false,
            tls: TlsSettings::default(),
        }
    }
}

/// Why a call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The backend answered with a refusal or a failure.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The breaker refused the call without sending it (transient).
    #[error(transparent)]
    CircuitOpen(#[from] CircuitOpen),
    /// The backend could not be reached, or the exchange broke or timed out (transient).
    #[error("the backend could not be reached: {reason}")]
    Transport {
        /// What the HTTP client said (no secret: requests carry none but the signature).
        reason: String,
    },
    /// The answer was larger than the route allows.
    #[error("the backend's answer exceeds {limit_bytes} bytes")]
    TooLarge {
        /// The route's cap.
        limit_bytes: usize,
    },
    /// The answer was not what the protocol says.
    #[error("the backend's answer does not decode: {reason}")]
    Decode {
        /// The decoder's message.
        reason: String,
    },
}

impl CallError {
    /// Whether it counts as the backend's failure for its breaker.
    fn counts_toward_breaker(&self) -> bool {
        match self {
            Self::Backend(error) => error.counts_toward_breaker(),
            Self::CircuitOpen(_) => false,
            Self::Transport { .. } | Self::TooLarge { .. } | Self::Decode { .. } => true,
        }
    }
}

/// One backend, reached over HTTP.
#[derive(Debug, Clone)]
pub struct BackendClient {
    config: Arc<BackendConfig>,
    http: reqwest::Client,
    breaker: SharedBreaker,
    clock: Arc<dyn Clock>,
    /// Error bodies that were not the envelope (for `/metrics`).
    malformed: Arc<std::sync::atomic::AtomicU64>,
}

/// One request: its route, method, target (path and query, as signed) and JSON body.
struct Call<'a> {
    route: Route,
    method: Method,
    target: &'a str,
    body: Vec<u8>,
    cap: usize,
}

impl BackendClient {
    /// A client of the backend `config` names; its breaker runs on `clock`.
    ///
    /// # Errors
    /// [`CallError::Transport`] when the HTTP client cannot be built.
    pub fn new(config: BackendConfig, clock: Arc<dyn Clock>) -> Result<Self, CallError> {
        let transport = |e: reqwest::Error| CallError::Transport { reason: e.to_string() };
        let mut http = reqwest::Client::builder()
            .timeout(config.timeout)
            .pool_max_idle_per_host(10)
            .pool_idle_timeout(Duration::from_secs(90));
        if let Some(ca) = &config.tls.ca_pem {
            let ca = reqwest::Certificate::from_pem(ca).map_err(transport)?;
            http = http.tls_built_in_root_certs(false).add_root_certificate(ca);
        }
        if let Some(identity) = &config.tls.client_identity_pem {
            // The key's bytes stay out of the error: reqwest's message names no content.
            let identity =
                reqwest::Identity::from_pem(identity).map_err(|_| CallError::Transport {
                    reason: "the TLS client certificate or key is not PEM".into(),
                })?;
            http = http.identity(identity);
        }
        let http = http.build().map_err(transport)?;
        let open_for = chrono::TimeDelta::from_std(config.breaker_open)
            .map_err(|e| CallError::Transport { reason: format!("breaker_open: {e}") })?;
        let breaker = SharedBreaker::opening_for(open_for);
        let malformed = Arc::default();
        Ok(Self { config: Arc::new(config), http, breaker, clock, malformed })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// How it was configured (no secret is shown by its `Debug`).
    pub fn config(&self) -> &BackendConfig {
        &self.config
    }

    /// How many of its error bodies were not the error envelope.
    pub fn malformed_error_bodies(&self) -> u64 {
        self.malformed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Its breaker's state now.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state(self.clock.now())
    }

    /// `POST /provision`.
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn provision(
        &self,
        request: &ProvisionRequest,
    ) -> Result<ProvisionAccepted, CallError> {
        self.post_for(Route::Provision, "/provision", request, decode).await
    }

    /// `POST /restart`.
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn restart(&self, request: &RestartRequest) -> Result<(), CallError> {
        self.post(Route::Restart, "/restart", request).await
    }

    /// `POST /update`.
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn update(&self, request: &UpdateRequest) -> Result<(), CallError> {
        self.post(Route::Update, "/update", request).await
    }

    /// `POST /restore`.
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn restore(&self, request: &RestoreRequest) -> Result<(), CallError> {
        self.post(Route::Restore, "/restore", request).await
    }

    /// `POST /deprovision` (only `200` is success, even for a lease already gone).
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn deprovision(&self, lease: Uuid) -> Result<(), CallError> {
        let request = DeprovisionRequest { lease_uuid: lease };
        self.post(Route::Deprovision, "/deprovision", &request).await
    }

    /// `POST /reconcile_custom_domain`.
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn reconcile_custom_domain(
        &self,
        request: &ReconcileCustomDomainRequest,
    ) -> Result<(), CallError> {
        self.post(Route::ReconcileCustomDomain, "/reconcile_custom_domain", request).await
    }

    /// `GET /info/{lease}`.
    ///
    /// # Errors
    /// See [`CallError`]; [`BackendError::NotProvisioned`] before it is ready.
    pub async fn info(&self, lease: Uuid) -> Result<LeaseInfo, CallError> {
        self.get(&format!("/info/{lease}"), BACKEND_INFO_BYTES_MAX).await
    }

    /// `GET /provisions/{lease}`: one provision (never settlement evidence).
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn provision_info(&self, lease: Uuid) -> Result<ProvisionInfo, CallError> {
        self.get(&format!("/provisions/{lease}"), BACKEND_INFO_BYTES_MAX).await
    }

    /// `GET /logs/{lease}?tail=N`, by instance.
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn logs(
        &self,
        lease: Uuid,
        tail: u32,
    ) -> Result<std::collections::BTreeMap<String, String>, CallError> {
        let target = format!("/logs/{lease}?tail={tail}");
        let call = Call {
            route: Route::Read,
            method: Method::GET,
            target: &target,
            body: Vec::new(),
            cap: BACKEND_LOGS_BYTES_MAX,
        };
        // A tail too large is the asker's doing (a tenant's `tail`), not the backend's
        // failure: it must never open the circuit every tenant's work goes through.
        self.guarded_with(call, decode, false).await
    }

    /// `GET /releases/{lease}`.
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn releases(&self, lease: Uuid) -> Result<Vec<ReleaseInfo>, CallError> {
        self.get(&format!("/releases/{lease}"), BACKEND_RELEASES_BYTES_MAX).await
    }

    /// `GET /stats`.
    ///
    /// # Errors
    /// See [`CallError`]; [`BackendError::NotProvisioned`] from a backend without stats.
    pub async fn stats(&self) -> Result<super::wire::LoadStats, CallError> {
        self.get("/stats", BACKEND_INFO_BYTES_MAX).await
    }

    /// `GET /health`: unsigned, and outside the breaker.
    ///
    /// # Errors
    /// [`BackendError::Unhealthy`] for any status but 200, or a transport error.
    pub async fn health(&self) -> Result<(), CallError> {
        let url = format!("{}/health", self.config.url);
        let response = self.http.get(url).send().await.map_err(transport)?;
        let status = response.status().as_u16();
        classify(Route::Health, status, b"").map_err(CallError::from)
    }

    /// Every provision, walked page by page (`GET /provisions?continue=..&limit=1000`):
    /// complete or an error, never a part.
    ///
    /// # Errors
    /// See [`CallError`]; a token that does not advance is [`CallError::Decode`].
    pub async fn list_provisions(&self) -> Result<Vec<ProvisionInfo>, CallError> {
        self.walk("/provisions", BACKEND_PROVISIONS_BYTES_MAX, |page: ProvisionsPage| {
            (page.provisions, page.next)
        })
        .await
    }

    /// Every lease whose data the backend retains (`GET /retentions`), complete or an error.
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn list_retentions(&self) -> Result<Vec<RetainedLease>, CallError> {
        self.walk("/retentions", BACKEND_RETENTIONS_BYTES_MAX, |page: RetentionsPage| {
            (page.retentions, page.next)
        })
        .await
    }

    /// The provisions of `leases` (1 to 100; sorted, as fred sends them). Unknown ones are
    /// absent from the answer.
    ///
    /// # Errors
    /// See [`CallError`]; more than 100 or none is refused before sending.
    pub async fn lookup_provisions(
        &self,
        leases: &[Uuid],
    ) -> Result<Vec<ProvisionInfo>, CallError> {
        if leases.is_empty() || leases.len() > BACKEND_LOOKUP_UUIDS_MAX {
            return Err(CallError::Decode {
                reason: format!("a lookup names 1 to {BACKEND_LOOKUP_UUIDS_MAX} leases"),
            });
        }
        let mut sorted = leases.to_vec();
        sorted.sort_unstable();
        let query: Vec<String> = sorted.iter().map(|lease| format!("lease_uuid={lease}")).collect();
        let target = format!("/provisions?{}", query.join("&"));
        match self.get::<ProvisionsPage>(&target, BACKEND_PROVISIONS_BYTES_MAX).await {
            Ok(page) => Ok(page.provisions),
            Err(CallError::Backend(BackendError::NotProvisioned)) => Ok(Vec::new()),
            Err(error) => Err(error),
        }
    }

    async fn walk<P: DeserializeOwned, T>(
        &self,
        path: &str,
        cap: usize,
        split: impl Fn(P) -> (Vec<T>, Option<String>),
    ) -> Result<Vec<T>, CallError> {
        let mut all = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..BACKEND_PAGES_MAX {
            // The query's keys in sorted order, as Go's `url.Values.Encode` writes them.
            let target = match &token {
                Some(token) => format!("{path}?continue={token}&limit={BACKEND_PAGE_LIMIT}"),
                None => format!("{path}?limit={BACKEND_PAGE_LIMIT}"),
            };
            let (items, next) = split(self.get(&target, cap).await?);
            all.extend(items);
            match next {
                None => return Ok(all),
                Some(next) if token.as_ref().is_some_and(|token| &next <= token) => {
                    return Err(CallError::Decode {
                        reason: "non-advancing continue token".into(),
                    });
                }
                Some(next) => token = Some(next),
            }
        }
        Err(CallError::Decode { reason: format!("more than {BACKEND_PAGES_MAX} pages") })
    }

    async fn post<B: Serialize>(
        &self,
        route: Route,
        path: &str,
        body: &B,
    ) -> Result<(), CallError> {
        self.post_for(route, path, body, |_| Ok(())).await
    }

    /// A `POST` whose answer `read` turns into its result (inside the breaker's count).
    async fn post_for<B: Serialize, T>(
        &self,
        route: Route,
        path: &str,
        body: &B,
        read: impl FnOnce(&[u8]) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        let body =
            serde_json::to_vec(body).map_err(|e| CallError::Decode { reason: e.to_string() })?;
        let cap = BACKEND_INFO_BYTES_MAX;
        let call = Call { route, method: Method::POST, target: path, body, cap };
        self.guarded(call, read).await
    }

    async fn get<T: DeserializeOwned>(&self, target: &str, cap: usize) -> Result<T, CallError> {
        let call = Call { route: Route::Read, method: Method::GET, target, body: Vec::new(), cap };
        self.guarded(call, decode).await
    }

    /// The call behind the breaker: refused while it is open; its result, decoding included,
    /// recorded (a call dropped before its end counts as failed).
    async fn guarded<T>(
        &self,
        call: Call<'_>,
        read: impl FnOnce(&[u8]) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        self.guarded_with(call, read, true).await
    }

    /// As [`Self::guarded`]; an answer over the cap counts against the backend only when
    /// `too_large_counts`.
    async fn guarded_with<T>(
        &self,
        call: Call<'_>,
        read: impl FnOnce(&[u8]) -> Result<T, CallError>,
        too_large_counts: bool,
    ) -> Result<T, CallError> {
        let admitted = self.breaker.admit(self.clock.now())?;
        let result = self.send(call).await.and_then(|body| read(&body));
        let failed = match &result {
            Err(CallError::TooLarge { .. }) => too_large_counts,
            Err(error) => error.counts_toward_breaker(),
            Ok(_) => false,
        };
        if let Err(CallError::Backend(BackendError::MalformedErrorBody { .. })) = &result {
            self.malformed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        admitted.record(failed, self.clock.now());
        result
    }

    async fn send(&self, call: Call<'_>) -> Result<Vec<u8>, CallError> {
        let signature = self.config.secret.sign(
            Utc::now().timestamp(),
            call.method.as_str(),
            call.target,
            &call.body,
        );
        let mut request = self
            .http
            .request(call.method.clone(), format!("{}{}", self.config.url, call.target))
            .header(SIGNATURE_HEADER, signature);
        if call.method == Method::POST {
            request = request.header("content-type", "application/json").body(call.body);
        }
        let mut response = request.send().await.map_err(transport)?;
        let status = response.status().as_u16();
        let success = response.status().is_success();
        let cap = if success { call.cap } else { BACKEND_ERROR_BODY_BYTES_MAX };
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            if body.len() + chunk.len() > cap {
                if success {
                    return Err(CallError::TooLarge { limit_bytes: cap });
                }
                // An error body is only ever read this far.
                body.extend_from_slice(&chunk[..cap - body.len()]);
                break;
            }
            body.extend_from_slice(&chunk);
        }
        classify(call.route, status, &body)?;
        Ok(body)
    }
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, CallError> {
    serde_json::from_slice(body).map_err(|e| CallError::Decode { reason: e.to_string() })
}

fn transport(error: reqwest::Error) -> CallError {
    // `without_url`: a URL could carry a lease id into a log line; the backend's name does.
    CallError::Transport { reason: error.without_url().to_string() }
}
