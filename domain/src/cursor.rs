//! The position of an event in the whole log.

use std::fmt;
use std::str::FromStr;

/// Where an event stands in the committed order of the whole log: `(log_epoch, tx_id,
/// position)`, compared in that order.
///
/// The position alone is not an order readers may trust: identity values are handed out at
/// insert time but become visible at commit, so a transaction that commits late would be
/// skipped. The transaction id comes first so that rows that become visible later always sort
/// after rows already delivered. The epoch is raised after a logical restore, where
/// transaction ids start again from lower values.
///
/// Its string form is 40 lowercase hex digits (8 for the epoch, 16 each for the transaction
/// id and the position). It is stable, round-trips exactly and sorts as text in log order;
/// clients should still treat it as opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Cursor {
    /// Raised after a logical restore; every event of an older epoch precedes the newer ones.
    pub log_epoch: u32,
    /// The writing transaction's 64-bit id (`xid8`).
    pub tx_id: u64,
    /// The event's identity value, which orders events within one transaction.
    pub position: u64,
}

/// Why a cursor string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CursorParseError {
    /// The string was not exactly 40 characters long.
    #[error("a cursor is 40 characters long, this one has {length}")]
    Length {
        /// The length that was found.
        length: usize,
    },
    /// The string held something other than lowercase hex digits.
    #[error("a cursor holds only the characters 0-9 and a-f")]
    NotHex,
}

const CURSOR_LENGTH: usize = 40;

impl Cursor {
    /// The cursor before the first event: reading after it reads the whole log.
    pub const START: Cursor = Cursor { log_epoch: 0, tx_id: 0, position: 0 };
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}{:016x}{:016x}", self.log_epoch, self.tx_id, self.position)
    }
}

impl FromStr for Cursor {
    type Err = CursorParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.len() != CURSOR_LENGTH {
            return Err(CursorParseError::Length { length: text.len() });
        }
        // Uppercase is refused too, so that each cursor has exactly one spelling.
        if !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(CursorParseError::NotHex);
        }
        let hex = |range: std::ops::Range<usize>| u64::from_str_radix(&text[range], 16);
        let log_epoch = hex(0..8).map_err(|_| CursorParseError::NotHex)?;
        let tx_id = hex(8..24).map_err(|_| CursorParseError::NotHex)?;
        let position = hex(24..40).map_err(|_| CursorParseError::NotHex)?;
        let log_epoch = u32::try_from(log_epoch).map_err(|_| CursorParseError::NotHex)?;
        Ok(Cursor { log_epoch, tx_id, position })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn string_form_round_trips(log_epoch: u32, tx_id: u64, position: u64) {
            let cursor = Cursor { log_epoch, tx_id, position };
            let text = cursor.to_string();
            prop_assert_eq!(text.len(), 40);
            prop_assert_eq!(text.parse::<Cursor>(), Ok(cursor));
        }

        #[test]
        fn text_order_is_log_order(a: (u32, u64, u64), b: (u32, u64, u64)) {
            let a = Cursor { log_epoch: a.0, tx_id: a.1, position: a.2 };
            let b = Cursor { log_epoch: b.0, tx_id: b.1, position: b.2 };
            prop_assert_eq!(a.cmp(&b), a.to_string().cmp(&b.to_string()));
        }
    }

    #[test]
    fn refuses_malformed_strings() {
        assert_eq!("".parse::<Cursor>(), Err(CursorParseError::Length { length: 0 }));
        assert_eq!("g".repeat(40).parse::<Cursor>(), Err(CursorParseError::NotHex));
        assert_eq!("A".repeat(40).parse::<Cursor>(), Err(CursorParseError::NotHex));
        assert_eq!("+".repeat(40).parse::<Cursor>(), Err(CursorParseError::NotHex));
        assert_eq!(Cursor::START.to_string(), "0".repeat(40));
    }
}
