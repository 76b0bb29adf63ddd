//! The runner nodes file (`serve --runner-nodes-file`): where each runner node's provider
//! agent is called, and the issuer runner registrations are minted from, in JSON:
//!
//! ```json
//! { "issuer": { "url": "https://api.github.com/orgs/acme/actions/runners/generate-jitconfig",
//!               "token_file": "github.token", "runner_group_id": 1 },
//!   "nodes": [ { "node": "docker-1", "url": "http://10.0.0.8:9200",
//!                "token_file": "docker-1.token", "timeout_seconds": 30 } ] }
//! ```
//!
//! `node` is the name the node registers under (`leasehold token --role agent --runner-node
//! NAME`); names are unique, and the dispatcher tries nodes in the file's order. `url`
//! (`http://` or `https://`, no credentials in it) and the bearer token in `token_file` (at
//! least 32 bytes; never logged, never in an event) are how Leasehold calls the agent;
//! `timeout_seconds` (one exchange) defaults to 30. Relative token files are relative to the
//! file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold_domain::runner::RunnerNodeName;
use serde::Deserialize;

use crate::providers::ProviderToken;
use crate::providers::config::{ConfigError, check_url, read_token};

/// Longest timeout an agent may be given.
const TIMEOUT_SECONDS_MAX: u64 = 600;

/// One exchange's timeout when the file names none.
const TIMEOUT_SECONDS_DEFAULT: u64 = 30;

/// One runner node's provider agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerNodeConfig {
    /// The node's registered name.
    pub node: RunnerNodeName,
    /// Where its agent is called.
    pub url: String,
    /// What Leasehold presents to it.
    pub token: ProviderToken,
    /// One exchange's timeout.
    pub timeout: Duration,
}

/// Where runner registrations are minted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuerConfig {
    /// The `generate-jitconfig` URL.
    pub url: String,
    /// What Leasehold presents to it.
    pub token: ProviderToken,
    /// The runner group registrations join.
    pub runner_group_id: u64,
    /// One exchange's timeout.
    pub timeout: Duration,
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerNodesFile {
    /// The issuer.
    pub issuer: IssuerConfig,
    /// The nodes, in the order they are tried.
    pub nodes: Vec<RunnerNodeConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    issuer: IssuerEntry,
    nodes: Vec<NodeEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IssuerEntry {
    url: String,
    token_file: PathBuf,
    runner_group_id: u64,
    #[serde(default)]
    timeout_seconds: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeEntry {
    node: String,
    url: String,
    token_file: PathBuf,
    #[serde(default)]
    timeout_seconds: Option<u64>,
}

fn timeout_of(seconds: Option<u64>, name: &str) -> Result<Duration, ConfigError> {
    let seconds = seconds.unwrap_or(TIMEOUT_SECONDS_DEFAULT);
    if !(1..=TIMEOUT_SECONDS_MAX).contains(&seconds) {
        let reason = format!("timeout_seconds must be 1 to {TIMEOUT_SECONDS_MAX}");
        return Err(ConfigError::Invalid { name: name.to_owned(), reason });
    }
    Ok(Duration::from_secs(seconds))
}

fn url_of(url: String, name: &str) -> Result<String, ConfigError> {
    check_url(&url)
        .map_err(|reason| ConfigError::Invalid { name: name.to_owned(), reason: reason.into() })?;
    Ok(url)
}

/// Reads the runner nodes file at `path`.
///
/// # Errors
/// [`ConfigError`].
pub fn load(path: &Path) -> Result<RunnerNodesFile, ConfigError> {
    let text = std::fs::read(path).map_err(|error| ConfigError::Unreadable {
        path: path.to_path_buf(),
        reason: error.to_string(),
    })?;
    let file: File = serde_json::from_slice(&text).map_err(|error| ConfigError::Malformed {
        path: path.to_path_buf(),
        reason: error.to_string(),
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    let issuer = IssuerConfig {
        token: read_token(&base.join(&file.issuer.token_file), "issuer")?,
        url: url_of(file.issuer.url, "issuer")?,
        runner_group_id: file.issuer.runner_group_id,
        timeout: timeout_of(file.issuer.timeout_seconds, "issuer")?,
    };
    let mut nodes: Vec<RunnerNodeConfig> = Vec::new();
    for entry in file.nodes {
        let name = entry.node.clone();
        let node = RunnerNodeName::parse("node", entry.node.as_str()).map_err(|error| {
            ConfigError::Invalid { name: name.clone(), reason: error.to_string() }
        })?;
        if nodes.iter().any(|known| known.node == node) {
            let reason = "node names must be unique".into();
            return Err(ConfigError::Invalid { name, reason });
        }
        nodes.push(RunnerNodeConfig {
            token: read_token(&base.join(&entry.token_file), &name)?,
            url: url_of(entry.url, &name)?,
            timeout: timeout_of(entry.timeout_seconds, &name)?,
            node,
        });
    }
    Ok(RunnerNodesFile { issuer, nodes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_with_its_tokens_redacted_and_a_bad_one_is_named() {
        let dir = std::env::temp_dir().join(format!("lh-runner-nodes-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).expect("a directory");
        std::fs::write(dir.join("t"), "a-runner-agent-token-of-at-least-32-bytes\n").expect("w");
        let write = |nodes: &str| {
            let path = dir.join("nodes.json");
            let text = format!(
                r#"{{"issuer": {{"url": "http://127.0.0.1:9/jit", "token_file": "t",
                    "runner_group_id": 1}}, "nodes": {nodes}}}"#
            );
            std::fs::write(&path, text).expect("written");
            path
        };
        let good =
            write(r#"[{"node": "docker-1", "url": "http://127.0.0.1:9", "token_file": "t"}]"#);
        let loaded = load(&good).expect("valid");
        assert_eq!(loaded.nodes[0].node.as_str(), "docker-1");
        assert_eq!(loaded.nodes[0].timeout, Duration::from_secs(30));
        assert!(!format!("{loaded:?}").contains("runner-agent-token"));
        let twice = write(
            r#"[{"node": "d", "url": "http://a", "token_file": "t"},
                {"node": "d", "url": "http://b", "token_file": "t"}]"#,
        );
        assert!(load(&twice).expect_err("refused").to_string().contains("unique"));
        let password = write(r#"[{"node": "d", "url": "http://u:p@a", "token_file": "t"}]"#);
        assert!(load(&password).expect_err("refused").to_string().contains("user or password"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
