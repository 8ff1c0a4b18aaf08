//! The commands that change a service: `submit`, `scale`, `restart` (each with
//! `--wait`), `stop`, and `status` that shows where a change stands.

use crate::cli::{ListFormat, WaitArgs};
use crate::client::{Answer, Client, Put};
use crate::endpoints::write_out;
use crate::error::{CliError, ErrorKind};
use crate::format;
use crate::model::ServiceDetail;
use crate::{json_line, rollout, Io};
use std::path::Path;

/// `service submit FILE`: `PUT /v1/services/{name}` with the name from the file, so the
/// same command creates and updates. A file without a usable name goes to
/// `POST /v1/services` instead, which answers with every problem of the profile (the
/// server validates; this client only needs a name for the path).
pub(crate) async fn submit(
    file: &Path,
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
    let result = match profile_name(&toml) {
        Some(name) => client.put(&name, toml).await,
        // POST only ever creates: its success is a 201.
        None => client.submit(toml).await.map(|a| (Put::Created, a)),
    };
    let (put, answer) = result.map_err(|e| match e.kind {
        ErrorKind::Invalid if !e.details.is_empty() => CliError {
            hint: Some(format!("fix {} and submit it again", file.display())),
            ..e
        },
        _ => e,
    })?;
    write_out(io, &format::submitted(put, &answer.value))?;
    then_wait(wait, client, io, answer).await
}

/// `service scale NAME N`.
pub(crate) async fn scale(
    name: &str,
    replicas: u32,
    wait: WaitArgs,
    client: &Client,
    io: &mut Io,
) -> Result<(), CliError> {
    let answer = client.scale(name, replicas).await?;
    write_out(io, &format::scaling(&answer.value))?;
    then_wait(wait, client, io, answer).await
}

/// `service restart NAME`.
pub(crate) async fn restart(
    name: &str,
    wait: WaitArgs,
    client: &Client,
    io: &mut Io,
) -> Result<(), CliError> {
    let answer = client.restart(name).await?;
    write_out(io, &format::restarting(&answer.value))?;
    then_wait(wait, client, io, answer).await
}

/// `service stop NAME [--now]`.
pub(crate) async fn stop(
    name: &str,
    now: bool,
    client: &Client,
    io: &mut Io,
) -> Result<(), CliError> {
    let answer = client.stop(name, now).await?;
    write_out(io, &format::stopped(&answer.value, now)).map(drop)
}

/// `service status NAME [-o table|json]`.
pub(crate) async fn status(
    name: &str,
    output: ListFormat,
    client: &Client,
    io: &mut Io,
) -> Result<(), CliError> {
    let answer = client.service(name, None).await?;
    let out = match output {
        ListFormat::Table => format::status(&answer.value),
        ListFormat::Json => json_line(&answer.raw),
    };
    write_out(io, &out).map(drop)
}

async fn then_wait(
    wait: WaitArgs,
    client: &Client,
    io: &mut Io,
    answer: Answer<ServiceDetail>,
) -> Result<(), CliError> {
    if !wait.wait {
        return Ok(());
    }
    // Follow the service the server named (the answer's name is authoritative).
    let name = answer.value.name.clone();
    rollout::follow(client, io, &name, answer, wait.timeout).await
}

/// `[service].name` of a TOML profile, if the text parses and the name is one the server
/// could accept (DESIGN §3: 1-63 chars of `[a-z0-9-]`, starting with a letter, ending
/// alphanumeric), so that it can go in a URL path.
fn profile_name(toml_text: &str) -> Option<String> {
    let doc: toml::Table = toml::from_str(toml_text).ok()?;
    let name = doc.get("service")?.as_table()?.get("name")?.as_str()?;
    let bytes = name.as_bytes();
    let valid = (1..=63).contains(&bytes.len())
        && bytes[0].is_ascii_lowercase()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    valid.then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn check(toml: &str, expect: Expect) {
        expect.assert_eq(&format!("{:?}", profile_name(toml)));
    }

    #[test]
    fn names_for_the_put_path() {
        check("[service]\nname = \"web\"\n", expect![[r#"Some("web")"#]]);
        check(
            "[service]\nname = \"web-2\"\nreplicas = 3\n",
            expect![[r#"Some("web-2")"#]],
        );
        // Everything else goes to POST, where the server lists the problems.
        check("[service]\nname = \"Web\"\n", expect!["None"]);
        check("[service]\nname = \"2web\"\n", expect!["None"]);
        check("[service]\nname = \"web-\"\n", expect!["None"]);
        check("[service]\nname = \"../x\"\n", expect!["None"]);
        check(
            &format!("[service]\nname = \"{}\"\n", "a".repeat(64)),
            expect!["None"],
        );
        check("[service]\nname = 7\n", expect!["None"]);
        check("[service]\nreplicas = 1\n", expect!["None"]);
        check("name = \"web\"\n", expect!["None"]);
        check("this is = = not toml", expect!["None"]);
    }
}
