//! Verifying an export file with no database: the same checks `events verify` makes of the
//! log, on the lines as they come (one pass; memory holds one seal's range and each stream
//! until its head is read: with [`HeadsAhead`], only the streams open at that point of the
//! log). Every event's hash is recomputed and its chain followed; the commit order holds
//! from line to line; each seal chains from the one before and lists exactly the events of
//! its range; each stream's last event is the head its `stream` line records; the counts the
//! header and the `end` line give are the lines the file holds.

use std::collections::HashMap;
use std::io::BufRead;

use leasehold_domain::Cursor;

mod heads;

use super::ArchiveError;
use super::heads_ahead::HeadsAhead;
use super::lines::{EndLine, EventLine, FORMAT, FORMAT_VERSION, HeaderLine, Line, SealLine, View};
use crate::canonical::to_canonical_json;
use crate::chain::{CanonicalPieces, GENESIS_HASH};
use crate::verify::{
    BreakKind, ChainBreak, Held, Link, Linked, StoredSeal, VerifyReport, check_link, compare,
    digest_holds, push_break,
};

/// Where one stream of the file stands.
#[derive(Debug, Clone, Copy)]
struct StreamWalk {
    link: Link,
    /// The position and line of its last event.
    position: u64,
    line: u64,
    /// Its `stream` line was read.
    headed: bool,
    /// Its type and tenant (as its events, whose hashes cover them, say), hashed: a stream
    /// line must name the same.
    owner: u64,
    /// The transaction of its last event.
    tx_id: u64,
}

/// A stream's type and tenant, hashed (compared, never shown).
fn owner_of(stream_type: &str, tenant_id: &str) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (stream_type, tenant_id).hash(&mut hasher);
    hasher.finish()
}

/// The most events one seal covers (`events seal --every` at most): a file whose promised
/// seal never comes holds no more than this in memory.
const SEAL_RANGE_MAX: usize = 100_000;

/// What part of the file the reader is in: the format's order of lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    Start,
    Events,
    Streams,
    Ended,
}

/// An export file checked line by line.
#[derive(Debug)]
pub struct FileCheck<'h> {
    header: Option<HeaderLine>,
    part: Part,
    streams: HashMap<String, StreamWalk>,
    /// The most streams held at once.
    streams_held_max: u64,
    /// The file's heads, read ahead: a stream is forgotten once its head is checked.
    heads: Option<HeadsAhead<'h>>,
    /// The stream lines checked ahead, once the stream lines came: how many, and a digest of
    /// them, which this reader's own first lines must match.
    heads_checked: (u64, [u8; 32]),
    /// A digest of this reader's first stream lines, up to those checked ahead.
    heads_read: sha2::Sha256,
    /// Fingerprints of the streams forgotten once their heads were checked: none may come
    /// again.
    closed: std::collections::HashSet<u128>,
    /// The first event of the range of the next seal.
    range_first: Option<Cursor>,
    last: Option<Cursor>,
    /// The events since the last seal, while seals are still to come.
    range: Vec<Held>,
    seal: Option<(u64, [u8; 32])>,
    read: EndLine,
    report: VerifyReport,
}

/// What checking a file found.
#[derive(Debug, Clone, PartialEq)]
pub struct FileReport {
    /// The file's header.
    pub header: HeaderLine,
    /// What was checked and the faults found (each with its line).
    pub report: VerifyReport,
    /// The most streams held at once (every stream without heads read ahead; with them, those
    /// open at one point of the log).
    pub streams_held_max: u64,
}

impl Default for FileCheck<'_> {
    fn default() -> Self {
        Self {
            header: None,
            part: Part::Start,
            streams: HashMap::new(),
            streams_held_max: 0,
            heads: None,
            heads_checked: (0, [0; 32]),
            heads_read: sha2::Sha256::default(),
            closed: std::collections::HashSet::new(),
            range_first: None,
            last: None,
            range: Vec::new(),
            seal: None,
            read: EndLine { events: 0, seals: 0, streams: 0 },
            report: VerifyReport::default(),
        }
    }
}

/// Reads and checks a whole file, with its heads read ahead by `heads` if given (a second
/// reader of the same file); `progress` is called now and then with the bytes read.
///
/// # Errors
/// [`ArchiveError`] when the file cannot be read, is not an export (no header, another
/// format or version) or holds a tenant's view (no hashes to check). Faults in an export
/// are the report's, not errors.
pub fn check_file(
    mut reader: impl BufRead,
    heads: Option<HeadsAhead<'_>>,
    mut progress: impl FnMut(u64),
) -> Result<FileReport, ArchiveError> {
    let mut check = FileCheck::new(heads);
    let (mut text, mut number, mut bytes) = (String::new(), 0, 0);
    loop {
        text.clear();
        let read = reader.read_line(&mut text)?;
        if read == 0 {
            break;
        }
        number += 1;
        bytes += read as u64;
        check.text_line(number, text.trim_end_matches(['\n', '\r']))?;
        if number % 10_000 == 0 {
            progress(bytes);
        }
    }
    progress(bytes);
    check.finish()
}

impl<'h> FileCheck<'h> {
    /// A check with the file's heads read ahead by `heads`, if given.
    #[must_use]
    pub fn new(heads: Option<HeadsAhead<'h>>) -> Self {
        Self { heads, ..Self::default() }
    }

    /// Checks line `number` (from 1) as read from the file.
    ///
    /// # Errors
    /// As [`check_file`].
    pub fn text_line(&mut self, number: u64, text: &str) -> Result<(), ArchiveError> {
        match Line::parse(number, text) {
            Ok(line) => self.line(number, &line),
            Err(ArchiveError::Malformed { reason, .. }) if self.header.is_some() => {
                self.fault(number, BreakKind::Malformed { reason });
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// Checks one parsed line.
    ///
    /// # Errors
    /// As [`check_file`].
    pub fn line(&mut self, number: u64, line: &Line) -> Result<(), ArchiveError> {
        match line {
            Line::Header(header) => self.header(number, header),
            Line::Event(event) => {
                self.enter(number, Part::Events);
                self.event(number, event);
                Ok(())
            }
            Line::Seal(seal) => {
                self.enter(number, Part::Events);
                self.seal(number, seal);
                Ok(())
            }
            Line::Stream(stream) => {
                self.enter(number, Part::Streams);
                self.stream(number, stream);
                Ok(())
            }
            Line::End(end) => {
                self.enter(number, Part::Ended);
                self.end(number, *end);
                Ok(())
            }
        }
    }

    fn header(&mut self, number: u64, header: &HeaderLine) -> Result<(), ArchiveError> {
        if number != 1 || self.header.is_some() {
            self.fault(number, BreakKind::Malformed { reason: "a second header".into() });
            return Ok(());
        }
        if header.format != FORMAT || header.format_version != FORMAT_VERSION {
            return Err(ArchiveError::Unsuitable(format!(
                "the file is {} version {}, not {FORMAT} version {FORMAT_VERSION}",
                header.format, header.format_version
            )));
        }
        if header.view == View::Tenant {
            return Err(ArchiveError::Unsuitable(
                "the file is a tenant's view of the log: it holds no hashes to verify".into(),
            ));
        }
        if header.complete != header.filters.is_complete() {
            // A cut file posing as the whole log would have its first events and seals taken
            // on trust.
            return Err(ArchiveError::Unsuitable(
                "the header says the file is complete, and its filters say it is not".into(),
            ));
        }
        self.header = Some(header.clone());
        Ok(())
    }

    /// The header, which must have come first.
    fn started(&self) -> Option<&HeaderLine> {
        self.header.as_ref()
    }

    /// Moves to `part` of the file; a line of an earlier part after a later one is out of
    /// place.
    fn enter(&mut self, number: u64, part: Part) {
        if self.part > part || self.part == Part::Ended {
            let reason = format!("a {part:?} line after the {:?} part", self.part).to_lowercase();
            self.fault(number, BreakKind::Malformed { reason });
        }
        self.part = self.part.max(part);
    }

    fn fault(&mut self, line: u64, kind: BreakKind) {
        let found = ChainBreak { stream_id: String::new(), version: 0, position: 0, line, kind };
        push_break(&mut self.report, found);
    }

    fn event_fault(&mut self, number: u64, event: &EventLine, kind: BreakKind) {
        let found = ChainBreak {
            stream_id: event.stream_id.clone(),
            version: event.version,
            position: event.position,
            line: number,
            kind,
        };
        push_break(&mut self.report, found);
    }

    fn event(&mut self, number: u64, event: &EventLine) {
        let Some(from_the_start) = self.started().map(|h| h.filters.from_the_start()) else {
            return self.fault(number, BreakKind::Malformed { reason: "no header".into() });
        };
        self.read.events += 1;
        if event.cursor.position != event.position {
            let reason = "its position is not its cursor's".to_owned();
            self.event_fault(number, event, BreakKind::Malformed { reason });
        }
        if self.last.is_some_and(|last| event.cursor <= last) {
            self.event_fault(number, event, BreakKind::Reordered);
        }
        self.last = Some(self.last.map_or(event.cursor, |last| last.max(event.cursor)));
        if !self.streams.contains_key(&event.stream_id) && self.was_closed(&event.stream_id) {
            // Its head was read ahead, and compared, at what was its last event.
            let reason = "an event of a stream after the last its head records".to_owned();
            self.event_fault(number, event, BreakKind::Malformed { reason });
        } else {
            self.walk(number, event, from_the_start);
        }
        self.hold_for_seal(number, event);
    }

    /// Follows `event`'s stream's chain to it.
    fn walk(&mut self, number: u64, event: &EventLine, from_the_start: bool) {
        let new_stream = !self.streams.contains_key(&event.stream_id);
        let start = if from_the_start || !new_stream {
            Link { version: 0, hash: GENESIS_HASH }
        } else {
            // Cut by the export's start: its first event here is taken on trust, then checked.
            Link { version: event.version.saturating_sub(1), hash: event.prev_hash.0 }
        };
        let owner = owner_of(&event.stream_type, &event.tenant_id);
        let walk = self.streams.entry(event.stream_id.clone()).or_insert(StreamWalk {
            link: start,
            position: 0,
            line: 0,
            headed: false,
            owner,
            tx_id: 0,
        });
        if new_stream {
            self.report.streams_checked += 1;
        }
        let (metadata_json, payload_json) =
            (to_canonical_json(&event.metadata), to_canonical_json(&event.payload));
        let pieces = CanonicalPieces {
            event_id: event.event_id,
            event_type: &event.event_type,
            metadata_json: &metadata_json,
            payload_json: &payload_json,
            recorded_at: event.recorded_at,
            schema_version: event.schema_version,
            stream_id: &event.stream_id,
            stream_type: &event.stream_type,
            tenant_id: &event.tenant_id,
            version: event.version,
        };
        let linked = Linked {
            pieces,
            position: event.position,
            line: number,
            prev_hash: event.prev_hash.0,
            hash: event.hash.0,
        };
        check_link(&mut walk.link, &linked, &mut self.report);
        let moved_owner = walk.owner != owner;
        (walk.position, walk.line, walk.tx_id) = (event.position, number, event.cursor.tx_id);
        if moved_owner {
            let reason = "its stream's earlier events name another type or tenant".to_owned();
            self.event_fault(number, event, BreakKind::Malformed { reason });
        }
        self.streams_held_max = self.streams_held_max.max(self.streams.len() as u64);
        self.check_heads_ahead();
    }

    /// Holds `event` for the seal to come that must list it.
    fn hold_for_seal(&mut self, number: u64, event: &EventLine) {
        if self.seals_to_come() && self.range.len() >= SEAL_RANGE_MAX {
            let reason = format!("more than {SEAL_RANGE_MAX} events before the next seal");
            self.event_fault(number, event, BreakKind::Malformed { reason });
            self.range.clear();
        }
        if self.seals_to_come() {
            if self.range.is_empty() {
                self.range_first = Some(event.cursor);
            }
            self.range.push(Held {
                position: i64::try_from(event.position).unwrap_or(i64::MAX),
                hash: event.hash.0.to_vec(),
                stream_id: event.stream_id.clone(),
                version: event.version,
                line: number,
            });
        } else {
            self.report.unsealed_events += 1;
        }
    }

    fn seals_to_come(&self) -> bool {
        self.header.as_ref().is_some_and(|header| header.seals > self.read.seals)
    }

    fn seal(&mut self, number: u64, seal: &SealLine) {
        let Some(from_the_start) = self.started().map(|h| h.filters.from_the_start()) else {
            return self.fault(number, BreakKind::Malformed { reason: "no header".into() });
        };
        self.read.seals += 1;
        let chained = match self.seal {
            Some((seal_no, digest)) => seal.seal_no == seal_no + 1 && seal.prev_digest.0 == digest,
            None if from_the_start => seal.seal_no == 1 && seal.prev_digest.0 == GENESIS_HASH,
            // The first seal of a file cut by a cursor: what came before is not here.
            None => true,
        };
        let stored = StoredSeal {
            seal_no: seal.seal_no,
            last: seal.last,
            hashes: seal.hashes.clone(),
            positions: seal.positions.clone(),
            prev_digest: seal.prev_digest.0.to_vec(),
            digest: seal.digest.0.to_vec(),
        };
        // The range it names is the range it lists: its last event is the one just read, and
        // (unless the file's start cut it) its first the first since the seal before.
        let first_named =
            (self.seal.is_none() && !from_the_start) || self.range_first == Some(seal.first);
        let bounded = self.last == Some(seal.last) && first_named;
        if !chained || !bounded || !digest_holds(&stored) {
            let position = u64::try_from(seal.positions.first().copied().unwrap_or_default());
            let found = ChainBreak {
                stream_id: String::new(),
                version: 0,
                position: position.unwrap_or_default(),
                line: number,
                kind: BreakKind::SealMismatch { seal_no: seal.seal_no },
            };
            push_break(&mut self.report, found);
        }
        let mut range = std::mem::take(&mut self.range);
        self.range_first = None;
        if self.seal.is_none() && !from_the_start {
            let first = i64::try_from(seal.first.position).unwrap_or(i64::MAX);
            let start = range.iter().position(|held| held.position == first).unwrap_or(0);
            range.drain(..start);
        }
        compare(&stored, &range, &mut self.report);
        self.report.seals_checked += 1;
        self.seal = Some((seal.seal_no, seal.digest.0));
    }

    fn end(&mut self, number: u64, end: EndLine) {
        let counts = [
            ("events", end.events, self.read.events),
            ("seals", end.seals, self.read.seals),
            ("streams", end.streams, self.read.streams),
        ];
        for (what, expected, found) in counts {
            if expected != found {
                self.fault(number, BreakKind::CountMismatch { what, expected, found });
            }
        }
    }

    /// The report, once every line was read.
    ///
    /// # Errors
    /// [`ArchiveError::Unsuitable`] for a file with no header.
    pub fn finish(mut self) -> Result<FileReport, ArchiveError> {
        let Some(header) = self.header.take() else {
            return Err(ArchiveError::Unsuitable("the file holds no export header".into()));
        };
        let lines = self.read.events + self.read.seals + self.read.streams + 2;
        if self.part != Part::Ended {
            let reason = "the file ends before its end line: it was cut short".to_owned();
            self.fault(lines, BreakKind::Malformed { reason });
        }
        for (what, expected, found) in
            [("events", header.events, self.read.events), ("seals", header.seals, self.read.seals)]
        {
            if expected != found {
                self.fault(lines, BreakKind::CountMismatch { what, expected, found });
            }
        }
        if header.complete {
            self.unheaded_streams();
            if let Some(heads) = self.heads.take() {
                // This reader never came to the stream lines the other read.
                self.heads_checked = heads.taken();
            }
            self.heads_read_twice(lines);
        }
        self.report.unsealed_events += self.range.len() as u64;
        Ok(FileReport { header, report: self.report, streams_held_max: self.streams_held_max })
    }
}
