//! Sorting a request that failed into a [`CliError`]: no answer at all
//! ([`transport_error`]), or an answer that is not a 2xx ([`status_error`], which reads the
//! apiserver's error body with `plugin_api::ErrorBody`).

use crate::error::{CliError, ErrorKind};
use plugin_api::{ErrorBody, FieldError};
use reqwest::{StatusCode, Url};
use std::time::Duration;

/// The pause between retries of a read answered 503 `no_leader` without `Retry-After`,
/// and the longest one honoured.
pub(crate) const NO_LEADER_RETRY: Duration = Duration::from_secs(1);
pub(crate) const NO_LEADER_RETRY_MAX: Duration = Duration::from_secs(5);

/// The URL without its query, as error messages name it.
pub(crate) fn without_query(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.to_string()
}

/// A request that got no HTTP answer (`skipped`: other apiservers that could not be
/// connected to first).
pub(crate) fn transport_error(url: &Url, err: &reqwest::Error, skipped: &[String]) -> CliError {
    // reqwest's own text is generic ("error sending request"); the innermost cause says
    // what happened ("Connection refused (os error 111)").
    let mut cause: &dyn std::error::Error = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    let url = without_query(url);
    if let Some(tls) = control_tls::client::explain(err, "--ca-file") {
        return CliError::new(
            ErrorKind::Unreachable,
            format!("cannot reach the apiserver at {url}: {tls}"),
        )
        .with_hint("the CA comes from --ca-file, XCE_CA_FILE or the config file's ca_file");
    }
    let message = if err.is_timeout() {
        format!("no answer from the apiserver at {url} in time")
    } else if err.is_connect() {
        format!("cannot reach the apiserver at {url}: {cause}")
    } else {
        format!("lost the connection to the apiserver at {url}: {cause}")
    };
    let message = if skipped.is_empty() {
        message
    } else {
        format!(
            "{message} (could not connect to {} either)",
            skipped.join(", ")
        )
    };
    CliError::new(ErrorKind::Unreachable, message).with_hint(
        "is the apiserver running (e.g. `xced dev`)? pass --api or set XCE_API to its url",
    )
}

/// A non-2xx answer.
/// What to ask for after a 403: a cluster-wide permission the message names (`host list`
/// needs `host.view`), or a project's.
fn forbidden_hint(message: &str) -> String {
    match ["host.view", "metrics.view"]
        .into_iter()
        .find(|p| message.contains(p))
    {
        Some(p) => format!(
            "your token lacks {p}, a cluster-wide permission: ask an admin for a grant \
             {{ permission = \"{p}\", projects = [\"*\"] }}"
        ),
        None => "your token lacks the permission on this project (e.g. job.submit); ask an admin"
            .to_owned(),
    }
}

pub(crate) fn status_error(url: &Url, status: StatusCode, body: &str) -> CliError {
    let answer = ErrorAnswer::read(status, body);
    match status {
        StatusCode::UNAUTHORIZED => CliError::new(
            ErrorKind::Auth,
            format!("not authenticated: {}", answer.message),
        )
        .with_hint("set XCE_TOKEN, pass --token, or run `xced dev` which writes the client config"),
        StatusCode::FORBIDDEN => CliError::new(
            ErrorKind::Forbidden,
            format!("forbidden: {}", answer.message),
        )
        .with_hint(forbidden_hint(&answer.message)),
        StatusCode::NOT_FOUND => not_found(url, answer.message),
        StatusCode::CONFLICT if answer.code == "ambiguous" => {
            ambiguous(&answer.message, answer.fields)
        }
        StatusCode::BAD_REQUEST
        | StatusCode::CONFLICT
        | StatusCode::PAYLOAD_TOO_LARGE
        | StatusCode::UNPROCESSABLE_ENTITY => invalid(status, answer),
        StatusCode::SERVICE_UNAVAILABLE if answer.code == "no_leader" => {
            let mut e = CliError::new(
                ErrorKind::Server,
                format!("no leader controller answers: {}", answer.message),
            )
            .with_hint("a controller takeover is under way, or no controller runs");
            e.no_leader = Some(NO_LEADER_RETRY);
            e
        }
        s => {
            let message = if s.is_server_error() {
                format!(
                    "the apiserver failed ({}) on {}",
                    s.as_u16(),
                    without_query(url)
                )
            } else {
                format!(
                    "unexpected answer {} from {}",
                    s.as_u16(),
                    without_query(url)
                )
            };
            let details = answer.detail_lines();
            CliError::new(ErrorKind::Server, format!("{message}: {}", answer.message))
                .with_details(details)
        }
    }
}

/// What an error answer said, read from the apiserver's error body when it has one.
struct ErrorAnswer {
    /// The server's message, else the status's reason (lowercase).
    message: String,
    /// The stable code; empty without an error body.
    code: String,
    /// The per-field problems.
    fields: Vec<FieldError>,
}

// === impl ErrorAnswer ===

impl ErrorAnswer {
    fn read(status: StatusCode, body: &str) -> Self {
        let parsed = ErrorBody::parse(body.as_bytes()).map(|b| b.error);
        let (message, code, fields) = match parsed {
            Some(e) => (e.message, e.code, e.details),
            None => (String::new(), String::new(), Vec::new()),
        };
        let message = Some(message).filter(|m| !m.is_empty()).unwrap_or_else(|| {
            status
                .canonical_reason()
                .unwrap_or("unknown status")
                .to_lowercase()
        });
        ErrorAnswer {
            message,
            code,
            fields,
        }
    }

    /// The problems as lines (`field: reason`, or the reason alone), without the one the
    /// message repeats: a one-problem error often repeats its only detail as its message.
    fn detail_lines(&self) -> Vec<String> {
        self.fields
            .iter()
            .map(|d| {
                if d.field.is_empty() {
                    d.reason.clone()
                } else {
                    format!("{}: {}", d.field, d.reason)
                }
            })
            .filter(|d| *d != self.message)
            .collect()
    }
}

/// 404: the hint says where we looked.
fn not_found(url: &Url, message: String) -> CliError {
    let hint = match query_project(url) {
        Some(p) => format!(
            "looked in project {p} only; `xcecli service list` shows the services you may view and their projects"
        ),
        None => "`xcecli service list` shows the services you may view".to_owned(),
    };
    CliError::new(ErrorKind::NotFound, message).with_hint(hint)
}

/// A request the apiserver refused as it is (400, 409, 413, 422), with its problems.
fn invalid(status: StatusCode, answer: ErrorAnswer) -> CliError {
    let details = answer.detail_lines();
    let answer_code = answer.code.clone();
    let err = CliError::new(ErrorKind::Invalid, answer.message).with_details(details);
    match status {
        // Stopping already: "stop it first" would say the opposite of the message.
        StatusCode::CONFLICT if answer_code == "stopping" => err.with_hint(
            "wait until it is gone (`xcecli service list` no longer shows it), then try again",
        ),
        StatusCode::CONFLICT => {
            err.with_hint("a service with this name exists: stop it first or choose another name")
        }
        StatusCode::PAYLOAD_TOO_LARGE => {
            err.with_hint("the request is larger than the apiserver accepts")
        }
        _ => err,
    }
}

/// The `?project=` a request carried.
fn query_project(url: &Url) -> Option<String> {
    url.query_pairs()
        .find(|(k, _)| k == "project")
        .map(|(_, v)| v.into_owned())
}

/// 409 `ambiguous`: the name exists in several of the caller's projects. The server's
/// message lists them and names its query parameter (`pick one with ?project=`); the
/// client says `--project` instead. A detail (`"team-a" has a service "web"`) is shown
/// only when the message does not already list its project.
fn ambiguous(server_message: &str, details: Vec<FieldError>) -> CliError {
    let message = match server_message.find("; pick one with") {
        Some(at) => &server_message[..at],
        None => server_message,
    };
    let listed: Vec<&str> = message
        .rsplit_once('(')
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(list, _)| list.split(',').map(str::trim).collect())
        .unwrap_or_default();
    let mut projects = Vec::new();
    let mut lines = Vec::new();
    for d in details {
        let project = (d.field == "project")
            .then(|| leading_quoted(&d.reason))
            .flatten();
        match project {
            Some(p) => {
                if !listed.contains(&p.as_str()) {
                    lines.push(format!("{}: {}", d.field, d.reason));
                }
                projects.push(p);
            }
            None if d.field.is_empty() => lines.push(d.reason),
            None => lines.push(format!("{}: {}", d.field, d.reason)),
        }
    }
    let example = projects
        .first()
        .map(String::as_str)
        .or(listed.first().copied())
        .filter(|p| !p.is_empty())
        .map(|p| format!(", e.g. --project {p}"))
        .unwrap_or_default();
    CliError::new(ErrorKind::Ambiguous, message)
        .with_details(lines)
        .with_hint(format!(
            "pick one with --project P (or set XCE_PROJECT){example}"
        ))
}

/// `team-a` of `"team-a" has a service "web"`.
fn leading_quoted(s: &str) -> Option<String> {
    let rest = s.strip_prefix('"')?;
    let (quoted, _) = rest.split_once('"')?;
    (!quoted.is_empty() && !quoted.contains('\\')).then(|| quoted.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn check_status(status: u16, body: &str, expect: Expect) {
        check_status_at(
            "http://127.0.0.1:7480/v1/services?x=1",
            status,
            body,
            expect,
        );
    }

    fn check_status_at(url: &str, status: u16, body: &str, expect: Expect) {
        let url = Url::parse(url).unwrap();
        let err = status_error(&url, StatusCode::from_u16(status).unwrap(), body);
        expect.assert_eq(&format!("exit {}: {err}", err.exit_code()));
    }

    #[test]
    fn statuses() {
        check_status(
            401,
            r#"{"error":{"code":"unauthenticated","message":"invalid bearer token","details":[]}}"#,
            expect![[r#"
                exit 5: error: not authenticated: invalid bearer token
                hint: set XCE_TOKEN, pass --token, or run `xced dev` which writes the client config"#]],
        );
        check_status(
            404,
            r#"{"error":{"code":"not_found","message":"service \"web\" not found","details":[]}}"#,
            expect![[r#"
                exit 4: error: service "web" not found
                hint: `xcecli service list` shows the services you may view"#]],
        );
        check_status(
            400,
            r#"{"error":{"code":"invalid","message":"invalid service profile","details":[
                {"field":"service.ports[1].name","reason":"duplicate port name \"http\""},
                {"field":"service.ports[0].port","reason":"must be 1-65535"}]}}"#,
            expect![[r#"
                exit 1: error: invalid service profile
                  service.ports[1].name: duplicate port name "http"
                  service.ports[0].port: must be 1-65535"#]],
        );
        check_status(
            403,
            r#"{"error":{"code":"forbidden","message":"job.submit on project team-a required","details":[]}}"#,
            expect![[r#"
                exit 1: error: forbidden: job.submit on project team-a required
                hint: your token lacks the permission on this project (e.g. job.submit); ask an admin"#]],
        );
        check_status(
            403,
            r#"{"error":{"code":"forbidden","message":"GET /v1/hosts needs the permission host.view (or admin), which \"alice\" does not hold","details":[]}}"#,
            expect![[r#"
                exit 1: error: forbidden: GET /v1/hosts needs the permission host.view (or admin), which "alice" does not hold
                hint: your token lacks host.view, a cluster-wide permission: ask an admin for a grant { permission = "host.view", projects = ["*"] }"#]],
        );
        check_status(
            409,
            r#"{"error":{"code":"conflict","message":"service \"web\" exists","details":[]}}"#,
            expect![[r#"
                exit 1: error: service "web" exists
                hint: a service with this name exists: stop it first or choose another name"#]],
        );
        check_status(
            409,
            r#"{"error":{"code":"stopping","message":"service \"web\" is stopping; change or submit it again once it is gone","details":[]}}"#,
            expect![[r#"
                exit 1: error: service "web" is stopping; change or submit it again once it is gone
                hint: wait until it is gone (`xcecli service list` no longer shows it), then try again"#]],
        );
        check_status_at(
            "http://127.0.0.1:7480/v1/services/web?project=team-a",
            404,
            r#"{"error":{"code":"not_found","message":"service \"web\" not found","details":[]}}"#,
            expect![[r#"
                exit 4: error: service "web" not found
                hint: looked in project team-a only; `xcecli service list` shows the services you may view and their projects"#]],
        );
        check_status(
            409,
            r#"{"error":{"code":"ambiguous","message":"service \"web\" exists in several of your projects (team-a, team-b); pick one with ?project=","details":[
                {"field":"project","reason":"\"team-a\" has a service \"web\""},
                {"field":"project","reason":"\"team-b\" has a service \"web\""}]}}"#,
            expect![[r#"
                exit 1: error: service "web" exists in several of your projects (team-a, team-b)
                hint: pick one with --project P (or set XCE_PROJECT), e.g. --project team-a"#]],
        );
        // Worded otherwise: the details carry the projects, the hint still an example.
        check_status(
            409,
            r#"{"error":{"code":"ambiguous","message":"service \"web\" is ambiguous","details":[
                {"field":"project","reason":"\"team-b\" has a service \"web\""},
                {"field":"project","reason":"\"team-c\" has a service \"web\""}]}}"#,
            expect![[r#"
                exit 1: error: service "web" is ambiguous
                  project: "team-b" has a service "web"
                  project: "team-c" has a service "web"
                hint: pick one with --project P (or set XCE_PROJECT), e.g. --project team-b"#]],
        );
        check_status(
            409,
            r#"{"error":{"code":"ambiguous","message":"service \"web\" exists in several of your projects","details":[]}}"#,
            expect![[r#"
                exit 1: error: service "web" exists in several of your projects
                hint: pick one with --project P (or set XCE_PROJECT)"#]],
        );
        check_status(
            502,
            "<html>bad gateway</html>",
            expect!["exit 1: error: the apiserver failed (502) on http://127.0.0.1:7480/v1/services: bad gateway"],
        );
    }
}
