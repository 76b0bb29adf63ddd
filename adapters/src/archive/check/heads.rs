//! A complete file's stream heads, checked against the streams' walks: as each `stream` line
//! is read, or ahead of it ([`HeadsAhead`]) as soon as its stream's last event is read. A
//! stream checked ahead is forgotten but for a fingerprint, so that an event or a second head
//! of it is still found.

use sha2::{Digest as _, Sha256};

use super::{FileCheck, StreamWalk, owner_of};
use crate::archive::heads_ahead::digest_head;
use crate::archive::lines::StreamLine;
use crate::verify::{BreakKind, ChainBreak, push_break};

/// A stream id's fingerprint: the first 128 bits of its SHA-256.
fn fingerprint(stream_id: &str) -> u128 {
    let digest = Sha256::digest(stream_id.as_bytes());
    let mut first = [0; 16];
    first.copy_from_slice(&digest[..16]);
    u128::from_be_bytes(first)
}

impl FileCheck<'_> {
    pub(super) fn stream(&mut self, number: u64, stream: &StreamLine) {
        let index = self.read.streams;
        self.read.streams += 1;
        if let Some(heads) = self.heads.take() {
            // From here on this reader reads the heads; those read ahead were checked.
            self.heads_checked = heads.taken();
        }
        if index < self.heads_checked.0 {
            digest_head(&mut self.heads_read, stream);
            return;
        }
        let complete = self.header.as_ref().is_some_and(|header| header.complete);
        if !complete {
            let reason = "a stream head in an export that is not complete".to_owned();
            return self.fault(number, BreakKind::Malformed { reason });
        }
        let walk = self.streams.get_mut(&stream.stream_id).map(|walk| {
            let again = walk.headed;
            walk.headed = true;
            (again, *walk)
        });
        match walk {
            Some((true, _)) => self.second_head(number, stream),
            None if self.was_closed(&stream.stream_id) => self.second_head(number, stream),
            walk => self.check_head(number, stream, walk.map(|(_, walk)| walk)),
        }
    }

    fn second_head(&mut self, number: u64, stream: &StreamLine) {
        let reason = "a second head for its stream".to_owned();
        let found = ChainBreak {
            stream_id: stream.stream_id.clone(),
            version: stream.version,
            position: 0,
            line: number,
            kind: BreakKind::Malformed { reason },
        };
        push_break(&mut self.report, found);
    }

    /// Whether `stream_id`'s head was checked ahead and the stream forgotten.
    pub(super) fn was_closed(&self, stream_id: &str) -> bool {
        !self.closed.is_empty() && self.closed.contains(&fingerprint(stream_id))
    }

    /// Checks each head read ahead whose stream's walk is at the version it records (as an
    /// export writes them, the one whose last event was just read), then forgets that stream.
    /// A head whose stream is not there yet waits; one whose stream never gets there exactly
    /// (a fault) is checked when its own line is read.
    pub(super) fn check_heads_ahead(&mut self) {
        if !self.header.as_ref().is_some_and(|header| header.complete) {
            return;
        }
        while let Some(heads) = self.heads.as_mut() {
            let reached = heads.peek().is_some_and(|head| {
                self.streams.get(&head.stream_id).is_some_and(|w| w.link.version == head.version)
            });
            let Some((number, head)) = reached.then(|| heads.take()).flatten() else {
                return;
            };
            let walk = self.streams.remove(&head.stream_id);
            self.closed.insert(fingerprint(&head.stream_id));
            self.check_head(number, &head, walk);
        }
    }

    /// Compares a stream's head (line `number`) with its walk through the file's events.
    fn check_head(&mut self, number: u64, stream: &StreamLine, walk: Option<StreamWalk>) {
        let recorded = stream.version;
        let (version, position, kind) = match walk {
            None => (1, 0, BreakKind::StreamMissing),
            Some(walk) if walk.link.version < recorded => {
                (walk.link.version + 1, walk.position, BreakKind::EventsMissing { recorded })
            }
            Some(walk)
                if walk.link.version > recorded
                    || walk.link.hash != stream.last_hash.0
                    || walk.owner != owner_of(&stream.stream_type, &stream.tenant_id)
                    || (stream.last_tx_id != walk.tx_id && stream.last_tx_id != 0) =>
            {
                // A head of another type or tenant would hand the stream to another owner on
                // import; its last transaction is its last event's (or 0, reset by a new
                // epoch).
                (walk.link.version, walk.position, BreakKind::HeadMismatch)
            }
            Some(_) => return,
        };
        let found = ChainBreak {
            stream_id: stream.stream_id.clone(),
            version,
            position,
            line: number,
            kind,
        };
        push_break(&mut self.report, found);
    }

    /// The heads checked ahead were this reader's first stream lines: else the file changed
    /// between its two readings (or they read two files), and what was checked is not what
    /// was read.
    pub(super) fn heads_read_twice(&mut self, line: u64) {
        let (checked, digest) = self.heads_checked;
        if checked == 0 {
            return;
        }
        let read: [u8; 32] = std::mem::take(&mut self.heads_read).finalize().into();
        if self.read.streams < checked || read != digest {
            let reason = "its stream heads differ between the file's two readings".to_owned();
            self.fault(line, BreakKind::Malformed { reason });
        }
    }

    /// A complete file records every stream's head: a stream without one was added.
    pub(super) fn unheaded_streams(&mut self) {
        let mut unheaded: Vec<(String, StreamWalk)> = self
            .streams
            .iter()
            .filter(|(_, walk)| !walk.headed)
            .map(|(id, walk)| (id.clone(), *walk))
            .collect();
        unheaded.sort_by_key(|(_, walk)| walk.position);
        for (stream_id, walk) in unheaded {
            let found = ChainBreak {
                stream_id,
                version: walk.link.version,
                position: walk.position,
                line: walk.line,
                kind: BreakKind::HeadMissing,
            };
            push_break(&mut self.report, found);
        }
    }
}
