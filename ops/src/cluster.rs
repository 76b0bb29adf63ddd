//! Where `leasehold serve` finds PostgreSQL when none is configured: the local server at
//! 127.0.0.1:5432 if it answers; else a private cluster it initialises (once) and starts from
//! the machine's PostgreSQL binaries under its data directory, and stops when it stops; else a
//! message that says what to install.
//!
//! PostgreSQL refuses to run as root, so as root the cluster is initialised and run as the
//! `postgres` user (with `runuser`), in a directory that user can reach.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use leasehold_adapters::DatabaseUrl;

/// The local server tried first (override with `LEASEHOLD_LOCAL_POSTGRES`, host:port).
const LOCAL_SERVER: &str = "127.0.0.1:5432";

/// The database `serve` uses on the local server or the private cluster.
const DATABASE: &str = "leasehold";

/// Where the cluster lives as root when the data directory is out of `postgres`'s reach.
const ROOT_CLUSTER_DIR: &str = "/var/lib/leasehold/postgres";

/// The file that remembers the private cluster's port.
const PORT_FILE: &str = "leasehold-port";

/// How long the local server may take to accept a connection.
const PROBE_WAIT: Duration = Duration::from_secs(2);

/// A private cluster this process started; stopped on drop.
#[derive(Debug)]
pub struct PrivateCluster {
    dir: PathBuf,
    bin: PathBuf,
    as_postgres: bool,
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let pg_ctl = self.bin.join("pg_ctl");
        let dir = self.dir.display().to_string();
        let args = ["-D", dir.as_str(), "-m", "fast", "-w", "stop"];
        match run(self.as_postgres, &pg_ctl, &args) {
            Ok(()) => println!("stopped the private PostgreSQL cluster in {dir}"),
            Err(error) => eprintln!("warning: stopping the private cluster in {dir}: {error:#}"),
        }
    }
}

/// The URL `serve` uses when none is configured, and the private cluster if one was started.
pub async fn local_or_private(
    data_dir: &Path,
) -> anyhow::Result<(DatabaseUrl, Option<PrivateCluster>)> {
    let local = std::env::var("LEASEHOLD_LOCAL_POSTGRES").unwrap_or_else(|_| LOCAL_SERVER.into());
    let address: SocketAddr =
        local.parse().context("LEASEHOLD_LOCAL_POSTGRES must be host:port")?;
    if TcpStream::connect_timeout(&address, PROBE_WAIT).is_ok() {
        let url = DatabaseUrl::parse(&format!("postgres://postgres@{local}/{DATABASE}"))?;
        return Ok((url, None));
    }
    println!("no PostgreSQL server answers on {local}; starting a private cluster");
    let cluster = start_private(data_dir)?;
    let port = std::fs::read_to_string(cluster.dir.join(PORT_FILE))?.trim().to_string();
    let url = DatabaseUrl::parse(&format!("postgres://postgres@127.0.0.1:{port}/{DATABASE}"))?;
    Ok((url, Some(cluster)))
}

fn start_private(data_dir: &Path) -> anyhow::Result<PrivateCluster> {
    let bin = binaries()?;
    let as_postgres = is_root();
    let dir = cluster_dir(data_dir, as_postgres);
    if !dir.join("PG_VERSION").is_file() {
        initialise(&bin, &dir, as_postgres)?;
    }
    let pg_ctl = bin.join("pg_ctl");
    let dir_text = dir.display().to_string();
    let log = dir.join("server.log").display().to_string();
    // A cluster left running by a crashed serve is stopped first; "not running" is fine.
    let _ = run(as_postgres, &pg_ctl, &["-D", &dir_text, "-m", "fast", "-w", "stop"]);
    // In a session of its own, so that a Ctrl-C meant for serve does not stop the server
    // before serve has stopped with it.
    let pg_ctl_text = pg_ctl.display().to_string();
    let start = [pg_ctl_text.as_str(), "-D", &dir_text, "-l", &log, "-w", "-t", "60", "start"];
    run(as_postgres, Path::new("setsid"), &start)
        .with_context(|| format!("starting the private cluster (its log: {log})"))?;
    println!("private PostgreSQL cluster running from {dir_text}");
    Ok(PrivateCluster { dir, bin, as_postgres })
}

/// `initdb` with trust authentication for local connections, listening on 127.0.0.1 only, on
/// a port free now, with the socket in the cluster's own directory.
fn initialise(bin: &Path, dir: &Path, as_postgres: bool) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    if as_postgres {
        run(false, Path::new("chown"), &["postgres:postgres", &dir.display().to_string()])?;
    }
    let dir_text = dir.display().to_string();
    let args = [
        "-D",
        dir_text.as_str(),
        "-U",
        "postgres",
        "--auth=trust",
        "-E",
        "UTF8",
        "--no-instructions",
    ];
    run(as_postgres, &bin.join("initdb"), &args).context("initdb")?;
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let settings = format!(
        "\n# Written by leasehold serve.\nlisten_addresses = '127.0.0.1'\nport = {port}\n\
         unix_socket_directories = '{dir_text}'\n"
    );
    let conf = dir.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).context("reading postgresql.conf")?;
    text.push_str(&settings);
    std::fs::write(&conf, text).context("writing postgresql.conf")?;
    std::fs::write(dir.join(PORT_FILE), port.to_string())?;
    println!("initialised a private PostgreSQL cluster in {dir_text} (port {port})");
    Ok(())
}

/// The newest PostgreSQL server binaries on the machine.
fn binaries() -> anyhow::Result<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries.filter_map(Result::ok).map(|entry| entry.path().join("bin")).collect()
        })
        .unwrap_or_default();
    // Newest major version first.
    candidates.sort_by_key(|path| {
        let version = path.parent().and_then(|p| p.file_name()).and_then(|v| v.to_str());
        std::cmp::Reverse(version.and_then(|v| v.parse::<u32>().ok()).unwrap_or_default())
    });
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output()
        && output.status.success()
    {
        candidates.push(PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()));
    }
    candidates.push(PathBuf::from("/usr/local/pgsql/bin"));
    candidates
        .into_iter()
        .find(|bin| bin.join("initdb").is_file() && bin.join("pg_ctl").is_file())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no PostgreSQL server answers on {LOCAL_SERVER} and no PostgreSQL server binaries \
                 (initdb, pg_ctl) were found. Install PostgreSQL 13 or later (Debian/Ubuntu: \
                 `apt install postgresql`; macOS: `brew install postgresql`), or point \
                 --database-url / LEASEHOLD_DATABASE_URL at a server"
            )
        })
}

/// The cluster's directory: in the data directory, unless running as root and `postgres`
/// cannot reach it (a home directory is usually closed to other users).
fn cluster_dir(data_dir: &Path, as_postgres: bool) -> PathBuf {
    let inside = data_dir.join("postgres");
    if !as_postgres || reachable_by_others(data_dir) {
        inside
    } else {
        PathBuf::from(ROOT_CLUSTER_DIR)
    }
}

/// Whether every existing ancestor of `path` lets other users through.
fn reachable_by_others(path: &Path) -> bool {
    path.ancestors()
        .filter_map(|dir| std::fs::metadata(dir).ok())
        .all(|meta| meta.permissions().mode() & 0o001 != 0)
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    // The owner of /proc/self is this process's effective user.
    std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
}

/// Runs a program (as `postgres` when asked), failing with its output.
fn run(as_postgres: bool, program: &Path, args: &[&str]) -> anyhow::Result<()> {
    let mut command = if as_postgres {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    };
    let output =
        command.args(args).output().with_context(|| format!("running {}", program.display()))?;
    if !output.status.success() {
        bail!(
            "{} failed: {}{}",
            program.display(),
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}
