//! The log taken away and brought back: an export (NDJSON) imports into a new database with
//! every event, seal and head identical; a file is verified with no database, and tampering
//! with it (an altered payload, a removed line, two lines swapped) is named by position and
//! line; a tenant's export holds nothing of another tenant and no operator-only field.

use leasehold_adapters::PgEventStore;
use leasehold_adapters::archive::check::{FileReport, check_file};
use leasehold_adapters::archive::import::import;
use leasehold_adapters::archive::{ArchiveError, ExportFilter, ExportSummary, HeadsAhead};
use leasehold_adapters::verify::BreakKind;
use leasehold_domain::{
    Cursor, EventStore, ExpectedVersion, StreamAppend, StreamId, StreamType, TenantId,
};
use leasehold_tests::TestDb;
use serde_json::{Value, json};

use crate::support::{event, read_log_through};

/// An append to stream `name` of type `lease` owned by `tenant`.
fn append(tenant: &str, name: &str, events: Vec<leasehold_domain::NewEvent>) -> StreamAppend {
    StreamAppend {
        stream_id: StreamId::parse(name).unwrap(),
        stream_type: StreamType::parse("lease").unwrap(),
        tenant_id: TenantId::parse(tenant).unwrap(),
        expected: ExpectedVersion::Any,
        events,
    }
}

/// Payloads that exercise the canonical form: nesting, unicode, escapes, numbers.
fn payload(stream: usize, n: usize) -> Value {
    json!({
        "attempt": n,
        "at": "2026-12-05T08:00:00Z",
        "generation": stream,
        "detail": format!("operator-only detail {stream}/{n}: \"quoted\"\n\tline é ✓"),
        "nested": { "list": [1, 2.5, -3, 1e21, null, true], "empty": {} },
    })
}

/// Six streams of two tenants, appended in two epochs (the log was restored once), sealed
/// every 4 events with a tail left unsealed. Returns once every event is below the horizon.
async fn a_log(store: &PgEventStore) -> Cursor {
    let mut last = Cursor::START;
    for round in 0..2 {
        for stream in 0..6 {
            let tenant = if stream % 2 == 0 { "acme" } else { "globex" };
            let events = (0..3).map(|n| event("LeaseDispatchFailed", payload(stream, n))).collect();
            let name = format!("lease-{stream}");
            last = store.append(vec![append(tenant, &name, events)]).await.unwrap().cursor;
        }
        if round == 0 {
            store.raise_epoch().await.unwrap();
        }
    }
    read_log_through(store, Cursor::START, 100, last).await;
    store.seal_all(4, false).await.unwrap();
    last
}

async fn exported(store: &PgEventStore, filter: &ExportFilter) -> (String, ExportSummary) {
    let mut out = Vec::new();
    let summary = store.export(filter, &mut out, |_, _| {}).await.unwrap();
    (String::from_utf8(out).unwrap(), summary)
}

/// The file checked with its heads read ahead, as `events verify --from FILE` does, and in one
/// pass with no reader ahead.
fn both(text: &str) -> (FileReport, FileReport) {
    let ahead = check_file(text.as_bytes(), Some(HeadsAhead::new(text.as_bytes())), |_| {});
    (ahead.unwrap(), check_file(text.as_bytes(), None, |_| {}).unwrap())
}

/// The file checked with its heads read ahead, as `events verify --from FILE` does; checked
/// in one pass with no reader ahead, it must report the very same.
fn checked(text: &str) -> FileReport {
    let ahead = check_file(text.as_bytes(), Some(HeadsAhead::new(text.as_bytes())), |_| {});
    let one_pass = check_file(text.as_bytes(), None, |_| {}).unwrap();
    let ahead = ahead.unwrap();
    assert_eq!((&ahead.header, &ahead.report), (&one_pass.header, &one_pass.report));
    ahead
}

/// Every row of a table, in a fixed order, as text.
async fn rows(db: &TestDb, sql: &str) -> Vec<String> {
    let client = db.client().await;
    let sql = format!("SELECT to_jsonb(t)::text FROM ({sql}) t");
    client.query(&sql, &[]).await.unwrap().iter().map(|row| row.get(0)).collect()
}

const EVENTS: &str = "SELECT position, log_epoch, tx_id::text, event_id, stream_id, version, \
     stream_type, tenant_id, event_type, schema_version, payload, metadata, recorded_at, \
     prev_hash, hash FROM events ORDER BY log_epoch, tx_id, position";
const STREAMS: &str = "SELECT stream_id, stream_type, tenant_id, version, last_hash \
     FROM streams ORDER BY stream_id";
const SEALS: &str = "SELECT seal_no, first_epoch, first_tx_id::text, first_position, last_epoch, \
     last_tx_id::text, last_position, events, hashes, positions, prev_digest, digest, sealed_at \
     FROM ledger_seals ORDER BY seal_no";

#[tokio::test]
async fn an_export_imports_into_an_empty_database_exactly_and_verifies() {
    let source = TestDb::migrated().await;
    a_log(&source.store()).await;
    let (text, summary) = exported(&source.store(), &ExportFilter::default()).await;
    assert_eq!((summary.events, summary.streams), (36, 6));
    assert_eq!(summary.seals, 9, "36 events sealed by 4");

    let target = TestDb::migrated().await;
    let imported = import(&target.store(), text.as_bytes(), None, |_| {}).await.unwrap();
    assert!(imported.checked.report.breaks.is_empty(), "{:?}", imported.checked.report.breaks);
    for sql in [EVENTS, STREAMS, SEALS] {
        assert_eq!(rows(&source, sql).await, rows(&target, sql).await, "{sql}");
    }
    let report = target.store().verify_log(|_| {}).await.unwrap();
    assert!(report.breaks.is_empty(), "{:?}", report.breaks);
    assert_eq!((report.events_checked, report.seals_checked), (36, 9));

    // The target's epoch is past the restored events': a new event sorts after all of them,
    // and a reader from the start reads the restored log in its order, then the new event.
    assert_eq!(imported.epoch, 3, "the source's events are in epochs 1 and 2");
    let store = target.store();
    let new = store.append(vec![append("acme", "lease-new", vec![event("Made", json!({}))])]);
    let new = new.await.unwrap().cursor;
    let read = read_log_through(&store, Cursor::START, 100, new).await;
    assert_eq!(read.len(), 37);
    assert_eq!(read.last().unwrap().cursor, new);
    let source_read =
        read_log_through(&source.store(), Cursor::START, 100, summary.last.unwrap()).await;
    let source_ids: Vec<_> = source_read.iter().map(|e| e.event_id).collect();
    let target_ids: Vec<_> = read[..36].iter().map(|e| e.event_id).collect();
    assert_eq!(source_ids, target_ids);

    // A database that holds a log is refused, and nothing is added to it.
    let again = import(&target.store(), text.as_bytes(), None, |_| {}).await;
    assert!(matches!(again, Err(ArchiveError::NotEmpty { events: 37, streams: 7 })), "{again:?}");
}

#[tokio::test]
async fn a_file_that_does_not_verify_imports_nothing_and_a_filtered_one_is_refused() {
    let source = TestDb::migrated().await;
    a_log(&source.store()).await;
    let (text, _) = exported(&source.store(), &ExportFilter::default()).await;
    let target = TestDb::migrated().await;

    let altered = text.replacen("operator-only detail 3/1", "operator-only detail 3/9", 1);
    let refused = import(&target.store(), altered.as_bytes(), None, |_| {}).await;
    let Err(ArchiveError::DoesNotVerify { first }) = refused else { panic!("{refused:?}") };
    assert!(first.contains("HashMismatch"), "{first}");
    let counts = rows(&target, "SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM streams) + (SELECT count(*) FROM ledger_seals) AS n").await;
    assert_eq!(counts, [r#"{"n": 0}"#]);

    let filter = ExportFilter { stream_types: vec!["lease".into()], ..ExportFilter::default() };
    let (filtered, _) = exported(&source.store(), &filter).await;
    let refused = import(&target.store(), filtered.as_bytes(), None, |_| {}).await;
    assert!(matches!(refused, Err(ArchiveError::Unsuitable(_))), "{refused:?}");
}

/// The lines of a file, and the index of the `n`th event line.
fn event_line(lines: &[&str], n: usize) -> usize {
    lines
        .iter()
        .enumerate()
        .filter(|(_, line)| line.starts_with(r#"{"kind":"event""#))
        .nth(n)
        .map(|(index, _)| index)
        .unwrap()
}

fn position_of(line: &str) -> u64 {
    serde_json::from_str::<Value>(line).unwrap()["position"].as_u64().unwrap()
}

#[tokio::test]
async fn verify_from_a_file_names_each_kind_of_tampering_by_position_and_line() {
    let db = TestDb::migrated().await;
    a_log(&db.store()).await;
    let (text, _) = exported(&db.store(), &ExportFilter::default()).await;
    let clean = checked(&text);
    assert!(clean.report.breaks.is_empty(), "{:?}", clean.report.breaks);
    assert_eq!(
        (clean.report.events_checked, clean.report.streams_checked, clean.report.seals_checked),
        (36, 6, 9)
    );
    let lines: Vec<&str> = text.lines().collect();

    // An altered payload: its event's hash no longer holds (and its seal no longer lists it).
    let at = event_line(&lines, 10);
    let mut tampered: Value = serde_json::from_str(lines[at]).unwrap();
    tampered["payload"]["attempt"] = json!(99);
    let mut edited = lines.clone();
    let tampered = tampered.to_string();
    edited[at] = &tampered;
    let report = checked(&edited.join("\n")).report;
    let first = report.first_break().unwrap();
    assert_eq!(first.kind, BreakKind::HashMismatch, "{:?}", report.breaks);
    assert_eq!((first.position, first.line), (position_of(lines[at]), at as u64 + 1));

    // A removed line: its seal misses it, its stream's next event does not follow, the counts
    // do not hold.
    let at = event_line(&lines, 13);
    let mut removed = lines.clone();
    removed.remove(at);
    let report = checked(&removed.join("\n")).report;
    let kinds: Vec<&BreakKind> = report.breaks.iter().map(|b| &b.kind).collect();
    let missing = report.breaks.iter().find(|b| b.kind == BreakKind::SealedEventMissing);
    assert_eq!(missing.map(|b| b.position), Some(position_of(lines[at])), "{kinds:?}");
    assert!(kinds.iter().any(|k| matches!(k, BreakKind::VersionGap { .. })), "{kinds:?}");
    assert!(
        kinds.contains(&&BreakKind::CountMismatch { what: "events", expected: 36, found: 35 }),
        "{kinds:?}"
    );

    // Two lines swapped: the later event comes first, out of the log's order.
    let at = event_line(&lines, 20);
    let mut swapped = lines.clone();
    swapped.swap(at, at + 1);
    let report = checked(&swapped.join("\n")).report;
    let first = report.first_break().unwrap();
    assert_eq!(first.kind, BreakKind::Reordered, "{:?}", report.breaks);
    assert_eq!((first.position, first.line), (position_of(lines[at]), at as u64 + 2));

    // A seal naming a range other than the one it lists: its last event moved one back.
    let at = lines.iter().position(|l| l.starts_with(r#"{"kind":"seal""#)).unwrap();
    let mut seal: Value = serde_json::from_str(lines[at]).unwrap();
    let before: Value = serde_json::from_str(lines[at - 2]).unwrap();
    seal["last"] = before["cursor"].clone();
    let (seal, mut moved) = (seal.to_string(), lines.clone());
    moved[at] = &seal;
    let report = checked(&moved.join("\n")).report;
    let first = report.first_break().unwrap();
    assert_eq!(first.kind, BreakKind::SealMismatch { seal_no: 1 }, "{:?}", report.breaks);

    // The last line removed: the file was cut short.
    let cut = lines[..lines.len() - 1].join("\n");
    let report = checked(&cut).report;
    assert!(
        report.breaks.iter().any(
            |b| matches!(&b.kind, BreakKind::Malformed { reason } if reason.contains("cut short"))
        ),
        "{:?}",
        report.breaks
    );
}

/// Twenty streams one after the other, each whole in one append, and one long-lived stream
/// appended to before and after them; exported.
async fn one_after_another(store: &PgEventStore) -> String {
    let long = |n| append("acme", "lease-long", vec![event("LeaseDispatchFailed", payload(99, n))]);
    store.append(vec![long(0)]).await.unwrap();
    for stream in 0..20 {
        let events = (0..3).map(|n| event("LeaseDispatchFailed", payload(stream, n))).collect();
        store.append(vec![append("acme", &format!("lease-{stream:02}"), events)]).await.unwrap();
    }
    let last = store.append(vec![long(1)]).await.unwrap().cursor;
    read_log_through(store, Cursor::START, 100, last).await;
    exported(store, &ExportFilter::default()).await.0
}

#[tokio::test]
async fn a_stream_that_starts_again_after_its_head_and_a_second_head_are_found() {
    let db = TestDb::migrated().await;
    let text = one_after_another(&db.store()).await;
    let lines: Vec<&str> = text.lines().collect();
    let is_event_of = |line: &&str, stream: &str| {
        line.starts_with(r#"{"kind":"event""#)
            && line.contains(&format!(r#""stream_id":"{stream}""#))
    };
    // lease-03's first event copied to the end of the events, under a later cursor (neither
    // is hashed), and a second head for lease-03 saying it ends there.
    let first = lines.iter().find(|line| is_event_of(line, "lease-03")).unwrap();
    let last_event = lines.iter().rfind(|line| line.starts_with(r#"{"kind":"event""#)).unwrap();
    let last: Cursor = serde_json::from_str::<Value>(last_event).unwrap()["cursor"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let again = Cursor { position: last.position + 100, ..last };
    let mut copy: Value = serde_json::from_str(first).unwrap();
    copy["cursor"] = json!(again.to_string());
    copy["position"] = json!(again.position);
    let head = lines.iter().find(|l| l.contains(r#""kind":"stream","stream_id":"lease-03""#));
    let mut second_head: Value = serde_json::from_str(head.unwrap()).unwrap();
    second_head["version"] = json!(1);
    second_head["last_hash"] = copy["hash"].clone();
    let (copy, second_head) = (copy.to_string(), second_head.to_string());
    let at = lines.iter().rposition(|line| line.starts_with(r#"{"kind":"event""#)).unwrap() + 1;
    let mut edited = lines.clone();
    edited.insert(at, &copy);
    edited.insert(edited.len() - 1, &second_head);
    let text = edited.join("\n");

    let (ahead, one_pass) = both(&text);
    let named = |report: &FileReport, line: usize| {
        report.report.breaks.iter().any(|b| b.stream_id == "lease-03" && b.line == line as u64)
    };
    for report in [&ahead, &one_pass] {
        assert!(named(report, at + 1), "the copy, line {}: {:?}", at + 1, report.report.breaks);
        assert!(named(report, edited.len() - 1), "the second head: {:?}", report.report.breaks);
    }
    let kinds: Vec<String> = ahead.report.breaks.iter().map(|b| format!("{:?}", b.kind)).collect();
    assert!(kinds.iter().any(|k| k.contains("after the last its head records")), "{kinds:?}");
    assert!(kinds.iter().any(|k| k.contains("a second head")), "{kinds:?}");
}

#[tokio::test]
async fn an_import_of_two_epochs_and_more_seals_than_it_holds_at_once_restores_each_exactly() {
    let source = TestDb::migrated().await;
    let store = source.store();
    let mut last = Cursor::START;
    for round in 0..41 {
        let events = (0..100).map(|n| event("LeaseDispatchFailed", payload(round, n))).collect();
        let name = format!("lease-{}", round % 7);
        last = store.append(vec![append("acme", &name, events)]).await.unwrap().cursor;
        if round == 20 {
            store.raise_epoch().await.unwrap();
        }
    }
    read_log_through(&store, Cursor::START, 1_000, last).await;
    // A seal for each event: more than the 4,096 an import holds before it writes them.
    assert_eq!(store.seal_all(1, false).await.unwrap(), 4_100);
    let (text, _) = exported(&store, &ExportFilter::default()).await;
    let target = TestDb::migrated().await;
    let heads = Some(HeadsAhead::new(text.as_bytes()));
    let imported = import(&target.store(), text.as_bytes(), heads, |_| {}).await.unwrap();
    assert!(imported.checked.report.breaks.is_empty(), "{:?}", imported.checked.report.breaks);
    for sql in [EVENTS, STREAMS, SEALS] {
        assert_eq!(rows(&source, sql).await, rows(&target, sql).await, "{sql}");
    }
    let report = target.store().verify_log(|_| {}).await.unwrap();
    assert!(report.breaks.is_empty(), "{:?}", report.breaks);
    assert_eq!((report.events_checked, report.seals_checked), (4_100, 4_100));
}

#[tokio::test]
async fn a_check_reading_the_heads_ahead_holds_only_the_streams_still_open() {
    let db = TestDb::migrated().await;
    let text = one_after_another(&db.store()).await;

    let ahead = checked(&text);
    assert!(ahead.report.breaks.is_empty(), "{:?}", ahead.report.breaks);
    assert_eq!(ahead.report.streams_checked, 21);
    assert_eq!(ahead.streams_held_max, 2, "the long stream and the one being read");
    let one_pass = check_file(text.as_bytes(), None, |_| {}).unwrap();
    assert_eq!(one_pass.streams_held_max, 21);

    // The heads are written in the order of the events they name; a file with its heads in
    // another order (exports before it wrote them by stream id) verifies all the same.
    let lines: Vec<&str> = text.lines().collect();
    let heads: Vec<&str> =
        lines.iter().copied().filter(|l| l.contains(r#""kind":"stream""#)).collect();
    assert!(heads[0].contains("lease-00") && heads[20].contains("lease-long"), "{heads:#?}");
    let reversed: Vec<&str> = heads.iter().rev().copied().collect();
    let start = lines.len() - 1 - heads.len();
    let reordered = [&lines[..start], &reversed[..], &lines[lines.len() - 1..]].concat().join("\n");
    let report = checked(&reordered);
    assert!(report.report.breaks.is_empty(), "{:?}", report.report.breaks);
    assert_eq!(report.report.streams_checked, 21);

    // A stream's last event removed: its head, read ahead, waits for it, and is named when
    // its own line comes, as in one pass.
    let at = lines
        .iter()
        .rposition(|l| l.contains(r#""stream_id":"lease-05""#) && l.contains(r#""kind":"event""#));
    let mut removed = lines.clone();
    removed.remove(at.unwrap());
    let report = checked(&removed.join("\n")).report;
    let missing = report.breaks.iter().find(|b| b.stream_id == "lease-05").unwrap();
    assert_eq!(missing.kind, BreakKind::EventsMissing { recorded: 3 }, "{:?}", report.breaks);
}

#[tokio::test]
async fn a_cursor_range_verifies_with_the_seals_it_holds_whole() {
    let db = TestDb::migrated().await;
    let store = db.store();
    a_log(&store).await;
    let log = store.read_log(Cursor::START, 100).await.unwrap().events;
    let filter = ExportFilter {
        from_cursor: Some(log[5].cursor),
        to_cursor: Some(log[30].cursor),
        ..ExportFilter::default()
    };
    let (text, summary) = exported(&store, &filter).await;
    assert_eq!(summary.events, 25);
    // Seals of 4 from the first event: those wholly after the 6th event and up to the 31st
    // (the 9th to the 28th event: five).
    assert_eq!(summary.seals, 5);
    let report = checked(&text);
    assert!(!report.header.complete);
    assert!(report.report.breaks.is_empty(), "{:?}", report.report.breaks);
    assert_eq!(report.report.seals_checked, 5);
}

#[tokio::test]
async fn a_tenants_export_holds_nothing_of_another_tenant_and_no_operator_only_field() {
    let db = TestDb::migrated().await;
    a_log(&db.store()).await;
    let filter = ExportFilter { tenant: Some("acme".into()), ..ExportFilter::default() };
    let (text, summary) = exported(&db.store(), &filter).await;
    assert_eq!((summary.events, summary.seals, summary.streams), (18, 0, 0));
    for line in text.lines() {
        let line: Value = serde_json::from_str(line).unwrap();
        if line["kind"] != "event" {
            continue;
        }
        let mut keys: Vec<&str> = line.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            ["event_type", "kind", "payload", "recorded_at", "stream_id", "stream_type", "version"]
        );
        // The tenant view of LeaseDispatchFailed: attempt and time, no generation or detail.
        let mut shown: Vec<&str> =
            line["payload"].as_object().unwrap().keys().map(String::as_str).collect();
        shown.sort_unstable();
        assert_eq!(shown, ["at", "attempt"]);
    }
    assert!(!text.contains("globex"), "another tenant in a tenant's export:\n{text}");
    let events: Vec<&str> =
        text.lines().filter(|line| line.contains(r#""kind":"event""#)).collect();
    for absent in ["lease-1", "lease-3", "lease-5", "operator-only", "hash", "cursor", "tenant"] {
        assert!(!events.iter().any(|line| line.contains(absent)), "{absent} in {events:#?}");
    }
    let refused = check_file(text.as_bytes(), None, |_| {});
    assert!(matches!(refused, Err(ArchiveError::Unsuitable(_))), "{refused:?}");
}

#[tokio::test]
async fn a_cut_file_posing_as_complete_and_a_stream_head_handed_to_another_tenant_are_refused() {
    let db = TestDb::migrated().await;
    let store = db.store();
    a_log(&store).await;
    // A file cut by a cursor that says it is the whole log would have its first events and
    // seals taken on trust.
    let log = store.read_log(Cursor::START, 100).await.unwrap().events;
    let cut = ExportFilter { from_cursor: Some(log[7].cursor), ..ExportFilter::default() };
    let (text, _) = exported(&store, &cut).await;
    let posing = text.replacen("\"complete\":false", "\"complete\":true", 1);
    let refused = check_file(posing.as_bytes(), None, |_| {});
    assert!(matches!(refused, Err(ArchiveError::Unsuitable(_))), "{refused:?}");
    let target = TestDb::migrated().await;
    let refused = import(&target.store(), posing.as_bytes(), None, |_| {}).await;
    assert!(matches!(refused, Err(ArchiveError::Unsuitable(_))), "{refused:?}");

    // A stream's head naming another tenant would hand the stream to it on import.
    let (text, _) = exported(&store, &ExportFilter::default()).await;
    let lines: Vec<&str> = text.lines().collect();
    let at = lines.iter().position(|l| l.starts_with(r#"{"kind":"stream""#)).unwrap();
    let handed = lines[at].replace("\"tenant_id\":\"acme\"", "\"tenant_id\":\"globex\"");
    assert_ne!(handed, lines[at]);
    let mut edited = lines.clone();
    edited[at] = &handed;
    let report = checked(&edited.join("\n")).report;
    let first = report.first_break().expect("found");
    assert_eq!((first.kind.clone(), first.line), (BreakKind::HeadMismatch, at as u64 + 1));
    let refused = import(&target.store(), edited.join("\n").as_bytes(), None, |_| {}).await;
    assert!(matches!(refused, Err(ArchiveError::DoesNotVerify { .. })), "{refused:?}");
}
