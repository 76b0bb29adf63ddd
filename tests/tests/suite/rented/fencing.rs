//! A rental's generation fences every command that acts on its capacity: after a stop and a
//! resume, a command stamped with the generation from before is `FENCED` and appends nothing;
//! under 16 concurrent commands from separate processes mixing observations, stops and
//! resumes, versions stay contiguous, generations never decrease, and nothing is applied under
//! a stale generation.

use futures_util::future::join_all;
use leasehold_commands::ErrorClass;
use leasehold_domain::node::{Node, NodeStatus};
use leasehold_domain::rental::{CapacityState, Rental, RentalEvent, RentalStatus};
use leasehold_domain::{Aggregate, DomainEvent};
use leasehold_projections::ManualClock;
use leasehold_tests::TestDb;

use super::support::*;
use leasehold_commands::enrollment::node_of;

#[tokio::test]
async fn a_command_from_before_a_stop_and_resume_is_fenced_and_appends_nothing() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let services = services(&db, &clock);
    let rental = active_rental(&services, "acme", "r1").await;
    let acme = tenant("acme");
    services.rentals.stop(&acme, "stop", (rental, 1)).await.expect("stopped");
    let stopped = looked(CapacityState::Stopped, start() + chrono::TimeDelta::seconds(5));
    services
        .rentals
        .observe(&provider(), "seen-stopped", &connection(), (rental, 1, stopped))
        .await
        .expect("observed");
    services.rentals.resume(&acme, "resume", (rental, 1)).await.expect("resumed");
    let before = events_of(&db, &rental.stream_id()).await.len();
    // A poll asked before the resume, answered after it, still sees the machine stopped.
    let late = looked(CapacityState::Stopped, start() + chrono::TimeDelta::seconds(500));
    let late_look =
        services.rentals.observe(&provider(), "seen-late", &connection(), (rental, 1, late)).await;
    for refused in [
        services.rentals.stop(&acme, "stale-stop", (rental, 1)).await,
        services.rentals.terminate(&acme, "stale-terminate", (rental, 1)).await,
        late_look,
    ] {
        let error = refused.expect_err("fenced");
        assert_eq!(error.class(), ErrorClass::Fenced, "{error:?}");
    }
    assert_eq!(events_of(&db, &rental.stream_id()).await.len(), before, "no event");
    // The resume retired generation 1's node and invited generation 2's, in its append.
    let (_, _, old) = services
        .nodes
        .pipeline()
        .state::<Node>(&node_of(rental, 1).stream_id())
        .await
        .expect("read")
        .expect("exists");
    let (_, _, new) = services
        .nodes
        .pipeline()
        .state::<Node>(&node_of(rental, 2).stream_id())
        .await
        .expect("read")
        .expect("exists");
    assert_eq!((old.status, new.status), (NodeStatus::Retired, NodeStatus::Enrolling));
    // Another tenant's rental is not found, whatever its generation.
    let error = services
        .rentals
        .stop(&tenant("globex"), "theirs", (rental, 2))
        .await
        .expect_err("not theirs");
    assert_eq!(error.class(), ErrorClass::NotFound);
}

#[tokio::test]
async fn sixteen_concurrent_commands_on_one_rental_keep_generations_honest() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(start());
    let first = services(&db, &clock);
    let rental = active_rental(&first, "acme", "r1").await;
    // Sixteen processes: each its own pipeline (nothing remembered in common), each driving
    // the rental round its cycle (stop, confirm, resume, confirm) for a few rounds from the
    // state and generation it read, as a real client would: they race each other all along.
    let attempts = (0..16i64).map(|n| {
        let db = &db;
        let clock = clock.clone();
        async move {
            let process = services(db, &clock);
            let acme = tenant("acme");
            let (mut answers, mut stamped) = (Vec::new(), Vec::new());
            for round in 0..6i64 {
                let (_, seen) = process.rentals.owned(rental).await.expect("read");
                let at = start() + chrono::TimeDelta::seconds(10 + round * 16 + n);
                let key = format!("{n}-{round}");
                // Every command's key names the generation it is stamped with.
                stamped.push((key.clone(), seen.generation));
                let answer = match seen.status {
                    RentalStatus::Active => {
                        process
                            .rentals
                            .stop(&acme, &format!("stop-{key}"), (rental, seen.generation))
                            .await
                    }
                    RentalStatus::Stopped => {
                        process
                            .rentals
                            .resume(&acme, &format!("resume-{key}"), (rental, seen.generation))
                            .await
                    }
                    RentalStatus::Stopping => {
                        let look = looked(CapacityState::Stopped, at);
                        process
                            .rentals
                            .observe(
                                &provider(),
                                &format!("stopped-{key}"),
                                &connection(),
                                (rental, seen.generation, look),
                            )
                            .await
                    }
                    _ => {
                        let look = looked(CapacityState::Active, at);
                        process
                            .rentals
                            .observe(
                                &provider(),
                                &format!("active-{key}"),
                                &connection(),
                                (rental, seen.generation, look),
                            )
                            .await
                    }
                };
                answers.push(answer);
            }
            (answers, stamped)
        }
    });
    let (answers, stamped): (Vec<_>, Vec<_>) = join_all(attempts).await.into_iter().unzip();
    let answers: Vec<_> = answers.into_iter().flatten().collect();
    // A command's events carry its key (as part of each kind's operation key).
    let stamped: Vec<(String, u64)> = stamped.into_iter().flatten().collect();
    let stamped_for = |operation_key: &str| {
        let mut named =
            stamped.iter().filter(|(key, _)| operation_key.ends_with(&format!("-{key}")));
        let found = named.next().map(|(_, generation)| *generation);
        assert!(named.next().is_none(), "one command per key");
        found
    };
    for answer in &answers {
        if let Err(error) = answer {
            // Losing to a resume is fenced; a stop or resume in the wrong state is refused.
            assert!(
                matches!(error.class(), ErrorClass::Fenced | ErrorClass::InvalidState),
                "{error:?}"
            );
        }
    }
    let events = events_of(&db, &rental.stream_id()).await;
    let versions: Vec<u64> = events.iter().map(|event| event.version).collect();
    assert_eq!(versions, (1..=events.len() as u64).collect::<Vec<_>>(), "contiguous");
    // Replayed, every command event was decided at the generation its command was stamped
    // with (observations too: their events do not carry it, their command's key does), and
    // the generation never decreases.
    let mut state = Rental::initial();
    let mut last_generation = 0;
    let mut checked = 0;
    for recorded in &events {
        let key = recorded.metadata.operation_key.as_deref().unwrap_or_default();
        if let Some(generation) = stamped_for(key) {
            assert_eq!(generation, state.generation, "{key} applied under a stale generation");
            checked += 1;
        }
        let event = RentalEvent::from_stored(recorded.event_type.as_str(), &recorded.payload)
            .expect("decodes");
        match &event {
            RentalEvent::CapacityStopRequested { generation, .. }
            | RentalEvent::CapacityTerminationRequested { generation, .. } => {
                assert_eq!(*generation, state.generation, "applied under a stale generation");
            }
            RentalEvent::CapacityResumed { generation, .. } => {
                assert_eq!(*generation, state.generation + 1, "a resume starts the next one");
            }
            _ => {}
        }
        state = state.evolve(&event);
        assert!(state.generation >= last_generation, "generations never decrease");
        assert_eq!(recorded.metadata.generation, Some(state.generation), "the stamp after it");
        last_generation = state.generation;
    }
    // Among them the provider's looks (a resume needs the stop's confirmation, one).
    let observed = events
        .iter()
        .filter(|e| matches!(e.event_type.as_str(), "CapacityObserved" | "CapacityStopped"))
        .filter(|e| stamped_for(e.metadata.operation_key.as_deref().unwrap_or_default()).is_some())
        .count();
    assert!(checked > 2 && observed > 0, "the racers' events were checked ({checked})");
    // The processes raced through whole cycles, not only refusals: at least one resume
    // (each round some process acts on the state it read, and six rounds of sixteen pass
    // through stop, confirm and resume many times over).
    assert!(state.generation >= 2, "no resume went through: {:?}", state.status);
    // Every generation's node exists, and only the current one is not retired.
    for generation in 1..=state.generation {
        let found = first
            .nodes
            .pipeline()
            .state::<Node>(&node_of(rental, generation).stream_id())
            .await
            .expect("read");
        let (_, _, node) = found.expect("every generation's node was invited");
        let retired = node.status == NodeStatus::Retired;
        assert_eq!(retired, generation < state.generation, "generation {generation}");
    }
}
