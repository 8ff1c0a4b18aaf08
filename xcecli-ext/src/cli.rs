//! The command line of `xcecli service …` and `xcecli host …` (docs/cli.md), as clap types
//! the binary embeds. Global flags (`--api`, `--token`, the config file) are the binary's,
//! and so is the default of `--project` (`XCE_PROJECT`, the config file's `project`), which
//! it passes in as [`ClientConfig::project`](crate::ClientConfig::project).

use clap::builder::NonEmptyStringValueParser;
use std::path::PathBuf;
use std::time::Duration;

/// The client's subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Submit, change, list and stop services, and read their endpoints
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Show exec hosts; cordon, drain and uncordon them
    #[command(subcommand)]
    Host(HostCommand),
}

/// `xcecli service …`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ServiceCommand {
    /// Create a service from a profile (TOML), or update it (a rollout)
    Submit {
        /// The profile file, e.g. examples/web.toml
        file: PathBuf,
        /// Refuse (exit 2) unless the file is for project P (its `project` in `[service]`,
        /// or `default` without one): the file decides where the service goes, this checks it
        #[arg(long, value_name = "P", value_parser = NonEmptyStringValueParser::new())]
        project: Option<String>,
        /// `--wait [--timeout]`
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Set the number of replicas of a service
    Scale {
        /// The service name
        name: String,
        /// The new number of replicas
        replicas: u32,
        /// `--project P`
        #[command(flatten)]
        project: ProjectArg,
        /// `--wait [--timeout]`
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Roll every replica of a service over to a fresh one (same profile, new generation)
    Restart {
        /// The service name
        name: String,
        /// `--project P`
        #[command(flatten)]
        project: ProjectArg,
        /// `--wait [--timeout]`
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Show a service's rollout, replicas, and why and when each last ended (restarts, log paths)
    Status {
        /// The service name
        name: String,
        /// `--project P`
        #[command(flatten)]
        project: ProjectArg,
        /// Output format
        #[arg(short = 'o', long = "output", value_enum, default_value_t = ListFormat::Table)]
        output: ListFormat,
    },
    /// List the services you may view, with their ready counts
    List {
        /// Output format
        #[arg(short = 'o', long = "output", value_enum, default_value_t = ListFormat::Table)]
        output: ListFormat,
    },
    /// Stop all replicas of a service (each drains first)
    Stop {
        /// The service name
        name: String,
        /// `--project P`
        #[command(flatten)]
        project: ProjectArg,
        /// Skip the drain: replicas leave the endpoint and get SIGTERM at once
        #[arg(long)]
        now: bool,
        /// Wait until the service is gone (every replica drained and exited), printing how
        /// many replicas are left on stderr as that changes; exit 3 after --timeout
        #[arg(long)]
        wait: bool,
        /// How long --wait waits, e.g. 90s, 15m
        #[arg(long, value_name = "DURATION", value_parser = parse_duration,
              default_value = "10m", requires = "wait")]
        timeout: Duration,
    },
    /// Print the endpoints (address:port) of a service's ready replicas
    Endpoints(EndpointsArgs),
}

/// `xcecli host …`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum HostCommand {
    /// List exec hosts with their addresses and port usage
    List {
        /// Output format
        #[arg(short = 'o', long = "output", value_enum, default_value_t = ListFormat::Table)]
        output: ListFormat,
    },
    /// Stop new placements on a host; what runs there stays (admin)
    Cordon {
        /// The host id, e.g. exec-02
        name: String,
    },
    /// Let a cordoned or drained host take placements again (admin)
    Uncordon {
        /// The host id
        name: String,
    },
    /// Cordon a host and move every replica off it: each replacement is placed elsewhere
    /// and ready before the replica it replaces drains (admin)
    Drain {
        /// The host id
        name: String,
        /// Wait until no replica is left on the host (exit 0) or --timeout runs out (exit
        /// 3); progress lines (replicas left, per service) go to stderr
        #[arg(long)]
        wait: bool,
        /// How long --wait waits, e.g. 90s, 15m
        #[arg(long, value_name = "DURATION", value_parser = parse_duration,
              default_value = "10m", requires = "wait")]
        timeout: Duration,
    },
}

/// `xcecli service endpoints NAME …`.
#[derive(Debug, Clone, clap::Args)]
pub struct EndpointsArgs {
    /// The service name
    pub name: String,
    /// `--project P`
    #[command(flatten)]
    pub project: ProjectArg,
    /// Keep only this port (by name)
    #[arg(long, value_name = "P")]
    pub port: Option<String>,
    /// Output format [default: table on a terminal; otherwise plain when the service has
    /// one port or --port is given, else json]
    #[arg(short = 'o', long = "output", value_enum)]
    pub output: Option<EndpointFormat>,
    /// Also show replicas that are placed but not ready (table and json)
    #[arg(long)]
    pub all: bool,
    /// Keep running and print the list again on every change, until interrupted; a
    /// service that does not exist yet is waited for, one that goes away is an empty list
    #[arg(long)]
    pub watch: bool,
    /// With --watch: run CMD (sh -c) with the list on stdin, initially and on every change
    #[arg(long, value_name = "CMD", requires = "watch")]
    pub exec: Option<String>,
    /// Wait until at least N replicas are ready, then print them (N above the service's
    /// replica count is a usage error)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub wait_ready: Option<u32>,
    /// Give up --wait-ready after DURATION (exit 3), or end --watch after it (exit 0),
    /// e.g. 30s, 2m
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
}

/// `--project P` of the commands that name a service (all but `submit`, whose file names
/// the project, and `list`).
///
/// A name resolves among the projects the caller may view; `P` picks one, and is needed
/// when the name exists in several of them (the apiserver answers 409 `ambiguous`). When
/// absent, the host's default applies ([`ClientConfig::project`]).
///
/// [`ClientConfig::project`]: crate::ClientConfig::project
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct ProjectArg {
    /// The project of the service, needed when the name exists in several of your
    /// projects [default: $XCE_PROJECT, else the config file's `project`]
    #[arg(long, value_name = "P", value_parser = NonEmptyStringValueParser::new())]
    pub project: Option<String>,
}

/// `--wait [--timeout DURATION]` of the commands that change a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct WaitArgs {
    /// Follow the rollout until it is complete (exit 0), failed or reverted (exit 6), or
    /// --timeout runs out (exit 3); progress lines go to stderr
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits, e.g. 90s, 15m
    #[arg(long, value_name = "DURATION", value_parser = parse_duration,
          default_value = "10m", requires = "wait")]
    pub timeout: Duration,
}

/// Output formats of `service endpoints`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EndpointFormat {
    /// Aligned columns for people
    Table,
    /// The REST entry as the apiserver sent it
    Json,
    /// One address:port line per ready replica, for one port
    Plain,
    /// `XCE_ENDPOINTS_<PORT>=addr:port,...` lines for eval
    Env,
}

/// Output formats of the list commands and `service status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ListFormat {
    /// Aligned columns for people
    Table,
    /// The REST answer as the apiserver sent it
    Json,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 30s, 2m, 1h)"))
}
