//! Where the JWT secret comes from: `--jwt-secret-file`, else `LEASEHOLD_JWT_SECRET`, else the
//! secret `serve` keeps in its data directory (created on first use, readable by its owner
//! only). `serve` and `token` resolve it the same way, so a token printed by one is accepted by
//! the other. The secret is never logged or printed.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Args;

/// The secret file's name inside the data directory.
const SECRET_FILE: &str = "jwt-secret";

/// Where the JWT secret is.
#[derive(Debug, Clone, Args)]
pub struct SecretArgs {
    /// A file holding the HS256 secret (at least 32 bytes).
    #[arg(long, env = "LEASEHOLD_JWT_SECRET_FILE")]
    pub jwt_secret_file: Option<PathBuf>,
    /// The HS256 secret itself (at least 32 bytes); prefer a file.
    #[arg(long = "jwt-secret", env = "LEASEHOLD_JWT_SECRET", hide_env_values = true, hide = true)]
    pub jwt_secret: Option<String>,
    /// Where `serve` keeps what it needs between runs (the generated secret, a private
    /// PostgreSQL cluster). Default: $XDG_DATA_HOME/leasehold or ~/.local/share/leasehold.
    #[arg(long, env = "LEASEHOLD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

impl SecretArgs {
    /// The data directory.
    pub fn data_dir(&self) -> anyhow::Result<PathBuf> {
        if let Some(dir) = &self.data_dir {
            return Ok(dir.clone());
        }
        if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|dir| !dir.is_empty()) {
            return Ok(PathBuf::from(dir).join("leasehold"));
        }
        let home = std::env::var_os("HOME").context("neither --data-dir nor HOME is set")?;
        Ok(PathBuf::from(home).join(".local/share/leasehold"))
    }

    /// The secret's bytes, creating the data directory's secret if nothing else is set.
    pub fn secret(&self) -> anyhow::Result<Vec<u8>> {
        if let Some(file) = &self.jwt_secret_file {
            return std::fs::read(file)
                .with_context(|| format!("reading --jwt-secret-file {}", file.display()));
        }
        if let Some(secret) = &self.jwt_secret {
            return Ok(secret.as_bytes().to_vec());
        }
        let dir = self.data_dir()?;
        kept_secret(&dir)
    }
}

/// The data directory's secret, generated on first use.
fn kept_secret(dir: &Path) -> anyhow::Result<Vec<u8>> {
    let path = dir.join(SECRET_FILE);
    match std::fs::read(&path) {
        Ok(secret) => return Ok(secret),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let secret = leasehold_gateway::auth::random_secret();
    // create_new: if another process made it first, use theirs.
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
        Ok(mut file) => {
            file.write_all(secret.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
            Ok(secret.into_bytes())
        }
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
        }
        Err(error) => Err(error).with_context(|| format!("creating {}", path.display())),
    }
}
