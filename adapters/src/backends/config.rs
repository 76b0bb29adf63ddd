//! The backends file: how to reach each lease backend (`serve --backends-file`), in JSON:
//!
//! ```json
//! { "backends": [
//!     { "name": "docker-1", "url": "http://10.0.0.5:9000",
//!       "secret_file": "/etc/leasehold/docker-1.secret", "timeout_seconds": 30,
//!       "breaker_open_seconds": 60 } ] }
//! ```
//!
//! `timeout_seconds` (one exchange, body included) and `breaker_open_seconds` (how long the
//! circuit stays open after 5 failures in a row) default to fred's 30 and 60. Routing (fred's
//! rules, `routing.rs`): `skus` lists the SKUs a backend serves (exact matches), `default:
//! true` marks the one SKUs no backend lists go to (at most one; without it, the first
//! backend), and `fenced: true` takes a backend out: never chosen, never called.
//! `subscribes: true` marks a backend that cannot be called (behind NAT): it needs no `url`,
//! is never called, and takes its work from the `work` subscription instead.
//!
//! Each backend has its own signing secret, read from its file (at least 32 bytes; never
//! logged, never in an event). Names are unique, URLs are `http://` or `https://`. TLS, as
//! fred's backends file: `tls_ca_file` (the CA that signed the backend's certificate; only it
//! is trusted, else the system's roots), `tls_client_cert_file` with `tls_client_key_file`
//! (Leasehold's certificate for mutual TLS). There is no way to skip verification.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{BackendConfig, SigningSecret};
use crate::limits::BACKEND_TIMEOUT_DEFAULT_SECONDS;

/// Longest timeout a backend may be given.
const TIMEOUT_SECONDS_MAX: u64 = 600;

/// Why the backends file cannot be used. No variant carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file (or a secret file) cannot be read.
    #[error("cannot read {path}: {reason}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file is not the JSON described above.
    #[error("{path} is not a backends file: {reason}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },
    /// One backend's settings are wrong.
    #[error("backend {name:?}: {reason}")]
    Invalid {
        /// The backend.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    backends: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    #[serde(default)]
    url: Option<String>,
    secret_file: PathBuf,
    #[serde(default)]
    timeout_seconds: Option<u64>,
    #[serde(default)]
    breaker_open_seconds: Option<u64>,
    #[serde(default)]
    skus: Vec<String>,
    #[serde(default)]
    default: bool,
    #[serde(default)]
    fenced: bool,
    #[serde(default)]
    subscribes: bool,
    #[serde(default)]
    tls_ca_file: Option<PathBuf>,
    #[serde(default)]
    tls_client_cert_file: Option<PathBuf>,
    #[serde(default)]
    tls_client_key_file: Option<PathBuf>,
}

/// Reads the backends file at `path` (relative secret files are relative to it).
///
/// # Errors
/// [`ConfigError`].
pub fn load(path: &Path) -> Result<Vec<BackendConfig>, ConfigError> {
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
    let mut configs: Vec<BackendConfig> = Vec::new();
    for entry in file.backends {
        let invalid =
            |reason: &str| ConfigError::Invalid { name: entry.name.clone(), reason: reason.into() };
        if entry.name.is_empty() || configs.iter().any(|c| c.name == entry.name) {
            return Err(invalid("names must be present and unique"));
        }
        // A backend behind NAT has no URL to call: it subscribes to its work.
        let url = match (&entry.url, entry.subscribes) {
            (Some(url), _) => url.clone(),
            (None, true) => String::new(),
            (None, false) => return Err(invalid("url is required unless it subscribes")),
        };
        if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
            return Err(invalid("url must start with http:// or https://"));
        }
        // Credentials in a URL would be printed wherever the URL is: secrets go in files.
        let authority = url.split("://").nth(1).unwrap_or("").split('/').next();
        if authority.is_some_and(|authority| authority.contains('@')) {
            return Err(invalid("url must not carry a user or password (use secret_file)"));
        }
        let timeout = entry.timeout_seconds.unwrap_or(BACKEND_TIMEOUT_DEFAULT_SECONDS);
        if !(1..=TIMEOUT_SECONDS_MAX).contains(&timeout) {
            return Err(invalid("timeout_seconds must be 1 to 600"));
        }
        let secret_path = base.join(&entry.secret_file);
        let bytes = std::fs::read(&secret_path).map_err(|error| unreadable(&secret_path, error))?;
        let secret = SigningSecret::new(&bytes)
            .map_err(|_| invalid("its secret file must hold at least 32 bytes"))?;
        let mut config = BackendConfig::new(&entry.name, &url, secret);
        config.subscribes = entry.subscribes;
        config.timeout = Duration::from_secs(timeout);
        if entry.default && configs.iter().any(|c| c.default) {
            return Err(invalid("at most one backend is the default"));
        }
        config.skus.clone_from(&entry.skus);
        config.default = entry.default;
        config.fenced = entry.fenced;
        if let Some(open) = entry.breaker_open_seconds {
            if !(1..=TIMEOUT_SECONDS_MAX).contains(&open) {
                return Err(invalid("breaker_open_seconds must be 1 to 600"));
            }
            config.breaker_open = Duration::from_secs(open);
        }
        config.tls = tls_of(&entry, base)?;
        configs.push(config);
    }
    Ok(configs)
}

/// The entry's TLS files, read (relative paths are relative to the backends file).
fn tls_of(entry: &Entry, base: &Path) -> Result<super::TlsSettings, ConfigError> {
    let read = |file: &Path| {
        let path = base.join(file);
        std::fs::read(&path)
            .map_err(|error| ConfigError::Unreadable { path, reason: error.to_string() })
    };
    let ca_pem = entry.tls_ca_file.as_deref().map(read).transpose()?;
    let client_identity_pem = match (&entry.tls_client_cert_file, &entry.tls_client_key_file) {
        (Some(cert), Some(key)) => {
            let mut pem = read(cert)?;
            pem.push(b'\n');
            pem.extend(read(key)?);
            Some(pem)
        }
        (None, None) => None,
        _ => {
            return Err(ConfigError::Invalid {
                name: entry.name.clone(),
                reason: "tls_client_cert_file and tls_client_key_file go together".into(),
            });
        }
    };
    let tls = ca_pem.is_some() || client_identity_pem.is_some();
    if tls && !entry.url.as_deref().is_some_and(|url| url.starts_with("https://")) {
        return Err(ConfigError::Invalid {
            name: entry.name.clone(),
            reason: "TLS settings need an https:// url".into(),
        });
    }
    Ok(super::TlsSettings { ca_pem, client_identity_pem })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lh-backends-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn reads_each_backend_with_its_own_secret() {
        let dir = dir();
        write(&dir, "a.secret", "a-secret-of-at-least-thirty-two-bytes!!\n");
        let file = write(
            &dir,
            "backends.json",
            r#"{"backends":[{"name":"a","url":"http://127.0.0.1:1/","secret_file":"a.secret","timeout_seconds":5}]}"#,
        );
        let configs = load(&file).expect("loads");
        assert_eq!(configs.len(), 1);
        assert_eq!(
            (configs[0].name.as_str(), configs[0].url.as_str()),
            ("a", "http://127.0.0.1:1")
        );
        assert_eq!(configs[0].timeout, Duration::from_secs(5));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn refuses_what_would_fail_later() {
        let dir = dir();
        write(&dir, "short", "too short");
        write(&dir, "ok", "a-secret-of-at-least-thirty-two-bytes!!");
        let cases = [
            (r#"{"backends":[{"name":"a","url":"http://x","secret_file":"short"}]}"#, "32 bytes"),
            (r#"{"backends":[{"name":"a","url":"ftp://x","secret_file":"ok"}]}"#, "http://"),
            (
                r#"{"backends":[{"name":"a","url":"https://u:token@x/","secret_file":"ok"}]}"#,
                "user or password",
            ),
            (
                r#"{"backends":[{"name":"a","url":"http://x","secret_file":"ok","default":true},{"name":"b","url":"http://y","secret_file":"ok","default":true}]}"#,
                "at most one",
            ),
            (
                r#"{"backends":[{"name":"a","url":"http://x","secret_file":"ok"},{"name":"a","url":"http://y","secret_file":"ok"}]}"#,
                "unique",
            ),
            (
                r#"{"backends":[{"name":"a","url":"http://x","secret_file":"ok","timeout_seconds":0}]}"#,
                "1 to 600",
            ),
            (
                r#"{"backends":[{"name":"a","url":"http://x","secret_file":"missing"}]}"#,
                "cannot read",
            ),
            (r#"{"backends":[{"name":"a","secret_file":"ok"}]}"#, "unless it subscribes"),
            (
                r#"{"backends":[{"name":"a","url":"https://x","secret_file":"ok","tls_client_cert_file":"ok"}]}"#,
                "go together",
            ),
            (
                r#"{"backends":[{"name":"a","url":"http://x","secret_file":"ok","tls_ca_file":"ok"}]}"#,
                "https://",
            ),
            (
                r#"{"backends":[{"name":"a","url":"https://x","secret_file":"ok","tls_ca_file":"none"}]}"#,
                "cannot read",
            ),
            (
                r#"{"backends":[{"name":"a","url":"http://x","secret":"inline"}]}"#,
                "not a backends file",
            ),
        ];
        for (text, expected) in cases {
            let file = write(&dir, "backends.json", text);
            let error = load(&file).expect_err(text).to_string();
            assert!(error.contains(expected), "{text}: {error}");
            assert!(!error.contains("a-secret-of"), "a secret leaked: {error}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
