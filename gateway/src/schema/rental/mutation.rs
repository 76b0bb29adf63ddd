//! Mutations on rentals: tenants provision, stop, resume and terminate theirs (operators may
//! terminate any); a provider connection's agent reports on its connection's rentals (its
//! token names the connection), fenced by the generation the report was asked under.

use async_graphql::{Context, Object};
use leasehold_commands::CommandError;
use leasehold_commands::rental_service::{ProvisionRental, RentalOutcome};
use leasehold_domain::rental::{
    CapacityObservation, CapacityReceipt, CapacityState, ConnectionId, NativeRef, OfferId, Pricing,
    RentalError, RentalId, Resources, TerminateCause,
};

use super::types::{
    PricingInput, ProvisionRentalInput, RentalGenerationInput, RentalObservationInput,
    RentalReceiptInput, RentalReportInput,
};
use crate::auth::Role;
use crate::errors::{ApiError, ApiResult};
use crate::schema::command::{CommandResult, answer_on, caller_of};
use crate::schema::query::uuid_arg;
use crate::schema::{require, shared};

/// The rental's mutations.
#[derive(Debug, Default, Clone, Copy)]
pub struct RentalMutation;

/// Answers a rental command's result.
async fn answer(
    ctx: &Context<'_>,
    rental: RentalId,
    run: impl std::future::Future<Output = Result<RentalOutcome, CommandError<RentalError>>>,
) -> ApiResult<CommandResult> {
    // Boxed: a resolver's future is part of the mutation root's, which every mutation's
    // task carries on its stack.
    let run = Box::pin(run);
    answer_on(ctx, rental.0.to_string(), async { run.await.map(|done| done.outcome) }).await
}

fn rental_arg(input: &async_graphql::ID) -> ApiResult<RentalId> {
    Ok(RentalId(uuid_arg("rentalId", input)?))
}

fn state_arg(field: &str, state: &str) -> ApiResult<CapacityState> {
    CapacityState::parse(state).ok_or_else(|| {
        ApiError::bad_input(format!(
            "{field}: one of requested, starting, active, stopping, stopped, terminated, unknown"
        ))
    })
}

fn native_arg(native: &str) -> ApiResult<NativeRef> {
    NativeRef::parse("nativeRef", native).map_err(ApiError::from_field)
}

fn pricing_of(pricing: PricingInput) -> ApiResult<Pricing> {
    let currency = pricing.currency;
    if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(ApiError::bad_input("pricing.currency: an ISO 4217 code (USD)"));
    }
    Ok(Pricing { currency, micros_per_hour: pricing.micros_per_hour, exact: pricing.exact })
}

/// A provider connection's agent: the connection its token names, and it as a caller.
fn reporting_agent<'a>(
    ctx: &Context<'a>,
) -> ApiResult<(&'a ConnectionId, leasehold_commands::lease_service::Caller)> {
    let principal = require(ctx, &[Role::Agent], "report on rentals")?;
    let connection =
        principal.connection.as_ref().ok_or_else(|| ApiError::forbidden("report on rentals"))?;
    Ok((connection, caller_of(principal, None)))
}

#[Object]
impl RentalMutation {
    /// Rents capacity through a provider connection: the rental's id (from your operation
    /// key), its ownership token and its first node are minted now, before any provider is
    /// called. An unregistered connection is `BAD_USER_INPUT` naming `connectionId`.
    async fn provision_rental(
        &self,
        ctx: &Context<'_>,
        input: ProvisionRentalInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "provision rentals")?;
        let ask = ProvisionRental {
            connection: ConnectionId::parse("connectionId", input.connection_id.as_str())
                .map_err(ApiError::from_field)?,
            offer: OfferId::parse("offerId", input.offer_id.as_str())
                .map_err(ApiError::from_field)?,
            resources: Resources {
                cpu_millis: input.resources.cpu_millis,
                memory_mb: input.resources.memory_mb,
                disk_gb: input.resources.disk_gb,
                gpus: input.resources.gpus.unwrap_or(0),
            },
            interruptible: input.interruptible.unwrap_or(false),
            max_lifetime_seconds: input.max_lifetime_seconds,
        };
        let caller = caller_of(principal, None);
        let rentals = &shared(ctx).rented.rentals;
        let provisioned = Box::pin(rentals.provision(&caller, &input.operation_key, &ask)).await?;
        let rental = provisioned.rental;
        answer(ctx, rental, async { Ok(provisioned) }).await
    }

    /// Stops one of your rentals under the generation you read (its connection must support
    /// stop, else `UNSUPPORTED`, never retried).
    async fn stop_rental(
        &self,
        ctx: &Context<'_>,
        input: RentalGenerationInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "stop rentals")?;
        let rental = rental_arg(&input.rental_id)?;
        let caller = caller_of(principal, None);
        let rentals = &shared(ctx).rented.rentals;
        answer(ctx, rental, rentals.stop(&caller, &input.operation_key, (rental, input.generation)))
            .await
    }

    /// Resumes one of your stopped rentals under the generation you read: a new generation
    /// starts, whose node is invited while the previous generation's is retired.
    async fn resume_rental(
        &self,
        ctx: &Context<'_>,
        input: RentalGenerationInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "resume rentals")?;
        let rental = rental_arg(&input.rental_id)?;
        let caller = caller_of(principal, None);
        let rentals = &shared(ctx).rented.rentals;
        let run = rentals.resume(&caller, &input.operation_key, (rental, input.generation));
        answer(ctx, rental, run).await
    }

    /// Terminates one of your rentals (operators: any tenant's), idempotently; it stays
    /// charged until its provider confirms the machine gone.
    async fn terminate_rental(
        &self,
        ctx: &Context<'_>,
        input: RentalGenerationInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant, Role::Operator], "terminate rentals")?;
        let rental = rental_arg(&input.rental_id)?;
        let caller = caller_of(principal, None);
        let rentals = &shared(ctx).rented.rentals;
        let key = input.operation_key.as_str();
        if principal.role == Role::Tenant {
            return answer(
                ctx,
                rental,
                rentals.terminate(&caller, key, (rental, input.generation)),
            )
            .await;
        }
        let (owner, _) = Box::pin(rentals.owned(rental)).await?;
        let run = rentals.terminate_as(
            &caller,
            key,
            (owner, rental, input.generation),
            TerminateCause::Operator,
        );
        answer(ctx, rental, run).await
    }

    /// A provider connection's agent reports its provider accepted a rental's provision
    /// (what it actually allocated, and its price).
    async fn report_rental_receipt(
        &self,
        ctx: &Context<'_>,
        input: RentalReceiptInput,
    ) -> ApiResult<CommandResult> {
        let (connection, caller) = reporting_agent(ctx)?;
        let rental = rental_arg(&input.rental_id)?;
        let receipt = CapacityReceipt {
            native_ref: native_arg(&input.native_ref)?,
            state: state_arg("state", &input.state)?,
            accepted_at: input.accepted_at,
            duplicate: input.duplicate,
            interruptible: input.interruptible,
            pricing: pricing_of(input.pricing)?,
        };
        let rentals = &shared(ctx).rented.rentals;
        let key = input.operation_key.as_str();
        answer(
            ctx,
            rental,
            rentals.accept(&caller, key, connection, (rental, input.generation, receipt)),
        )
        .await
    }

    /// A provider connection's agent reports a look at a rental's machine, asked under
    /// `generation` (`FENCED` when the rental resumed since). Leasehold stamps its own
    /// receipt time; `unknown` is recorded, never acted on.
    async fn report_rental_observation(
        &self,
        ctx: &Context<'_>,
        input: RentalObservationInput,
    ) -> ApiResult<CommandResult> {
        let (connection, caller) = reporting_agent(ctx)?;
        let rental = rental_arg(&input.rental_id)?;
        let observation = CapacityObservation {
            native_ref: native_arg(&input.native_ref)?,
            state: state_arg("state", &input.state)?,
            state_since: input.state_since,
            observed_at: input.observed_at,
            interrupted: input.interrupted.unwrap_or(false),
        };
        let rentals = &shared(ctx).rented.rentals;
        let key = input.operation_key.as_str();
        let run =
            rentals.observe(&caller, key, connection, (rental, input.generation, observation));
        answer(ctx, rental, run).await
    }

    /// A provider connection's agent reports its provider does not know a rental's machine:
    /// it confirms a termination only when the provider declares terminated capacity
    /// unobservable; otherwise absence proves nothing.
    async fn report_rental_not_found(
        &self,
        ctx: &Context<'_>,
        input: RentalReportInput,
    ) -> ApiResult<CommandResult> {
        let (connection, caller) = reporting_agent(ctx)?;
        let rental = rental_arg(&input.rental_id)?;
        if input.detail.is_some() {
            return Err(ApiError::bad_input("detail: only for reportRentalProvisionFailed"));
        }
        let rentals = &shared(ctx).rented.rentals;
        let key = input.operation_key.as_str();
        answer(ctx, rental, rentals.not_found(&caller, key, connection, (rental, input.generation)))
            .await
    }

    /// A provider connection's agent reports its provider refused a rental's provision for
    /// good (`detail` is for operators, never shown to the tenant).
    async fn report_rental_provision_failed(
        &self,
        ctx: &Context<'_>,
        input: RentalReportInput,
    ) -> ApiResult<CommandResult> {
        let (connection, caller) = reporting_agent(ctx)?;
        let rental = rental_arg(&input.rental_id)?;
        let detail = input.detail.as_deref().unwrap_or_default();
        let rentals = &shared(ctx).rented.rentals;
        let key = input.operation_key.as_str();
        let run =
            rentals.fail_provision(&caller, key, connection, (rental, input.generation, detail));
        answer(ctx, rental, run).await
    }
}
