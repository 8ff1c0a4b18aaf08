//! The `service.ports` profile section (docs/profile.md): parsing and the checks that need no
//! knowledge of the cluster. Host-dependent checks live in the plugin.

use crate::grant::Protocol;
use crate::name::PortName;
use crate::pool::PortRequest;
use plugin_api::FieldError;
use serde_json::{Map, Value};

/// The field path of the section from the profile root.
pub const SECTION_PATH: &str = "service.ports";

/// The most ports one service may declare (docs/profile.md): a profile cannot ask one host
/// for thousands of ports per replica.
pub const MAX_PORTS: usize = 64;

/// One declared port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortDecl {
    /// Its name, unique within the service.
    pub name: PortName,
    /// tcp (default) or udp.
    pub protocol: Protocol,
    /// A fixed port, or `None` for "any free".
    pub port: Option<u16>,
}

/// A validated `service.ports` section: the ports in declaration order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortsSection {
    /// The ports.
    pub ports: Vec<PortDecl>,
}

/// One `[[service.ports]]` entry as far as it could be read; `None` fields were invalid
/// (and reported).
#[derive(Debug, Clone)]
pub(crate) struct Draft {
    pub(crate) index: usize,
    pub(crate) name: Option<PortName>,
    pub(crate) protocol: Option<Protocol>,
    /// `Some(None)`: "any free"; `None`: the `port` field was invalid.
    pub(crate) port: Option<Option<u16>>,
}

// === impl PortsSection ===

impl PortsSection {
    /// Parses and checks the section (`None` when the profile has none). Returns every
    /// problem found, with field paths like `service.ports[1].name`.
    pub fn parse(section: Option<&Value>) -> Result<Self, Vec<FieldError>> {
        let (drafts, errors) = draft(section);
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Self {
            ports: drafts
                .into_iter()
                .map(|d| PortDecl {
                    name: d.name.expect("no errors means every field parsed"),
                    protocol: d.protocol.expect("no errors means every field parsed"),
                    port: d.port.expect("no errors means every field parsed"),
                })
                .collect(),
        })
    }

    /// What the pool is asked for, in declaration order.
    pub fn requests(&self) -> Vec<PortRequest> {
        self.ports
            .iter()
            .map(|d| PortRequest {
                protocol: d.protocol,
                fixed: d.port,
            })
            .collect()
    }
}

/// Reads the section as far as possible, collecting every problem.
pub(crate) fn draft(section: Option<&Value>) -> (Vec<Draft>, Vec<FieldError>) {
    let mut errors = Vec::new();
    let Some(section) = section else {
        return (Vec::new(), errors);
    };
    let Some(items) = section.as_array() else {
        errors.push(FieldError::new(SECTION_PATH, "expected an array of tables"));
        return (Vec::new(), errors);
    };
    if items.len() > MAX_PORTS {
        errors.push(FieldError::new(
            SECTION_PATH,
            format!(
                "declares {} ports; a service may declare at most {MAX_PORTS}",
                items.len()
            ),
        ));
    }
    let mut drafts = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let Some(table) = item.as_object() else {
            errors.push(FieldError::new(
                format!("{SECTION_PATH}[{index}]"),
                "expected a table",
            ));
            continue;
        };
        drafts.push(Draft::read(index, table, &mut errors));
    }
    cross_entry_checks(&drafts, &mut errors);
    (drafts, errors)
}

// === impl Draft ===

impl Draft {
    /// Reads entry `index` of the section, every field it can.
    fn read(index: usize, table: &Map<String, Value>, errors: &mut Vec<FieldError>) -> Self {
        let at = format!("{SECTION_PATH}[{index}]");
        let d = Draft {
            index,
            name: read_name(&at, table.get("name"), errors),
            protocol: read_protocol(&at, table.get("protocol"), errors),
            port: read_port(&at, table.get("port"), errors),
        };
        for key in table.keys() {
            if !matches!(key.as_str(), "name" | "protocol" | "port") {
                errors.push(FieldError::new(format!("{at}.{key}"), "unknown field"));
            }
        }
        d
    }
}

/// The `name` of the entry at `at` (required).
fn read_name(at: &str, v: Option<&Value>, errors: &mut Vec<FieldError>) -> Option<PortName> {
    let problem = match v {
        None => "missing field".to_owned(),
        Some(Value::String(s)) => match PortName::new(s) {
            Ok(n) => return Some(n),
            Err(e) => format!("{s:?} is not a valid port name: {e}"),
        },
        Some(_) => "expected a string".to_owned(),
    };
    errors.push(FieldError::new(format!("{at}.name"), problem));
    None
}

/// The `protocol` of the entry at `at`; tcp when absent.
fn read_protocol(at: &str, v: Option<&Value>, errors: &mut Vec<FieldError>) -> Option<Protocol> {
    match v {
        None => Some(Protocol::Tcp),
        Some(Value::String(s)) if s == "tcp" => Some(Protocol::Tcp),
        Some(Value::String(s)) if s == "udp" => Some(Protocol::Udp),
        Some(_) => {
            errors.push(FieldError::new(
                format!("{at}.protocol"),
                "expected \"tcp\" or \"udp\"",
            ));
            None
        }
    }
}

/// The `port` of the entry at `at`: `Some(None)` ("any free") when absent, `None` when
/// invalid.
fn read_port(at: &str, v: Option<&Value>, errors: &mut Vec<FieldError>) -> Option<Option<u16>> {
    let problem = match v {
        None => return Some(None),
        // Negative and huge numbers are out of range, not "no integer".
        Some(Value::Number(n)) => match (n.as_i64(), n.as_u64()) {
            (Some(p), _) if (1..=65535).contains(&p) => return Some(Some(p as u16)),
            (Some(p), _) => format!("port {p} is not between 1 and 65535"),
            (None, Some(p)) => format!("port {p} is not between 1 and 65535"),
            (None, None) => "expected an integer".to_owned(),
        },
        Some(_) => "expected an integer".to_owned(),
    };
    errors.push(FieldError::new(format!("{at}.port"), problem));
    None
}

/// Checks across entries, on what could be read: names are unique, and no fixed port is
/// fixed twice for one protocol. Each problem names the later entry and the first one.
fn cross_entry_checks(drafts: &[Draft], errors: &mut Vec<FieldError>) {
    for (i, d) in drafts.iter().enumerate() {
        let earlier = &drafts[..i];
        if let Some(name) = &d.name {
            if let Some(first) = earlier.iter().find(|o| o.name.as_ref() == Some(name)) {
                errors.push(FieldError::new(
                    format!("{SECTION_PATH}[{}].name", d.index),
                    format!(
                        "duplicate port name {:?} (first declared at {SECTION_PATH}[{}])",
                        name.as_str(),
                        first.index
                    ),
                ));
            }
        }
        if let (Some(Some(port)), Some(proto)) = (d.port, d.protocol) {
            if let Some(first) = earlier
                .iter()
                .find(|o| o.port == Some(Some(port)) && o.protocol == Some(proto))
            {
                errors.push(FieldError::new(
                    format!("{SECTION_PATH}[{}].port", d.index),
                    format!(
                        "port {proto}/{port} is already fixed by {SECTION_PATH}[{}]",
                        first.index
                    ),
                ));
            }
        }
    }
}

/// The names the section declares, when every entry's name can be read whatever else is
/// wrong with the section; `None` when the section is no array or some entry is no table
/// or has no valid name (a probe may then reference the one that could not be read).
pub(crate) fn declared_names(section: Option<&Value>) -> Option<Vec<PortName>> {
    let entries = match section {
        None => 0,
        Some(s) => s.as_array()?.len(),
    };
    let (drafts, _) = draft(section);
    // `draft` skips an entry that is no table.
    if drafts.len() != entries {
        return None;
    }
    drafts.into_iter().map(|d| d.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    /// Parses a profile (TOML) and prints the ports or every problem.
    fn check(profile: &str, expect: Expect) {
        let value: Value = toml::from_str::<toml::Table>(profile)
            .map(|t| serde_json::to_value(t).unwrap())
            .unwrap();
        let section = value.pointer("/service/ports");
        let out = match PortsSection::parse(section) {
            Ok(s) => s
                .ports
                .iter()
                .map(|d| format!("{} {} {:?}", d.name, d.protocol, d.port))
                .collect::<Vec<_>>()
                .join("\n"),
            Err(errs) => errs
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
        };
        expect.assert_eq(&out);
    }

    fn names_table(names: &[&str]) -> String {
        names
            .iter()
            .map(|n| format!("[[service.ports]]\nname = {n:?}\n"))
            .collect()
    }

    #[test]
    fn valid_profiles() {
        check(
            r#"
            [[service.ports]]
            name = "http"
            [[service.ports]]
            name = "dns"
            protocol = "udp"
            port = 53
            [[service.ports]]
            name = "dns-tcp"
            protocol = "tcp"
            port = 53
            "#,
            expect![[r#"
                http tcp None
                dns udp Some(53)
                dns-tcp tcp Some(53)"#]],
        );
        check("[service]\nname = \"x\"", expect![""]);
    }

    #[test]
    fn names_are_declared_when_every_entry_has_a_readable_one() {
        let names = |profile: &str| {
            let value: Value = toml::from_str::<toml::Table>(profile)
                .map(|t| serde_json::to_value(t).unwrap())
                .unwrap();
            let names = declared_names(value.pointer("/service/ports"))
                .map(|n| n.iter().map(|n| n.as_str().to_owned()).collect::<Vec<_>>());
            format!("{names:?}")
        };
        // Other problems aside (an unknown protocol, a duplicate name).
        expect![[r#"Some(["http", "http"])"#]].assert_eq(&names(
            "[[service.ports]]\nname = \"http\"\nprotocol = \"sctp\"\n[[service.ports]]\nname = \"http\"",
        ));
        expect![[r#"Some([])"#]].assert_eq(&names("[service]\nname = \"x\""));
        expect!["None"].assert_eq(&names(&names_table(&["http", "HTTP"])));
        expect!["None"].assert_eq(&names("[[service.ports]]\nport = 9"));
        expect!["None"].assert_eq(&names("[service]\nports = [1]"));
        expect!["None"].assert_eq(&names("[service]\nports = 3"));
    }

    #[test]
    fn at_most_64_ports() {
        let many: String = (0..65)
            .map(|i| format!("[[service.ports]]\nname = \"p{i}\"\n"))
            .collect();
        check(
            &many,
            expect!["service.ports: declares 65 ports; a service may declare at most 64"],
        );
    }

    #[test]
    fn iana_name_table() {
        check(
            &names_table(&["telnet", "re-mail-ck", "pop3", "a", "1-a"]),
            expect![[r#"
                telnet tcp None
                re-mail-ck tcp None
                pop3 tcp None
                a tcp None
                1-a tcp None"#]],
        );
        check(
            &names_table(&[
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
            ]),
            expect![[r#"
                service.ports[0].name: "" is not a valid port name: must not be empty
                service.ports[1].name: "abcdefghijklmnop" is not a valid port name: must be at most 15 characters
                service.ports[2].name: "12345" is not a valid port name: must contain at least one letter
                service.ports[3].name: "1-2-3-4" is not a valid port name: must contain at least one letter
                service.ports[4].name: "-begin" is not a valid port name: must not start or end with '-'
                service.ports[5].name: "end-" is not a valid port name: must not start or end with '-'
                service.ports[6].name: "two--hyphens" is not a valid port name: must not contain '--'
                service.ports[7].name: "whois++" is not a valid port name: may contain only lowercase letters, digits and '-'
                service.ports[8].name: "HTTP" is not a valid port name: may contain only lowercase letters, digits and '-'
                service.ports[9].name: "http_api" is not a valid port name: may contain only lowercase letters, digits and '-'"#]],
        );
    }

    #[test]
    fn port_number_table() {
        let profile: String = ["0", "-1", "65536", "100000", "1", "65535", "\"80\"", "80.5"]
            .iter()
            .enumerate()
            .map(|(i, p)| format!("[[service.ports]]\nname = \"p{i}\"\nport = {p}\n"))
            .collect();
        check(
            &profile,
            expect![[r#"
                service.ports[0].port: port 0 is not between 1 and 65535
                service.ports[1].port: port -1 is not between 1 and 65535
                service.ports[2].port: port 65536 is not between 1 and 65535
                service.ports[3].port: port 100000 is not between 1 and 65535
                service.ports[6].port: expected an integer
                service.ports[7].port: expected an integer"#]],
        );
        check(
            "[[service.ports]]\nname = \"lo\"\nport = 1\n[[service.ports]]\nname = \"hi\"\nport = 65535",
            expect![[r#"
                lo tcp Some(1)
                hi tcp Some(65535)"#]],
        );
    }

    #[test]
    fn every_problem_is_listed() {
        check(
            r#"
            [[service.ports]]
            name = "http"
            port = 8080
            foo = 1
            [[service.ports]]
            name = "http"
            protocol = "sctp"
            [[service.ports]]
            name = "admin"
            port = 8080
            [[service.ports]]
            name = "admin-udp"
            protocol = "udp"
            port = 8080
            [[service.ports]]
            port = 9
            [[service.ports]]
            name = 7
            "#,
            expect![[r#"
                service.ports[0].foo: unknown field
                service.ports[1].protocol: expected "tcp" or "udp"
                service.ports[4].name: missing field
                service.ports[5].name: expected a string
                service.ports[1].name: duplicate port name "http" (first declared at service.ports[0])
                service.ports[2].port: port tcp/8080 is already fixed by service.ports[0]"#]],
        );
        check(
            "[service]\nports = 3",
            expect!["service.ports: expected an array of tables"],
        );
        check(
            "[service]\nports = [1]",
            expect!["service.ports[0]: expected a table"],
        );
    }
}
