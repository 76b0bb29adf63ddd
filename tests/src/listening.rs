//! Child processes that say where they listen: `leasehold backend-sim` in each of its modes
//! prints `listening on URL` as its first line.

use std::time::Duration;

use tokio::io::AsyncBufReadExt as _;

/// How long a child has to say where it listens.
const SAY_WITHIN: Duration = Duration::from_secs(30);

/// Starts `command` (its standard output piped, killed when the child is dropped) and waits
/// (bounded) for its first line, `listening on URL`: the URL and the child.
///
/// # Panics
/// When it does not start, or its first line does not come in time or is not that.
pub async fn spawn_listening(
    mut command: tokio::process::Command,
) -> (String, tokio::process::Child) {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let stdout = child.stdout.take().expect("piped");
    let mut line = String::new();
    tokio::time::timeout(SAY_WITHIN, tokio::io::BufReader::new(stdout).read_line(&mut line))
        .await
        .expect("the child says where it listens")
        .expect("a first line");
    let url = line.trim().strip_prefix("listening on ").expect("its first line names its URL");
    (url.to_string(), child)
}

/// The routes of `docs/mercator-protocol.md`'s tables whose first cell starts with
/// `` `prefix ``, each as the rest of that cell (so a contract test checks every documented
/// route, and a route added to the note without a server behind it fails).
///
/// # Panics
/// When the note cannot be read.
pub fn documented_routes(prefix: &str) -> Vec<String> {
    routes_in("mercator-protocol.md", prefix)
}

/// The routes of the tables of `docs/<note>` whose first cell starts with `` `prefix ``,
/// each as the rest of that cell (`documented_routes("GET ")` of the billet note: `/kind`,
/// ...).
///
/// # Panics
/// When the note cannot be read.
pub fn routes_in(note: &str, prefix: &str) -> Vec<String> {
    let path = format!("{}/../docs/{note}", env!("CARGO_MANIFEST_DIR"));
    let note = std::fs::read_to_string(path).expect("the protocol note");
    let cell = format!("| `{prefix}");
    note.lines()
        .filter_map(|line| line.strip_prefix(cell.as_str()))
        .filter_map(|rest| rest.split('`').next())
        .map(str::to_string)
        .collect()
}
