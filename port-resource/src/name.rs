//! Port names: the IANA service-name rules (RFC 6335 §5.1), restricted to lower case.
//!
//! The rules make the environment mapping (`-` → `_`, upper case) injective: no `_` in a
//! name, no doubled `-`, and only one case, so two distinct names never give the same
//! `XCE_PORT_<NAME>`.

use std::fmt;

/// The longest port name, in characters (RFC 6335).
pub const MAX_PORT_NAME_LEN: usize = 15;

/// A valid port name, e.g. `http` or `re-mail-ck`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortName(String);

/// Why a string is not a valid port name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidPortName {
    /// The empty string.
    #[error("must not be empty")]
    Empty,
    /// More than [`MAX_PORT_NAME_LEN`] characters.
    #[error("must be at most 15 characters")]
    TooLong,
    /// A character outside `[a-z0-9-]`.
    #[error("may contain only lowercase letters, digits and '-'")]
    BadChar,
    /// Digits and hyphens only.
    #[error("must contain at least one letter")]
    NoLetter,
    /// Starts or ends with `-`.
    #[error("must not start or end with '-'")]
    EdgeHyphen,
    /// Contains `--`.
    #[error("must not contain '--'")]
    DoubleHyphen,
}

// === impl PortName ===

impl PortName {
    /// Checks `name` against the rules.
    pub fn new(name: &str) -> Result<Self, InvalidPortName> {
        if name.is_empty() {
            return Err(InvalidPortName::Empty);
        }
        if name.chars().count() > MAX_PORT_NAME_LEN {
            return Err(InvalidPortName::TooLong);
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(InvalidPortName::BadChar);
        }
        if !name.bytes().any(|b| b.is_ascii_lowercase()) {
            return Err(InvalidPortName::NoLetter);
        }
        if name.starts_with('-') || name.ends_with('-') {
            return Err(InvalidPortName::EdgeHyphen);
        }
        if name.contains("--") {
            return Err(InvalidPortName::DoubleHyphen);
        }
        Ok(Self(name.to_owned()))
    }

    /// The name as declared.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The environment-variable form: upper case, `-` → `_` (`re-mail-ck` → `RE_MAIL_CK`).
    pub fn env_suffix(&self) -> String {
        self.0
            .chars()
            .map(|c| {
                if c == '-' {
                    '_'
                } else {
                    c.to_ascii_uppercase()
                }
            })
            .collect()
    }
}

impl fmt::Display for PortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn check(input: &[&str], expect: Expect) {
        let out: Vec<String> = input
            .iter()
            .map(|s| match PortName::new(s) {
                Ok(n) => format!("{s:?} ok XCE_PORT_{}", n.env_suffix()),
                Err(e) => format!("{s:?} rejected: {e}"),
            })
            .collect();
        expect.assert_eq(&out.join("\n"));
    }

    #[test]
    fn iana_examples() {
        check(
            &[
                "telnet",
                "re-mail-ck",
                "pop3",
                "a",
                "1-a",
                "",
                "abcdefghijklmnop",
                "12345",
                "1-2-3-4",
                "-begin",
                "end-",
                "two--hyphens",
                "whois++",
                "HTTP",
                "http_api",
                "abcdefghijklmno",
                "héllo",
            ],
            expect![[r#"
                "telnet" ok XCE_PORT_TELNET
                "re-mail-ck" ok XCE_PORT_RE_MAIL_CK
                "pop3" ok XCE_PORT_POP3
                "a" ok XCE_PORT_A
                "1-a" ok XCE_PORT_1_A
                "" rejected: must not be empty
                "abcdefghijklmnop" rejected: must be at most 15 characters
                "12345" rejected: must contain at least one letter
                "1-2-3-4" rejected: must contain at least one letter
                "-begin" rejected: must not start or end with '-'
                "end-" rejected: must not start or end with '-'
                "two--hyphens" rejected: must not contain '--'
                "whois++" rejected: may contain only lowercase letters, digits and '-'
                "HTTP" rejected: may contain only lowercase letters, digits and '-'
                "http_api" rejected: may contain only lowercase letters, digits and '-'
                "abcdefghijklmno" ok XCE_PORT_ABCDEFGHIJKLMNO
                "héllo" rejected: may contain only lowercase letters, digits and '-'"#]],
        );
    }
}
