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

/// Most items one lease may hold.
pub const LEASE_ITEMS_MAX: usize = 32;

/// Longest SKU, in bytes.
pub const LEASE_SKU_MAX_BYTES: usize = 64;

/// Longest failure reason, in bytes.
pub const LEASE_REASON_MAX_BYTES: usize = 64;

/// Longest tenant-safe failure message, in characters.
pub const LEASE_TENANT_MESSAGE_MAX_CHARS: usize = 512;

/// Longest operator-only failure detail kept, in bytes; longer detail is cut.
pub const LEASE_OPERATOR_DETAIL_MAX_BYTES: usize = 8 * 1024;

/// Default most of one SKU one item may rent; the pipeline's configuration may lower it.
pub const LEASE_QUANTITY_DEFAULT_MAX: u32 = 1024;

/// Most placement labels a host declares or a VM selects on.
pub const FLEET_LABELS_MAX: usize = 64;

/// Longest host agent URL, in bytes.
pub const FLEET_URL_MAX_BYTES: usize = 2048;

/// How long after a recorded heartbeat the next one is recorded, in seconds: heartbeats in
/// between change nothing (a host's `last_seen` is that fresh, and the log does not grow by
/// one event per beat).
pub const HOST_HEARTBEAT_RECORD_SECONDS: i64 = 60;

/// Most vCPUs one VM may ask for.
pub const VM_CPUS_MAX: u32 = 256;

/// Least RAM one VM may ask for, in MiB.
pub const VM_RAM_MB_MIN: u64 = 128;

/// Most RAM one VM may ask for, in MiB (4 TiB).
pub const VM_RAM_MB_MAX: u64 = 4 * 1024 * 1024;

/// Most disk one VM may ask for, in GiB.
pub const VM_STORAGE_GB_MAX: u64 = 65_536;

/// Most guest files one VM may be given.
pub const VM_GUEST_FILES_MAX: usize = 64;

/// Most ports one VM may expose.
pub const VM_EXPOSED_PORTS_MAX: usize = 16;

/// The default largest startup-script timeout a VM may ask for, in seconds: the script runs
/// inside the boot request, so the bound stays under the agent's 60-second request timeout.
pub const VM_STARTUP_SCRIPT_TIMEOUT_DEFAULT_MAX_SECONDS: u32 = 50;

/// How long after a recorded activity (an exec, an attach) the next one is recorded, in
/// seconds.
pub const VM_ACTIVITY_RECORD_SECONDS: i64 = 60;

/// Longest provider-native name (a machine's id, an offer's), in bytes.
pub const RENTAL_NATIVE_REF_MAX_BYTES: usize = 256;

/// Longest max lifetime a rental may ask for, in seconds (30 days).
pub const RENTAL_MAX_LIFETIME_SECONDS_MAX: u64 = 30 * 24 * 3600;

/// How long an enrollment token stays redeemable after its invite, in seconds.
pub const NODE_ENROLLMENT_SECONDS: i64 = 30 * 60;

/// How long a node's lease lasts after its last recorded heartbeat, in seconds.
pub const NODE_LEASE_SECONDS: i64 = 90;

/// How long a node's session lasts after its enrollment or renewal, in seconds.
pub const NODE_SESSION_SECONDS: i64 = 30 * 60;

/// How long after a recorded heartbeat the next one is recorded, in seconds: beats in
/// between are checked (fenced) and change nothing, and the lease they extend is never
/// shorter than [`NODE_LEASE_SECONDS`] less this.
pub const NODE_HEARTBEAT_RECORD_SECONDS: i64 = 30;

/// Most settled operations a node's state remembers (the oldest are forgotten first; a
/// forgotten one sent again is answered by the idempotency ledger).
pub const NODE_OPERATIONS_KEPT: usize = 256;

/// Most image digests one node's facts may list.
pub const NODE_FACT_IMAGES_MAX: usize = 256;

/// Most attempts whose last reported phase a node's state remembers (to record a repeated
/// look once).
pub const NODE_WORKLOADS_KEPT: usize = 64;

/// Most arguments a runner's command may have.
pub const RUNNER_COMMAND_ARGS_MAX: usize = 64;

/// Longest argument of a runner's command, in bytes.
pub const RUNNER_COMMAND_ARG_MAX_BYTES: usize = 4096;

/// Most vCPUs one runner lease may be charged.
pub const RUNNER_VCPU_MAX: u32 = 256;

/// Most memory one runner lease may be charged, in MiB.
pub const RUNNER_MEMORY_MB_MAX: u64 = 4 * 1024 * 1024;

/// A runner lease's time to live when its request names none, in seconds (billet's): it
/// expires unless its holder reports within this long.
pub const RUNNER_LEASE_TTL_SECONDS: u32 = 90;

/// The longest time to live a runner lease may ask for, in seconds.
pub const RUNNER_LEASE_TTL_SECONDS_MAX: u32 = 3600;

/// How long after a recorded heartbeat the next one is recorded, in seconds: beats in
/// between are checked (fenced) and change nothing.
pub const RUNNER_HEARTBEAT_RECORD_SECONDS: i64 = 30;

/// How long a quarantined lease must have been expired before a node's inventory without
/// it proves its compute gone, in seconds (billet's grace: an instance still being created
/// may not be listed yet).
pub const RUNNER_QUARANTINE_GRACE_SECONDS: i64 = 300;

/// Most provider kinds a runner lease may name.
pub const RUNNER_PROVIDERS_MAX: usize = 4;
