//! The client of one provider connection's agent (`wire.rs` has the routes): its bearer
//! token on every request, redirects refused, answers and error bodies capped, and every
//! answer classified into one [`ProviderError`] the dispatcher acts on. An operation the
//! connection does not declare is refused here, before anything is sent.

use std::time::Duration;

use leasehold_domain::rental::{CapacityObservation, CapacityReceipt, CapacitySupport};
use reqwest::StatusCode;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::config::ProviderConfig;
use super::wire::{
    CapacityCommand, CapacityRef, ObservationWire, OwnedCapacity, OwnedList, OwnershipQuery,
    ProviderRefusal, ProvisionCommand, ReceiptWire,
};

/// Largest answer read, in bytes.
pub(crate) const ANSWER_BYTES_MAX: usize = 1024 * 1024;

/// Longest refusal code kept, in bytes.
const CODE_BYTES_MAX: usize = 64;

/// Why an exchange with a provider failed. No variant carries a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The operation is not in the connection's declaration (refused before sending, or
    /// answered 501): a routing bug, never retried.
    #[error("the provider does not support {0}")]
    Unsupported(&'static str),
    /// The provider has no such machine (404).
    #[error("the provider has no such machine")]
    NotFound,
    /// The command's generation was superseded (409 `FENCED`).
    #[error("the provider refused a superseded generation")]
    Fenced,
    /// Refused for good (another 4xx): sending it again changes nothing. Only the status
    /// and the refusal's code are kept: the provider's message may echo the request (its
    /// bootstrap's enrollment token, the ownership token), so it is never read.
    #[error("the provider refused the request ({status} {code})")]
    Refused {
        /// The status.
        status: u16,
        /// Its code (a short token: anything else is dropped).
        code: String,
    },
    /// No usable answer (a 5xx, a 429, unreachable, timed out, malformed): tried again.
    #[error("the provider did not answer usably: {0}")]
    Failed(String),
}

/// One connection's client.
#[derive(Debug, Clone)]
pub struct ProviderClient {
    config: ProviderConfig,
    http: reqwest::Client,
}

impl ProviderClient {
    /// A client of `config`'s agent.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(config: ProviderConfig) -> Result<Self, ProviderError> {
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(10)))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| ProviderError::Failed(error.to_string()))?;
        Ok(Self { config, http })
    }

    /// The connection's settings.
    pub fn config(&self) -> &ProviderConfig {
        &self.config
    }

    fn support(&self) -> CapacitySupport {
        self.config.support
    }

    /// Provisions capacity.
    ///
    /// # Errors
    /// [`ProviderError`].
    pub async fn provision(
        &self,
        command: &ProvisionCommand,
    ) -> Result<CapacityReceipt, ProviderError> {
        let receipt: ReceiptWire = self.exchange("/v1/capacity/provision", command).await?;
        Ok(receipt.into())
    }

    /// Looks at a machine.
    ///
    /// # Errors
    /// [`ProviderError`]; `NotFound` when the provider does not know it.
    pub async fn observe(
        &self,
        capacity: &CapacityRef,
    ) -> Result<CapacityObservation, ProviderError> {
        let observed: ObservationWire = self.exchange("/v1/capacity/observe", capacity).await?;
        Ok(observed.into())
    }

    /// Stops a machine, keeping its identity.
    ///
    /// # Errors
    /// [`ProviderError`]; `Unsupported` without the declared capability.
    pub async fn stop(&self, command: &CapacityCommand) -> Result<CapacityReceipt, ProviderError> {
        if !self.support().stop {
            return Err(ProviderError::Unsupported("stop"));
        }
        let receipt: ReceiptWire = self.exchange("/v1/capacity/stop", command).await?;
        Ok(receipt.into())
    }

    /// Starts a stopped machine again, under the command's new generation.
    ///
    /// # Errors
    /// As [`Self::stop`].
    pub async fn start(&self, command: &CapacityCommand) -> Result<CapacityReceipt, ProviderError> {
        if !self.support().resume {
            return Err(ProviderError::Unsupported("resume"));
        }
        let receipt: ReceiptWire = self.exchange("/v1/capacity/start", command).await?;
        Ok(receipt.into())
    }

    /// Terminates a machine.
    ///
    /// # Errors
    /// [`ProviderError`]; `NotFound` when the provider does not know it.
    pub async fn terminate(
        &self,
        command: &CapacityCommand,
    ) -> Result<CapacityReceipt, ProviderError> {
        let receipt: ReceiptWire = self.exchange("/v1/capacity/terminate", command).await?;
        Ok(receipt.into())
    }

    /// Every machine the connection allocated, as the provider lists them.
    ///
    /// # Errors
    /// As [`Self::stop`].
    pub async fn owned(&self, query: &OwnershipQuery) -> Result<Vec<OwnedCapacity>, ProviderError> {
        if !self.support().list_owned {
            return Err(ProviderError::Unsupported("list owned"));
        }
        let listed: OwnedList = self.exchange("/v1/capacity/owned", query).await?;
        Ok(listed.capacity)
    }

    async fn exchange<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ProviderError> {
        let url = format!("{}{path}", self.config.url.trim_end_matches('/'));
        let bytes = serde_json::to_vec(body).expect("requests serialize");
        let response = self
            .http
            .post(url)
            .header(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {}", self.config.token.expose()),
            )
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(bytes)
            .send()
            .await
            // The error's text may name the URL, never the token (a header).
            .map_err(|error| ProviderError::Failed(error.without_url().to_string()))?;
        let status = response.status();
        let body = capped(response).await?;
        if status.is_success() {
            // serde's message may quote the answer: only where it failed is kept.
            return serde_json::from_slice(&body).map_err(|error| {
                ProviderError::Failed(format!(
                    "a malformed answer (line {}, column {})",
                    error.line(),
                    error.column()
                ))
            });
        }
        Err(refusal(status, &body))
    }
}

/// What an unsuccessful answer means, from its status and its refusal's code only.
pub(crate) fn refusal(status: StatusCode, body: &[u8]) -> ProviderError {
    let refusal: Option<ProviderRefusal> = serde_json::from_slice(body).ok();
    let code = refusal.map(|refusal| refusal.code).filter(|code| is_code(code)).unwrap_or_default();
    match status {
        StatusCode::NOT_IMPLEMENTED => ProviderError::Unsupported("this operation"),
        StatusCode::NOT_FOUND => ProviderError::NotFound,
        StatusCode::CONFLICT if code == "FENCED" => ProviderError::Fenced,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::REQUEST_TIMEOUT => {
            ProviderError::Failed(format!("the provider answered {status} {code}"))
        }
        status if status.is_client_error() => {
            ProviderError::Refused { status: status.as_u16(), code }
        }
        status => ProviderError::Failed(format!("the provider answered {status} {code}")),
    }
}

/// A refusal's code as the protocol spells them (`NO_CAPACITY`): upper-case letters, digits
/// and `_`, at most [`CODE_BYTES_MAX`] bytes. Anything else is not kept.
fn is_code(code: &str) -> bool {
    !code.is_empty()
        && code.len() <= CODE_BYTES_MAX
        && code.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

pub(crate) async fn capped(mut response: reqwest::Response) -> Result<Vec<u8>, ProviderError> {
    let mut body = Vec::new();
    while let Some(chunk) =
        response.chunk().await.map_err(|error| ProviderError::Failed(error.to_string()))?
    {
        if body.len() + chunk.len() > ANSWER_BYTES_MAX {
            return Err(ProviderError::Failed("an answer over 1 MiB".into()));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
