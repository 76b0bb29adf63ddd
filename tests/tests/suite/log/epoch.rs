//! A logical restore into a cluster whose transaction ids are lower than the dump's: after
//! `raise_epoch` (`leasehold events new-epoch`), every new event sorts after every restored
//! one, so a reader resuming from a cursor handed out before the restore skips nothing.

use leasehold_adapters::DatabaseUrl;
use leasehold_domain::{Cursor, EventStore, ExpectedVersion};
use leasehold_tests::TestDb;
use serde_json::json;

use crate::support::{append, event, read_log_through};

/// How far ahead of this cluster the dumped cluster's transaction ids were.
const XID_OFFSET: i64 = 1_000_000_000;

async fn run(program: &str, args: &[&str], stdin: Option<std::process::Stdio>) -> Vec<u8> {
    let mut command = tokio::process::Command::new(program);
    command.args(args);
    if let Some(stdin) = stdin {
        command.stdin(stdin);
    }
    let output = command.output().await.unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(output.status.success(), "{program}: {}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

/// `pg_dump SOURCE | psql TARGET`.
async fn dump_and_restore(source: &TestDb, target: &TestDb) {
    let connection = |url: &DatabaseUrl, name: &str| {
        let (host, port) = url
            .endpoint()
            .rsplit_once(':')
            .map(|(h, p)| (h.to_string(), p.to_string()))
            .expect("host:port");
        vec![
            "-h".to_string(),
            host,
            "-p".to_string(),
            port,
            "-U".into(),
            "postgres".into(),
            "-d".into(),
            name.to_string(),
        ]
    };
    let mut dump_args = connection(&source.url, source.name());
    dump_args.push("--no-owner".into());
    let dump_args: Vec<&str> = dump_args.iter().map(String::as_str).collect();
    let dump = run("pg_dump", &dump_args, None).await;
    let file = std::env::temp_dir().join(format!("{}.sql", source.name()));
    std::fs::write(&file, dump).expect("the dump is written");
    let mut restore_args = connection(&target.url, target.name());
    restore_args.extend(["-q".into(), "-v".into(), "ON_ERROR_STOP=1".into(), "-f".into()]);
    restore_args.push(file.display().to_string());
    let restore_args: Vec<&str> = restore_args.iter().map(String::as_str).collect();
    run("psql", &restore_args, None).await;
    let _ = std::fs::remove_file(&file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restore_and_a_new_epoch_readers_resuming_from_an_old_cursor_see_every_new_event() {
    // The original cluster: a log, whose transaction ids were far ahead of the cluster it
    // is restored into (moved ahead here, since both live on one test server).
    let source = TestDb::migrated().await;
    let store = source.store();
    let mut written = Cursor::START;
    for n in 0..3 {
        let stream = format!("restored-{n}");
        let events = vec![event("Happened", json!({ "n": n }))];
        let appended = store.append(vec![append(&stream, ExpectedVersion::NoStream, events)]);
        written = appended.await.unwrap().cursor;
    }
    // Read once the horizon has passed them (another test's open transaction holds it back).
    let before = read_log_through(&store, Cursor::START, 100, written).await;
    assert_eq!(before.len(), 3);
    let shift = format!(
        "UPDATE events SET tx_id = (tx_id::text::bigint + {XID_OFFSET})::text::xid8;
         UPDATE streams SET last_tx_id = (last_tx_id::text::bigint + {XID_OFFSET})::text::xid8;"
    );
    source.client().await.batch_execute(&shift).await.expect("shifted");
    // The cursor a reader (a projection, a subscriber) held from before the restore.
    let last_read = before.last().expect("an event").cursor;
    let held = Cursor { tx_id: last_read.tx_id + XID_OFFSET as u64, ..last_read };

    let target = TestDb::empty().await;
    dump_and_restore(&source, &target).await;
    let restored = target.store();
    let epoch = restored.raise_epoch().await.expect("the epoch is raised");
    assert_eq!(epoch, 2);

    // New events, on a restored stream and a new one.
    let more = vec![event("Happened", json!({ "n": 3 }))];
    restored.append(vec![append("restored-0", ExpectedVersion::Exact(1), more)]).await.unwrap();
    let new = vec![event("Happened", json!({ "n": 4 }))];
    let last = restored.append(vec![append("new-0", ExpectedVersion::NoStream, new)]).await;
    let last = last.expect("appended").cursor;
    assert!(last > held, "new events sort after the restored ones");

    let seen = read_log_through(&restored, held, 10, last).await;
    let numbers: Vec<i64> = seen.iter().map(|e| e.payload["n"].as_i64().expect("n")).collect();
    assert_eq!(numbers, [3, 4], "every new event, none skipped, nothing restored again");
    // From the start, the whole log: the restored events, then the new ones.
    let all = read_log_through(&restored, Cursor::START, 10, last).await;
    assert_eq!(all.len(), 5);
}
