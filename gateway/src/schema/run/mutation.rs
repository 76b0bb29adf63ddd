//! Mutations on runs: tenants submit runs to their rentals and cancel them.

use async_graphql::{Context, Object};
use leasehold_commands::run_service::SubmitRun;
use leasehold_domain::node::ManifestDigest;
use leasehold_domain::rental::RentalId;
use leasehold_domain::run::RunId;

use super::types::{CancelRunInput, SubmitRunInput};
use crate::auth::Role;
use crate::errors::{ApiError, ApiResult};
use crate::schema::command::{CommandResult, answer_on, caller_of};
use crate::schema::query::uuid_arg;
use crate::schema::{require, shared};

/// The run's mutations.
#[derive(Debug, Default, Clone, Copy)]
pub struct RunMutation;

#[Object]
impl RunMutation {
    /// Submits a run to one of your active rentals and books it on the rental's schedule
    /// (at most one running and four queued). A full schedule or a rental that is not active
    /// is `INVALID_STATE`, and the run ends failed with nothing launched.
    async fn submit_run(
        &self,
        ctx: &Context<'_>,
        input: SubmitRunInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "submit runs")?;
        let ask = SubmitRun {
            rental: RentalId(uuid_arg("rentalId", &input.rental_id)?),
            manifest_digest: ManifestDigest::parse(
                "manifestDigest",
                input.manifest_digest.as_str(),
            )
            .map_err(ApiError::from_field)?,
            max_runtime_seconds: input.max_runtime_seconds,
        };
        let caller = caller_of(principal, None);
        // Boxed, as every rented mutation's service call: a resolver's future is part of the
        // mutation root's, which every mutation's task carries on its stack.
        let runs = &shared(ctx).rented.runs;
        let submitted = Box::pin(runs.submit(&caller, &input.operation_key, &ask)).await?;
        let (run, outcome) = (submitted.run, submitted.outcome);
        answer_on::<leasehold_domain::run::RunError>(ctx, run.0.to_string(), async { Ok(outcome) })
            .await
    }

    /// Cancels one of your runs: at once when nothing was launched, else by ordering its
    /// node to stop it (the outcome is recorded when the node applies the stop, unless an
    /// exit came first).
    async fn cancel_run(
        &self,
        ctx: &Context<'_>,
        input: CancelRunInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "cancel runs")?;
        let run = RunId(uuid_arg("runId", &input.run_id)?);
        let caller = caller_of(principal, None);
        let runs = &shared(ctx).rented.runs;
        let cancelled = Box::pin(runs.cancel(&caller, &input.operation_key, run));
        answer_on(ctx, run.0.to_string(), async { cancelled.await.map(|done| done.outcome) }).await
    }
}
