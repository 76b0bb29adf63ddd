//! Concurrent commands on one aggregate, from two processes' worth of pipelines.

use leasehold_commands::lease_input;
use leasehold_domain::lease::LeaseFacts;
use leasehold_tests::TestDb;

use super::support::*;

const COMMANDS: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_commands_on_one_lease_all_apply_once() {
    let db = TestDb::migrated().await;
    let (one, two) = (pipeline(&db), pipeline(&db));
    let lease = ready_lease(&one, "acme").await;
    let tasks: Vec<_> = (0..COMMANDS)
        .map(|n| {
            let pipeline = if n % 2 == 0 { one.clone() } else { two.clone() };
            tokio::spawn(async move {
                let domain = format!("d{n}.example.com");
                let command =
                    lease_input::set_custom_domain(Some("web"), Some(&domain)).expect("valid");
                pipeline
                    .execute(request(
                        "acme",
                        lease,
                        &format!("domain-{n}"),
                        command,
                        LeaseFacts::default(),
                    ))
                    .await
            })
        })
        .collect();
    let mut versions = Vec::new();
    for task in tasks {
        let outcome = task.await.expect("the task ran").expect("applied, within the retry budget");
        assert_eq!(outcome.event_types, ["LeaseCustomDomainSet"]);
        assert!(!outcome.duplicate);
        versions.push(outcome.version);
    }
    versions.sort_unstable();
    // A ready lease has three events: requested, provisioned, activated.
    let expected: Vec<u64> = (4..4 + COMMANDS as u64).collect();
    assert_eq!(versions, expected, "each command got its own version, contiguous");
    let events = events_of(&db, lease).await;
    assert_eq!(events.len(), 3 + COMMANDS);
    let mut domains: Vec<String> = events[3..]
        .iter()
        .map(|e| e.payload["domain"].as_str().expect("a domain").to_owned())
        .collect();
    domains.sort_unstable();
    domains.dedup();
    assert_eq!(domains.len(), COMMANDS, "every command's own change, once");
}
