//! `xced token new`: a fresh token for the tokens file (docs/rbac.md).

use anyhow::{Context, Result};
use plugin_api::Permission;
use xce_serve::auth::{random_secret, Grant, Key, Tokens, UserToken};

/// `xced token ...`
#[derive(Debug, clap::Subcommand)]
pub(crate) enum TokenCmd {
    /// Print a fresh random secret (256 bits from the OS) and the `[[token]]` entry, with
    /// its `secret_sha256`, to paste into the tokens file; then SIGHUP the daemons.
    New {
        /// The principal the token authenticates as (logs, the audit log).
        #[arg(long, default_value = "user")]
        principal: String,
        /// Grants, comma-separated `PERMISSION:PROJECT` (`job.view`, `job.submit`,
        /// `admin`, and the cluster-wide `metrics.view`, `host.view` on `*`; project `*` =
        /// all), e.g. `--grant job.view:team-a,job.submit:team-a`.
        /// Repeatable.
        #[arg(long, value_delimiter = ',')]
        grant: Vec<String>,
    },
}

pub(crate) fn run(cmd: TokenCmd) -> Result<()> {
    match cmd {
        TokenCmd::New { principal, grant } => {
            let grants = grants(&grant)?;
            let secret = random_secret()
                .map_err(|e| anyhow::anyhow!("reading random bytes from the OS: {e}"))?;
            let entry = UserToken {
                key: Key::Sha256(secret.digest()),
                principal,
                grants,
            };
            // Checked as the file will be, so what is printed loads.
            let tokens = Tokens::new(vec![entry], Vec::new()).context("invalid token")?;
            let entry = &tokens.users()[0];
            println!("# The secret: give it to its user (XCE_TOKEN, or `token` in the client");
            println!("# config); it is not stored anywhere, and cannot be shown again.");
            println!("# secret: {}", secret.expose());
            println!("#");
            println!(
                "# Paste into the tokens file, then `kill -HUP` the controller and apiservers:"
            );
            print!("{}", entry_toml(entry));
            debug_assert_eq!(
                Tokens::parse(&entry_toml(entry)).ok().as_ref(),
                Some(&tokens)
            );
            Ok(())
        }
    }
}

/// The entry in the tokens file's usual layout (grants inline, as in the docs).
fn entry_toml(entry: &UserToken) -> String {
    let quote = |s: &str| toml::Value::String(s.to_owned()).to_string();
    let grants: Vec<String> = entry
        .grants
        .iter()
        .map(|g| {
            let permission = serde_json::to_value(g.permission)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let projects: Vec<String> = g.projects.iter().map(|p| quote(p)).collect();
            format!(
                "{{ permission = {}, projects = [{}] }}",
                quote(&permission),
                projects.join(", ")
            )
        })
        .collect();
    format!(
        "[[token]]\nsecret_sha256 = {}\nprincipal = {}\ngrants = [ {} ]\n",
        quote(&entry.key.digest().to_hex()),
        quote(&entry.principal),
        grants.join(",\n           ")
    )
}

/// `PERMISSION:PROJECT` pairs, one grant per permission (its projects in order).
fn grants(specs: &[String]) -> Result<Vec<Grant>> {
    let mut grants: Vec<Grant> = Vec::new();
    for spec in specs {
        let (perm, project) = spec.split_once(':').with_context(|| {
            format!("--grant {spec:?}: expected PERMISSION:PROJECT, e.g. job.view:team-a")
        })?;
        let permission: Permission = serde_json::from_value(serde_json::Value::String(
            perm.trim().to_owned(),
        ))
        .map_err(|_| {
            anyhow::anyhow!(
                "--grant {spec:?}: unknown permission {perm:?}, expected job.view, job.submit, admin, metrics.view or host.view"
            )
        })?;
        let project = project.trim();
        if project.is_empty() {
            anyhow::bail!("--grant {spec:?}: the project is empty (use * for all)");
        }
        if permission.cluster_wide() && project != "*" {
            anyhow::bail!(
                "--grant {spec:?}: {} is cluster-wide: grant it on * ({}:*)",
                permission.name(),
                permission.name()
            );
        }
        match grants.iter_mut().find(|g| g.permission == permission) {
            Some(g) => g.projects.push(project.to_owned()),
            None => grants.push(Grant {
                permission,
                projects: vec![project.to_owned()],
            }),
        }
    }
    Ok(grants)
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_api::Authenticator as _;

    #[test]
    fn the_printed_entry_loads_as_the_token() {
        let entry = UserToken {
            key: Key::Sha256(xce_serve::auth::Digest::of("carol-example-secret")),
            principal: "carol \"c\"".into(),
            grants: grants(&["job.view:team-a".into(), "admin:*".into()]).unwrap(),
        };
        let text = entry_toml(&entry);
        expect_test::expect![[r#"
            [[token]]
            secret_sha256 = "5c8bf079e40c961a216993d4b1c894b78f09f324aef4ef231db1b09d8f1f8fc3"
            principal = 'carol "c"'
            grants = [ { permission = "job.view", projects = ["team-a"] },
                       { permission = "admin", projects = ["*"] } ]
        "#]]
        .assert_eq(&text);
        let t = Tokens::parse(&text).unwrap();
        assert_eq!(t.users(), &[entry]);
        assert!(t.authenticate(Some("carol-example-secret")).is_ok());
    }

    #[test]
    fn grants_are_grouped_by_permission_and_checked() {
        let g = grants(&[
            "job.view:team-a".into(),
            "job.submit:team-a".into(),
            "job.view:team-b".into(),
        ])
        .unwrap();
        expect_test::expect![[r#"
            [
                Grant {
                    permission: JobView,
                    projects: [
                        "team-a",
                        "team-b",
                    ],
                },
                Grant {
                    permission: JobSubmit,
                    projects: [
                        "team-a",
                    ],
                },
            ]
        "#]]
        .assert_debug_eq(&g);
        for (bad, why) in [
            ("job.view", "expected PERMISSION:PROJECT"),
            ("job.delete:a", "unknown permission"),
            ("admin:", "the project is empty"),
        ] {
            let e = grants(&[bad.into()]).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
