//! `xcecli`: the xce command line. It resolves the global settings (flags, then the
//! environment, then the client config file; for the default project of the service
//! commands `XCE_PROJECT`, then the file) and hands the subcommand to `xcecli-ext`,
//! which owns the client, the formats and the exit codes.

use clap::{CommandFactory, Parser, Subcommand};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use xcecli_ext::clientconf::{self, ClientFile};
use xcecli_ext::{CliError, Client, ClientConfig, ErrorKind, Io};

const DEFAULT_API: &str = "http://127.0.0.1:7480";

/// What this binary is: the version and the commit `build.rs` found.
const BUILD: xce_wire::version::Build = xce_wire::version::Build {
    version: env!("CARGO_PKG_VERSION"),
    commit: env!("XCE_COMMIT"),
};

/// Talk to an xce apiserver.
#[derive(Debug, Parser)]
#[command(
    name = "xcecli",
    version = xce_wire::version::init(BUILD),
    about = "Submit services and read their endpoints from an xce cluster"
)]
struct Cli {
    /// Apiserver base URL, or several comma-separated (one that cannot be connected to is
    /// skipped for the next) [default: the config file's `api`, else http://127.0.0.1:7480].
    #[arg(long, global = true, env = "XCE_API")]
    api: Option<String>,
    /// CA certificate(s) (PEM) that an https:// apiserver's certificate must be signed by
    /// [default: the config file's `ca_file`, else the system's roots].
    #[arg(long, global = true, env = "XCE_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Bearer token [default: the config file's `token`].
    #[arg(long, global = true, env = "XCE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Client config file [default: $XCE_CONFIG, else ~/.config/xce/xcecli.toml].
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// The project of the service commands, before the command (`xcecli --project P
    /// service stop web`); a command's own `--project` wins [default: $XCE_PROJECT, else
    /// the config file's `project`].
    #[arg(long = "project", value_name = "P", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    project: Option<String>,
    #[command(subcommand)]
    cmd: Top,
}

#[derive(Debug, Subcommand)]
enum Top {
    #[command(flatten)]
    Ext(xcecli_ext::Command),
    /// Print shell completions.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

fn main() -> ExitCode {
    // Before any request: the client compares its own with the server's version.
    xce_wire::version::init(BUILD);
    let cli = Cli::parse();
    let cmd = match cli.cmd {
        Top::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "xcecli", &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        Top::Ext(cmd) => cmd,
    };
    let mut io = Io {
        stdout: Box::new(std::io::stdout()),
        stderr: Box::new(std::io::stderr()),
        stdout_is_tty: std::io::stdout().is_terminal(),
        stderr_is_tty: std::io::stderr().is_terminal(),
    };
    // A watch runs until interrupted: SIGINT or SIGTERM end it cleanly (exit 0), as a
    // sidecar's supervisor stops it. Other commands keep the default (killed by the signal).
    let watching = matches!(
        &cmd,
        xcecli_ext::Command::Service(xcecli_ext::ServiceCommand::Endpoints(a)) if a.watch
    );
    let result = settings(cli.api, cli.token, cli.ca_file, cli.config).and_then(|mut cfg| {
        // Before the command, it is the default every service command starts from.
        cfg.project = cli.project.or(cfg.project);
        let client = Client::new(cfg)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                CliError::new(
                    ErrorKind::Internal,
                    format!("cannot start the runtime: {e}"),
                )
            })?;
        rt.block_on(async {
            let run = xcecli_ext::run(cmd, &client, &mut io);
            if !watching {
                return run.await;
            }
            tokio::select! {
                r = run => r,
                // A running `--exec` hook is killed as the watch is dropped.
                () = interrupted() => Ok(()),
            }
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln_err(&mut io, &e);
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

/// Resolves on SIGINT or SIGTERM (never, if they cannot be listened for).
async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

fn writeln_err(io: &mut Io, e: &CliError) -> std::io::Result<()> {
    use std::io::Write;
    writeln!(io.stderr, "{e}")
}

/// Flags and environment (clap already merged those) win over the config file.
fn settings(
    api: Option<String>,
    token: Option<String>,
    ca_file: Option<PathBuf>,
    config: Option<PathBuf>,
) -> Result<ClientConfig, CliError> {
    let explicit =
        config.is_some() || std::env::var_os("XCE_CONFIG").is_some_and(|v| !v.is_empty());
    let path = config.or_else(|| {
        clientconf::default_path(
            std::env::var_os("XCE_CONFIG"),
            std::env::var_os("XDG_CONFIG_HOME"),
            std::env::var_os("HOME"),
        )
    });
    let file = match &path {
        Some(p) if p.exists() => {
            let text = std::fs::read_to_string(p).map_err(|e| {
                CliError::new(
                    ErrorKind::Config,
                    format!("cannot read {}: {e}", p.display()),
                )
            })?;
            toml::from_str::<ClientFile>(&text).map_err(|e| {
                CliError::new(
                    ErrorKind::Config,
                    format!("invalid client config {}: {}", p.display(), e.message()),
                )
            })?
        }
        Some(p) if explicit => {
            return Err(CliError::new(
                ErrorKind::Config,
                format!("client config {} does not exist", p.display()),
            ))
        }
        _ => ClientFile::default(),
    };
    // `--project` itself is a flag of the service commands (xcecli-ext); this is its
    // default. An empty XCE_PROJECT counts as unset, as clap treats the other variables.
    let project = match std::env::var("XCE_PROJECT") {
        Ok(p) if !p.is_empty() => Some(p),
        Ok(_) | Err(std::env::VarError::NotPresent) => file.project,
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(CliError::new(
                ErrorKind::Config,
                "XCE_PROJECT is not valid unicode",
            ))
        }
    };
    Ok(ClientConfig {
        api: api.or(file.api).unwrap_or_else(|| DEFAULT_API.to_owned()),
        token: token.or(file.token),
        // A relative `ca_file` in the file is relative to the file.
        ca_file: ca_file.or_else(|| {
            let f = file.ca_file?;
            Some(match path.as_deref().and_then(std::path::Path::parent) {
                Some(dir) if f.is_relative() => dir.join(f),
                _ => f,
            })
        }),
        project,
    })
}
