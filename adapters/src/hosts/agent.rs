//! A client of fuse's host agent: `Authorization: Bearer <the host's token>` on every route,
//! error bodies read as plain text and capped (fuse's client reads 64 KiB), answers capped,
//! a 404 on delete taken as already gone, redirects refused.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::wire::{
    AgentCapacity, AgentVm, AgentVms, ArtifactPullRequest, ArtifactPulled, CreateVmRequest,
    ExportRequest, ForkVmRequest, RestoreRequest, SnapshotRequest, SnapshotTaken,
};

/// Largest error body kept, in bytes (fuse's `hostwire.MaxErrorBodyBytes`).
const ERROR_BODY_BYTES_MAX: usize = 64 * 1024;

/// Largest answer read, in bytes.
const ANSWER_BYTES_MAX: usize = 1024 * 1024;

/// Where one host's agent is and the token it wants. Its `Debug` never shows the token.
#[derive(Clone)]
pub struct AgentTarget {
    /// The agent's base URL.
    pub url: String,
    /// Its bearer token.
    pub token: String,
}

impl std::fmt::Debug for AgentTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTarget").field("url", &self.url).finish_non_exhaustive()
    }
}

/// Why an exchange with an agent failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// The agent refused the token (401).
    #[error("the host agent refused its token")]
    Unauthorized,
    /// It already has a VM of that name (409).
    #[error("the host agent already has that VM")]
    Exists,
    /// It has no such VM (404).
    #[error("the host agent has no such VM")]
    NotFound,
    /// It refused the request (another 4xx), with its text.
    #[error("the host agent refused the request ({status}): {message}")]
    Refused {
        /// The status.
        status: u16,
        /// Its plain-text body, capped.
        message: String,
    },
    /// It failed (5xx), with its text: a boot that failed and was rolled back.
    #[error("the host agent failed ({status}): {message}")]
    Failed {
        /// The status.
        status: u16,
        /// Its plain-text body, capped.
        message: String,
    },
    /// No answer: unreachable, timed out, or cut off.
    #[error("the host agent did not answer: {0}")]
    Unreachable(String),
    /// An answer that is not what the contract says.
    #[error("the host agent's answer is malformed: {0}")]
    Malformed(String),
}

/// What a delete found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// The agent destroyed it (204).
    Destroyed,
    /// It was gone already (404).
    AlreadyGone,
}

/// What an export found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exported {
    /// The agent wrote it (200, 204).
    Written,
    /// It took it on, to report later (202).
    Accepted,
}

/// The client, shared by every host.
#[derive(Debug, Clone)]
pub struct HostAgentClient {
    http: reqwest::Client,
}

impl HostAgentClient {
    /// A client whose every exchange takes at most `timeout` (a boot waits for the VM:
    /// fuse's agent answers a create only once it booted, up to its own 60 s).
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(timeout: Duration) -> Result<Self, AgentError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| AgentError::Unreachable(error.to_string()))?;
        Ok(Self { http })
    }

    /// `POST /v1/vm`: boots a VM; answers once it booted.
    ///
    /// # Errors
    /// [`AgentError`]; `Exists` when a VM of that name is there already.
    pub async fn create(
        &self,
        agent: &AgentTarget,
        request: &CreateVmRequest,
    ) -> Result<AgentVm, AgentError> {
        self.exchange(agent, Method::POST, "/v1/vm", Some(request)).await
    }

    /// `GET /v1/vm/{id}`: the VM, or `None` when the agent has none of that id.
    ///
    /// # Errors
    /// [`AgentError`] other than not found.
    pub async fn get(
        &self,
        agent: &AgentTarget,
        vm_id: &str,
    ) -> Result<Option<AgentVm>, AgentError> {
        let path = format!("/v1/vm/{vm_id}");
        match self.exchange::<(), AgentVm>(agent, Method::GET, &path, None).await {
            Ok(vm) => Ok(Some(vm)),
            Err(AgentError::NotFound) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// `GET /v1/vm?prefix=P`: every VM whose name starts with `prefix`.
    ///
    /// # Errors
    /// [`AgentError`].
    pub async fn list(
        &self,
        agent: &AgentTarget,
        prefix: &str,
    ) -> Result<Vec<AgentVm>, AgentError> {
        let path = format!("/v1/vm?prefix={prefix}");
        let listed: AgentVms = self.exchange::<(), _>(agent, Method::GET, &path, None).await?;
        Ok(listed.vms)
    }

    /// `DELETE /v1/vm/{id}`: 204 destroyed, 404 already gone.
    ///
    /// # Errors
    /// [`AgentError`] other than not found.
    pub async fn delete(&self, agent: &AgentTarget, vm_id: &str) -> Result<Deleted, AgentError> {
        let path = format!("/v1/vm/{vm_id}");
        let response = self.send::<()>(agent, Method::DELETE, &path, None).await?;
        match response.status() {
            StatusCode::NO_CONTENT | StatusCode::OK => Ok(Deleted::Destroyed),
            StatusCode::NOT_FOUND => Ok(Deleted::AlreadyGone),
            _ => Err(failure(response).await),
        }
    }

    /// `POST /v1/vm/{id}/snapshot`: a snapshot of the VM into the host's store, answered once
    /// taken (and hashed).
    ///
    /// # Errors
    /// [`AgentError`]; `NotFound` for no such VM.
    pub async fn snapshot(
        &self,
        agent: &AgentTarget,
        vm_id: &str,
        request: &SnapshotRequest,
    ) -> Result<SnapshotTaken, AgentError> {
        let path = format!("/v1/vm/{vm_id}/snapshot");
        let within = Duration::from_secs(crate::limits::HOST_AGENT_SNAPSHOT_SECONDS);
        self.exchange_within(agent, (Method::POST, &path), Some(request), Some(within)).await
    }

    /// `POST /v1/vm/{id}/restore`: the VM restored in place from one of its snapshots (a disk
    /// one cold-booted, a live one resumed), answered once done.
    ///
    /// # Errors
    /// [`AgentError`]; `NotFound` for no such VM or snapshot (fuse's agent answers both with
    /// 404).
    pub async fn restore(
        &self,
        agent: &AgentTarget,
        vm_id: &str,
        request: &RestoreRequest,
    ) -> Result<(), AgentError> {
        let path = format!("/v1/vm/{vm_id}/restore");
        let within = Duration::from_secs(crate::limits::HOST_AGENT_SNAPSHOT_SECONDS);
        let _: serde_json::Value =
            self.exchange_within(agent, (Method::POST, &path), Some(request), Some(within)).await?;
        Ok(())
    }

    /// `DELETE /v1/vm/{id}/snapshots/{snapshot}`, as fuse's orchestrator sends it: 204
    /// deleted, 404 not found. fuse's agent has no such route and answers every one 404, so
    /// the bytes stay on the host (docs/fuse-host-agent-protocol.md §7): recorded as the
    /// provider's not-found, which the snapshot takes as deleted.
    ///
    /// # Errors
    /// [`AgentError`] other than not found.
    pub async fn delete_snapshot(
        &self,
        agent: &AgentTarget,
        vm_id: &str,
        snapshot: &str,
    ) -> Result<Deleted, AgentError> {
        let path = format!("/v1/vm/{vm_id}/snapshots/{snapshot}");
        let response = self.send::<()>(agent, Method::DELETE, &path, None).await?;
        match response.status() {
            StatusCode::NO_CONTENT | StatusCode::OK => Ok(Deleted::Destroyed),
            StatusCode::NOT_FOUND => Ok(Deleted::AlreadyGone),
            _ => Err(failure(response).await),
        }
    }

    /// `POST /v1/vm/{source}/fork`: a new VM on the same host from one of the source's
    /// snapshots, answered once it booted.
    ///
    /// # Errors
    /// [`AgentError`]; `NotFound` for no such source or snapshot, `Exists` when a VM of the
    /// new name is there already.
    pub async fn fork(
        &self,
        agent: &AgentTarget,
        source: &str,
        request: &ForkVmRequest,
    ) -> Result<AgentVm, AgentError> {
        let path = format!("/v1/vm/{source}/fork");
        self.exchange(agent, Method::POST, &path, Some(request)).await
    }

    /// `POST /v1/artifacts/{digest}/pull`: the agent fetches an artifact from a peer agent
    /// (with a grant the peer checks) and files it, only once it verified.
    ///
    /// # Errors
    /// [`AgentError`]; a transfer or verification failure is `Refused` (422).
    pub async fn pull_artifact(
        &self,
        agent: &AgentTarget,
        digest: &str,
        request: &ArtifactPullRequest,
    ) -> Result<ArtifactPulled, AgentError> {
        let path = format!("/v1/artifacts/{digest}/pull");
        let within = Duration::from_secs(crate::limits::HOST_AGENT_ARTIFACT_PULL_SECONDS);
        self.exchange_within(agent, (Method::POST, &path), Some(request), Some(within)).await
    }

    /// `POST /v1/vm/{id}/snapshots/{snapshot}/export` (Leasehold's route, not fuse's): the
    /// agent writes `snapshot` of its store to the request's destination.
    ///
    /// # Errors
    /// [`AgentError`]; `NotFound` for no such snapshot, or an agent without the route.
    pub async fn export_snapshot(
        &self,
        agent: &AgentTarget,
        (vm_id, snapshot): (&str, &str),
        request: &ExportRequest,
    ) -> Result<Exported, AgentError> {
        let path = format!("/v1/vm/{vm_id}/snapshots/{snapshot}/export");
        let within = Some(Duration::from_secs(crate::limits::HOST_AGENT_SNAPSHOT_SECONDS));
        let response =
            self.send_within(agent, (Method::POST, &path), Some(request), within).await?;
        match response.status() {
            StatusCode::OK | StatusCode::NO_CONTENT => Ok(Exported::Written),
            StatusCode::ACCEPTED => Ok(Exported::Accepted),
            _ => Err(failure(response).await),
        }
    }

    /// `GET /v1/capacity`: what the host has, as its agent probes it.
    ///
    /// # Errors
    /// [`AgentError`].
    pub async fn capacity(&self, agent: &AgentTarget) -> Result<AgentCapacity, AgentError> {
        self.exchange::<(), _>(agent, Method::GET, "/v1/capacity", None).await
    }

    async fn send<B: Serialize>(
        &self,
        agent: &AgentTarget,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<reqwest::Response, AgentError> {
        self.send_within(agent, (method, path), body, None).await
    }

    /// As `send`, taking at most `within` instead of the client's timeout when given (a
    /// snapshot, an artifact transfer).
    async fn send_within<B: Serialize>(
        &self,
        agent: &AgentTarget,
        (method, path): (Method, &str),
        body: Option<&B>,
        within: Option<Duration>,
    ) -> Result<reqwest::Response, AgentError> {
        let url = format!("{}{path}", agent.url.trim_end_matches('/'));
        let mut request = self
            .http
            .request(method, url)
            .header(reqwest::header::AUTHORIZATION, format!("Bearer {}", agent.token))
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        if let Some(body) = body {
            let bytes = serde_json::to_vec(body).expect("requests serialize");
            request = request.body(bytes);
        }
        if let Some(within) = within {
            request = request.timeout(within);
        }
        // The error's text may name the URL, never the token (a header).
        request
            .send()
            .await
            .map_err(|error| AgentError::Unreachable(error.without_url().to_string()))
    }

    async fn exchange<B: Serialize, T: DeserializeOwned>(
        &self,
        agent: &AgentTarget,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, AgentError> {
        self.exchange_within(agent, (method, path), body, None).await
    }

    async fn exchange_within<B: Serialize, T: DeserializeOwned>(
        &self,
        agent: &AgentTarget,
        (method, path): (Method, &str),
        body: Option<&B>,
        within: Option<Duration>,
    ) -> Result<T, AgentError> {
        let response = self.send_within(agent, (method, path), body, within).await?;
        if !response.status().is_success() {
            return Err(failure(response).await);
        }
        let bytes = capped(response, ANSWER_BYTES_MAX).await?;
        serde_json::from_slice(&bytes).map_err(|error| AgentError::Malformed(error.to_string()))
    }
}

/// The error an unsuccessful answer means.
async fn failure(response: reqwest::Response) -> AgentError {
    let status = response.status();
    let text = match capped(response, ERROR_BODY_BYTES_MAX).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
        Err(error) => return error,
    };
    match status {
        StatusCode::UNAUTHORIZED => AgentError::Unauthorized,
        StatusCode::CONFLICT => AgentError::Exists,
        StatusCode::NOT_FOUND => AgentError::NotFound,
        status if status.is_server_error() => {
            AgentError::Failed { status: status.as_u16(), message: text }
        }
        status => AgentError::Refused { status: status.as_u16(), message: text },
    }
}

/// The body, read up to `max` bytes (a longer one is cut there: the agent's text is for
/// operators, and an answer that long is malformed anyway).
async fn capped(mut response: reqwest::Response, max: usize) -> Result<Vec<u8>, AgentError> {
    let mut body = Vec::new();
    while let Some(chunk) =
        response.chunk().await.map_err(|error| AgentError::Unreachable(error.to_string()))?
    {
        let room = max.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= max {
            break;
        }
    }
    Ok(body)
}
