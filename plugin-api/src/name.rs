//! The rule for service and project names (docs/profile.md), written once: the controller
//! validates profiles with it and the CLI decides with it whether a name can go in a URL
//! path. Port names have their own, stricter rule in `port-resource` (`name::PortName`).

/// The longest service or project name, in characters.
pub const MAX_NAME_LEN: usize = 63;

/// Why a string is not a valid service or project name. The messages are the `reason` of
/// the profile's field errors (`service.name`, `service.project`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidName {
    /// Empty or longer than [`MAX_NAME_LEN`].
    #[error("must be 1-63 characters")]
    Length,
    /// A character outside `[a-z0-9-]`.
    #[error("may contain only a-z, 0-9 and '-'")]
    BadChar,
    /// Starts with a digit or `-`.
    #[error("must start with a letter")]
    Start,
    /// Ends with `-`.
    #[error("must end with a letter or digit")]
    End,
}

/// Checks a service or project name: 1-63 characters of `[a-z0-9-]`, starting with a
/// letter, ending with a letter or digit. Checks in that order, so the first broken rule
/// is the one reported.
pub fn check_name(s: &str) -> Result<(), InvalidName> {
    if s.is_empty() || s.len() > MAX_NAME_LEN {
        return Err(InvalidName::Length);
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(InvalidName::BadChar);
    }
    if !s.as_bytes()[0].is_ascii_lowercase() {
        return Err(InvalidName::Start);
    }
    if s.ends_with('-') {
        return Err(InvalidName::End);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str) -> String {
        match check_name(input) {
            Ok(()) => "ok".to_owned(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_rule_and_its_reasons() {
        let long = "a".repeat(64);
        let max = "a".repeat(63);
        let cases: Vec<(&str, &str)> = vec![
            ("a", "ok"),
            ("web", "ok"),
            ("web-1", "ok"),
            ("a1", "ok"),
            ("a-b-c", "ok"),
            (&max, "ok"),
            ("", "must be 1-63 characters"),
            (&long, "must be 1-63 characters"),
            ("A", "may contain only a-z, 0-9 and '-'"),
            ("a_b", "may contain only a-z, 0-9 and '-'"),
            ("wéb", "may contain only a-z, 0-9 and '-'"),
            ("1a", "must start with a letter"),
            ("-a", "must start with a letter"),
            ("a-", "must end with a letter or digit"),
        ];
        for (input, want) in cases {
            assert_eq!(check(input), want, "{input:?}");
        }
    }
}
