//! An export's stream lines, read ahead by a second reader of the same file while the first
//! reads its events.
//!
//! A complete export ends with every stream's head, and a checker must hold each stream's
//! walk until it reads that stream's head: read in one pass, that is every stream of the log
//! at once. An export writes its heads in the commit order of each stream's last event, so a
//! second reader, started at the first head, meets each head just as the first reader checks
//! the event it names. The check then compares the head and forgets the stream: it holds only
//! the streams still open at that point of the log. A file whose heads are in another order
//! (or that was tampered with) verifies the same, holding more.

use std::io::BufRead;

use sha2::{Digest as _, Sha256};

use super::lines::{Line, StreamLine};

/// What begins a stream line as an export writes it; any other line is parsed to be sure.
const STREAM_PREFIX: &[u8] = b"{\"kind\":\"stream\",";
/// What begins the lines an export writes before its heads: skipped unread on the way.
const SKIPPED_PREFIXES: [&[u8]; 3] =
    [b"{\"kind\":\"event\",", b"{\"kind\":\"seal\",", b"{\"kind\":\"header\","];

/// Where the second reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// Not yet at the first stream line.
    ToHeads,
    /// Among the stream lines.
    Heads,
    /// Past them, or at a line it could not read: the first reader checks the rest.
    Done,
}

/// The stream lines of a file, one at a time, ahead of the first reader.
pub struct HeadsAhead<'r> {
    reader: Box<dyn BufRead + Send + 'r>,
    reading: Reading,
    /// The line number of the last line read (from 1).
    number: u64,
    /// The next head, read and not yet taken, with its line.
    next: Option<(u64, StreamLine)>,
    /// Heads taken so far: the file's first `taken` stream lines, and their digest.
    taken: u64,
    digest: Sha256,
    text: Vec<u8>,
}

impl std::fmt::Debug for HeadsAhead<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadsAhead")
            .field("reading", &self.reading)
            .field("number", &self.number)
            .field("taken", &self.taken)
            .finish_non_exhaustive()
    }
}

impl<'r> HeadsAhead<'r> {
    /// Reads the heads of the file `reader` reads from its start (a second handle of the
    /// file the check reads).
    pub fn new(reader: impl BufRead + Send + 'r) -> Self {
        Self {
            reader: Box::new(reader),
            reading: Reading::ToHeads,
            number: 0,
            next: None,
            taken: 0,
            digest: Sha256::default(),
            text: Vec::new(),
        }
    }

    /// The next head not yet taken, read if need be; `None` past the heads, or at a line this
    /// reader cannot read (the first reader then finds what is wrong with it).
    pub(super) fn peek(&mut self) -> Option<&StreamLine> {
        if self.next.is_none() {
            self.next = self.read_head();
        }
        self.next.as_ref().map(|(_, head)| head)
    }

    /// Takes the head [`Self::peek`] showed, with its line number.
    pub(super) fn take(&mut self) -> Option<(u64, StreamLine)> {
        let taken = self.next.take();
        if let Some((_, head)) = &taken {
            self.taken += 1;
            digest_head(&mut self.digest, head);
        }
        taken
    }

    /// How many of the file's first stream lines were taken (and so already checked), and
    /// their digest: the first reader's own first lines must match it.
    pub(super) fn taken(self) -> (u64, [u8; 32]) {
        (self.taken, self.digest.finalize().into())
    }

    fn read_head(&mut self) -> Option<(u64, StreamLine)> {
        if self.reading == Reading::ToHeads {
            self.skip_to_heads();
        }
        if self.reading != Reading::Heads {
            return None;
        }
        let head = self.read_line().and_then(|line| match line {
            Line::Stream(head) => Some((self.number, head)),
            _ => None,
        });
        if head.is_none() {
            self.reading = Reading::Done;
        }
        head
    }

    /// Skips every line before the first stream line, reading no event or seal line whole.
    fn skip_to_heads(&mut self) {
        loop {
            let starts = match self.reader.fill_buf() {
                Ok([]) | Err(_) => break,
                Ok(buffered) => (
                    SKIPPED_PREFIXES.iter().any(|prefix| buffered.starts_with(prefix)),
                    buffered.starts_with(STREAM_PREFIX),
                ),
            };
            match starts {
                (true, _) => {
                    if self.reader.skip_until(b'\n').is_err() {
                        break;
                    }
                    self.number += 1;
                }
                (false, true) => {
                    self.reading = Reading::Heads;
                    return;
                }
                // Another line, or one split by the buffer's end: read it whole.
                (false, false) => {
                    let number = self.number + 1;
                    match self.read_line() {
                        Some(Line::Stream(head)) => {
                            self.next = Some((number, head));
                            self.reading = Reading::Heads;
                            return;
                        }
                        Some(_) => {}
                        None if self.number < number => break,
                        None => {}
                    }
                }
            }
        }
        self.reading = Reading::Done;
    }

    /// Reads and parses the next line; `None` at the end, on a read error or on a line that
    /// does not parse (counted all the same).
    fn read_line(&mut self) -> Option<Line> {
        self.text.clear();
        match self.reader.read_until(b'\n', &mut self.text) {
            Ok(0) | Err(_) => return None,
            Ok(_) => self.number += 1,
        }
        let text = std::str::from_utf8(&self.text).ok()?;
        Line::parse(self.number, text.trim_end_matches(['\n', '\r'])).ok()
    }
}

/// Adds a head to a digest of heads (every field, each ended unambiguously).
pub(super) fn digest_head(digest: &mut Sha256, head: &StreamLine) {
    for text in [&head.stream_id, &head.stream_type, &head.tenant_id] {
        digest.update((text.len() as u64).to_be_bytes());
        digest.update(text.as_bytes());
    }
    digest.update(head.version.to_be_bytes());
    digest.update(head.last_hash.0);
    digest.update(head.last_tx_id.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(id: &str) -> String {
        format!(
            r#"{{"kind":"stream","stream_id":"{id}","stream_type":"lease","tenant_id":"acme","version":1,"last_hash":"{}","last_tx_id":7}}"#,
            "00".repeat(32)
        )
    }

    #[test]
    fn the_heads_are_read_from_the_first_stream_line_with_their_line_numbers() {
        let file = [
            r#"{"kind":"header","format":"x"}"#.to_owned(),
            r#"{"kind":"event","anything":"skipped unread"}"#.to_owned(),
            r#"{"kind":"seal","seal_no":1}"#.to_owned(),
            r#"{"kind":"event","more":1}"#.to_owned(),
            head("a"),
            head("b"),
            r#"{"kind":"end","events":2,"seals":1,"streams":2}"#.to_owned(),
        ]
        .join("\n");
        let mut heads = HeadsAhead::new(file.as_bytes());
        assert_eq!(heads.peek().map(|h| h.stream_id.as_str()), Some("a"));
        assert_eq!(heads.take().map(|(line, h)| (line, h.stream_id)), Some((5, "a".into())));
        assert_eq!(heads.take(), None, "take only what was peeked");
        assert_eq!(heads.peek().map(|h| h.stream_id.as_str()), Some("b"));
        assert_eq!(heads.take().map(|(line, _)| line), Some(6));
        assert!(heads.peek().is_none(), "the end line ends the heads");
        assert_eq!(heads.taken().0, 2);
    }

    #[test]
    fn crlf_line_ends_and_a_stray_head_among_the_events_are_read_as_the_first_reader_reads() {
        let file = [
            r#"{"kind":"header"}"#.to_owned(),
            head("stray"),
            r#"{"kind":"event","a":1}"#.to_owned(),
            head("a"),
        ]
        .join("\r\n");
        let mut heads = HeadsAhead::new(file.as_bytes());
        assert_eq!(heads.peek().map(|h| h.stream_id.as_str()), Some("stray"));
        assert_eq!(heads.take().map(|(line, _)| line), Some(2));
        assert!(heads.peek().is_none(), "the heads end at the first line that is not one");
    }

    #[test]
    fn a_file_with_no_heads_or_a_bad_line_among_them_gives_none() {
        let none = [r#"{"kind":"header"}"#, r#"{"kind":"event","a":1}"#].join("\n");
        assert!(HeadsAhead::new(none.as_bytes()).peek().is_none());
        let bad = [head("a"), "{not json".to_owned(), head("b")].join("\n");
        let mut heads = HeadsAhead::new(bad.as_bytes());
        assert!(heads.peek().is_some());
        heads.take();
        assert!(heads.peek().is_none(), "a line it cannot read ends what it reads ahead");
    }
}
