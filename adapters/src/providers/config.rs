//! The providers file: the rental provider connections a deployment rents through (`serve
//! --providers-file`), in JSON:
//!
//! ```json
//! { "providers": [
//!     { "connection": "shadeform-eu", "url": "http://10.0.0.7:9100",
//!       "token_file": "/etc/leasehold/shadeform-eu.token", "timeout_seconds": 30,
//!       "capabilities": { "stop": true, "resume": true, "persistent_disk": true,
//!         "spot": false, "exact_pricing": true, "idempotent_provision": "operation_key",
//!         "list_owned": true, "observe_after_terminate": false } } ] }
//! ```
//!
//! `connection` names the connection in rentals and in its agent's token (`leasehold token
//! --role agent --connection NAME`); names are unique. `capabilities` is what the provider
//! declares it can do (mercator's `CapacitySupport`, every field required): it is validated
//! here (a provider without idempotent provision must list owned capacity; resume and
//! persistent disk need stop), and a declaration that breaks a rule stops `serve` from
//! starting. `url` (`http://` or `https://`, no credentials in it) and the bearer token in
//! `token_file` (at least 32 bytes; never logged, never in an event) are how Leasehold calls
//! the provider's agent; `timeout_seconds` (one exchange) defaults to 30.

use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold_domain::rental::{CapacitySupport, ConnectionId};
use serde::Deserialize;

/// Longest timeout a provider may be given.
const TIMEOUT_SECONDS_MAX: u64 = 600;

/// One exchange's timeout when the file names none.
const TIMEOUT_SECONDS_DEFAULT: u64 = 30;

/// Least length of a provider's token.
const TOKEN_BYTES_MIN: usize = 32;

/// Why the providers file cannot be used. No variant carries a token.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file (or a token file) cannot be read.
    #[error("cannot read {path}: {reason}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file is not the JSON described above.
    #[error("{path} is not a providers file: {reason}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },
    /// One connection's settings are wrong.
    #[error("provider connection {name:?}: {reason}")]
    Invalid {
        /// The connection.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

/// The bearer token Leasehold presents to a provider's agent. Its `Debug` shows nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct ProviderToken(String);

impl ProviderToken {
    /// `text` as a token: at least [`TOKEN_BYTES_MIN`] printable bytes (surrounding whitespace
    /// cut), else `None`. For tokens made in memory (`serve --demo`'s simulators); files go
    /// through [`load`].
    pub fn new(text: &str) -> Option<Self> {
        let text = text.trim_ascii();
        (text.len() >= TOKEN_BYTES_MIN && text.bytes().all(|b| b.is_ascii_graphic()))
            .then(|| Self(text.to_owned()))
    }

    /// The token's text, for the `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ProviderToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProviderToken([redacted])")
    }
}

/// One provider connection, as the file declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// Its name.
    pub connection: ConnectionId,
    /// Where its agent is called.
    pub url: String,
    /// What Leasehold presents to it.
    pub token: ProviderToken,
    /// One exchange's timeout.
    pub timeout: Duration,
    /// What it declares it can do (validated).
    pub support: CapacitySupport,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    providers: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    connection: String,
    url: String,
    token_file: PathBuf,
    #[serde(default)]
    timeout_seconds: Option<u64>,
    capabilities: CapacitySupport,
}

/// Reads the providers file at `path` (relative token files are relative to it).
///
/// # Errors
/// [`ConfigError`].
pub fn load(path: &Path) -> Result<Vec<ProviderConfig>, ConfigError> {
    let unreadable = |path: &Path, error: std::io::Error| ConfigError::Unreadable {
        path: path.to_path_buf(),
        reason: error.to_string(),
    };
    let text = std::fs::read(path).map_err(|error| unreadable(path, error))?;
    let file: File = serde_json::from_slice(&text).map_err(|error| ConfigError::Malformed {
        path: path.to_path_buf(),
        reason: error.to_string(),
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut configs: Vec<ProviderConfig> = Vec::new();
    for entry in file.providers {
        let name = entry.connection.clone();
        let invalid = |reason: String| ConfigError::Invalid { name: name.clone(), reason };
        let connection = ConnectionId::parse("connection", entry.connection.as_str())
            .map_err(|error| invalid(error.to_string()))?;
        if configs.iter().any(|c| c.connection == connection) {
            return Err(invalid("names must be unique".into()));
        }
        entry.capabilities.validate().map_err(|error| invalid(error.to_string()))?;
        check_url(&entry.url).map_err(|reason| invalid(reason.into()))?;
        let timeout = entry.timeout_seconds.unwrap_or(TIMEOUT_SECONDS_DEFAULT);
        if !(1..=TIMEOUT_SECONDS_MAX).contains(&timeout) {
            return Err(invalid(format!("timeout_seconds must be 1 to {TIMEOUT_SECONDS_MAX}")));
        }
        let token = read_token(&base.join(&entry.token_file), &name)?;
        configs.push(ProviderConfig {
            connection,
            url: entry.url,
            token,
            timeout: Duration::from_secs(timeout),
            support: entry.capabilities,
        });
    }
    Ok(configs)
}

/// The bearer token in the file at `path`, for the agent named `name`: at least
/// [`TOKEN_BYTES_MIN`] printable bytes (surrounding whitespace cut).
///
/// # Errors
/// [`ConfigError`]: unreadable, or not such a token (its text is never quoted).
pub(crate) fn read_token(path: &Path, name: &str) -> Result<ProviderToken, ConfigError> {
    let bytes = std::fs::read(path).map_err(|error| ConfigError::Unreadable {
        path: path.to_path_buf(),
        reason: error.to_string(),
    })?;
    std::str::from_utf8(&bytes).ok().and_then(ProviderToken::new).ok_or_else(|| {
        ConfigError::Invalid {
            name: name.to_owned(),
            reason: format!("its token file must hold at least {TOKEN_BYTES_MIN} printable bytes"),
        }
    })
}

/// `http://` or `https://`, and no user or password in it (secrets go in files).
pub(crate) fn check_url(url: &str) -> Result<(), &'static str> {
    let Some(rest) = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")) else {
        return Err("url must start with http:// or https://");
    };
    if rest.split('/').next().is_some_and(|authority| authority.contains('@')) {
        return Err("url must not carry a user or password (use token_file)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lh-providers-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        std::fs::write(dir.join("sim.token"), "a-provider-token-of-at-least-32-bytes\n")
            .expect("written");
        dir
    }

    fn file(dir: &Path, capabilities: &str, url: &str) -> PathBuf {
        let path = dir.join("providers.json");
        let text = format!(
            r#"{{"providers": [{{"connection": "sim", "url": "{url}",
                "token_file": "sim.token", "capabilities": {capabilities}}}]}}"#
        );
        std::fs::write(&path, text).expect("written");
        path
    }

    const GOOD: &str = r#"{"stop": true, "resume": true, "persistent_disk": false,
        "spot": true, "exact_pricing": false, "idempotent_provision": "none",
        "list_owned": true, "observe_after_terminate": false}"#;

    #[test]
    fn a_valid_file_is_read_with_its_token_redacted() {
        let dir = dir();
        let loaded = load(&file(&dir, GOOD, "http://127.0.0.1:9")).expect("valid");
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].connection.as_str(), "sim");
        assert_eq!(loaded[0].token.expose(), "a-provider-token-of-at-least-32-bytes");
        assert_eq!(loaded[0].timeout, Duration::from_secs(30));
        assert!(!format!("{loaded:?}").contains("provider-token"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_declaration_that_breaks_a_rule_is_refused_naming_the_connection() {
        let dir = dir();
        let unlisted = GOOD.replace(r#""list_owned": true"#, r#""list_owned": false"#);
        let error = load(&file(&dir, &unlisted, "http://127.0.0.1:9")).expect_err("refused");
        assert!(matches!(&error, ConfigError::Invalid { name, .. } if name == "sim"), "{error}");
        let resume_alone = GOOD.replace(r#""stop": true"#, r#""stop": false"#);
        assert!(load(&file(&dir, &resume_alone, "http://127.0.0.1:9")).is_err());
        let with_password = load(&file(&dir, GOOD, "http://u:p@127.0.0.1:9")).expect_err("no");
        assert!(with_password.to_string().contains("user or password"), "{with_password}");
        let missing = GOOD.replace(r#""spot": true,"#, "");
        assert!(matches!(
            load(&file(&dir, &missing, "http://127.0.0.1:9")),
            Err(ConfigError::Malformed { .. })
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
