//! Where a seeded VM's host gets its seed: its own copy (the seed itself, or its tenant's disk
//! artifact of the same digest there, under that host's store id), or a pull from a holder's
//! agent (fuse's artifact pull, with a grant minted with the holder's token, filed under the
//! seed's id). The dispatcher carries a pull out before the boot; a host that takes its own
//! work (`vmWork`) is handed the pull to carry out itself. A seed the artifact index no longer
//! knows as one of the tenant's ready snapshots is never sent on as named.

use leasehold_commands::CommandStore;
use leasehold_commands::vm_service::{CredentialVault, HostCatalog, VmService};
use leasehold_domain::TenantId;
use leasehold_domain::values::fleet::HostId;
use leasehold_domain::vm::SnapshotRef;
use leasehold_projections::ReconcileError;

use super::{host_target, retry};
use crate::hosts::grant::{self, GRANT_TTL_SECONDS};
use crate::hosts::wire::ArtifactPullRequest;
use crate::vault::PgCredentialVault;

/// How a host gets a VM's seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeedPlan {
    /// It holds a copy, under this store id.
    Local(String),
    /// Its agent pulls it by this digest, from one of these holders (in order), each pull
    /// with its own grant.
    Pull {
        /// The sha256 asked for and checked.
        digest: String,
        /// One pull per holder with a registered token.
        from: Vec<ArtifactPullRequest>,
    },
    /// It cannot get it, for good (the seed is gone, no copy can move, or none is held where
    /// Leasehold can mint a grant: a holder with no registered agent token).
    Unavailable(String),
}

/// How `host` gets `tenant`'s `seed`.
///
/// # Errors
/// The index, a host or a token cannot be read.
pub async fn seed_plan<S, C, V>(
    (vms, tokens): (&VmService<S, C, V>, &PgCredentialVault),
    (tenant, host): (&TenantId, &HostId),
    seed: &str,
) -> Result<SeedPlan, ReconcileError>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    C: HostCatalog,
    V: CredentialVault,
{
    let gone =
        || SeedPlan::Unavailable("the seed is not one of the tenant's ready snapshots".into());
    let Ok(seed_ref) = SnapshotRef::parse("seed", seed) else { return Ok(gone()) };
    let copies = vms.catalog().seed_copies(tenant, &seed_ref).await;
    let copies = copies.map_err(|error| retry("read the seed's copies", &error))?;
    if copies.is_empty() {
        return Ok(gone());
    }
    if let Some(local) = copies.iter().find(|copy| copy.host == *host && copy.bootable_here()) {
        return Ok(SeedPlan::Local(local.store_ref.to_string()));
    }
    let movable: Vec<_> = copies.iter().filter(|copy| copy.pullable().is_some()).collect();
    let Some(digest) = movable.first().and_then(|copy| copy.pullable()).map(ToString::to_string)
    else {
        return Ok(SeedPlan::Unavailable("no copy of the seed can move to this host".into()));
    };
    let mut from = Vec::new();
    let mut asked = std::collections::BTreeSet::new();
    // One pull per holder: its first movable copy.
    for copy in movable.into_iter().filter(|copy| asked.insert(copy.host.clone())) {
        let Some(peer) = host_target(vms.pipeline(), tokens, &copy.host).await? else { continue };
        let digest = copy.pullable().expect("movable").as_str();
        from.push(pull_request(&peer.url, &peer.token, (digest, seed))?);
    }
    if from.is_empty() {
        let why = "no holder of a movable copy of the seed has a registered agent token";
        return Ok(SeedPlan::Unavailable(why.into()));
    }
    Ok(SeedPlan::Pull { digest, from })
}

/// A pull of `digest` from the agent at `peer_url` (whose token is `peer_token`: the grant is
/// minted with it, and the pulling agent never holds it), filed under `snapshot_id`.
///
/// # Errors
/// No randomness for the grant's nonce.
pub fn pull_request(
    peer_url: &str,
    peer_token: &str,
    (digest, snapshot_id): (&str, &str),
) -> Result<ArtifactPullRequest, ReconcileError> {
    let expiry = chrono::Utc::now().timestamp() + GRANT_TTL_SECONDS;
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce).map_err(|error| retry("draw a grant's nonce", &error))?;
    Ok(ArtifactPullRequest {
        peer_url: peer_url.to_owned(),
        grant: grant::mint(peer_token, digest, expiry, nonce),
        snapshot_id: snapshot_id.to_owned(),
    })
}
