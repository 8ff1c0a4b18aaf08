//! Inclusive port ranges, checked at construction.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// An inclusive range of ports `lo..=hi` with `1 <= lo <= hi <= 65535`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "[u32; 2]", into = "[u32; 2]")]
pub struct PortRange {
    lo: u16,
    hi: u16,
}

/// Why a range is not a valid port range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidRange {
    /// Not of the form `lo-hi`.
    #[error("expected \"lo-hi\", e.g. \"20000-32000\"")]
    Syntax,
    /// A bound outside 1-65535.
    #[error("port {0} is not between 1 and 65535")]
    OutOfBounds(u32),
    /// `lo > hi`.
    #[error("lower bound {lo} is above upper bound {hi}")]
    Reversed {
        /// Lower bound.
        lo: u32,
        /// Upper bound.
        hi: u32,
    },
}

// === impl PortRange ===

impl PortRange {
    /// The default dynamic range (docs/profile.md#port-allocation).
    pub const DEFAULT: PortRange = PortRange {
        lo: 20000,
        hi: 32000,
    };

    /// Checks and builds `lo..=hi`.
    pub fn try_new(lo: u32, hi: u32) -> Result<Self, InvalidRange> {
        for b in [lo, hi] {
            if !(1..=65535).contains(&b) {
                return Err(InvalidRange::OutOfBounds(b));
            }
        }
        if lo > hi {
            return Err(InvalidRange::Reversed { lo, hi });
        }
        Ok(Self {
            lo: lo as u16,
            hi: hi as u16,
        })
    }

    /// Lower bound (inclusive).
    pub fn lo(self) -> u16 {
        self.lo
    }

    /// Upper bound (inclusive).
    pub fn hi(self) -> u16 {
        self.hi
    }

    /// Number of ports in the range.
    pub fn len(self) -> u32 {
        u32::from(self.hi) - u32::from(self.lo) + 1
    }

    /// Always false: a range holds at least one port. (For clippy's `len_without_is_empty`.)
    pub fn is_empty(self) -> bool {
        false
    }

    /// Whether `port` is in the range.
    pub fn contains(self, port: u16) -> bool {
        self.lo <= port && port <= self.hi
    }

    /// The ports in both ranges, if any.
    pub fn intersect(self, other: PortRange) -> Option<PortRange> {
        let lo = self.lo.max(other.lo);
        let hi = self.hi.min(other.hi);
        (lo <= hi).then_some(PortRange { lo, hi })
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.lo, self.hi)
    }
}

impl FromStr for PortRange {
    type Err = InvalidRange;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (lo, hi) = s.trim().split_once('-').ok_or(InvalidRange::Syntax)?;
        let parse = |t: &str| t.trim().parse::<u32>().map_err(|_| InvalidRange::Syntax);
        Self::try_new(parse(lo)?, parse(hi)?)
    }
}

impl TryFrom<[u32; 2]> for PortRange {
    type Error = InvalidRange;

    fn try_from([lo, hi]: [u32; 2]) -> Result<Self, Self::Error> {
        Self::try_new(lo, hi)
    }
}

impl From<PortRange> for [u32; 2] {
    fn from(r: PortRange) -> Self {
        [r.lo.into(), r.hi.into()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn check(input: &[&str], expect: Expect) {
        let out: Vec<String> = input
            .iter()
            .map(|s| match s.parse::<PortRange>() {
                Ok(r) => format!("{s:?} ok {r} len={}", r.len()),
                Err(e) => format!("{s:?} rejected: {e}"),
            })
            .collect();
        expect.assert_eq(&out.join("\n"));
    }

    #[test]
    fn parse_ranges() {
        check(
            &[
                "20000-32000",
                "1-65535",
                "80-80",
                " 1 - 2 ",
                "0-10",
                "10-65536",
                "32000-20000",
                "20000",
                "a-b",
                "-5-10",
            ],
            expect![[r#"
                "20000-32000" ok 20000-32000 len=12001
                "1-65535" ok 1-65535 len=65535
                "80-80" ok 80-80 len=1
                " 1 - 2 " ok 1-2 len=2
                "0-10" rejected: port 0 is not between 1 and 65535
                "10-65536" rejected: port 65536 is not between 1 and 65535
                "32000-20000" rejected: lower bound 32000 is above upper bound 20000
                "20000" rejected: expected "lo-hi", e.g. "20000-32000"
                "a-b" rejected: expected "lo-hi", e.g. "20000-32000"
                "-5-10" rejected: expected "lo-hi", e.g. "20000-32000""#]],
        );
    }
}
