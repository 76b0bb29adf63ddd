//! The snapshot's transition table, row by row (the doc comment of `domain/src/snapshot.rs`),
//! with every guard's refusal; the tenant quota's table (`domain/src/quota.rs`); then
//! properties over random quota command sequences (usage is the sum of the reservations and
//! a reservation never takes usage over a limit) and over random snapshot command sequences
//! with their linked quota commands (`conservation.rs`).

mod conservation;
mod quota;

use chrono::{DateTime, TimeZone, Utc};
use leasehold_domain::quota::QuotaCommand;
use leasehold_domain::snapshot::{
    DeleteCause, ExportDestination, LayerKey, ReportedSizes, RequestedKind, Snapshot,
    SnapshotCommand as C, SnapshotError, SnapshotEvent, SnapshotFacts, SnapshotId, SnapshotKind,
    SnapshotMode, SnapshotStatus as S, SnapshotTerms, Written, quota_effect,
};
use leasehold_domain::values::fleet::{Arch, HostId, TaskId, VmId};
use leasehold_domain::values::{OperationId, OperatorDetail};
use leasehold_domain::vm::SnapshotRef;
use leasehold_domain::{Actor, Aggregate, Context, DomainEvent, Refusal, RefusalKind, TenantId};
use uuid::Uuid;

fn t(minute: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 12, minute, 0).single().expect("a valid time")
}

fn ctx(facts: SnapshotFacts) -> Context<SnapshotFacts> {
    Context {
        now: t(30),
        tenant: TenantId::parse("acme").expect("valid"),
        actor: Actor { subject: "acme".into(), role: "tenant".into() },
        new_ids: Vec::new(),
        facts,
    }
}

fn quota_ctx() -> Context<()> {
    let Context { now, tenant, actor, new_ids, .. } = ctx(SnapshotFacts::default());
    Context { now, tenant, actor, new_ids, facts: () }
}

fn running() -> SnapshotFacts {
    SnapshotFacts { vm_running: true, ..SnapshotFacts::default() }
}

fn op(n: u128) -> OperationId {
    OperationId(Uuid::from_u128(100 + n))
}

fn vm() -> VmId {
    VmId(Uuid::from_u128(2))
}

fn terms(mode: SnapshotMode, requested: RequestedKind) -> SnapshotTerms {
    SnapshotTerms {
        snapshot: SnapshotId(Uuid::from_u128(1)),
        vm: vm(),
        task: TaskId::parse("t", "task-1").expect("valid"),
        host: HostId::parse("h", "agent-1").expect("valid"),
        arch: Arch::amd64(),
        mode,
        requested,
        parent: None,
        layer_key: None,
        name: None,
        retention_until: None,
        estimate_bytes: 1_000,
    }
}

fn create(terms: SnapshotTerms) -> C {
    C::Create { terms: Box::new(terms), operation: op(1) }
}

fn written(kind: SnapshotKind) -> Written {
    Written {
        kind,
        sizes: ReportedSizes { disk_bytes: 800, memory_bytes: 4_096 },
        digest: None,
        store_ref: SnapshotRef::parse("r", "snap-1-a").expect("valid"),
        diff_of: None,
    }
}

fn detail() -> OperatorDetail {
    OperatorDetail::new("agent said 500")
}

fn destination() -> ExportDestination {
    ExportDestination::parse("d", "s3://bucket/snap-1").expect("valid")
}

/// Each step is a command with the facts it is decided with.
type History = Vec<(C, SnapshotFacts)>;

fn replay(history: &History) -> Snapshot {
    history.iter().fold(Snapshot::initial(), |state, (command, facts)| {
        let events = state.decide(command, &ctx(facts.clone())).expect("the history is valid");
        events.iter().fold(state, |state, event| state.evolve(event))
    })
}

fn creating_of(terms: SnapshotTerms) -> History {
    vec![(create(terms), running())]
}

fn creating() -> History {
    creating_of(terms(SnapshotMode::Manual, RequestedKind::Disk))
}

fn ready_of(terms: SnapshotTerms) -> History {
    let mut history = creating_of(terms);
    history
        .push((C::Confirm { operation: op(1), written: written(SnapshotKind::Disk) }, running()));
    history
}

fn ready() -> History {
    ready_of(terms(SnapshotMode::Manual, RequestedKind::Disk))
}

/// Ready, and past its retention (it ended at minute 10; commands are decided at 30).
fn expired() -> History {
    let mut expired = terms(SnapshotMode::Manual, RequestedKind::Disk);
    expired.retention_until = Some(t(10));
    ready_of(expired)
}

/// A ready layer artifact (a build snapshot with a layer key).
fn layer() -> History {
    let mut layer = terms(SnapshotMode::Build, RequestedKind::Disk);
    layer.layer_key = Some(LayerKey::parse("l", "step:1").expect("valid"));
    ready_of(layer)
}

fn restoring() -> History {
    let mut history = ready();
    history.push((C::Restore { vm: vm(), operation: op(2) }, running()));
    history
}

fn errored() -> History {
    let mut history = creating();
    history.push((C::Fail { operation: op(1), detail: detail() }, running()));
    history
}

fn deleting(cause: DeleteCause) -> History {
    let mut history = ready();
    history.push((C::Delete { operation: op(3), cause }, SnapshotFacts::default()));
    history
}

fn deleted() -> History {
    let mut history = deleting(DeleteCause::Tenant);
    history
        .push((C::ConfirmDeleted { operation: op(3), not_found: false }, SnapshotFacts::default()));
    history
}

#[derive(Clone)]
enum Expect {
    Events(&'static [&'static str]),
    NoChange,
    Refused(SnapshotError),
}

/// Decides `command` on `given` and checks the outcome; the state after it.
fn check(given: &History, command: C, facts: SnapshotFacts, expect: Expect) -> Snapshot {
    let state = replay(given);
    let decided = state.decide(&command, &ctx(facts));
    match expect {
        Expect::Events(types) => {
            let events = decided.unwrap_or_else(|e| panic!("{command:?} refused: {e}"));
            let got: Vec<_> = events.iter().map(SnapshotEvent::event_type).collect();
            assert_eq!(got, types, "{command:?}");
            events.iter().fold(state, |state, event| state.evolve(event))
        }
        Expect::NoChange => {
            assert_eq!(decided, Ok(Vec::new()), "{command:?}");
            state
        }
        Expect::Refused(error) => {
            assert_eq!(decided, Err(error), "{command:?}");
            state
        }
    }
}

use Expect::{Events, NoChange, Refused};

#[test]
fn creating_a_snapshot_of_a_running_vm() {
    let snapshot = check(
        &[].into(),
        create(terms(SnapshotMode::Manual, RequestedKind::Disk)),
        running(),
        Events(&["SnapshotRequested"]),
    );
    assert_eq!(snapshot.status, S::Creating);
    assert_eq!(snapshot.operation, Some(op(1)));
    assert!(snapshot.counts(), "a creating snapshot counts for the quota");
    // A retry with the same terms changes nothing; other terms under the same id conflict.
    check(
        &creating(),
        create(terms(SnapshotMode::Manual, RequestedKind::Disk)),
        running(),
        NoChange,
    );
    let refused = check(
        &creating(),
        create(terms(SnapshotMode::Auto, RequestedKind::Disk)),
        running(),
        Refused(SnapshotError::AlreadyExists),
    );
    assert_eq!(refused.status, S::Creating);
}

#[test]
fn a_create_is_guarded_vm_first() {
    let disk = || create(terms(SnapshotMode::Manual, RequestedKind::Disk));
    check(&[].into(), disk(), SnapshotFacts::default(), Refused(SnapshotError::VmNotRunning));
    let gpu = SnapshotFacts { vm_gpus: 1, ..running() };
    check(&[].into(), disk(), gpu, Refused(SnapshotError::GpuUnsupported));
    assert_eq!(SnapshotError::GpuUnsupported.kind(), RefusalKind::InvalidState);
    let mut layered = terms(SnapshotMode::Manual, RequestedKind::Disk);
    layered.layer_key = Some(LayerKey::parse("l", "step:1").expect("valid"));
    check(
        &[].into(),
        create(layered.clone()),
        running(),
        Refused(SnapshotError::LayerKeyNeedsBuild),
    );
    layered.mode = SnapshotMode::Build;
    let built = check(&[].into(), create(layered), running(), Events(&["SnapshotRequested"]));
    assert!(built.is_layer());
    assert!(!built.counts(), "a build artifact never counts for the quota");
}

#[test]
fn a_diff_needs_the_vms_last_live_snapshot_as_parent() {
    let live = SnapshotId(Uuid::from_u128(50));
    let mut diff = terms(SnapshotMode::Manual, RequestedKind::Diff);
    let none = Refused(SnapshotError::DiffNeedsLiveParent { last_live: None });
    check(&[].into(), create(diff.clone()), running(), none);
    let with_live = SnapshotFacts { last_live: Some(live), ..running() };
    let wrong = Refused(SnapshotError::DiffNeedsLiveParent { last_live: Some(live) });
    diff.parent = Some(SnapshotId(Uuid::from_u128(51)));
    check(&[].into(), create(diff.clone()), with_live.clone(), wrong);
    let message = SnapshotError::DiffNeedsLiveParent { last_live: None }.to_string();
    assert!(message.contains("last live snapshot"), "the refusal says why: {message}");
    diff.parent = Some(live);
    check(&[].into(), create(diff), with_live, Events(&["SnapshotRequested"]));
}

#[test]
fn a_confirmation_records_what_the_agent_wrote_and_its_honest_size() {
    // Asked live, written live: memory counts.
    let live = creating_of(terms(SnapshotMode::Manual, RequestedKind::Live));
    let confirm = |kind| C::Confirm { operation: op(1), written: written(kind) };
    let snapshot =
        check(&live, confirm(SnapshotKind::Live), running(), Events(&["SnapshotCreated"]));
    assert_eq!(snapshot.status, S::Ready);
    assert_eq!(snapshot.size_bytes, 800 + 4_096, "a live snapshot's size counts its memory");
    // Asked live, served as disk: filed as disk, memory not counted.
    let snapshot =
        check(&live, confirm(SnapshotKind::Disk), running(), Events(&["SnapshotCreated"]));
    assert_eq!(snapshot.written.map(|w| w.kind), Some(SnapshotKind::Disk));
    assert_eq!(snapshot.size_bytes, 800);
    // The arch is the building host's, from the terms: the report has none to give.
    assert_eq!(replay(&ready()).terms.map(|t| t.arch), Some(Arch::amd64()));
}

#[test]
fn reports_are_fenced_by_the_current_operation() {
    let stale = C::Confirm { operation: op(9), written: written(SnapshotKind::Disk) };
    check(&creating(), stale, running(), Refused(SnapshotError::Fenced));
    check(
        &restoring(),
        C::ConfirmRestore { operation: op(1) },
        running(),
        Refused(SnapshotError::Fenced),
    );
    assert_eq!(SnapshotError::Fenced.kind(), RefusalKind::Fenced);
    // A report on a deleted snapshot is a redelivery.
    check(
        &deleted(),
        C::ConfirmDeleted { operation: op(3), not_found: false },
        running(),
        NoChange,
    );
    // So is the current operation's report once it settled, when it says what was recorded;
    // one that contradicts it is a conflict, never a silent success.
    let same = C::Confirm { operation: op(1), written: written(SnapshotKind::Disk) };
    check(&ready(), same, running(), NoChange);
    let contradicts = Refused(SnapshotError::ReportContradicts);
    let other = C::Confirm { operation: op(1), written: written(SnapshotKind::Live) };
    check(&ready(), other, running(), contradicts.clone());
    check(&ready(), C::Fail { operation: op(1), detail: detail() }, running(), contradicts.clone());
    assert_eq!(SnapshotError::ReportContradicts.kind(), RefusalKind::Conflict);
    let mut failed = creating();
    failed.push((C::Fail { operation: op(1), detail: detail() }, running()));
    check(&failed, C::Fail { operation: op(1), detail: detail() }, running(), NoChange);
    let late = C::Confirm { operation: op(1), written: written(SnapshotKind::Disk) };
    check(&failed, late, running(), contradicts.clone());
    let mut restored = restoring();
    restored.push((C::ConfirmRestore { operation: op(2) }, running()));
    check(&restored, C::ConfirmRestore { operation: op(2) }, running(), NoChange);
    let failure = C::FailRestore { operation: op(2), missing: false, detail: detail() };
    check(&restored, failure, running(), contradicts);
}

#[test]
fn a_failed_creation_is_an_error() {
    let snapshot = check(
        &creating(),
        C::Fail { operation: op(1), detail: detail() },
        running(),
        Events(&["SnapshotFailed"]),
    );
    assert_eq!(snapshot.status, S::Error);
    assert_eq!(snapshot.last_error, Some(detail()));
    assert!(!snapshot.counts(), "an error no longer counts");
}

#[test]
fn restoring_onto_its_own_running_vm() {
    let restore = |vm| C::Restore { vm, operation: op(2) };
    let snapshot = check(&ready(), restore(vm()), running(), Events(&["SnapshotRestoring"]));
    assert_eq!(snapshot.status, S::Restoring);
    assert!(snapshot.counts(), "restoring counts");
    check(
        &ready(),
        restore(VmId(Uuid::from_u128(77))),
        running(),
        Refused(SnapshotError::NotFound),
    );
    check(&ready(), restore(vm()), SnapshotFacts::default(), Refused(SnapshotError::VmNotRunning));
    check(&restoring(), restore(vm()), running(), NoChange);
    let back = check(
        &restoring(),
        C::ConfirmRestore { operation: op(2) },
        running(),
        Events(&["SnapshotRestored"]),
    );
    assert_eq!(back.status, S::Ready);
    let missing = C::FailRestore {
        operation: op(2),
        missing: true,
        detail: OperatorDetail::new("snapshot missing from provider"),
    };
    let failed = check(&restoring(), missing, running(), Events(&["SnapshotRestoreFailed"]));
    assert_eq!(failed.status, S::Error);
    assert_eq!(
        failed.last_error.map(|d| d.as_str().to_owned()).as_deref(),
        Some("snapshot missing from provider")
    );
    // A diff is only a delta over its parent.
    let live = SnapshotId(Uuid::from_u128(50));
    let mut diff = terms(SnapshotMode::Manual, RequestedKind::Diff);
    diff.parent = Some(live);
    let asked: History = vec![(create(diff), SnapshotFacts { last_live: Some(live), ..running() })];
    let mut as_diff = written(SnapshotKind::Live);
    as_diff.diff_of = Some(live);
    let mut history = asked.clone();
    history.push((C::Confirm { operation: op(1), written: as_diff }, running()));
    check(&history, restore(vm()), running(), Refused(SnapshotError::DiffNotRestorable));
    // Asked as a diff, written in full (the agent's report has no parent): it restores.
    let mut history = asked;
    history
        .push((C::Confirm { operation: op(1), written: written(SnapshotKind::Live) }, running()));
    check(&history, restore(vm()), running(), Events(&["SnapshotRestoring"]));
}

#[test]
fn deleting_is_refused_while_a_child_lives_and_is_idempotent() {
    let delete = |cause| C::Delete { operation: op(3), cause };
    let children = SnapshotFacts { live_children: 1, ..SnapshotFacts::default() };
    let refused = Refused(SnapshotError::HasLiveChildren { count: 1 });
    check(&ready(), delete(DeleteCause::Tenant), children, refused);
    assert_eq!(SnapshotError::HasLiveChildren { count: 1 }.kind(), RefusalKind::InvalidState);
    for given in [ready(), errored()] {
        let snapshot = check(
            &given,
            delete(DeleteCause::Tenant),
            SnapshotFacts::default(),
            Events(&["SnapshotDeleting"]),
        );
        assert_eq!(snapshot.status, S::Deleting);
        assert!(!snapshot.counts());
    }
    check(
        &deleting(DeleteCause::Tenant),
        delete(DeleteCause::Tenant),
        SnapshotFacts::default(),
        NoChange,
    );
    check(&deleted(), delete(DeleteCause::Tenant), SnapshotFacts::default(), NoChange);
    for given in [creating(), restoring()] {
        let status = replay(&given).status.name();
        let invalid = Refused(SnapshotError::InvalidState { status, command: "delete" });
        check(&given, delete(DeleteCause::Tenant), SnapshotFacts::default(), invalid);
    }
    // A provider's not-found is a deletion too.
    let gone = C::ConfirmDeleted { operation: op(3), not_found: true };
    let snapshot = check(
        &deleting(DeleteCause::Tenant),
        gone,
        SnapshotFacts::default(),
        Events(&["SnapshotDeleted"]),
    );
    assert_eq!(snapshot.status, S::Deleted);
    assert!(snapshot.is_terminal());
}

#[test]
fn gc_and_eviction_keep_to_their_own_artifacts() {
    let delete = |cause| C::Delete { operation: op(3), cause };
    let none = SnapshotFacts::default;
    let mut build = terms(SnapshotMode::Build, RequestedKind::Disk);
    build.retention_until = Some(t(10));
    let build = ready_of(build);
    check(&build, delete(DeleteCause::Gc), none(), Refused(SnapshotError::BuildArtifact));
    check(&ready(), delete(DeleteCause::Gc), none(), Refused(SnapshotError::RetentionNotPassed));
    let mut later = terms(SnapshotMode::Manual, RequestedKind::Disk);
    later.retention_until = Some(t(40));
    check(
        &ready_of(later),
        delete(DeleteCause::Gc),
        none(),
        Refused(SnapshotError::RetentionNotPassed),
    );
    let latest = SnapshotFacts { latest_of_vm: true, ..none() };
    check(&expired(), delete(DeleteCause::Gc), latest, Refused(SnapshotError::LatestOfVm));
    let parent = SnapshotFacts { live_children: 2, ..none() };
    check(
        &expired(),
        delete(DeleteCause::Gc),
        parent.clone(),
        Refused(SnapshotError::HasLiveChildren { count: 2 }),
    );
    let gc = check(&expired(), delete(DeleteCause::Gc), none(), Events(&["SnapshotDeleting"]));
    assert_eq!(gc.deletion, Some(DeleteCause::Gc));
    // Eviction: layers only, never a parent.
    check(&ready(), delete(DeleteCause::Evicted), none(), Refused(SnapshotError::NotALayer));
    check(&build, delete(DeleteCause::Evicted), none(), Refused(SnapshotError::NotALayer));
    check(
        &layer(),
        delete(DeleteCause::Evicted),
        parent,
        Refused(SnapshotError::HasLiveChildren { count: 2 }),
    );
    check(&layer(), delete(DeleteCause::Evicted), none(), Events(&["SnapshotDeleting"]));
    // The cause is kept to the end.
    let mut gc = expired();
    gc.push((delete(DeleteCause::Gc), none()));
    let gone = check(
        &gc,
        C::ConfirmDeleted { operation: op(3), not_found: false },
        none(),
        Events(&["SnapshotDeleted"]),
    );
    assert_eq!(gone.deletion, Some(DeleteCause::Gc));
}

#[test]
fn a_failed_gc_deletion_is_an_error_and_from_the_fifth_in_a_row_a_dead_letter() {
    let fail = C::FailDelete { operation: op(3), detail: detail() };
    let gc = C::Delete { operation: op(3), cause: DeleteCause::Gc };
    let mut history = expired();
    history.push((gc.clone(), SnapshotFacts::default()));
    for failures in 1..=6u32 {
        let expected: &'static [&'static str] = if failures >= 5 {
            &["SnapshotDeleteFailed", "SnapshotGcDeadLettered"]
        } else {
            &["SnapshotDeleteFailed"]
        };
        let snapshot = check(&history, fail.clone(), SnapshotFacts::default(), Events(expected));
        assert_eq!((snapshot.status, snapshot.gc_failures), (S::Error, failures));
        history.push((fail.clone(), SnapshotFacts::default()));
        history.push((gc.clone(), SnapshotFacts::default()));
    }
    // A count of the deployment's own, even one lowered below failures already counted.
    let mut three = expired();
    for _ in 0..3 {
        three.push((gc.clone(), SnapshotFacts::default()));
        three.push((fail.clone(), SnapshotFacts::default()));
    }
    three.push((gc.clone(), SnapshotFacts::default()));
    let lowered = SnapshotFacts { gc_dead_letter_after: 2, ..SnapshotFacts::default() };
    let events = &["SnapshotDeleteFailed", "SnapshotGcDeadLettered"];
    check(&three, fail.clone(), lowered, Events(events));
    let mut history = expired();
    history.push((gc, SnapshotFacts::default()));
    let twice = SnapshotFacts { gc_dead_letter_after: 1, ..SnapshotFacts::default() };
    check(
        &history,
        fail.clone(),
        twice,
        Events(&["SnapshotDeleteFailed", "SnapshotGcDeadLettered"]),
    );
    // A tenant's failed deletion is an error, never counted as GC's.
    let snapshot = check(
        &deleting(DeleteCause::Tenant),
        fail,
        SnapshotFacts::default(),
        Events(&["SnapshotDeleteFailed"]),
    );
    assert_eq!(snapshot.gc_failures, 0);
}

#[test]
fn exports_are_recorded_pending_then_ready_or_error() {
    let request = C::RequestExport { destination: destination(), operation: op(7) };
    let snapshot =
        check(&ready(), request.clone(), running(), Events(&["SnapshotExportRequested"]));
    assert_eq!(snapshot.exports.len(), 1);
    assert_eq!(snapshot.exports[0].operation, Some(op(7)));
    let mut pending = ready();
    pending.push((request.clone(), running()));
    check(&pending, request.clone(), running(), NoChange);
    let report = |operation, ready| C::ReportExport {
        destination: destination(),
        operation: op(operation),
        ready,
        detail: None,
    };
    let done = check(&pending, report(7, true), running(), Events(&["SnapshotExported"]));
    assert_eq!(done.exports[0].status.name(), "ready");
    let failed = check(&pending, report(7, false), running(), Events(&["SnapshotExportFailed"]));
    assert_eq!(failed.exports[0].status.name(), "error");
    check(&ready(), report(7, true), running(), Refused(SnapshotError::NoSuchExport));
    for bad in
        ["s3://user:pass@bucket/key", "https://b.example/k?X-Amz-Signature=abc", "s3://b/k#t"]
    {
        assert!(
            ExportDestination::parse("d", bad).is_err(),
            "{bad}: a destination never carries credentials"
        );
    }
    check(&deleted(), report(7, true), running(), NoChange);
    // Asked while ready, it settles after the snapshot failed a restore too.
    let mut failed_restore = pending.clone();
    failed_restore.push((C::Restore { vm: vm(), operation: op(2) }, running()));
    let failure = C::FailRestore { operation: op(2), missing: false, detail: detail() };
    failed_restore.push((failure, running()));
    check(&failed_restore, report(7, true), running(), Events(&["SnapshotExported"]));
}

#[test]
fn an_export_report_names_its_request_and_a_late_answer_never_settles_a_later_request() {
    let first = C::RequestExport { destination: destination(), operation: op(7) };
    let report = |operation, ready| C::ReportExport {
        destination: destination(),
        operation: op(operation),
        ready,
        detail: None,
    };
    let mut history = ready();
    history.push((first, running()));
    check(&history, report(8, true), running(), Refused(SnapshotError::Fenced));
    history.push((report(7, false), running()));
    // Settled: the same report again is a redelivery; the opposite one contradicts it.
    check(&history, report(7, false), running(), NoChange);
    check(&history, report(7, true), running(), Refused(SnapshotError::ReportContradicts));
    // Asked again after its failure: a new operation, and the first attempt's late success
    // is fenced off.
    let again = C::RequestExport { destination: destination(), operation: op(8) };
    history.push((again, running()));
    check(&history, report(7, true), running(), Refused(SnapshotError::Fenced));
    let done = check(&history, report(8, true), running(), Events(&["SnapshotExported"]));
    assert_eq!((done.exports.len(), done.exports[0].status.name()), (1, "ready"));
}

#[test]
fn an_export_recorded_before_exports_had_operations_is_settled_by_its_destination() {
    let payload = serde_json::json!({ "destination": "s3://bucket/snap-1", "at": t(20) });
    let legacy = SnapshotEvent::from_stored("SnapshotExportRequested", &payload)
        .expect("an event without an operation still decodes");
    let pending = replay(&ready()).evolve(&legacy);
    assert_eq!(pending.exports[0].operation, None);
    let report =
        C::ReportExport { destination: destination(), operation: op(9), ready: true, detail: None };
    let events = pending.decide(&report, &ctx(running())).expect("settled by destination");
    let done = events.iter().fold(pending, |state, event| state.evolve(event));
    assert_eq!(done.exports[0].status.name(), "ready");
    let again = done.decide(&report, &ctx(running()));
    assert!(matches!(again, Err(SnapshotError::NoSuchExport)), "{again:?}");
}

#[test]
fn a_cache_hit_uses_a_ready_snapshot_and_nothing_acts_on_an_unknown_or_deleted_one() {
    let used = check(&layer(), C::Use, running(), Events(&["SnapshotUsed"]));
    assert_eq!(used.last_used, Some(t(30)));
    check(&ready(), C::Use, running(), Refused(SnapshotError::NotALayer));
    check(&[].into(), C::Use, running(), Refused(SnapshotError::NotFound));
    let invalid = Refused(SnapshotError::InvalidState { status: "deleted", command: "use" });
    check(&deleted(), C::Use, running(), invalid);
}

/// The quota effect of `command` decided on `given`.
fn effect(given: &History, command: C, facts: SnapshotFacts) -> Option<QuotaCommand> {
    let before = replay(given);
    let events = before.decide(&command, &ctx(facts)).expect("decided");
    quota_effect(&before, &events)
}

#[test]
fn the_quota_reserves_on_the_estimate_settles_to_the_honest_size_and_releases_on_leaving() {
    let id = SnapshotId(Uuid::from_u128(1));
    let disk = || create(terms(SnapshotMode::Manual, RequestedKind::Disk));
    assert_eq!(
        effect(&[].into(), disk(), running()),
        Some(QuotaCommand::Reserve { snapshot: id, bytes: 1_000 })
    );
    let confirm = C::Confirm { operation: op(1), written: written(SnapshotKind::Disk) };
    assert_eq!(
        effect(&creating(), confirm, running()),
        Some(QuotaCommand::Settle { snapshot: id, bytes: 800 })
    );
    let fail = C::Fail { operation: op(1), detail: detail() };
    assert_eq!(effect(&creating(), fail, running()), Some(QuotaCommand::Release { snapshot: id }));
    // Restoring still counts; a failed restore does not.
    assert_eq!(effect(&ready(), C::Restore { vm: vm(), operation: op(2) }, running()), None);
    let missing = C::FailRestore { operation: op(2), missing: true, detail: detail() };
    assert_eq!(
        effect(&restoring(), missing, running()),
        Some(QuotaCommand::Release { snapshot: id })
    );
    let delete = C::Delete { operation: op(3), cause: DeleteCause::Tenant };
    assert_eq!(
        effect(&ready(), delete, SnapshotFacts::default()),
        Some(QuotaCommand::Release { snapshot: id })
    );
    let gone = C::ConfirmDeleted { operation: op(3), not_found: false };
    assert_eq!(effect(&deleting(DeleteCause::Tenant), gone, SnapshotFacts::default()), None);
    // A build artifact never touches the quota.
    let build = create(terms(SnapshotMode::Build, RequestedKind::Disk));
    assert_eq!(effect(&[].into(), build, running()), None);
}

#[test]
fn a_live_snapshot_adopts_its_diffs_and_is_not_deleted_while_one_is_alive() {
    let child = SnapshotId(Uuid::from_u128(9));
    let live = {
        let mut history = creating();
        history.push((
            C::Confirm { operation: op(1), written: written(SnapshotKind::Live) },
            running(),
        ));
        history
    };
    let adopt = || C::AdoptChild { child, vm: vm() };
    let adopted = check(&live, adopt(), running(), Events(&["SnapshotChildAdopted"]));
    assert!(adopted.children.contains(&child));
    let mut history = live.clone();
    history.push((adopt(), running()));
    check(&history, adopt(), running(), NoChange);
    // Its own diffs keep it, whatever the listing says.
    let delete = C::Delete { operation: op(3), cause: DeleteCause::Tenant };
    check(
        &history,
        delete.clone(),
        SnapshotFacts::default(),
        Refused(SnapshotError::HasLiveChildren { count: 1 }),
    );
    history.push((C::ReleaseChild { child }, running()));
    check(&history, C::ReleaseChild { child }, running(), NoChange);
    check(&history, delete, SnapshotFacts::default(), Events(&["SnapshotDeleting"]));
    // Only a live snapshot of the diff's own VM adopts it.
    let other_vm = C::AdoptChild { child, vm: VmId(Uuid::from_u128(77)) };
    check(&live, other_vm, running(), Refused(SnapshotError::ParentNotLive));
    check(&ready(), adopt(), running(), Refused(SnapshotError::ParentNotLive));
    check(&creating(), adopt(), running(), Refused(SnapshotError::ParentNotLive));
    assert_eq!(SnapshotError::ParentNotLive.kind(), RefusalKind::InvalidState);
}
