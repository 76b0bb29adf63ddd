//! The runner dispatcher's clients: of one runner node's provider agent (the routes of
//! `docs/billet-protocol.md` §1) and of the registration issuer. Each presents its bearer
//! token, refuses redirects, caps answers, and classifies every answer into one
//! [`ProviderError`], keeping a refusal's status and code only (an agent may echo the request,
//! registration included, so its message is never read).

use std::time::Duration;

use leasehold_domain::runner::{Teardown, TrustClass};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::config::{IssuerConfig, RunnerNodeConfig};
use super::wire::{
    FindAnswer, InstanceList, InstanceWire, JitAnswer, JitConfig, JitRequest, KindAnswer,
    LaunchSpec, TeardownAnswer,
};
use crate::providers::ProviderError;
use crate::providers::client::{capped, refusal};

fn http(timeout: Duration) -> Result<reqwest::Client, ProviderError> {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|error| ProviderError::Failed(error.to_string()))
}

/// One exchange: `method` on `url` with `token`, `body` as JSON; the status and the capped
/// answer.
async fn exchange<B: Serialize>(
    http: &reqwest::Client,
    (method, url, token): (Method, String, &str),
    body: Option<&B>,
) -> Result<(StatusCode, Vec<u8>), ProviderError> {
    let mut request = http.request(method, url).bearer_auth(token);
    if let Some(body) = body {
        let bytes = serde_json::to_vec(body).expect("requests serialize");
        request = request.header(reqwest::header::CONTENT_TYPE, "application/json").body(bytes);
    }
    // The error's text may name the URL, never the token (a header) or the body.
    let response = request
        .send()
        .await
        .map_err(|error| ProviderError::Failed(error.without_url().to_string()))?;
    let status = response.status();
    Ok((status, capped(response).await?))
}

/// A successful answer decoded, or its refusal.
fn decoded<T: DeserializeOwned>((status, body): (StatusCode, Vec<u8>)) -> Result<T, ProviderError> {
    if !status.is_success() {
        return Err(refusal(status, &body));
    }
    // serde's message may quote the answer: only where it failed is kept.
    serde_json::from_slice(&body).map_err(|error| {
        ProviderError::Failed(format!(
            "a malformed answer (line {}, column {})",
            error.line(),
            error.column()
        ))
    })
}

/// The client of one runner node's provider agent.
#[derive(Debug, Clone)]
pub struct RunnerProviderClient {
    config: RunnerNodeConfig,
    http: reqwest::Client,
}

impl RunnerProviderClient {
    /// A client of `config`'s agent.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(config: RunnerNodeConfig) -> Result<Self, ProviderError> {
        Ok(Self { http: http(config.timeout)?, config })
    }

    /// The node's settings.
    pub fn config(&self) -> &RunnerNodeConfig {
        &self.config
    }

    async fn call<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<(StatusCode, Vec<u8>), ProviderError> {
        let url = format!("{}{path}", self.config.url.trim_end_matches('/'));
        exchange(&self.http, (method, url, self.config.token.expose()), body).await
    }

    /// `Kind()`: the backend's kind (`docker`, ...).
    ///
    /// # Errors
    /// [`ProviderError`].
    pub async fn kind(&self) -> Result<String, ProviderError> {
        let answer: KindAnswer = decoded(self.call::<()>(Method::GET, "/kind", None).await?)?;
        Ok(answer.kind)
    }

    /// `Accepts(trust)`: whether the backend takes work of `trust` (asked before a
    /// registration is minted).
    ///
    /// # Errors
    /// [`ProviderError`] for anything but an acceptance (204) or a refusal (403).
    pub async fn accepts(&self, trust: TrustClass) -> Result<bool, ProviderError> {
        let path = format!("/accepts?trust={trust}");
        let (status, body) = self.call::<()>(Method::GET, &path, None).await?;
        match (status, refusal(status, &body)) {
            (StatusCode::NO_CONTENT, _) => Ok(true),
            // Only the protocol's refusal: a 403 of another kind (a token refused) is not an
            // answer about the trust class.
            (StatusCode::FORBIDDEN, ProviderError::Refused { code, .. }) if code == "REFUSED" => {
                Ok(false)
            }
            (_, error) => Err(error),
        }
    }

    /// `Launch(spec)`: the instance created.
    ///
    /// # Errors
    /// [`ProviderError`]: a failure is not proof nothing started; [`Self::find`] it first.
    pub async fn launch(&self, spec: &LaunchSpec) -> Result<InstanceWire, ProviderError> {
        decoded(self.call(Method::POST, "/instances", Some(spec)).await?)
    }

    /// `Find(name)`: the instance of that name, if the backend has one.
    ///
    /// # Errors
    /// [`ProviderError`].
    pub async fn find(&self, name: &str) -> Result<Option<InstanceWire>, ProviderError> {
        if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(ProviderError::Failed("an instance name out of the protocol".into()));
        }
        let path = format!("/instances?name={name}");
        let answer: FindAnswer = decoded(self.call::<()>(Method::GET, &path, None).await?)?;
        Ok(answer.instance.filter(|_| answer.found))
    }

    /// `List()`: every instance the backend runs for billet.
    ///
    /// # Errors
    /// [`ProviderError`].
    pub async fn list(&self) -> Result<Vec<InstanceWire>, ProviderError> {
        let answer: InstanceList =
            decoded(self.call::<()>(Method::GET, "/instances", None).await?)?;
        Ok(answer.instances)
    }

    /// `Destroy(id)`: what it proved (an instance already gone is success).
    ///
    /// # Errors
    /// [`ProviderError`].
    pub async fn destroy(&self, id: &str) -> Result<Teardown, ProviderError> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_graphic() && b != b'/' && b != b'?') {
            return Err(ProviderError::Failed("an instance id out of the protocol".into()));
        }
        let path = format!("/instances/{id}");
        let answer: TeardownAnswer = decoded(self.call::<()>(Method::DELETE, &path, None).await?)?;
        Teardown::parse("teardown", &answer.teardown).map_err(|_| {
            ProviderError::Failed("a teardown that is neither requested nor stopped".into())
        })
    }
}

/// The client of the registration issuer.
#[derive(Debug, Clone)]
pub struct JitIssuer {
    config: IssuerConfig,
    http: reqwest::Client,
}

impl JitIssuer {
    /// A client of `config`'s issuer.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(config: IssuerConfig) -> Result<Self, ProviderError> {
        Ok(Self { http: http(config.timeout)?, config })
    }

    /// One exchange's timeout.
    pub fn timeout(&self) -> Duration {
        self.config.timeout
    }

    /// A new registration for the runner `name` labelled `tier`.
    ///
    /// # Errors
    /// [`ProviderError`].
    pub async fn mint(&self, name: &str, tier: &str) -> Result<JitConfig, ProviderError> {
        let request = JitRequest {
            name: name.to_owned(),
            runner_group_id: self.config.runner_group_id,
            labels: vec![tier.to_owned()],
            work_folder: "_work".into(),
        };
        let target = (Method::POST, self.config.url.clone(), self.config.token.expose());
        let answer: JitAnswer = decoded(exchange(&self.http, target, Some(&request)).await?)?;
        Ok(answer.encoded_jit_config)
    }
}
