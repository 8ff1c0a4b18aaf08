//! What a worker reports about its ports: the `ports` section of its host facts, the
//! worker's config for it, and the [`HostFactsProvider`] that fills it in.

use crate::grant::PLUGIN_NAME;
use crate::range::{InvalidRange, PortRange};
use async_trait::async_trait;
use plugin_api::{FactsError, FieldError, HostFacts, HostFactsProvider};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Mutex;

/// The `ports` section of a host's facts:
/// `{"range":[lo,hi],"reserved":[...],"ephemeral":[lo,hi] or null}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostPortsFacts {
    /// The dynamic range "any free" ports come from.
    pub range: PortRange,
    /// Ports never handed out, fixed or not.
    #[serde(default)]
    pub reserved: Vec<u16>,
    /// The kernel's ephemeral range, when known. Its overlap with `range` is not handed
    /// out.
    #[serde(default)]
    pub ephemeral: Option<PortRange>,
}

// === impl HostPortsFacts ===

impl HostPortsFacts {
    /// Reads the section from a host's facts. The error's field is the section path, e.g.
    /// `sections.ports.range`.
    pub fn from_facts(facts: &HostFacts) -> Result<Self, FieldError> {
        let field = format!("sections.{PLUGIN_NAME}");
        let value = facts
            .sections
            .get(PLUGIN_NAME)
            .ok_or_else(|| FieldError::new(&field, "missing: the worker reports no ports"))?;
        let parsed: Self = serde_json::from_value(value.clone())
            .map_err(|e| FieldError::new(&field, e.to_string()))?;
        if let Some(at) = parsed.reserved.iter().position(|&p| p == 0) {
            return Err(FieldError::new(
                format!("{field}.reserved[{at}]"),
                "port 0 is not between 1 and 65535",
            ));
        }
        Ok(parsed)
    }

    /// The part of the dynamic range that overlaps the ephemeral range.
    pub fn ephemeral_overlap(&self) -> Option<PortRange> {
        self.ephemeral.and_then(|e| e.intersect(self.range))
    }

    /// Encodes the section.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("host port facts always serialize")
    }
}

/// The worker's `[ports]` config.
///
/// ```toml
/// [ports]
/// range = "20000-32000"          # dynamic range, inclusive
/// reserved = [22, 80]            # never handed out
/// ephemeral_range_file = "/proc/sys/net/ipv4/ip_local_port_range"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerPortsConfig {
    /// The dynamic range, `"lo-hi"`. Default `"20000-32000"`.
    pub range: String,
    /// Reserved ports. Default `[22, 80]`.
    pub reserved: Vec<u16>,
    /// Where the kernel's ephemeral range is read from. Default
    /// `/proc/sys/net/ipv4/ip_local_port_range`; a missing file means "unknown".
    pub ephemeral_range_file: PathBuf,
}

/// A worker's `[ports]` config that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PortsConfigError {
    /// `range` is not a valid range.
    // The reason is part of the message and deliberately not a `source`: error chains
    // (`{:#}`) would print it twice.
    #[error("ports.range: invalid range {value:?}: {reason}")]
    Range {
        /// The configured text.
        value: String,
        /// Why.
        reason: InvalidRange,
    },
    /// A reserved port is 0.
    #[error("ports.reserved[{index}]: port 0 is not between 1 and 65535")]
    ReservedZero {
        /// Its index in the list.
        index: usize,
    },
}

impl Default for WorkerPortsConfig {
    fn default() -> Self {
        Self {
            range: PortRange::DEFAULT.to_string(),
            reserved: vec![22, 80],
            ephemeral_range_file: PathBuf::from("/proc/sys/net/ipv4/ip_local_port_range"),
        }
    }
}

// === impl WorkerPortsConfig ===

impl WorkerPortsConfig {
    /// Checks the config; returns the parsed dynamic range.
    pub fn validate(&self) -> Result<PortRange, PortsConfigError> {
        let range = self
            .range
            .parse::<PortRange>()
            .map_err(|reason| PortsConfigError::Range {
                value: self.range.clone(),
                reason,
            })?;
        if let Some(index) = self.reserved.iter().position(|&p| p == 0) {
            return Err(PortsConfigError::ReservedZero { index });
        }
        Ok(range)
    }
}

/// Reports the worker's dynamic range, reserved list and the kernel's ephemeral range as
/// `facts.sections["ports"]`.
#[derive(Debug)]
pub struct PortFactsProvider {
    range: PortRange,
    reserved: Vec<u16>,
    ephemeral_range_file: PathBuf,
    /// The overlap last warned about, so the warning is logged once per change, not on
    /// every re-read.
    warned: Mutex<Option<Option<PortRange>>>,
}

// === impl PortFactsProvider ===

impl PortFactsProvider {
    /// Builds the provider from a checked config.
    pub fn new(config: &WorkerPortsConfig) -> Result<Self, PortsConfigError> {
        let range = config.validate()?;
        let mut reserved = config.reserved.clone();
        reserved.sort_unstable();
        reserved.dedup();
        Ok(Self {
            range,
            reserved,
            ephemeral_range_file: config.ephemeral_range_file.clone(),
            warned: Mutex::new(None),
        })
    }

    /// Reads the ephemeral range; `Ok(None)` when the file does not exist.
    fn read_ephemeral(&self) -> Result<Option<PortRange>, FactsError> {
        let path = &self.ephemeral_range_file;
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(FactsError::new(
                    PLUGIN_NAME,
                    format!("reading {}: {e}", path.display()),
                ))
            }
        };
        parse_ephemeral(&text).map(Some).ok_or_else(|| {
            FactsError::new(
                PLUGIN_NAME,
                format!(
                    "{}: expected two port numbers, found {:?}",
                    path.display(),
                    text.trim()
                ),
            )
        })
    }
}

/// Parses `ip_local_port_range` (`"32768\t60999\n"`).
fn parse_ephemeral(text: &str) -> Option<PortRange> {
    let mut it = text.split_whitespace().map(|t| t.parse::<u32>().ok());
    let (lo, hi) = (it.next()??, it.next()??);
    if it.next().is_some() {
        return None;
    }
    PortRange::try_new(lo, hi).ok()
}

#[async_trait]
impl HostFactsProvider for PortFactsProvider {
    fn name(&self) -> &'static str {
        PLUGIN_NAME
    }

    async fn collect(&self, facts: &mut HostFacts) -> Result<(), FactsError> {
        let ephemeral = self.read_ephemeral()?;
        let section = HostPortsFacts {
            range: self.range,
            reserved: self.reserved.clone(),
            ephemeral,
        };
        let overlap = section.ephemeral_overlap();
        // A host with no port to hand out must not look ready for placements.
        let usable = (self.range.lo()..=self.range.hi())
            .filter(|p| !overlap.is_some_and(|o| o.contains(*p)))
            .filter(|p| self.reserved.binary_search(p).is_err())
            .count();
        if usable == 0 {
            let ephemeral = ephemeral.map_or_else(|| "-".to_owned(), |e| e.to_string());
            return Err(FactsError::new(
                PLUGIN_NAME,
                format!(
                    "ports.range {} has no usable port: it lies inside the kernel's ephemeral range {ephemeral} ({}) or is reserved; move ports.range outside it (or narrow net.ipv4.ip_local_port_range)",
                    self.range,
                    self.ephemeral_range_file.display()
                ),
            ));
        }
        {
            let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
            if *warned != Some(overlap) {
                if let (Some(o), Some(e)) = (overlap, ephemeral) {
                    tracing::warn!(
                        range = %self.range,
                        ephemeral = %e,
                        overlap = %o,
                        excluded = o.len(),
                        "dynamic port range overlaps the kernel's ephemeral range; \
                         the overlap is not handed out"
                    );
                }
                *warned = Some(overlap);
            }
        }
        facts
            .sections
            .insert(PLUGIN_NAME.to_owned(), section.to_value());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    /// Parses `config` (TOML), writes `ephemeral` to the range file (unless `None`), and
    /// prints the provider's section or the error.
    fn check(config: &str, ephemeral: Option<&str>, expect: Expect) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ip_local_port_range");
        if let Some(text) = ephemeral {
            std::fs::write(&file, text).unwrap();
        }
        let config = format!(
            "{config}\nephemeral_range_file = {:?}\n",
            file.to_str().unwrap()
        );
        let out = match toml::from_str::<WorkerPortsConfig>(&config) {
            Err(e) => format!("config: {}", e.message()),
            Ok(cfg) => match PortFactsProvider::new(&cfg) {
                Err(e) => format!("invalid: {e}"),
                Ok(p) => {
                    let mut facts = HostFacts::default();
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    match rt.block_on(p.collect(&mut facts)) {
                        Err(e) => format!("collect: {e}"),
                        Ok(()) => {
                            let back = HostPortsFacts::from_facts(&facts).unwrap();
                            format!(
                                "{} overlap={:?}",
                                facts.sections[PLUGIN_NAME],
                                back.ephemeral_overlap().map(|o| o.to_string())
                            )
                        }
                    }
                }
            },
        };
        expect.assert_eq(&out.replace(dir.path().to_str().unwrap(), "/TMP"));
    }

    #[test]
    fn defaults() {
        check(
            "",
            Some("32768\t60999\n"),
            expect![[
                r#"{"ephemeral":[32768,60999],"range":[20000,32000],"reserved":[22,80]} overlap=None"#
            ]],
        );
    }

    #[test]
    fn overlap_and_missing_file() {
        check(
            "range = \"30000-40000\"\nreserved = [9100, 22, 9100]",
            Some("32768 60999"),
            expect![[
                r#"{"ephemeral":[32768,60999],"range":[30000,40000],"reserved":[22,9100]} overlap=Some("32768-40000")"#
            ]],
        );
        check(
            "reserved = []",
            None,
            expect![[r#"{"ephemeral":null,"range":[20000,32000],"reserved":[]} overlap=None"#]],
        );
    }

    /// A range wholly inside the ephemeral range (or reserved) leaves no port to hand
    /// out: the facts say so, instead of a ready host with 0 usable ports.
    #[test]
    fn a_range_with_no_usable_port_is_refused() {
        check(
            "range = \"40000-40010\"",
            Some("32768\t60999\n"),
            expect!["collect: ports: ports.range 40000-40010 has no usable port: it lies inside the kernel's ephemeral range 32768-60999 (/TMP/ip_local_port_range) or is reserved; move ports.range outside it (or narrow net.ipv4.ip_local_port_range)"],
        );
        check("range = \"9100-9101\"\nreserved = [9100, 9101]", None, expect!["collect: ports: ports.range 9100-9101 has no usable port: it lies inside the kernel's ephemeral range - (/TMP/ip_local_port_range) or is reserved; move ports.range outside it (or narrow net.ipv4.ip_local_port_range)"]);
    }

    #[test]
    fn bad_configs() {
        check(
            "range = \"32000-20000\"",
            None,
            expect![[
                r#"invalid: ports.range: invalid range "32000-20000": lower bound 32000 is above upper bound 20000"#
            ]],
        );
        check(
            "range = \"0-100\"",
            None,
            expect![[
                r#"invalid: ports.range: invalid range "0-100": port 0 is not between 1 and 65535"#
            ]],
        );
        check(
            "reserved = [22, 0]",
            None,
            expect![[r#"invalid: ports.reserved[1]: port 0 is not between 1 and 65535"#]],
        );
        check(
            "reserved = [70000]",
            None,
            expect![[r#"config: invalid value: integer `70000`, expected u16"#]],
        );
        check(
            "rnage = \"1-2\"",
            None,
            expect![[
                r#"config: unknown field `rnage`, expected one of `range`, `reserved`, `ephemeral_range_file`"#
            ]],
        );
        check(
            "",
            Some("garbage"),
            expect![[
                r#"collect: ports: /TMP/ip_local_port_range: expected two port numbers, found "garbage""#
            ]],
        );
    }

    #[test]
    fn facts_section_errors() {
        let cases = [
            serde_json::json!(null),
            serde_json::json!({"range": [20000, 32000], "reserved": [], "ephemeral": null}),
            serde_json::json!({"range": [0, 32000], "reserved": [], "ephemeral": null}),
            serde_json::json!({"range": [20000, 32000], "reserved": [0], "ephemeral": null}),
            serde_json::json!({"range": [20000, 32000], "reserved": [], "ephemeral": null, "x": 1}),
        ];
        let out: Vec<String> = cases
            .into_iter()
            .map(|v| {
                let mut facts = HostFacts::default();
                if !v.is_null() {
                    facts.sections.insert(PLUGIN_NAME.into(), v);
                }
                match HostPortsFacts::from_facts(&facts) {
                    Ok(f) => format!("ok {}", f.range),
                    Err(e) => e.to_string(),
                }
            })
            .collect();
        expect![[r#"
            sections.ports: missing: the worker reports no ports
            ok 20000-32000
            sections.ports: port 0 is not between 1 and 65535
            sections.ports.reserved[0]: port 0 is not between 1 and 65535
            sections.ports: unknown field `x`, expected one of `range`, `reserved`, `ephemeral`"#]]
        .assert_eq(&out.join("\n"));
    }
}
