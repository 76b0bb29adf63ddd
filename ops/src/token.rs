//! `leasehold token`: prints a token signed with the secret `serve` uses.

use chrono::TimeDelta;
use clap::Args;
use leasehold_domain::TenantId;
use leasehold_gateway::{JwtSecret, Role};
use uuid::Uuid;

use crate::secrets::SecretArgs;

/// Options of `leasehold token`.
#[derive(Debug, Clone, Args)]
pub struct TokenArgs {
    /// tenant, operator, auditor or agent.
    #[arg(long)]
    role: Role,
    /// The tenant (required for --role tenant).
    #[arg(long)]
    tenant: Option<String>,
    /// For agents: the only provider (UUID) whose leases the token may report on. An agent
    /// token needs this or --all-providers.
    #[arg(long, conflicts_with = "all_providers")]
    provider: Option<Uuid>,
    /// For agents: grant reporting on every provider's leases (a separate, explicit grant,
    /// for a control-plane component rather than one provider's agent).
    #[arg(long, conflicts_with = "host")]
    all_providers: bool,
    /// For a host's agent: the host (its id) whose VMs the token may report on, and whose
    /// heartbeat it sends.
    #[arg(long, conflicts_with = "provider")]
    host: Option<String>,
    /// For a rental provider's agent: the provider connection (its name in the providers
    /// file) whose rentals the token may report on (receipts, observations).
    #[arg(long, conflicts_with_all = ["provider", "host", "all_providers"])]
    connection: Option<String>,
    /// For a runner node's agent: the runner node (its registered name) the token registers,
    /// whose inventory it reports and whose bound runner leases it reports on.
    #[arg(long, conflicts_with_all = ["provider", "host", "all_providers", "connection"])]
    runner_node: Option<String>,
    /// The subject (default: the role, or the tenant's name with `-user`).
    #[arg(long)]
    sub: Option<String>,
    /// How long it is valid: a number and a unit, s, m, h or d (e.g. 90m, 1h, 7d).
    #[arg(long, default_value = "1h", value_parser = parse_ttl)]
    ttl: TimeDelta,
    #[command(flatten)]
    secret: SecretArgs,
}

/// Prints the token on standard output.
pub fn run(args: &TokenArgs) -> anyhow::Result<()> {
    let secret = JwtSecret::new(&args.secret.secret()?)?;
    let tenant = match (&args.tenant, args.role) {
        (Some(name), _) => {
            Some(TenantId::parse(name).map_err(|e| anyhow::anyhow!("--tenant: {e}"))?)
        }
        (None, Role::Tenant) => anyhow::bail!("--role tenant needs --tenant"),
        (None, _) => None,
    };
    let sub = args.sub.clone().unwrap_or_else(|| match &tenant {
        Some(tenant) => format!("{}-user", tenant.as_str()),
        None => args.role.as_str().to_string(),
    });
    if let Some(host) = &args.host {
        anyhow::ensure!(args.role == Role::Agent, "--host is only for --role agent");
        let host = leasehold_domain::values::fleet::HostId::parse("--host", host.as_str())?;
        // Each host's agent its own subject by default: its own keys and cursors.
        let sub = args.sub.clone().unwrap_or_else(|| format!("host-{host}"));
        println!("{}", secret.mint_host_agent(&sub, &host, args.ttl));
        return Ok(());
    }
    if let Some(connection) = &args.connection {
        anyhow::ensure!(args.role == Role::Agent, "--connection is only for --role agent");
        let connection = leasehold_domain::rental::ConnectionId::parse("--connection", connection)?;
        let sub = args.sub.clone().unwrap_or_else(|| format!("connection-{connection}"));
        println!("{}", secret.mint_connection_agent(&sub, &connection, args.ttl));
        return Ok(());
    }
    if let Some(node) = &args.runner_node {
        anyhow::ensure!(args.role == Role::Agent, "--runner-node is only for --role agent");
        let node = leasehold_domain::runner::RunnerNodeName::parse("--runner-node", node)?;
        let sub = args.sub.clone().unwrap_or_else(|| format!("runner-node-{node}"));
        println!("{}", secret.mint_runner_node_agent(&sub, &node, args.ttl));
        return Ok(());
    }
    let token = match (args.role, args.provider, args.all_providers) {
        (Role::Agent, None, false) => anyhow::bail!(
            "--role agent needs --provider UUID, --host ID, --connection NAME, --runner-node \
             NAME (or the explicit --all-providers)"
        ),
        (Role::Agent, None, true) => secret.mint_agent_for_all_providers(&sub, args.ttl),
        (_, _, true) => anyhow::bail!("--all-providers is only for --role agent"),
        (role, provider, false) => secret.mint_for(&sub, role, tenant.as_ref(), provider, args.ttl),
    };
    println!("{token}");
    Ok(())
}

/// `90m`, `1h`, `7d`, `30s`.
pub fn parse_ttl(text: &str) -> Result<TimeDelta, String> {
    let (number, unit) = text.split_at(text.len().saturating_sub(1));
    let number: i64 = number.parse().map_err(|_| format!("{text:?}: expected e.g. 90m, 1h, 7d"))?;
    let delta = match unit {
        "s" => TimeDelta::try_seconds(number),
        "m" => TimeDelta::try_minutes(number),
        "h" => TimeDelta::try_hours(number),
        "d" => TimeDelta::try_days(number),
        _ => None,
    };
    delta
        .filter(|delta| *delta > TimeDelta::zero())
        .ok_or_else(|| format!("{text:?}: expected a positive duration such as 90m, 1h, 7d"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_their_unit() {
        assert_eq!(parse_ttl("90m"), Ok(TimeDelta::minutes(90)));
        assert_eq!(parse_ttl("7d"), Ok(TimeDelta::days(7)));
        assert!(parse_ttl("1y").is_err());
        assert!(parse_ttl("0h").is_err());
        assert!(parse_ttl("h").is_err());
    }
}
