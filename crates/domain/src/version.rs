//! The number of one version of an endpoint, read the same way wherever it is sent.

use std::fmt;
use std::str::FromStr;

use crate::error::Invalid;

/// The number of one version of an endpoint: 1 for the first, one more for each query change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VersionNumber(u32);

impl VersionNumber {
    pub const FIRST: Self = Self(1);

    pub fn get(self) -> u32 {
        self.0
    }

    /// Reads a version number sent as `attr`, as text.
    ///
    /// # Errors
    /// [`Invalid`] naming `attr` unless the text is a positive integer.
    pub fn parse_field(attr: &str, raw: &str) -> Result<Self, Invalid> {
        raw.parse().map_err(|NotAVersion| not_a_version(attr))
    }

    /// Reads a version number sent as `attr`, as a number.
    ///
    /// # Errors
    /// [`Invalid`] naming `attr` unless the number is a positive integer within 32 bits.
    pub fn from_field(attr: &str, number: i64) -> Result<Self, Invalid> {
        Self::try_from(number).map_err(|NotAVersion| not_a_version(attr))
    }
}

fn not_a_version(attr: &str) -> Invalid {
    Invalid::field(attr, format!("{attr} must be a positive integer."))
}

/// A number or text that is not a positive integer within 32 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAVersion;

impl TryFrom<i64> for VersionNumber {
    type Error = NotAVersion;

    fn try_from(number: i64) -> Result<Self, NotAVersion> {
        u32::try_from(number).ok().filter(|n| *n > 0).map(Self).ok_or(NotAVersion)
    }
}

impl TryFrom<u32> for VersionNumber {
    type Error = NotAVersion;

    fn try_from(number: u32) -> Result<Self, NotAVersion> {
        (number > 0).then_some(Self(number)).ok_or(NotAVersion)
    }
}

impl FromStr for VersionNumber {
    type Err = NotAVersion;

    fn from_str(raw: &str) -> Result<Self, NotAVersion> {
        raw.parse::<i64>().map_err(|_| NotAVersion).and_then(Self::try_from)
    }
}

impl fmt::Display for VersionNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_numbers_are_positive_integers_within_32_bits() {
        assert_eq!("7".parse::<VersionNumber>().map(VersionNumber::get), Ok(7));
        for bad in ["0", "-1", "1.5", "", "x", "4294967296", " 1"] {
            let err = VersionNumber::parse_field("version", bad).unwrap_err();
            assert_eq!(err.attr.as_deref(), Some("version"), "{bad}");
            assert_eq!(err.detail, "version must be a positive integer.");
        }
        assert_eq!(
            VersionNumber::from_field("version", i64::from(u32::MAX)).map(VersionNumber::get),
            Ok(u32::MAX)
        );
        assert!(VersionNumber::from_field("version", 0).is_err());
    }
}
