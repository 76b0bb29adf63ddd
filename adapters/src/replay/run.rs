//! Reading an export and running every projection over it, event by event.

use std::collections::HashMap;
use std::io::BufRead;

use leasehold_domain::{Cursor, RecordedEvent};
use leasehold_projections::host::HostProjection;
use leasehold_projections::lease::LeaseProjection;
use leasehold_projections::node::NodeProjection;
use leasehold_projections::rental::RentalProjection;
use leasehold_projections::run::RunProjection;
use leasehold_projections::runner::RunnerProjection;
use leasehold_projections::runner_fleet::RunnerFleetProjection;
use leasehold_projections::runner_job::JobProjection;
use leasehold_projections::snapshot::SnapshotProjection;
use leasehold_projections::vm::VmProjection;
use leasehold_projections::workload_quota::WorkloadQuotaProjection;
use leasehold_projections::{Projection, ProjectionError};

use super::{MemError, MemProjected, MemTables, TableDigest, digests};
use crate::archive::HeadsAhead;
use crate::archive::check::FileCheck;
use crate::archive::{ArchiveError, Line};
use crate::projections::PgProjected;
use crate::projections::tables::Owned;

/// Why a replay failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The file could not be read, or is not a complete export of every field.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// The file does not verify: its events are not the log's.
    #[error("the file does not verify: {first}; nothing was replayed")]
    DoesNotVerify {
        /// The first fault, for a person.
        first: String,
    },
    /// A projection cannot apply an event (as it would stop in `serve`).
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    /// A projection's memory writer and its statements disagree.
    #[error(transparent)]
    Memory(#[from] MemError),
}

/// What a replay found.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    /// Events replayed.
    pub events: u64,
    /// The last event's cursor: where the live projections must stand to compare.
    pub last: Option<Cursor>,
    /// Every read model's rows.
    pub tables: MemTables,
    /// Their digests, by table.
    pub digests: Vec<TableDigest>,
}

/// One projection in memory: its views, fed one event at a time.
struct MemRunner<P: Projection> {
    projection: P,
    views: HashMap<P::Key, P::View>,
}

/// A projection in memory, whatever its kind.
trait Feed {
    fn feed(&mut self, event: &RecordedEvent, tables: &mut MemTables) -> Result<(), ReplayError>;
}

impl<P: MemProjected> Feed for MemRunner<P> {
    fn feed(&mut self, event: &RecordedEvent, tables: &mut MemTables) -> Result<(), ReplayError> {
        let Some(key) = self.projection.key(event) else { return Ok(()) };
        let mut changes = Vec::new();
        let view = self.projection.project(self.views.get(&key), event, &mut changes)?;
        changes.push(self.projection.put(&key, &view));
        self.views.insert(key, view);
        P::write_memory(changes, tables)?;
        Ok(())
    }
}

/// A runner of `projection`, its read-model tables declared in `tables` (so that a digest
/// names a table it never wrote a row to).
fn runner<P: MemProjected + PgProjected>(projection: P, tables: &mut MemTables) -> Box<dyn Feed> {
    for owned in P::TABLES {
        let name = match *owned {
            Owned::Table(table) => table,
            Owned::Partition { parent, .. } => parent,
        };
        if !name.ends_with("_view_states") {
            tables.declare(name);
        }
    }
    Box::new(MemRunner { projection, views: HashMap::new() })
}

/// Every projection `serve` runs (a test in `ops` holds the two lists to each other).
fn every_projection(tables: &mut MemTables) -> Vec<Box<dyn Feed>> {
    vec![
        runner(LeaseProjection, tables),
        runner(VmProjection, tables),
        runner(HostProjection, tables),
        runner(SnapshotProjection, tables),
        runner(RentalProjection, tables),
        runner(NodeProjection, tables),
        runner(RunProjection, tables),
        runner(RunnerProjection, tables),
        runner(JobProjection, tables),
        runner(RunnerFleetProjection, tables),
        runner(WorkloadQuotaProjection, tables),
    ]
}

/// The names of the projections a replay runs.
pub const REPLAYED: &[&str] = &[
    LeaseProjection::NAME,
    VmProjection::NAME,
    HostProjection::NAME,
    SnapshotProjection::NAME,
    RentalProjection::NAME,
    NodeProjection::NAME,
    RunProjection::NAME,
    RunnerProjection::NAME,
    JobProjection::NAME,
    RunnerFleetProjection::NAME,
    WorkloadQuotaProjection::NAME,
];

/// Replays the complete export `reader` holds through every projection, in memory, checking
/// it as it reads (its heads read ahead by `heads`, if given: a second reader of the same
/// file); `progress` is called now and then with the bytes read.
///
/// # Errors
/// [`ReplayError`]: a file that is not a complete export of every field, or does not verify;
/// an event a projection cannot apply.
pub fn replay_file(
    mut reader: impl BufRead,
    heads: Option<HeadsAhead<'_>>,
    mut progress: impl FnMut(u64),
) -> Result<ReplayReport, ReplayError> {
    let mut tables = MemTables::default();
    let mut projections = every_projection(&mut tables);
    let mut check = FileCheck::new(heads);
    let (mut text, mut number, mut bytes) = (String::new(), 0_u64, 0_u64);
    let (mut events, mut last) = (0_u64, None);
    loop {
        text.clear();
        let read = reader.read_line(&mut text).map_err(ArchiveError::from)?;
        if read == 0 {
            break;
        }
        (number, bytes) = (number + 1, bytes + read as u64);
        let line = Line::parse(number, text.trim_end_matches(['\n', '\r']))?;
        check.line(number, &line)?;
        match &line {
            Line::Header(header) if !header.complete => {
                return Err(ArchiveError::Unsuitable(
                    "a replay needs a complete export (no filter): a part of the log makes \
                     a part of each read model"
                        .into(),
                )
                .into());
            }
            Line::Event(line) => {
                let event = line.recorded(number)?;
                for projection in &mut projections {
                    projection.feed(&event, &mut tables)?;
                }
                (events, last) = (events + 1, Some(event.cursor));
            }
            _ => {}
        }
        if number % 10_000 == 0 {
            progress(bytes);
        }
    }
    progress(bytes);
    let checked = check.finish()?;
    if let Some(first) = checked.report.first_break() {
        return Err(ReplayError::DoesNotVerify { first: first.to_string() });
    }
    let digests = digests(&tables);
    Ok(ReplayReport { events, last, tables, digests })
}
