//! The adapters' limits, in one place, with units in their names.

/// How long a connection attempt may take.
pub const CONNECT_TIMEOUT_SECONDS: u64 = 5;

/// How long a caller waits for a pooled connection before giving up.
pub const POOL_WAIT_TIMEOUT_SECONDS: u64 = 30;

/// A session idle inside a transaction longer than this is ended by the server: an open
/// writing transaction holds back every whole-log reader.
pub const IDLE_IN_TRANSACTION_TIMEOUT_MILLISECONDS: u64 = 10_000;

/// Default pool size of the event store.
pub const POOL_DEFAULT_SIZE: usize = 16;

/// How often a tailing reader polls when no wake-up arrives (another process may append).
pub const TAIL_POLL_INTERVAL_MILLISECONDS: u64 = 250;

/// How many times an autocommit append is retried after colliding with a concurrent
/// transaction (serialization failure, deadlock, a stream created concurrently).
pub const APPEND_RETRIES_MAX: u32 = 8;

/// Most chain breaks a verification run reports before it stops listing them.
pub const VERIFY_BREAKS_MAX: usize = 1_000;

/// Rows per page when verifying the hash chains.
pub const VERIFY_PAGE_ROWS: i64 = 5_000;

/// Most stream heads the event store remembers (see `store/heads.rs`).
pub const HEAD_CACHE_STREAMS_MAX: usize = 100_000;

/// Default number of group-commit workers of the event store.
pub const COMMITTERS_DEFAULT: usize = 2;

/// Most appends one group commit carries.
pub const GROUP_APPENDS_MAX: usize = 64;

/// Members a group could not settle that are retried on their own at once (each on a pooled
/// connection of its own).
pub const GROUP_ALONE_CONCURRENCY_MAX: usize = 4;

/// Appends with more events than this commit on their own, never in a group.
pub const GROUP_EVENTS_PER_APPEND_MAX: usize = 16;

/// Most appends waiting for a group commit; callers beyond it wait to queue.
pub const GROUP_QUEUE_MAX: usize = 1_024;

/// Times a group committer yields to the scheduler after the first append of a group arrives,
/// so that appends arriving right behind it join the same group.
pub const GROUP_LINGER_YIELDS: usize = 8;

/// Shortest secret a request or callback to or from a backend is signed with (fred's
/// `MinCallbackSecretLength`).
pub const SIGNING_SECRET_BYTES_MIN: usize = 32;

/// How long one exchange with a backend may take by default, body included (fred's).
pub const BACKEND_TIMEOUT_DEFAULT_SECONDS: u64 = 30;

/// Largest answer to `GET /info`, `/provisions/{lease}`, `/stats` and to a `POST` (fred's
/// `DefaultMaxInfoBytes`).
pub const BACKEND_INFO_BYTES_MAX: usize = 1 << 20;

/// Largest page of `GET /provisions`, and largest lookup answer.
pub const BACKEND_PROVISIONS_BYTES_MAX: usize = 8 << 20;

/// Largest page of `GET /retentions`.
pub const BACKEND_RETENTIONS_BYTES_MAX: usize = 1 << 20;

/// Largest answer to `GET /logs` (fred's `DefaultMaxLogsBytes`).
pub const BACKEND_LOGS_BYTES_MAX: usize = 16 << 20;

/// Largest answer to `GET /releases` (the seed's projected-response cap).
pub const BACKEND_RELEASES_BYTES_MAX: usize = 48 << 20;

/// How much of an error body is read (fred's `readErrorBodyBytes`).
pub const BACKEND_ERROR_BODY_BYTES_MAX: usize = 4 << 10;

/// Entries asked for per keyset page.
pub const BACKEND_PAGE_LIMIT: usize = 1_000;

/// Most pages one walk reads before giving up.
pub const BACKEND_PAGES_MAX: usize = 100_000;

/// Most leases one lookup names.
pub const BACKEND_LOOKUP_UUIDS_MAX: usize = 100;

/// Most pieces of work a dispatcher claims per call.
pub const DISPATCH_CLAIM_ROWS_MAX: usize = 256;

/// Most sends a dispatcher has in flight at once.
pub const DISPATCH_CONCURRENCY_MAX: usize = 32;

/// A dispatcher's wait after a first failed attempt, and after a send its target's breaker
/// refused; each further failure doubles it.
pub const DISPATCH_RETRY_FIRST_MILLISECONDS: u64 = 1_000;

/// A dispatcher's longest wait between attempts.
pub const DISPATCH_RETRY_MAX_MILLISECONDS: u64 = 60_000;

/// How long a host agent's snapshot may take: fuse's agent gives firecracker's snapshot API
/// 600 s (`FC_AGENT_SNAPSHOT_API_TIMEOUT`), plus the copy and hash of the rootfs.
pub const HOST_AGENT_SNAPSHOT_SECONDS: u64 = 660;

/// How long a host agent's artifact pull from a peer may take: fuse's agent allows a whole
/// transfer 1800 s.
pub const HOST_AGENT_ARTIFACT_PULL_SECONDS: u64 = 1_860;
