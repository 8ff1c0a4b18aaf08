//! The commands that change a service: `submit`, `scale`, `restart` (each with
//! `--wait`), `stop`, and `status` that shows where a change stands.

use crate::cli::{ListFormat, WaitArgs};
use crate::client::{Answer, Client, Put, ServiceRef};
use crate::error::{CliError, ErrorKind};
use crate::format;
use crate::io::{json_line, write_out, Io};
use crate::model::ServiceDetail;
use crate::rollout;
use std::path::Path;

/// `service submit FILE`: `PUT /v1/services/{name}` with the name from the file, so the
/// same command creates and updates, and `?project=` with the file's project when it names
/// one. A file without a usable name goes to `POST /v1/services` instead, which answers
/// with every problem of the profile (the server validates; this client only needs a name
/// for the path).
///
/// The file decides the project. `--project P` only checks it: a file that names another
/// project, or none (the server's default, `default`), is refused before anything is sent.
/// The host's default project (`XCE_PROJECT`, the config file) is not used here.
pub(crate) async fn submit(
    file: &Path,
    project: Option<&str>,
    wait: WaitArgs,
    client: &Client,
    io: &mut Io,
) -> Result<(), CliError> {
    let toml = tokio::fs::read_to_string(file).await.map_err(|e| {
        CliError::new(
            ErrorKind::Invalid,
            format!("cannot read {}: {e}", file.display()),
        )
    })?;
    let target = profile_target(&toml);
    if let Some(flag) = project {
        check_project(file, flag, &target)?;
    }
    // The `?project=`: the project the file names (unless it cannot be one: the server
    // says so); else `--project`, which the check above found to agree with the file.
    let named_project = match &target.project {
        FileProject::Named(p) => plugin_api::check_name(p).is_ok().then_some(p.as_str()),
        FileProject::Absent | FileProject::Unreadable => project,
    };
    let result = match &target.name {
        Some(name) => {
            let svc = ServiceRef {
                name,
                project: named_project,
            };
            client.put(svc, toml).await
        }
        // POST only ever creates: its success is a 201.
        None => client.submit(toml).await.map(|a| (Put::Created, a)),
    };
    let (put, answer) = result.map_err(|e| match e.kind {
        ErrorKind::Invalid if !e.details.is_empty() => CliError {
            hint: Some(format!("fix {} and submit it again", file.display())),
            ..e
        },
        // Only a server that resolves the path's name before reading the profile could
        // say this; the file is what names the project.
        ErrorKind::Ambiguous if named_project.is_none() => CliError {
            hint: Some(format!(
                "name the project in {}: project = \"P\" in its [service] table",
                file.display()
            )),
            ..e
        },
        _ => e,
    })?;
    write_out(io, &format::submitted(put, &answer.value))?;
    then_wait(wait, named_project, client, io, answer).await
}

/// `--project P` of `submit` against the file: the same project, or a usage error.
fn check_project(file: &Path, flag: &str, target: &Target) -> Result<(), CliError> {
    let refuse = |message: String, hint: String| Err(CliError::usage(message).with_hint(hint));
    match &target.project {
        FileProject::Named(p) if p == flag => Ok(()),
        FileProject::Named(p) => refuse(
            format!(
                "--project {flag} does not match {}, which is for project {:?}",
                file.display(),
                p
            ),
            format!(
                "the file decides the project: drop --project, or change project in its [service] table to \"{flag}\""
            ),
        ),
        FileProject::Absent if flag == DEFAULT_PROJECT => Ok(()),
        FileProject::Absent => refuse(
            format!(
                "--project {flag} does not match {}, which names no project (so it is for project {DEFAULT_PROJECT:?})",
                file.display()
            ),
            format!(
                "the file decides the project: add project = \"{flag}\" to its [service] table, or drop --project"
            ),
        ),
        // Not TOML, or a project that is not a string: the server lists the problems.
        FileProject::Unreadable => Ok(()),
    }
}

/// The project of a profile that names none (docs/profile.md#service).
const DEFAULT_PROJECT: &str = "default";

/// `service scale NAME N`.
pub(crate) async fn scale(
    svc: ServiceRef<'_>,
    replicas: u32,
    wait: WaitArgs,
    client: &Client,
    io: &mut Io,
) -> Result<(), CliError> {
    let answer = client.scale(svc, replicas).await?;
    write_out(io, &format::scaling(&answer.value))?;
    then_wait(wait, svc.project, client, io, answer).await
}

/// `service restart NAME`.
pub(crate) async fn restart(
    svc: ServiceRef<'_>,
    wait: WaitArgs,
    client: &Client,
    io: &mut Io,
) -> Result<(), CliError> {
    let answer = client.restart(svc).await?;
    write_out(io, &format::restarting(&answer.value))?;
    then_wait(wait, svc.project, client, io, answer).await
}

/// `service stop NAME [--now]`.
pub(crate) async fn stop(
    svc: ServiceRef<'_>,
    now: bool,
    client: &Client,
    io: &mut Io,
) -> Result<(), CliError> {
    let answer = client.stop(svc, now).await?;
    write_out(io, &format::stopped(&answer.value, now)).map(drop)
}

/// `service stop NAME --wait`: blocking queries on the service until it is gone (404),
/// a progress line on stderr whenever the number of replicas left changes; exit 3 once
/// `timeout` has passed.
pub(crate) async fn until_gone(
    svc: ServiceRef<'_>,
    timeout: std::time::Duration,
    client: &Client,
    io: &mut Io,
) -> Result<(), CliError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let (mut index, mut left) = (0, None);
    loop {
        let wait = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .min(std::time::Duration::from_secs(30));
        let answer = match client.service(svc, Some((index, wait))).await {
            Err(e) if e.kind == ErrorKind::NotFound => {
                let line = format!("service {} is gone\n", svc.name);
                io.stderr.write_all(line.as_bytes()).map_err(CliError::io)?;
                return Ok(());
            }
            other => other?,
        };
        index = answer.index.unwrap_or(answer.value.index);
        let jobs = answer.value.jobs.len();
        if left != Some(jobs) {
            left = Some(jobs);
            let line = format!("service {} stopping: {jobs} replicas left\n", svc.name);
            io.stderr.write_all(line.as_bytes()).map_err(CliError::io)?;
            io.stderr.flush().map_err(CliError::io)?;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CliError::new(
                ErrorKind::Timeout,
                format!(
                    "service {} still has {jobs} replicas after {timeout:?}",
                    svc.name
                ),
            ));
        }
    }
}

/// `service status NAME [-o table|json]`.
pub(crate) async fn status(
    svc: ServiceRef<'_>,
    output: ListFormat,
    client: &Client,
    io: &mut Io,
) -> Result<(), CliError> {
    let answer =
        crate::client::read(io, Client::read_patience(), || client.service(svc, None)).await?;
    let out = match output {
        ListFormat::Table => format::status(&answer.value, std::time::SystemTime::now()),
        ListFormat::Json => json_line(&answer.raw),
    };
    write_out(io, &out).map(drop)
}

/// `--wait`: follows the service the server named (the answer's name is authoritative),
/// in the `project` the command picked or, without one, the project the answer reports.
async fn then_wait(
    wait: WaitArgs,
    project: Option<&str>,
    client: &Client,
    io: &mut Io,
    answer: Answer<ServiceDetail>,
) -> Result<(), CliError> {
    if !wait.wait {
        return Ok(());
    }
    let name = answer.value.name.clone();
    let svc = ServiceRef {
        name: &name,
        project,
    };
    rollout::follow(client, io, svc, answer, wait.timeout).await
}

/// What `submit` reads of a profile: the name for the path, and the project.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    /// `[service].name`, if usable in a path (a name the server could accept,
    /// [`plugin_api::check_name`]).
    name: Option<String>,
    project: FileProject,
}

/// `[service].project` of a profile.
#[derive(Debug, PartialEq, Eq)]
enum FileProject {
    /// A string (not necessarily a valid name: the server says so).
    Named(String),
    /// No `project` key: the server's default, `default`.
    Absent,
    /// Not TOML, no `[service]` table, or a `project` that is not a string.
    Unreadable,
}

/// The name and project of a TOML profile, as far as they can be read.
fn profile_target(toml_text: &str) -> Target {
    let doc = toml::from_str::<toml::Table>(toml_text).ok();
    let service = doc
        .as_ref()
        .and_then(|d| d.get("service"))
        .and_then(|s| s.as_table());
    let Some(service) = service else {
        return Target {
            name: None,
            project: FileProject::Unreadable,
        };
    };
    let name = service
        .get("name")
        .and_then(|n| n.as_str())
        .filter(|n| plugin_api::check_name(n).is_ok())
        .map(str::to_owned);
    let project = match service.get("project") {
        None => FileProject::Absent,
        Some(toml::Value::String(p)) => FileProject::Named(p.clone()),
        Some(_) => FileProject::Unreadable,
    };
    Target { name, project }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn check(toml: &str, expect: Expect) {
        let t = profile_target(toml);
        expect.assert_eq(&format!("{:?} {:?}", t.name, t.project));
    }

    #[test]
    fn names_and_projects_for_the_put() {
        check(
            "[service]\nname = \"web\"\n",
            expect![[r#"Some("web") Absent"#]],
        );
        check(
            "[service]\nname = \"web-2\"\nproject = \"team-a\"\nreplicas = 3\n",
            expect![[r#"Some("web-2") Named("team-a")"#]],
        );
        // Everything else goes to POST, where the server lists the problems.
        check("[service]\nname = \"Web\"\n", expect!["None Absent"]);
        check("[service]\nname = \"2web\"\n", expect!["None Absent"]);
        check("[service]\nname = \"web-\"\n", expect!["None Absent"]);
        check("[service]\nname = \"../x\"\n", expect!["None Absent"]);
        check(
            &format!("[service]\nname = \"{}\"\n", "a".repeat(64)),
            expect!["None Absent"],
        );
        check("[service]\nname = 7\n", expect!["None Absent"]);
        check("[service]\nreplicas = 1\n", expect!["None Absent"]);
        check("name = \"web\"\n", expect!["None Unreadable"]);
        check("this is = = not toml", expect!["None Unreadable"]);
        // A project that is not a valid name is still read (to compare with --project),
        // but never sent as `?project=`.
        check(
            "[service]\nname = \"web\"\nproject = \"Team A\"\n",
            expect![[r#"Some("web") Named("Team A")"#]],
        );
        check(
            "[service]\nname = \"web\"\nproject = 7\n",
            expect![[r#"Some("web") Unreadable"#]],
        );
    }

    #[test]
    fn project_flag_against_the_file() {
        let run = |toml: &str, flag: &str| match check_project(
            Path::new("web.toml"),
            flag,
            &profile_target(toml),
        ) {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("exit {}: {e}", e.exit_code()),
        };
        let actual = [
            run(
                "[service]\nname = \"web\"\nproject = \"team-a\"\n",
                "team-a",
            ),
            run(
                "[service]\nname = \"web\"\nproject = \"team-b\"\n",
                "team-a",
            ),
            run("[service]\nname = \"web\"\n", "team-a"),
            run("[service]\nname = \"web\"\n", "default"),
            run("not toml", "team-a"),
        ]
        .join("\n");
        expect![[r#"
            ok
            exit 2: error: --project team-a does not match web.toml, which is for project "team-b"
            hint: the file decides the project: drop --project, or change project in its [service] table to "team-a"
            exit 2: error: --project team-a does not match web.toml, which names no project (so it is for project "default")
            hint: the file decides the project: add project = "team-a" to its [service] table, or drop --project
            ok
            ok"#]].assert_eq(&actual);
    }
}
