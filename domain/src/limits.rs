//! Every limit of the model in one place, with units in the names.

/// Longest stream id, stream type, tenant id or event type, in bytes.
pub const NAME_LENGTH_MAX_BYTES: usize = 200;

/// Default largest payload of one event (its canonical JSON), in bytes: 1 MiB.
pub const PAYLOAD_DEFAULT_MAX_BYTES: usize = 1024 * 1024;

/// Most events one append may carry, across all its streams.
pub const APPEND_EVENTS_MAX: usize = 10_000;

/// Most streams one append may touch.
pub const APPEND_STREAMS_MAX: usize = 100;

/// Most events one page of a read may return.
pub const READ_PAGE_EVENTS_MAX: usize = 10_000;
