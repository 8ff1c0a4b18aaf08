//! `xced`: the xce daemons — controller (with scheduler and apiserver), separate
//! apiservers on etcd, worker agent, and an all-in-one `dev` mode. This crate is the
//! wiring: it decides which plugins each component loads (`plugins.rs`; the plugins'
//! config types are read in `config.rs`, the dev cluster's in `dev.rs`), so that
//! the host's crates (`local-cluster/*`) depend on `plugin-api` only.

mod config;
mod daemon;
mod dev;
mod dns;
mod format;
mod plugins;
mod store_cmd;
mod tls;
mod token;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use retry_backoff::Backoff;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use xce_controller::ControllerConfig;
use xce_serve::keyring::Keyring;
use xce_store::etcd::gateway::Gateway;
use xce_store::{Election, EtcdStore, Leadership, Maintained, StoreSpec, DEFAULT_PREFIX};
use xce_worker::{ShutdownMode, WorkerConfig};

/// What this binary is: the version and the commit `build.rs` found.
const BUILD: xce_wire::version::Build = xce_wire::version::Build {
    version: env!("CARGO_PKG_VERSION"),
    commit: env!("XCE_COMMIT"),
};

/// Run the xce daemons.
#[derive(Debug, Parser)]
#[command(
    name = "xced",
    version = xce_wire::version::init(BUILD),
    about = "Run the xce controller, a worker agent, or an all-in-one dev cluster"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run controller, apiserver and N workers in one process.
    Dev(dev::DevArgs),
    /// Run the controller, scheduler and apiserver.
    Controller {
        /// Controller config file (TOML).
        #[arg(long)]
        config: PathBuf,
        /// Tokens file (see docs/rbac.md); overrides `tokens` in the config file.
        #[arg(long)]
        tokens: Option<PathBuf>,
        /// Where the state lives: `redb` (the embedded file `<data_dir>/controller.redb`,
        /// the default) or `etcd://HOST:PORT[,HOST:PORT...]`; overrides `store` in the
        /// config file. With etcd several controllers may run: one leads (an etcd lease),
        /// the others wait as standbys and take over when it dies.
        #[arg(long, value_name = "STORE")]
        store: Option<StoreSpec>,
    },
    /// Run an apiserver that serves endpoint reads and watches from the controller's
    /// etcd, and forwards everything else to the leader controller. Run as many as the
    /// readers need; point clients and workers at any of them.
    Apiserver {
        /// Apiserver config file (TOML).
        #[arg(long)]
        config: PathBuf,
        /// Tokens file (see docs/rbac.md); overrides `tokens` in the config file.
        #[arg(long)]
        tokens: Option<PathBuf>,
        /// The controller's store, `etcd://HOST:PORT[,HOST:PORT...]`; overrides `store`
        /// in the config file.
        #[arg(long, value_name = "STORE")]
        store: Option<StoreSpec>,
    },
    /// Make tokens for the tokens file.
    Token {
        #[command(subcommand)]
        cmd: token::TokenCmd,
    },
    /// Back up the controller's store while it runs, or restore a backup into a stopped
    /// one.
    Store {
        #[command(subcommand)]
        cmd: store_cmd::StoreCmd,
    },
    /// Run one worker agent.
    Worker {
        /// Worker config file (TOML).
        #[arg(long)]
        config: PathBuf,
        /// On SIGTERM, have the controller drain this host (replicas replaced elsewhere
        /// first) and exit once none is left (`leave_on_stop = true` in the config file)
        #[arg(long)]
        leave: bool,
    },
    /// Copy standard input to a replica's log file, rotating it (what a worker starts
    /// beside each replica; not for operators).
    #[command(hide = true)]
    ReplicaLog {
        /// The largest size of one file, in bytes.
        #[arg(long)]
        max_size: u64,
        /// Files kept, the current one included.
        #[arg(long)]
        keep: u32,
        /// The log file.
        file: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    // Whatever the umask it was started with (often 022): every file and directory a
    // daemon makes (data dirs, logs holding the audit log, stores, credentials) is its
    // user's alone. Replicas inherit it, and make private files too unless they say
    // otherwise.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    // Before anything serves or logs: the version headers, `/healthz` and
    // `xce_build_info` name this build.
    xce_wire::version::init(BUILD);
    let cli = Cli::parse();
    if let Cmd::ReplicaLog {
        max_size,
        keep,
        file,
    } = &cli.cmd
    {
        return replica_log(*max_size, *keep, file);
    }
    // Not a daemon: no log, no runtime; its output is the point.
    if let Cmd::Token { cmd } = cli.cmd {
        return match token::run(cmd) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    // Not a daemon either: its one line of output is the point.
    let cli = match cli.cmd {
        Cmd::Store { cmd } => return run_store(cmd),
        cmd => Cli { cmd },
    };
    // `xced dev` keeps its console for the user: warnings there, the full log in its
    // data dir (unless XCE_LOG/RUST_LOG asks for a console log).
    let dev_log = match &cli.cmd {
        Cmd::Dev(args) => Some(args.log_file()),
        _ => None,
    };
    init_tracing(dev_log.as_deref());
    // Every daemon's log says which build wrote it (a worker serves no /healthz to ask).
    let build = xce_wire::version::build();
    tracing::info!(
        version = build.version,
        commit = build.commit,
        protocol = xce_wire::version::protocol(),
        "xced starting"
    );
    // Every daemon may hold thousands of connections and (in `dev`) replicas' descriptors:
    // take the whole hard limit, and say so.
    match xce_serve::limits::raise_nofile() {
        Ok((before, after)) if before != after => {
            tracing::info!(before, after, "open-file limit raised to the hard limit")
        }
        Ok((_, limit)) => tracing::info!(limit, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    let rt = match build_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The daemons' multi-threaded runtime, with `XCED_WORKER_THREADS` worker threads if set.
fn build_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let threads = worker_threads()?;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        builder.worker_threads(n);
    }
    tracing::info!(
        worker_threads = threads.map_or_else(|| "one per core".to_owned(), |n| n.to_string()),
        "async runtime"
    );
    builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// The environment variable that sets the daemons' worker threads.
const WORKER_THREADS_ENV: &str = "XCED_WORKER_THREADS";

/// `XCED_WORKER_THREADS`: how many worker threads the daemon's async runtime runs (unset:
/// one per core, tokio's default). For pinning a daemon to fewer cores than the machine
/// has (`taskset`), or measuring it on one.
fn worker_threads() -> anyhow::Result<Option<usize>> {
    parse_worker_threads(std::env::var_os(WORKER_THREADS_ENV).as_deref())
}

fn parse_worker_threads(raw: Option<&std::ffi::OsStr>) -> anyhow::Result<Option<usize>> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let text = raw.to_string_lossy();
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(Some(n)),
        _ => anyhow::bail!(
            "{WORKER_THREADS_ENV} {text:?}: must be a whole number of threads from 1 to 1024"
        ),
    }
}

/// `xced store …` on a runtime of its own, without the daemons' log.
fn run_store(cmd: store_cmd::StoreCmd) -> std::process::ExitCode {
    let done = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(store_cmd::run(cmd)));
    match done {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Logs to stderr at `XCE_LOG`/`RUST_LOG` (default `info`). With `dev_log` and neither
/// variable set: warnings to stderr, `info` to that file.
fn init_tracing(dev_log: Option<&std::path::Path>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};
    let asked = EnvFilter::try_from_env("XCE_LOG").or_else(|_| EnvFilter::try_from_default_env());
    // Field values escaped and bounded (text from clients and workers cannot forge log
    // lines); colour only on a terminal without NO_COLOR.
    let console = tracing_subscriber::fmt::layer()
        .fmt_fields(xce_stdx::logging::fields())
        .with_ansi(xce_stdx::logging::use_ansi())
        .with_writer(std::io::stderr);
    let file = match (dev_log, &asked) {
        (Some(path), Err(_)) => match open_log(path) {
            Ok(f) => Some(f),
            Err(e) => {
                eprintln!(
                    "xced: cannot write the log file {}: {e}; logging to the console",
                    path.display()
                );
                None
            }
        },
        _ => None,
    };
    match file {
        Some(f) => {
            let to_file = tracing_subscriber::fmt::layer()
                .fmt_fields(xce_stdx::logging::fields())
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(f))
                .with_filter(EnvFilter::new("info"));
            tracing_subscriber::registry()
                .with(console.with_filter(EnvFilter::new("warn")))
                .with(to_file)
                .init();
        }
        None => tracing_subscriber::registry()
            .with(console.with_filter(asked.unwrap_or_else(|_| EnvFilter::new("info"))))
            .init(),
    }
}

/// `xced replica-log`: a replica's output (standard input) into its rotating log file,
/// until the replica and everything it started are gone.
fn replica_log(max_size: u64, keep: u32, file: &std::path::Path) -> std::process::ExitCode {
    let policy = xce_worker::LogPolicy {
        max_size,
        keep,
        retain: std::time::Duration::ZERO,
    };
    match xce_worker::write_rotating(std::io::stdin().lock(), file, policy) {
        Ok(_) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xced replica-log {}: {e}", file.display());
            std::process::ExitCode::FAILURE
        }
    }
}

/// Opens (appends to) a log file (0600: it holds the audit log), creating its directory
/// (0700).
fn open_log(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        xce_stdx::atomic_file::private_dir(dir, 0o700)?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    // One an older version made readable to all is made private.
    xce_stdx::atomic_file::make_private(path)?;
    Ok(f)
}

async fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Dev(args) => dev::run(args).await,
        Cmd::Controller {
            config,
            tokens,
            store,
        } => run_controller(config, tokens, store).await,
        Cmd::Apiserver {
            config,
            tokens,
            store,
        } => run_apiserver(config, tokens, store).await,
        Cmd::Worker { config, leave } => run_worker(config, leave).await,
        Cmd::Store { cmd } => store_cmd::run(cmd).await,
        Cmd::Token { cmd } => token::run(cmd),
        Cmd::ReplicaLog { .. } => unreachable!("handled before the runtime starts"),
    }
}

async fn run_apiserver(
    path: PathBuf,
    tokens_flag: Option<PathBuf>,
    store_flag: Option<StoreSpec>,
) -> Result<()> {
    let cfg = config::load_apiserver(&path)?;
    let tokens = load_tokens_of(tokens_flag, cfg.tokens.clone())?;
    let Some(StoreSpec::Etcd(etcd)) = store_flag.or(cfg.store.clone()) else {
        anyhow::bail!(
            "an apiserver follows the controller's etcd: pass --store etcd://HOST:PORT[,...] \
             or set `store` in the config file"
        );
    };
    tracing::info!(
        ?etcd,
        prefix = DEFAULT_PREFIX,
        "apiserver: following the controller's etcd"
    );
    let (plugins, dns) = plugins::apiserver_plugins(cfg.endpoints, &cfg.dns)?;
    let acfg = xce_apiserver::ApiserverConfig {
        listen: cfg.listen,
        body_limit: cfg.body_limit,
        etcd,
        prefix: DEFAULT_PREFIX.to_owned(),
        connections: cfg.connections,
        tls: tls::serve_tls(config::tls_files(
            &path,
            "apiserver",
            &cfg.tls_cert,
            &cfg.tls_key,
        )?)?,
        ca_file: cfg.ca_file.clone(),
        leader_tls: cfg.leader_tls,
        metrics: cfg.metrics,
        max_lag: cfg.max_lag,
    };
    let mut signals = Signals::new()?;
    let tls = acfg.tls.is_some();
    let running = xce_apiserver::start(acfg, tokens.clone(), plugins).await?;
    let _dns = dns::listen(&dns, &cfg.dns, &tokens).await?;
    daemon::announce(running.addr, tls);
    let signal = signals.next().await;
    tracing::info!(
        signal,
        drain_timeout = ?cfg.connections.drain_timeout,
        "shutting down: watches end now, requests in flight get the drain deadline"
    );
    signals.or_exit_at_once(running.shutdown()).await;
    tracing::info!("stopped");
    Ok(())
}

async fn run_controller(
    path: PathBuf,
    tokens_flag: Option<PathBuf>,
    store_flag: Option<StoreSpec>,
) -> Result<()> {
    let cfg = config::load_controller(&path)?;
    let tokens = load_tokens_of(tokens_flag, cfg.tokens.clone())?;
    let mut signals = Signals::new()?;
    let ccfg = ControllerConfig {
        listen: cfg.listen,
        data_dir: cfg.data_dir.clone(),
        heartbeat_interval: cfg.heartbeat_interval,
        unreachable_after: cfg.unreachable_after,
        grace_period: cfg.grace_period,
        disruption_threshold: cfg.threshold()?,
        body_limit: cfg.body_limit,
        connections: cfg.connections,
        tls: tls::serve_tls(config::tls_files(
            &path,
            "controller",
            &cfg.tls_cert,
            &cfg.tls_key,
        )?)?,
        quotas: config::quotas(&cfg)?,
        metrics: cfg.metrics,
        drain_ack_timeout: cfg.drain_ack_timeout,
        dns_ttl: cfg.dns.listen.map(|_| cfg.dns.ttl),
        store_format: cfg.store_format,
    };
    let endpoints = match store_flag.or(cfg.store.clone()) {
        None | Some(StoreSpec::Redb) => None,
        Some(StoreSpec::Etcd(endpoints)) => Some(endpoints),
    };
    // With etcd, several controllers may share the store: only the elected one loads the
    // state and serves, for as long as it keeps its lease.
    if let Some(endpoints) = endpoints {
        return run_elected(&cfg, ccfg, tokens, endpoints, &mut signals).await;
    }
    xce_stdx::atomic_file::private_dir(&cfg.data_dir, 0o700)
        .with_context(|| format!("creating data_dir {}", cfg.data_dir.display()))?;
    let store = daemon::open_redb(&cfg.data_dir)?;
    tracing::info!(data_dir = %cfg.data_dir.display(), "store: embedded redb");
    let (plugins, dns) =
        plugins::controller_plugins(cfg.address.clone(), cfg.endpoints.clone(), &cfg.dns, None)?;
    let tls = ccfg.tls.is_some();
    let running = xce_controller::start(ccfg, tokens.clone(), plugins, Arc::new(store)).await?;
    let _dns = dns::listen(&dns, &cfg.dns, &tokens).await?;
    daemon::announce(running.addr, tls);
    let failed = tokio::select! {
        signal = signals.next() => {
            tracing::info!(
                signal,
                drain_timeout = ?cfg.connections.drain_timeout,
                "shutting down: watches end now, requests in flight get the drain deadline"
            );
            None
        }
        reason = running.failed() => Some(reason),
    };
    signals.or_exit_at_once(running.shutdown()).await;
    tracing::info!("stopped");
    match failed {
        None => Ok(()),
        // Fail-stop: an embedded store that reported an I/O error (a full disk) refuses
        // every later write until it is reopened, and nothing in this process can tell
        // when the device is usable again; a supervisor's restart reopens it.
        Some(reason) => anyhow::bail!("{reason}: this controller stops"),
    }
}

/// How one term as the leader ended.
enum TermEnd {
    /// SIGTERM or SIGINT: resign and stop.
    Signal(&'static str),
    /// The leadership is gone (not renewed within the renew deadline, the lease or the
    /// key gone, or a commit refused because the key is another's): back to standby.
    Lost(String),
    /// The store refused a commit for another reason while this controller still holds
    /// the key: stop.
    Failed(String),
}

/// A controller on etcd: a standby until elected, then the leader until it stops or loses
/// the leadership, then a standby again, in the same process. Each term starts from
/// nothing: the state, the plugins (so the listeners' view) and the timers are built from
/// etcd at election and dropped with the term, so nothing of an old term survives into a
/// new one.
async fn run_elected(
    cfg: &config::ControllerFile,
    ccfg: ControllerConfig,
    tokens: Keyring,
    endpoints: Vec<String>,
    signals: &mut Signals,
) -> Result<()> {
    let timings = cfg.lease_timings();
    log_election(cfg, &endpoints);
    // Checked once here: a term that cannot start is retried, a bad config must not be.
    ccfg.validate().context("invalid controller config")?;
    let id = controller_id(cfg.listen);
    let election = Election::with_timings(endpoints.clone(), DEFAULT_PREFIX, &id, timings)
        .context("invalid leader election")?;
    let candidate = Candidate {
        cfg,
        ccfg,
        tokens,
        gateway: Gateway::new(endpoints.clone(), timings.retry_period),
        endpoints,
        election,
        role: xce_controller::standby::Role::default(),
    };
    // Between terms that could not start: from the retry period, growing up to the
    // lease's TTL while etcd keeps failing the load.
    let mut failed_starts = Backoff::jittered(timings.retry_period, timings.ttl);
    loop {
        let Some(leader) = candidate.stand_by(signals).await? else {
            tracing::info!("shutting down (standby)");
            return Ok(());
        };
        let store = candidate.fenced_store(&leader)?;
        let mut term = match candidate.start_term(leader, store).await {
            Ok(term) => term,
            // Migrated by a newer leader between the last check and the election: it
            // resigned already (start_term), so another controller can take over.
            Err(e) if format::is_newer(&e) => return Err(e.context(format::RESIGNED)),
            Err(e) => {
                let pause = failed_starts.next_pause();
                tracing::error!(error = %format!("{e:#}"), retry_in = ?pause, "elected, but cannot load the state from etcd: stepping aside, campaigning again");
                tokio::select! {
                    () = tokio::time::sleep(pause) => continue,
                    signal = signals.next() => {
                        tracing::info!(signal, "shutting down (standby)");
                        return Ok(());
                    }
                }
            }
        };
        failed_starts.reset();
        match term.end(signals).await {
            TermEnd::Signal(signal) => {
                tracing::info!(
                    signal,
                    drain_timeout = ?cfg.connections.drain_timeout,
                    "shutting down: resigning first, then watches end and requests in flight get the drain deadline"
                );
                stop_leading(signals, term.leadership, term.running).await;
                tracing::info!("stopped");
                return Ok(());
            }
            TermEnd::Failed(reason) => {
                stop_leading(signals, term.leadership, term.running).await;
                tracing::info!("stopped");
                anyhow::bail!("{reason}: this controller stops");
            }
            TermEnd::Lost(reason) => {
                candidate.role.lost();
                tracing::warn!(%reason, "leadership lost: dropping this term's state and going back to standby");
                term.step_down(signals).await;
                tracing::info!("back to standby: campaigning again");
            }
        }
    }
}

/// What an elected controller runs with, in one line.
fn log_election(cfg: &config::ControllerFile, endpoints: &[String]) {
    let timings = cfg.lease_timings();
    tracing::info!(
        ?endpoints,
        prefix = DEFAULT_PREFIX,
        leader_ttl = ?timings.ttl,
        renew_deadline = ?timings.renew_deadline,
        retry_period = ?timings.retry_period,
        max_txn_ops = cfg.etcd_max_txn_ops,
        "store: etcd, with leader election"
    );
}

/// What every term of an elected controller starts from.
struct Candidate<'a> {
    cfg: &'a config::ControllerFile,
    ccfg: ControllerConfig,
    tokens: Keyring,
    endpoints: Vec<String>,
    /// The store's etcd, for reading its format (see `format.rs`).
    gateway: Gateway,
    election: Election,
    /// What the standby and the leader's routes say this controller is.
    role: xce_controller::standby::Role,
}

impl Candidate<'_> {
    /// Campaigns while serving as a standby: `/healthz` and `/metrics` only, on the
    /// address it will serve the API on, given up when elected. `None`: told to stop.
    async fn stand_by(&self, signals: &mut Signals) -> Result<Option<Leadership>> {
        let (following, leader_id) = tokio::sync::watch::channel(None);
        let standby = xce_controller::standby::serve(
            self.cfg.listen,
            self.cfg.connections,
            self.ccfg.tls.clone(),
            leader_id,
            &self.role,
            xce_controller::standby::Metrics {
                auth: Arc::new(self.tokens.clone()),
                config: self.cfg.metrics,
            },
        )?;
        tracing::info!(addr = %standby.addr, "standby: serving /healthz and /metrics only");
        // Before campaigning: a store a newer release migrated is not this one's to lead.
        // After binding: etcd may take its time to say (a stepped-down leader comes back
        // here during a quorum loss), and the standby must be monitorable meanwhile.
        if let Err(e) = format::refuse_newer(&self.gateway, DEFAULT_PREFIX).await {
            standby.stop().await;
            return Err(e.context("this controller does not campaign"));
        }
        let period = self.cfg.lease_timings().retry_period;
        let elected = tokio::select! {
            elected = campaign(self.election.clone(), following, signals) => elected,
            // A leader of a newer release migrated the store while this one waited: exit
            // now, as a standby, rather than win an election it cannot serve.
            refusal = format::watch_newer(&self.gateway, DEFAULT_PREFIX, period) => {
                Err(refusal.context("this standby stops campaigning and exits; the leader stays in place"))
            }
        };
        standby.stop().await;
        elected
    }

    /// The store of `leader`'s term: every commit requires the leader key to be the one
    /// this leader created.
    fn fenced_store(&self, leader: &Leadership) -> Result<EtcdStore> {
        Ok(EtcdStore::new(self.endpoints.clone())
            .context("invalid etcd store")?
            .with_max_txn_ops(self.cfg.etcd_max_txn_ops)
            .with_leader_guard(leader.key(), leader.create_revision()))
    }

    /// Starts a term: the lease renewed on a thread of its own, the controller loaded
    /// from etcd and serving. A controller that cannot start steps aside (it resigns) and
    /// says why.
    async fn start_term(&self, leader: Leadership, store: EtcdStore) -> Result<Term> {
        let (lost_tx, lost) = tokio::sync::oneshot::channel();
        let leadership = leader.maintain(move |e| {
            tracing::error!(error = %e, "leadership lost: this term ends now");
            let _ = lost_tx.send(e);
        });
        // A leader frozen past its lease may have been replaced: its endpoint reads stop
        // at once when it runs again, before the renewing thread has noticed.
        let clock = leadership.clock();
        let authority: endpoint_table::Authority = Arc::new(move || clock.leading());
        let (plugins, dns) = plugins::controller_plugins(
            self.cfg.address.clone(),
            self.cfg.endpoints.clone(),
            &self.cfg.dns,
            Some(authority),
        )?;
        let started = xce_controller::start_with_role(
            self.ccfg.clone(),
            self.tokens.clone(),
            plugins,
            Arc::new(store),
            &self.role,
        )
        .await;
        let running = match started {
            Ok(r) => r,
            Err(e) => {
                // Not fail-stop: etcd may fail a read right after an outage, and an exit
                // would cost the cluster a controller (the config was checked before).
                // This one steps aside (the other controller may load it) and campaigns
                // again, logging each failure.
                resign(Some(leadership)).await;
                return Err(e);
            }
        };
        self.role.elected();
        // The leader's drains wait for the separate apiservers' acknowledgements.
        let fleet = EtcdStore::new(self.endpoints.clone())
            .and_then(|s| s.with_prefix(DEFAULT_PREFIX))
            .context("invalid etcd store")?;
        running.follow_fleet(Arc::new(fleet));
        // DNS answers from this term's table, for as long as the term lasts. A listener
        // that cannot start costs DNS, not the leadership (its config was checked).
        let dns = dns::listen(&dns, &self.cfg.dns, &self.tokens)
            .await
            .unwrap_or_else(|error| {
                tracing::error!(error = format!("{error:#}"), "dns: not serving");
                None
            });
        daemon::announce(running.addr, self.ccfg.tls.is_some());
        Ok(Term {
            running,
            leadership,
            lost,
            _dns: dns,
        })
    }
}

/// One term as the leader.
struct Term {
    running: xce_controller::RunningController,
    leadership: Maintained,
    /// Told once, by the lease thread, when the leadership is gone.
    lost: tokio::sync::oneshot::Receiver<xce_store::ElectionError>,
    /// The term's DNS listeners (`[dns] listen`), stopped with it.
    _dns: Option<xce_dns::Listener>,
}

impl Term {
    /// Waits for what ends the term.
    async fn end(&mut self, signals: &mut Signals) -> TermEnd {
        tokio::select! {
            signal = signals.next() => TermEnd::Signal(signal),
            lost = &mut self.lost => TermEnd::Lost(match lost {
                Ok(e) => e.to_string(),
                Err(_) => "the lease thread ended without a reason".into(),
            }),
            reason = self.running.failed() => match holds_key(&self.leadership).await {
                // The store's leader guard refused the commit: the leadership is gone
                // (the lease thread may not have noticed yet).
                Some(false) => TermEnd::Lost(reason),
                // The key is still this controller's, or etcd cannot say: another writer
                // moved the fence, or a commit reported failed landed after all. The
                // state in this process cannot be accounted for; stopping (as a restart
                // under a supervisor would) is the conservative answer, and the other
                // controller takes over meanwhile.
                Some(true) | None => TermEnd::Failed(reason),
            },
        }
    }

    /// Ends a term whose leadership is lost, like a graceful stop: the listener closes,
    /// blocking queries answer and streams end (clients resume on the new leader), the
    /// state task stops (its commits are refused by the leader guard anyway). Within
    /// [`STEP_DOWN_WAIT`], whatever the store does: a state task blocked in a commit
    /// (etcd without a quorum) does not keep the standby listener away, nor the lease
    /// from being revoked.
    async fn step_down(self, signals: &mut Signals) {
        // If the lease still lives (etcd unreachable so far), revoking it lets a standby
        // take over at once when etcd answers again. Started first and not waited for:
        // it must not wait for the state task (a commit blocked on the same etcd), and a
        // late revocation only ends this term's lease, never the next one's.
        tokio::spawn(revoke_lost(self.leadership));
        let mut stopped = false;
        signals
            .or_exit_at_once(async { stopped = self.running.step_down(STEP_DOWN_WAIT).await })
            .await;
        if !stopped {
            tracing::warn!(waited = ?STEP_DOWN_WAIT, "the stepped-down term's state task is still busy (most likely a commit blocked on the store): left to end by itself; its commit cannot land once another leader holds the key");
        }
    }
}

/// The longest a term whose leadership is lost waits for its server and state task before
/// it is back on the standby listener.
const STEP_DOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// A leader's graceful stop: resign first (a standby takes over while this one drains),
/// then stop serving.
async fn stop_leading(
    signals: &mut Signals,
    leadership: Maintained,
    running: xce_controller::RunningController,
) {
    signals
        .or_exit_at_once(async {
            resign(Some(leadership)).await;
            running.shutdown().await;
        })
        .await;
}

/// Whether the leader key is still this leader's (`None`: etcd did not say in time).
async fn holds_key(leadership: &Maintained) -> Option<bool> {
    let check = tokio::task::block_in_place(|| leadership.holds_key());
    match check {
        Ok(held) => Some(held),
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell whether this controller still holds the leader key");
            None
        }
    }
}

/// The longest a stopping leader waits for etcd to revoke its lease before it goes on
/// stopping (the lease then runs out by itself).
const RESIGN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Hands the leadership over at once rather than after the lease runs out: stops
/// renewing and revokes the lease (waiting at most [`RESIGN_TIMEOUT`]).
async fn resign(leadership: Option<Maintained>) {
    let Some(kept) = leadership else { return };
    let revoked = tokio::task::spawn_blocking(move || kept.resign());
    match tokio::time::timeout(RESIGN_TIMEOUT, revoked).await {
        Ok(Ok(Ok(()))) => tracing::info!("resigned the leadership"),
        Ok(Ok(Err(e))) => {
            tracing::warn!(error = %e, "could not resign; a standby takes over when the lease runs out")
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "could not resign"),
        Err(_) => tracing::warn!(
            timeout = ?RESIGN_TIMEOUT,
            "etcd did not confirm the resignation in time; a standby takes over when the lease runs out"
        ),
    }
}

/// How long a stepped-down term keeps trying to revoke its lease while etcd does not
/// answer (a quorum loss can last): past it, the lease runs out by itself.
const REVOKE_LOST_FOR: std::time::Duration = std::time::Duration::from_secs(600);

/// Revokes the lease of a term that lost the leadership, if it still lives (etcd was
/// unreachable, or the renew deadline passed before the lease's end), trying again until
/// etcd answers: after a quorum loss etcd extends every lease by its TTL, and a lease
/// left to run out would keep every controller from leading for that long.
async fn revoke_lost(leadership: Maintained) {
    match tokio::task::spawn_blocking(move || leadership.revoke_until_gone(REVOKE_LOST_FOR)).await {
        Ok(Ok(true)) => {
            tracing::info!("revoked the lost term's lease: a standby may take over at once")
        }
        Ok(Ok(false)) => tracing::info!("the lost term's lease is gone already"),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, given_up_after = ?REVOKE_LOST_FOR, "the lost term's lease could not be revoked: it runs out by itself")
        }
        Err(e) => tracing::warn!(error = %e, "could not revoke the lost term's lease"),
    }
}

/// Names this controller in the election: `<hostname>/<pid>@<listen>`.
fn controller_id(listen: SocketAddr) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}/{}@{listen}", std::process::id())
}

/// Campaigns until this controller leads (`Some`) or it is told to stop (`None`). A
/// standby does not load the state; `following` names the leader it waits on.
async fn campaign(
    election: Election,
    following: tokio::sync::watch::Sender<Option<String>>,
    signals: &mut Signals,
) -> Result<Option<Leadership>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    // A thread, not `spawn_blocking`: a standby told to stop must not wait for it.
    std::thread::Builder::new()
        .name("xce-campaign".into())
        .spawn(move || {
            let r = election.campaign(|leader| {
                tracing::info!("standby: waiting for leadership (leader: {leader})");
                following.send_replace(Some(leader.to_owned()));
            });
            let _ = tx.send(r);
        })
        .context("spawning the campaign thread")?;
    tokio::select! {
        r = rx => {
            let leader = r
                .context("the campaign thread ended without an answer")?
                .context("leader election failed")?;
            tracing::info!(id = leader.id(), ttl = ?leader.ttl(), "leader: loading the state from etcd");
            Ok(Some(leader))
        }
        _ = signals.next() => Ok(None),
    }
}

async fn run_worker(path: PathBuf, leave: bool) -> Result<()> {
    let cfg = config::load_worker(&path)?;
    // A leave drains the host first; otherwise the worker detaches and its replicas
    // keep running for a restarted worker to re-adopt.
    let mode = if leave || cfg.leave_on_stop {
        ShutdownMode::Leave {
            timeout: cfg.leave_timeout,
        }
    } else {
        ShutdownMode::Detach
    };
    let wcfg = WorkerConfig {
        host: cfg.host.clone(),
        controller: cfg.controller.clone(),
        credential: cfg.credential()?,
        ca_file: cfg.ca_file.clone(),
        data_dir: cfg.data_dir.clone(),
        stop_timeout: cfg.stop_timeout,
        facts_interval: cfg.facts_interval,
        replicas: xce_worker::ReplicaSettings {
            log_writer: Some(daemon::log_writer()?),
            ..cfg.settings.clone()
        },
        orphan_drain: cfg.orphan_drain,
    };
    let plugins = plugins::worker_plugins(cfg.address, cfg.ports)?;
    // Nothing of a worker is re-read: a SIGHUP (a closed terminal) is logged, never fatal.
    daemon::ignore_sighup("xced worker")?;
    xce_worker::run(wcfg, plugins, async move {
        daemon::shutdown_signal().await;
        if let ShutdownMode::Leave { .. } = mode {
            // A second signal does not wait for the drain (as the other daemons).
            tokio::spawn(async {
                daemon::shutdown_signal().await;
                tracing::warn!("second signal: exiting at once, the leave unfinished (the replicas left keep running)");
                std::process::exit(143);
            });
        }
        mode
    })
    .await
}

/// The tokens file named by `--tokens`, else by the config file's `tokens`.
/// Loads it into a keyring that re-reads it on every SIGHUP.
fn load_tokens_of(flag: Option<PathBuf>, from_config: Option<PathBuf>) -> Result<Keyring> {
    let path = flag
        .or(from_config)
        .context("no tokens file: pass --tokens FILE or set `tokens` in the config file")?;
    let keyring = Keyring::new(daemon::load_tokens(&path)?);
    daemon::reload_tokens_on_sighup(keyring.clone(), path.clone(), move || {
        daemon::load_tokens(&path)
    })?;
    Ok(keyring)
}

/// SIGTERM and SIGINT as they come, handled from the daemon's start: the first starts a
/// graceful stop, a second one ends the process at once.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate()).context("installing a SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing a SIGINT handler")?,
        })
    }

    /// The next signal's name.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }

    /// Runs the graceful stop `stop`; a signal meanwhile ends the process at once (status
    /// 128 + the signal's number, as if killed by it).
    async fn or_exit_at_once(&mut self, stop: impl std::future::Future<Output = ()>) {
        tokio::select! {
            () = stop => {}
            signal = self.next() => {
                tracing::warn!(signal, "second signal: exiting at once, without draining");
                let code = if signal == "SIGINT" { 130 } else { 143 };
                std::process::exit(code);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_worker_threads;
    use std::ffi::OsStr;

    #[test]
    fn worker_threads_are_a_bounded_whole_number_and_errors_name_the_variable() {
        assert_eq!(parse_worker_threads(None).unwrap(), None);
        assert_eq!(
            parse_worker_threads(Some(OsStr::new("1"))).unwrap(),
            Some(1)
        );
        assert_eq!(
            parse_worker_threads(Some(OsStr::new(" 4 "))).unwrap(),
            Some(4)
        );
        for bad in ["0", "-1", "two", "", "1025"] {
            let e = parse_worker_threads(Some(OsStr::new(bad))).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "XCED_WORKER_THREADS {bad:?}: must be a whole number of threads from 1 to 1024"
                )
            );
        }
    }
}
