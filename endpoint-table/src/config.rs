//! The table's configuration (the host reads it from its TOML file, e.g. under
//! `[endpoints]`, and passes it in).

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Limits and defaults of the endpoint REST surfaces.
///
/// ```toml
/// max_watchers = 20000
/// max_watchers_per_principal = 2000
/// stream_buffer = 64
/// all_stream_buffer = 4096
/// default_wait = "5m"
/// max_wait = "10m"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TableConfig {
    /// Watchers (blocking queries while they wait, and streams) allowed at once, in all.
    pub max_watchers: usize,
    /// Watchers allowed at once for one principal.
    pub max_watchers_per_principal: usize,
    /// How many changes of its service a stream client may fall behind (changes not yet
    /// written to it) before it is disconnected; it resumes with `Last-Event-ID`.
    pub stream_buffer: u64,
    /// How many changes (of all the services it follows) an all-services stream
    /// (`GET /v1/endpoints/stream`) may fall behind before it is disconnected. The
    /// apiserver remembers twice as many changes, which is how far back `Last-Event-ID`
    /// resumes without a reset.
    pub all_stream_buffer: u64,
    /// How long a blocking query waits when it names no `wait`.
    #[serde(with = "humantime_serde")]
    pub default_wait: Duration,
    /// The longest a blocking query waits, whatever it asks for.
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
}

impl Default for TableConfig {
    fn default() -> Self {
        Self {
            max_watchers: 20_000,
            max_watchers_per_principal: 2_000,
            stream_buffer: 64,
            all_stream_buffer: 4096,
            default_wait: Duration::from_secs(5 * 60),
            max_wait: Duration::from_secs(10 * 60),
        }
    }
}

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `default_wait` is longer than `max_wait`.
    #[error("default_wait ({default}) is longer than max_wait ({max})")]
    WaitAboveMax {
        /// `default_wait`, formatted.
        default: String,
        /// `max_wait`, formatted.
        max: String,
    },
    /// A limit is zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
}

impl TableConfig {
    /// Checks the configuration as a whole.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.default_wait > self.max_wait {
            return Err(ConfigError::WaitAboveMax {
                default: humantime::format_duration(self.default_wait).to_string(),
                max: humantime::format_duration(self.max_wait).to_string(),
            });
        }
        for (name, value) in [
            ("max_watchers", self.max_watchers as u64),
            (
                "max_watchers_per_principal",
                self.max_watchers_per_principal as u64,
            ),
            ("stream_buffer", self.stream_buffer),
            ("all_stream_buffer", self.all_stream_buffer),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn check(toml_text: &str, expect: Expect) {
        let got = match toml::from_str::<TableConfig>(toml_text) {
            Err(e) => format!("parse error: {}", e.message()),
            Ok(cfg) => match cfg.check() {
                Ok(()) => format!("{cfg:?}"),
                Err(e) => format!("invalid: {e}"),
            },
        };
        expect.assert_eq(&got);
    }

    #[test]
    fn config() {
        check(
            "",
            expect!["TableConfig { max_watchers: 20000, max_watchers_per_principal: 2000, stream_buffer: 64, all_stream_buffer: 4096, default_wait: 300s, max_wait: 600s }"],
        );
        check(
            "max_watchers = 5\ndefault_wait = \"30s\"\nmax_wait = \"1m\"",
            expect!["TableConfig { max_watchers: 5, max_watchers_per_principal: 2000, stream_buffer: 64, all_stream_buffer: 4096, default_wait: 30s, max_wait: 60s }"],
        );
        check(
            "default_wait = \"20m\"",
            expect![[r#"invalid: default_wait (20m) is longer than max_wait (10m)"#]],
        );
        check(
            "stream_buffer = 0",
            expect![[r#"invalid: stream_buffer must be at least 1"#]],
        );
        check(
            "max_wait = \"soon\"",
            expect![[r#"parse error: invalid value: string "soon", expected a duration"#]],
        );
        check(
            "maxwait = \"1m\"",
            expect!["parse error: unknown field `maxwait`, expected one of `max_watchers`, `max_watchers_per_principal`, `stream_buffer`, `all_stream_buffer`, `default_wait`, `max_wait`"],
        );
    }
}
