//! Where the secrets come from: `--jwt-secret-file`, else `LEASEHOLD_JWT_SECRET`, else the
//! secret `serve` keeps in its data directory (created on first use, readable by its owner
//! only); likewise the callback secret (`--callback-secret-file`, `LEASEHOLD_CALLBACK_SECRET`,
//! the data directory's `callback-secret`). `serve` and `token` resolve them the same way, so a
//! token printed by one is accepted by the other. Secrets are never logged or printed.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Args;

/// The JWT secret's file name inside the data directory.
const JWT_SECRET_FILE: &str = "jwt-secret";

/// The callback secret's file name inside the data directory.
const CALLBACK_SECRET_FILE: &str = "callback-secret";

/// The VM credentials' key's file name inside the data directory.
const VM_CREDENTIALS_KEY_FILE: &str = "vm-credentials-key";

/// The node enrollment key's file name inside the data directory.
const ENROLLMENT_KEY_FILE: &str = "enrollment-key";

/// Where the JWT secret is.
#[derive(Debug, Clone, Args)]
pub struct SecretArgs {
    /// A file holding the HS256 secret (at least 32 bytes).
    #[arg(long, env = "LEASEHOLD_JWT_SECRET_FILE")]
    pub jwt_secret_file: Option<PathBuf>,
    /// The HS256 secret itself (at least 32 bytes); prefer a file.
    #[arg(long = "jwt-secret", env = "LEASEHOLD_JWT_SECRET", hide_env_values = true, hide = true)]
    pub jwt_secret: Option<String>,
    /// A file holding the secret backends sign callbacks with (at least 32 bytes).
    #[arg(long, env = "LEASEHOLD_CALLBACK_SECRET_FILE")]
    pub callback_secret_file: Option<PathBuf>,
    /// The callback secret itself (at least 32 bytes); prefer a file.
    #[arg(
        long = "callback-secret",
        env = "LEASEHOLD_CALLBACK_SECRET",
        hide_env_values = true,
        hide = true
    )]
    pub callback_secret: Option<String>,
    /// A file holding the key VMs' credentials are sealed under (at least 32 bytes; AES-256-GCM
    /// with a key derived from it). Lose it and the sealed credentials are lost with it.
    #[arg(long, env = "LEASEHOLD_VM_CREDENTIALS_KEY_FILE")]
    pub vm_credentials_key_file: Option<PathBuf>,
    /// A file holding the key node enrollment tokens, rentals' ownership tokens and node
    /// credentials are derived from and signed with (at least 32 bytes). Change it and every
    /// outstanding enrollment token and node credential stops working.
    #[arg(long, env = "LEASEHOLD_ENROLLMENT_KEY_FILE")]
    pub enrollment_key_file: Option<PathBuf>,
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

    /// The JWT secret's bytes, creating the data directory's if nothing else is set.
    pub fn secret(&self) -> anyhow::Result<Vec<u8>> {
        self.resolve(&self.jwt_secret_file, &self.jwt_secret, "--jwt-secret-file", JWT_SECRET_FILE)
    }

    /// The callback secret's bytes, likewise.
    pub fn callback(&self) -> anyhow::Result<Vec<u8>> {
        let (file, value) = (&self.callback_secret_file, &self.callback_secret);
        self.resolve(file, value, "--callback-secret-file", CALLBACK_SECRET_FILE)
    }

    /// The VM credentials' key's bytes, likewise (the data directory's `vm-credentials-key`
    /// when no file is named).
    pub fn vm_credentials_key(&self) -> anyhow::Result<Vec<u8>> {
        let file = &self.vm_credentials_key_file;
        self.resolve(file, &None, "--vm-credentials-key-file", VM_CREDENTIALS_KEY_FILE)
    }

    /// The enrollment key's bytes, likewise (the data directory's `enrollment-key` when no
    /// file is named).
    pub fn enrollment_key(&self) -> anyhow::Result<Vec<u8>> {
        let file = &self.enrollment_key_file;
        self.resolve(file, &None, "--enrollment-key-file", ENROLLMENT_KEY_FILE)
    }

    /// Whether the JWT secret is the data directory's (no set-up).
    pub fn generated(&self) -> bool {
        self.jwt_secret_file.is_none() && self.jwt_secret.is_none()
    }

    fn resolve(
        &self,
        file: &Option<PathBuf>,
        value: &Option<String>,
        flag: &str,
        kept: &str,
    ) -> anyhow::Result<Vec<u8>> {
        if let Some(file) = file {
            return std::fs::read(file)
                .with_context(|| format!("reading {flag} {}", file.display()));
        }
        if let Some(secret) = value {
            return Ok(secret.as_bytes().to_vec());
        }
        kept_secret(&self.data_dir()?, kept)
    }
}

/// The data directory's secret `name`, generated on first use.
fn kept_secret(dir: &Path, name: &str) -> anyhow::Result<Vec<u8>> {
    let path = dir.join(name);
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
