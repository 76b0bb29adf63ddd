//! What a writer expects a stream's version to be.

use std::fmt;

/// The condition an append puts on a stream's current version (the number of events in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExpectedVersion {
    /// Append whatever the version is.
    Any,
    /// The stream must not exist yet. The same as `Exact(0)`.
    NoStream,
    /// The stream must be at exactly this version.
    Exact(u64),
}

impl ExpectedVersion {
    /// The version the stream must have, or `None` for [`ExpectedVersion::Any`].
    pub fn required(self) -> Option<u64> {
        match self {
            ExpectedVersion::Any => None,
            ExpectedVersion::NoStream => Some(0),
            ExpectedVersion::Exact(version) => Some(version),
        }
    }

    /// Whether a stream at `actual` satisfies this condition.
    pub fn admits(self, actual: u64) -> bool {
        self.required().is_none_or(|required| required == actual)
    }
}

impl fmt::Display for ExpectedVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExpectedVersion::Any => f.write_str("any version"),
            ExpectedVersion::NoStream => f.write_str("no stream"),
            ExpectedVersion::Exact(version) => write!(f, "version {version}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_by_kind() {
        assert!(ExpectedVersion::Any.admits(7));
        assert!(ExpectedVersion::NoStream.admits(0));
        assert!(!ExpectedVersion::NoStream.admits(1));
        assert!(ExpectedVersion::Exact(3).admits(3));
        assert!(!ExpectedVersion::Exact(3).admits(4));
    }
}
