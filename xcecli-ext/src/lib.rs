//! `xcecli-ext`: the client side of `xcecli` — `service
//! submit|scale|restart|status|list|stop|endpoints` and `host list|cordon|uncordon|drain`
//! (docs/cli.md): the REST
//! client, the output formats, `--wait` (rollouts), `--watch` and `--wait-ready`.
//!
//! The binary (`xcecli`, in the `xced` crate) parses its global flags, the config file
//! (whose shape and default path are [`clientconf`]'s) and the environment, then hands this crate everything it needs: a [`ClientConfig`] (api URL,
//! token, default project) and an [`Io`] (writers, whether they are terminals). This crate
//! never reads the environment, the terminal state, config files or the home directory
//! itself.
//!
//! ```no_run
//! # async fn demo() {
//! use clap::Parser;
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(subcommand)]
//!     command: xcecli_ext::Command,
//! }
//! let cli = Cli::parse();
//! let config = xcecli_ext::ClientConfig {
//!     api: "http://127.0.0.1:7480".into(),
//!     ca_file: None,
//!     token: None,
//!     project: None,
//! };
//! let mut io = xcecli_ext::Io::new(
//!     Box::new(std::io::stdout()), Box::new(std::io::stderr()), false, false);
//! let code = xcecli_ext::execute(cli.command, config, &mut io).await;
//! std::process::exit(code);
//! # }
//! ```
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod cli;
mod client;
pub mod clientconf;
mod endpoints;
mod error;
mod format;
mod host;
mod http_error;
mod io;
mod model;
mod rollout;
mod service;

pub use cli::{
    Command, EndpointFormat, EndpointsArgs, HostCommand, ListFormat, ProjectArg, ServiceCommand,
    WaitArgs,
};
pub use client::{Client, ClientConfig};
pub use error::{CliError, ErrorKind};
pub use io::Io;

use client::ServiceRef;
use io::{json_line, write_out};
use std::io::Write;

/// Runs one command against the apiserver. Results go to `io.stdout`; warnings and
/// progress to `io.stderr`. The error is returned, not printed: print it with its
/// `Display` and exit with [`CliError::exit_code`] (or let [`execute`] do both).
///
/// `--watch` runs until `--timeout` (if given) or until the future is dropped; `--wait`
/// until the rollout ends or its `--timeout` (default 10m) runs out.
pub async fn run(cmd: Command, client: &Client, io: &mut Io) -> Result<(), CliError> {
    match cmd {
        Command::Service(ServiceCommand::Endpoints(args)) => endpoints::run(args, client, io).await,
        Command::Service(ServiceCommand::List { output }) => {
            let answer = client::read(io, Client::read_patience(), || client.services()).await?;
            let out = match output {
                ListFormat::Table => format::service_list(&answer.value),
                ListFormat::Json => json_line(&answer.raw),
            };
            write_out(io, &out).map(drop)
        }
        Command::Service(ServiceCommand::Submit {
            file,
            project,
            wait,
        }) => service::submit(&file, project.as_deref(), wait, client, io).await,
        Command::Service(ServiceCommand::Scale {
            name,
            replicas,
            project,
            wait,
        }) => service::scale(named(&name, &project, client), replicas, wait, client, io).await,
        Command::Service(ServiceCommand::Restart {
            name,
            project,
            wait,
        }) => service::restart(named(&name, &project, client), wait, client, io).await,
        Command::Service(ServiceCommand::Status {
            name,
            project,
            output,
        }) => service::status(named(&name, &project, client), output, client, io).await,
        Command::Service(ServiceCommand::Stop {
            name,
            project,
            now,
            wait,
            timeout,
        }) => {
            let svc = named(&name, &project, client);
            service::stop(svc, now, client, io).await?;
            match wait {
                true => service::until_gone(svc, timeout, client, io).await,
                false => Ok(()),
            }
        }
        Command::Host(HostCommand::List { output }) => {
            let answer = client::read(io, Client::read_patience(), || client.hosts()).await?;
            let out = match output {
                ListFormat::Table => {
                    // On stderr: the table on stdout stays as scripts parse it (the JSON
                    // form carries `cluster` as a field).
                    if let Some(cluster) = &answer.value.cluster {
                        writeln!(io.stderr, "cluster: {cluster}").map_err(CliError::io)?;
                    }
                    format::host_list(&answer.value)
                }
                ListFormat::Json => json_line(&answer.raw),
            };
            write_out(io, &out).map(drop)
        }
        Command::Host(HostCommand::Cordon { name }) => host::act(&name, "cordon", client, io).await,
        Command::Host(HostCommand::Uncordon { name }) => {
            host::act(&name, "uncordon", client, io).await
        }
        Command::Host(HostCommand::Drain {
            name,
            wait,
            timeout,
        }) => {
            host::act(&name, "drain", client, io).await?;
            match wait {
                true => host::until_drained(&name, timeout, client, io).await,
                false => Ok(()),
            }
        }
    }
}

/// Builds the client, runs `cmd`, prints any error on `io.stderr`, and returns the exit
/// code listed in docs/cli.md (0 on success).
pub async fn execute(cmd: Command, config: ClientConfig, io: &mut Io) -> i32 {
    let result = match Client::new(config) {
        Ok(client) => run(cmd, &client, io).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            // Nothing better to do if stderr itself is broken.
            let _ = writeln!(io.stderr, "{e}");
            let _ = io.stderr.flush();
            e.exit_code()
        }
    }
}

/// The service a command names: `--project`, else the client's default project, else
/// none (the apiserver resolves the name among the caller's projects).
fn named<'a>(name: &'a str, project: &'a ProjectArg, client: &'a Client) -> ServiceRef<'a> {
    ServiceRef {
        name,
        project: project.project.as_deref().or(client.project()),
    }
}
