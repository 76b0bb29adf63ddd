//! Who is calling: HS256 JWTs with the claims `sub`, `role`, `tenant`, `provider` and `exp`.
//!
//! The tenant a request acts for comes from here and nowhere else. A token is verified with
//! HS256 only (the `alg` header cannot choose another algorithm), with its expiry required and
//! checked with a small leeway for clock skew.

use std::fmt;

use chrono::{DateTime, TimeDelta, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use leasehold_domain::TenantId;
use leasehold_domain::lease::ProviderId;
use leasehold_domain::rental::ConnectionId;
use leasehold_domain::runner::RunnerNodeName;
use leasehold_domain::values::fleet::HostId;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The shortest secret accepted, in bytes (HS256 keys shorter than the hash are weak).
pub const SECRET_BYTES_MIN: usize = 32;

/// Seconds of clock skew a token's expiry tolerates.
const LEEWAY_SECONDS: u64 = 5;

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Its own tenant's data only.
    Tenant,
    /// Everything operational.
    Operator,
    /// Reads the whole log; changes nothing.
    Auditor,
    /// A machine actor (backend, provider, node agent): reports, fenced.
    Agent,
}

impl Role {
    /// The role as tokens and events spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tenant => "tenant",
            Self::Operator => "operator",
            Self::Auditor => "auditor",
            Self::Agent => "agent",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = AuthError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "tenant" => Ok(Self::Tenant),
            "operator" => Ok(Self::Operator),
            "auditor" => Ok(Self::Auditor),
            "agent" => Ok(Self::Agent),
            _ => Err(AuthError::UnknownRole),
        }
    }
}

/// A token's claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Who.
    pub sub: String,
    /// In which role.
    pub role: Role,
    /// For `tenant` tokens: the tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// For `agent` tokens: the only provider whose leases it may report on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<Uuid>,
    /// For `agent` tokens: the explicit grant to report on every provider's leases. An agent
    /// token carries either this or `provider`, or is a host's agent (`host`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all_providers: bool,
    /// For a host's agent token: the only host whose VMs it may report on (and whose
    /// heartbeat it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// For a rental provider's agent token: the only provider connection whose rentals it
    /// may report on (receipts and observations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<String>,
    /// For a runner node's agent token: the only runner node it registers, whose inventory
    /// it reports and whose leases' phases, heartbeats and teardowns it reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_node: Option<String>,
    /// Expiry, seconds since the Unix epoch.
    pub exp: i64,
    /// Issued at, seconds since the Unix epoch.
    #[serde(default)]
    pub iat: i64,
}

impl Claims {
    /// The claims of `sub` in `role`, valid for `ttl` from now, bound to no tenant, provider,
    /// host, connection or runner node (the caller sets what its token is bound to; an agent
    /// token bound to nothing is refused).
    fn of(sub: &str, role: Role, ttl: TimeDelta) -> Self {
        let now = Utc::now();
        Self {
            sub: sub.to_string(),
            role,
            tenant: None,
            provider: None,
            all_providers: false,
            host: None,
            connection: None,
            runner_node: None,
            exp: (now + ttl).timestamp(),
            iat: now.timestamp(),
        }
    }

    /// An agent's claims for `sub` (see [`Claims::of`]).
    fn agent(sub: &str, ttl: TimeDelta) -> Self {
        Self::of(sub, Role::Agent, ttl)
    }
}

/// A verified caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The token's subject.
    pub subject: String,
    /// Its role.
    pub role: Role,
    /// The tenant, for tenant tokens.
    pub tenant: Option<TenantId>,
    /// The provider an agent is bound to; `None` for an agent only with the explicit
    /// all-providers grant (and for the other roles, which act for no provider).
    pub provider: Option<ProviderId>,
    /// The host a host's agent is bound to.
    pub host: Option<HostId>,
    /// The provider connection a rental provider's agent is bound to.
    pub connection: Option<ConnectionId>,
    /// The runner node a runner node's agent is bound to.
    pub runner_node: Option<RunnerNodeName>,
    /// When the token stops being valid.
    pub expires_at: DateTime<Utc>,
}

impl Principal {
    /// The scope cursors handed to this caller are bound to: a tenant's cursors are useless to
    /// anyone else.
    pub fn cursor_scope(&self) -> String {
        match (&self.tenant, self.role) {
            (Some(tenant), Role::Tenant) => format!("tenant:{}", tenant.as_str()),
            (_, Role::Agent) => format!("agent:{}", self.subject),
            (_, role) => role.as_str().to_string(),
        }
    }
}

/// Why a token was not accepted. Never says more than a client needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization: Bearer` header (or no `authorization` in `connection_init`).
    #[error("a bearer token is required")]
    Missing,
    /// Not a well-formed bearer token, a bad signature, or claims that do not validate.
    #[error("the token is not valid")]
    Invalid,
    /// Well-formed and signed, but past its expiry.
    #[error("the token has expired")]
    Expired,
    /// A role outside tenant, operator, auditor and agent.
    #[error("unknown role (expected tenant, operator, auditor or agent)")]
    UnknownRole,
    /// A tenant token without a valid `tenant` claim.
    #[error("a tenant token needs a valid tenant claim")]
    TenantMissing,
    /// An agent token that names no provider or host and does not carry the all-providers
    /// grant.
    #[error("an agent token must name its provider or host (or carry the all-providers grant)")]
    ProviderMissing,
    /// The signing secret is shorter than [`SECRET_BYTES_MIN`].
    #[error("the JWT secret must be at least {SECRET_BYTES_MIN} bytes")]
    WeakSecret,
}

/// The HS256 secret tokens are signed and verified with. Its `Debug` never shows it.
#[derive(Clone)]
pub struct JwtSecret {
    encoding: EncodingKey,
    decoding: DecodingKey,
}

impl fmt::Debug for JwtSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JwtSecret(..)")
    }
}

impl JwtSecret {
    /// A secret from its bytes (surrounding whitespace, as a secret file ends with, is cut).
    ///
    /// # Errors
    /// [`AuthError::WeakSecret`] when shorter than [`SECRET_BYTES_MIN`] bytes.
    pub fn new(bytes: &[u8]) -> Result<Self, AuthError> {
        let bytes = bytes.trim_ascii();
        if bytes.len() < SECRET_BYTES_MIN {
            return Err(AuthError::WeakSecret);
        }
        let encoding = EncodingKey::from_secret(bytes).map_err(|_| AuthError::WeakSecret)?;
        let decoding = DecodingKey::from_secret(bytes).map_err(|_| AuthError::WeakSecret)?;
        Ok(Self { encoding, decoding })
    }

    /// A token for `claims`.
    pub fn mint(&self, claims: &Claims) -> String {
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &self.encoding)
            .expect("HS256 signing of serializable claims cannot fail")
    }

    /// A token for `sub` in `role`, valid for `ttl` from now.
    pub fn mint_for(
        &self,
        sub: &str,
        role: Role,
        tenant: Option<&TenantId>,
        provider: Option<Uuid>,
        ttl: TimeDelta,
    ) -> String {
        let tenant = tenant.map(|tenant| tenant.as_str().to_string());
        self.mint(&Claims { tenant, provider, ..Claims::of(sub, role, ttl) })
    }

    /// A token for the agent of `host`, valid for `ttl`: it reports on that host's VMs only.
    pub fn mint_host_agent(&self, sub: &str, host: &HostId, ttl: TimeDelta) -> String {
        self.mint(&Claims { host: Some(host.to_string()), ..Claims::agent(sub, ttl) })
    }

    /// A token for the agent of the rental provider connection `connection`, valid for `ttl`:
    /// it reports on that connection's rentals only.
    pub fn mint_connection_agent(
        &self,
        sub: &str,
        connection: &ConnectionId,
        ttl: TimeDelta,
    ) -> String {
        let connection = Some(connection.to_string());
        self.mint(&Claims { connection, ..Claims::agent(sub, ttl) })
    }

    /// A token for the agent of the runner node `node`, valid for `ttl`: it registers that
    /// node, reports its inventory, and reports on the runner leases bound to it only.
    pub fn mint_runner_node_agent(
        &self,
        sub: &str,
        node: &RunnerNodeName,
        ttl: TimeDelta,
    ) -> String {
        self.mint(&Claims { runner_node: Some(node.to_string()), ..Claims::agent(sub, ttl) })
    }

    /// An agent token for `sub` that may report on every provider's leases, valid for `ttl`:
    /// a separate, explicit grant (an agent token without a provider is refused).
    pub fn mint_agent_for_all_providers(&self, sub: &str, ttl: TimeDelta) -> String {
        self.mint(&Claims { all_providers: true, ..Claims::agent(sub, ttl) })
    }

    /// The caller a token names, if its signature and claims hold now.
    ///
    /// # Errors
    /// [`AuthError`]: expired, invalid, or a tenant token without a tenant.
    pub fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = LEEWAY_SECONDS;
        validation.set_required_spec_claims(&["exp", "sub"]);
        let claims = jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation)
            .map_err(|error| match error.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => AuthError::Expired,
                _ => AuthError::Invalid,
            })?
            .claims;
        principal_of(claims)
    }

    /// The caller an `Authorization` value (`Bearer <token>`) names.
    ///
    /// # Errors
    /// [`AuthError::Missing`] without a value; otherwise as [`JwtSecret::verify`].
    pub fn verify_header(&self, value: Option<&str>) -> Result<Principal, AuthError> {
        let value = value.map(str::trim).filter(|value| !value.is_empty());
        let value = value.ok_or(AuthError::Missing)?;
        let (scheme, token) = value.split_once(' ').ok_or(AuthError::Invalid)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(AuthError::Invalid);
        }
        self.verify(token.trim())
    }
}

fn principal_of(claims: Claims) -> Result<Principal, AuthError> {
    let tenant = match claims.role {
        Role::Tenant => {
            let raw = claims.tenant.as_deref().ok_or(AuthError::TenantMissing)?;
            // Tenant ids under `leasehold:` are Leasehold's own (the fleet's hosts).
            if raw.starts_with(leasehold_domain::values::fleet::RESERVED_TENANT_PREFIX) {
                return Err(AuthError::TenantMissing);
            }
            Some(TenantId::parse(raw).map_err(|_| AuthError::TenantMissing)?)
        }
        _ => None,
    };
    let host = match (claims.role, claims.host.as_deref()) {
        (Role::Agent, Some(raw)) => {
            Some(HostId::parse("host", raw).map_err(|_| AuthError::Invalid)?)
        }
        (_, Some(_)) => return Err(AuthError::Invalid),
        _ => None,
    };
    let connection = match (claims.role, claims.connection.as_deref()) {
        (Role::Agent, Some(raw)) => {
            Some(ConnectionId::parse("connection", raw).map_err(|_| AuthError::Invalid)?)
        }
        (_, Some(_)) => return Err(AuthError::Invalid),
        _ => None,
    };
    let runner_node = match (claims.role, claims.runner_node.as_deref()) {
        (Role::Agent, Some(raw)) => {
            Some(RunnerNodeName::parse("runnerNode", raw).map_err(|_| AuthError::Invalid)?)
        }
        (_, Some(_)) => return Err(AuthError::Invalid),
        _ => None,
    };
    let provider =
        provider_of(&claims, [host.is_some(), connection.is_some(), runner_node.is_some()])?;
    let expires_at = DateTime::from_timestamp(claims.exp, 0).ok_or(AuthError::Invalid)?;
    let subject = claims.sub;
    Ok(Principal {
        subject,
        role: claims.role,
        tenant,
        provider,
        host,
        connection,
        runner_node,
        expires_at,
    })
}

/// An agent's provider: an agent is bound to exactly one of a provider, every provider, a
/// host, a rental connection or a runner node (`bindings`: the last three, present or not).
fn provider_of(claims: &Claims, bindings: [bool; 3]) -> Result<Option<ProviderId>, AuthError> {
    let others = bindings.iter().filter(|bound| **bound).count();
    match (claims.role, claims.provider, claims.all_providers, others) {
        (Role::Agent, Some(provider), false, 0) => Ok(Some(ProviderId(provider))),
        (Role::Agent, None, true, 0) | (Role::Agent, None, false, 1) => Ok(None),
        (Role::Agent, None, false, 0) => Err(AuthError::ProviderMissing),
        (Role::Agent, _, _, _) => Err(AuthError::Invalid),
        _ => Ok(None),
    }
}

/// A fresh random secret, hex-encoded (64 characters), for a data directory's secret file.
///
/// # Panics
/// When the operating system has no randomness to give.
pub fn random_secret() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system provides randomness");
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> JwtSecret {
        JwtSecret::new(&[7; 32]).expect("long enough")
    }

    #[test]
    fn a_minted_token_verifies_to_its_principal() {
        let acme = TenantId::parse("acme").expect("valid");
        let token =
            secret().mint_for("alice", Role::Tenant, Some(&acme), None, TimeDelta::hours(1));
        let principal = secret().verify_header(Some(&format!("Bearer {token}"))).expect("valid");
        assert_eq!(principal.tenant, Some(acme));
        assert_eq!(principal.cursor_scope(), "tenant:acme");
    }

    #[test]
    fn bad_tokens_are_refused_with_their_reason() {
        let other = JwtSecret::new(&[8; 32]).expect("long enough");
        let forged = other.mint_for("mallory", Role::Operator, None, None, TimeDelta::hours(1));
        assert_eq!(secret().verify(&forged), Err(AuthError::Invalid));
        let old = secret().mint_for("bob", Role::Operator, None, None, TimeDelta::hours(-1));
        assert_eq!(secret().verify(&old), Err(AuthError::Expired));
        let tenantless = secret().mint_for("bob", Role::Tenant, None, None, TimeDelta::hours(1));
        assert_eq!(secret().verify(&tenantless), Err(AuthError::TenantMissing));
        assert_eq!(secret().verify_header(None), Err(AuthError::Missing));
        assert_eq!(secret().verify_header(Some("Basic abc")), Err(AuthError::Invalid));
        assert_eq!(JwtSecret::new(b"short").err(), Some(AuthError::WeakSecret));
    }

    #[test]
    fn an_agent_token_names_its_provider_or_carries_the_all_providers_grant() {
        let unbound = secret().mint_for("agent", Role::Agent, None, None, TimeDelta::hours(1));
        assert_eq!(secret().verify(&unbound), Err(AuthError::ProviderMissing));
        let provider = Uuid::from_u128(7);
        let bound =
            secret().mint_for("agent", Role::Agent, None, Some(provider), TimeDelta::hours(1));
        assert_eq!(secret().verify(&bound).expect("valid").provider, Some(ProviderId(provider)));
        let all = secret().mint_agent_for_all_providers("agent", TimeDelta::hours(1));
        assert_eq!(secret().verify(&all).expect("valid").provider, None);
        let both = secret().mint(&Claims {
            sub: "agent".into(),
            role: Role::Agent,
            tenant: None,
            provider: Some(provider),
            all_providers: true,
            host: None,
            connection: None,
            runner_node: None,
            exp: Utc::now().timestamp() + 60,
            iat: Utc::now().timestamp(),
        });
        assert_eq!(secret().verify(&both), Err(AuthError::Invalid));
    }

    #[test]
    fn a_connection_agent_is_bound_to_its_connection_and_nothing_else() {
        let sim = ConnectionId::parse("connection", "sim").expect("valid");
        let token = secret().mint_connection_agent("provider-sim", &sim, TimeDelta::hours(1));
        let principal = secret().verify(&token).expect("valid");
        assert_eq!(
            (principal.connection, principal.provider, principal.host),
            (Some(sim), None, None)
        );
        let claims = |provider: Option<Uuid>, role: Role| Claims {
            sub: "agent".into(),
            role,
            tenant: Some("acme".into()),
            provider,
            all_providers: false,
            host: None,
            connection: Some("sim".into()),
            runner_node: None,
            exp: Utc::now().timestamp() + 60,
            iat: Utc::now().timestamp(),
        };
        let with_provider = secret().mint(&claims(Some(Uuid::from_u128(7)), Role::Agent));
        assert_eq!(secret().verify(&with_provider), Err(AuthError::Invalid));
        let on_a_tenant = secret().mint(&claims(None, Role::Tenant));
        assert_eq!(secret().verify(&on_a_tenant), Err(AuthError::Invalid));
    }

    #[test]
    fn a_runner_node_agent_is_bound_to_its_node_and_nothing_else() {
        let node = RunnerNodeName::parse("node", "docker-1").expect("valid");
        let token = secret().mint_runner_node_agent("runner-docker-1", &node, TimeDelta::hours(1));
        let principal = secret().verify(&token).expect("valid");
        assert_eq!(
            (principal.runner_node, principal.provider, principal.host, principal.connection),
            (Some(node), None, None, None)
        );
        let claims = |connection: Option<&str>, role: Role, name: &str| Claims {
            sub: "agent".into(),
            role,
            tenant: (role == Role::Tenant).then(|| "acme".into()),
            provider: None,
            all_providers: false,
            host: None,
            connection: connection.map(str::to_string),
            runner_node: Some(name.into()),
            exp: Utc::now().timestamp() + 60,
            iat: Utc::now().timestamp(),
        };
        for refused in [
            claims(Some("sim"), Role::Agent, "docker-1"),
            claims(None, Role::Tenant, "docker-1"),
            claims(None, Role::Agent, "not a node name"),
        ] {
            assert_eq!(secret().verify(&secret().mint(&refused)), Err(AuthError::Invalid));
        }
    }
}
