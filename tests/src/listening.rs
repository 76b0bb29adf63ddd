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
