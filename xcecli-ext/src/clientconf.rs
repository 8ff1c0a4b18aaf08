//! The `xcecli` client config file: where it lives and what it holds. `xced dev` writes
//! it; `xcecli` reads it. The binaries pass the environment in; nothing here reads it.

use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::path::PathBuf;

/// `xcecli.toml`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ClientFile {
    /// Apiserver base URL, or several comma-separated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<String>,
    /// Bearer token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The CA certificate(s) (PEM) that an `https://` apiserver's certificate is signed
    /// by; the system's roots without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// The project service commands name when neither `--project` nor `XCE_PROJECT` is
    /// given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

impl std::fmt::Debug for ClientFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientFile")
            .field("api", &self.api)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_file", &self.ca_file)
            .field("project", &self.project)
            .finish()
    }
}

/// The client config path: `$XCE_CONFIG`, else `$XDG_CONFIG_HOME/xce/xcecli.toml`, else
/// `$HOME/.config/xce/xcecli.toml`.
pub fn default_path(
    xce_config: Option<OsString>,
    xdg_config_home: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    let nonempty = |v: Option<OsString>| v.filter(|s| !s.is_empty());
    if let Some(p) = nonempty(xce_config) {
        return Some(PathBuf::from(p));
    }
    let base = nonempty(xdg_config_home)
        .map(PathBuf::from)
        .or_else(|| nonempty(home).map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("xce").join("xcecli.toml"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_precedence() {
        let s = |v: &str| Some(OsString::from(v));
        assert_eq!(
            default_path(s("/c.toml"), s("/x"), s("/h")),
            Some(PathBuf::from("/c.toml"))
        );
        assert_eq!(
            default_path(None, s("/x"), s("/h")),
            Some(PathBuf::from("/x/xce/xcecli.toml"))
        );
        assert_eq!(
            default_path(s(""), None, s("/h")),
            Some(PathBuf::from("/h/.config/xce/xcecli.toml"))
        );
        assert_eq!(default_path(None, None, None), None);
    }

    #[test]
    fn debug_redacts_the_token() {
        let f = ClientFile {
            api: None,
            token: Some("sekrit".into()),
            ca_file: None,
            project: None,
        };
        assert!(!format!("{f:?}").contains("sekrit"));
    }
}
