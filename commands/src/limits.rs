//! The pipeline's limits, with units in the names.

/// Most times a command without an expected version is decided again after losing a race.
/// 32 covers 16 commands racing on one stream with room to spare: each round one wins.
pub const COMMAND_RETRIES_MAX: usize = 32;

/// Default events between two snapshots of one aggregate.
pub const SNAPSHOT_EVERY_EVENTS_DEFAULT: u64 = 100;

/// Most aggregate states kept in memory between commands.
pub const STATE_CACHE_STREAMS_MAX: usize = 10_000;

/// Events read per page when loading a stream's tail.
pub const LOAD_PAGE_EVENTS: usize = 1_000;
