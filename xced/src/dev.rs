//! `xced dev`: controller, apiserver and N workers in one process, on loopback. Workers
//! `exec-01..exec-NN` advertise `127.0.0.11`, `127.0.0.12`, … so every host has its own
//! address; `--demo` submits `examples/web.toml`.

use anyhow::{bail, Context, Result};
use retry_backoff::Backoff;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use xce_controller::ControllerConfig;
use xce_serve::auth::{Tokens, UserToken, WorkerCredential};
use xce_serve::keyring::Keyring;
use xce_worker::{ShutdownMode, WorkerConfig};
use xcecli_ext::clientconf::{self, ClientFile};

/// The demo profile, built into the binary so `--demo` works from any directory.
const DEMO_PROFILE: &str = include_str!("../../examples/web.toml");

#[derive(Debug, clap::Args)]
pub(crate) struct DevArgs {
    /// Number of worker hosts (exec-01..exec-NN).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=200))]
    hosts: u16,
    /// Submit examples/web.toml (service `web`, 3 replicas serving HTTP).
    #[arg(long)]
    demo: bool,
    /// Where the controller's store, the workers' state and replica logs live.
    #[arg(long, default_value = ".xce-dev")]
    data_dir: PathBuf,
    /// Apiserver listen address (port 0 picks a free port; the chosen one is printed).
    #[arg(long, default_value = "127.0.0.1:7480")]
    listen: SocketAddr,
    /// Tokens file (see docs/rbac.md). Without it an admin token is generated and a client
    /// config that `xcecli` finds is written.
    #[arg(long)]
    tokens: Option<PathBuf>,
    /// Address of the first host; the others follow (must be loopback).
    #[arg(long, default_value = "127.0.0.11", hide = true)]
    first_host_ip: Ipv4Addr,
    /// Dynamic port range of every dev host.
    #[arg(long, default_value = "20000-32000", hide = true)]
    port_range: String,
    /// Host-loss grace period.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, hide = true)]
    grace_period: Duration,
    /// Where to write the client config (default: $XCE_CONFIG or ~/.config/xce/xcecli.toml).
    #[arg(long, hide = true)]
    client_config: Option<PathBuf>,
    /// Serve HTTPS with a CA and a certificate generated into DATA_DIR/tls (for 127.0.0.1,
    /// the dev hosts' addresses and localhost); the client config names the CA.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    tls: bool,
    /// Serve HTTPS with this certificate chain (PEM); with --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA (PEM) that signed --tls-cert, for the dev workers and the client config
    /// [default: the system's roots].
    #[arg(long, requires = "tls_cert")]
    ca_file: Option<PathBuf>,
    /// Serve DNS on ADDR over UDP and TCP (zone `xce`, TTL 1s), answering as principal
    /// `admin` (the generated token's) or, with --tokens, as principal `dns`.
    #[arg(long, value_name = "ADDR")]
    dns: Option<SocketAddr>,
    /// The per-source UDP rate limit of --dns, in queries/s (`[dns] per_source_qps`;
    /// 0: none, as for a benchmark).
    #[arg(long, value_name = "QPS", requires = "dns", default_value_t = xce_dns::DEFAULT_PER_SOURCE_QPS)]
    dns_per_source_qps: u32,
}

impl DevArgs {
    /// The `[dns]` section `--dns` stands for. Without `--tokens` the only principal is the
    /// generated admin (a one-user dev cluster: DNS shows what `xcecli` shows); with a
    /// tokens file, `dns` as for `xced controller`, so the file decides what DNS reveals.
    fn dns_config(&self) -> xce_dns::DnsConfig {
        let principal = match self.tokens {
            None => "admin".to_owned(),
            Some(_) => xce_dns::DEFAULT_PRINCIPAL.to_owned(),
        };
        xce_dns::DnsConfig {
            listen: self.dns,
            principal,
            per_source_qps: self.dns_per_source_qps,
            ..Default::default()
        }
    }

    /// The full log of `xced dev` when the console shows warnings only.
    pub(crate) fn log_file(&self) -> PathBuf {
        self.data_dir.join("xced.log")
    }
}

fn host_ip(first: Ipv4Addr, i: u16) -> Result<Ipv4Addr> {
    let n = u32::from(first)
        .checked_add(u32::from(i))
        .context("--first-host-ip leaves no room for that many hosts")?;
    let ip = Ipv4Addr::from(n);
    if !ip.is_loopback() {
        bail!("dev host address {ip} would leave the loopback range 127.0.0.0/8");
    }
    Ok(ip)
}

pub(crate) async fn run(args: DevArgs) -> Result<()> {
    let hosts: Vec<String> = (1..=args.hosts).map(|i| format!("exec-{i:02}")).collect();
    xce_stdx::atomic_file::private_dir(&args.data_dir, 0o700)
        .with_context(|| format!("creating --data-dir {}", args.data_dir.display()))?;
    let DevCredentials {
        tokens,
        admin,
        workers: worker_secrets,
        completion,
    } = DevCredentials::new(&args, &hosts)?;
    let keyring = Keyring::new(tokens);
    if let Some(completion) = completion {
        // A reload completes the file as at start: the dev workers keep the credentials
        // they run with, the process its admin token.
        let path = completion.path.clone();
        crate::daemon::reload_tokens_on_sighup(keyring.clone(), path, move || {
            completion.complete(crate::daemon::load_tokens(&completion.path)?)
        })?;
    } else {
        // No tokens file, nothing to reload: a closed terminal must not end the cluster.
        crate::daemon::ignore_sighup("xced dev")?;
    }
    let store = crate::daemon::open_redb(&args.data_dir)?;
    let (tls_files, ca_file) = dev_tls(&args)?;
    // Served over TLS exactly when there is a certificate to serve.
    let tls = tls_files.is_some();
    let (running, dns) = start_controller(&args, keyring.clone(), store, tls_files).await?;
    let _dns = crate::dns::listen(&dns, &args.dns_config(), &keyring).await?;
    let api = format!("{}://{}", if tls { "https" } else { "http" }, running.addr);
    let http = http_client(ca_file.as_deref())?;
    if args.tokens.is_none() {
        let path = client_config_path(&args)?;
        write_client_config(&path, &api, &admin, ca_file.as_deref())?;
        println!(
            "xced: client config for xcecli written to {}",
            path.display()
        );
    }
    let workers = DevWorkers::spawn(&args, &hosts, &worker_secrets, &api, ca_file.as_deref())?;
    // Announce once every dev host has registered: a script (or test) that reads the
    // announce line finds all hosts, and the demo's replicas spread over all of them.
    wait_for_hosts(&http, &api, &admin, hosts.len()).await?;
    crate::daemon::announce(running.addr, tls);
    println!("xced: {} hosts: {}", hosts.len(), hosts.join(", "));
    if std::env::var_os("XCE_LOG").is_none() && std::env::var_os("RUST_LOG").is_none() {
        println!(
            "xced: full log in {} (the console shows warnings; XCE_LOG=info for everything here)",
            args.log_file().display()
        );
    }
    if args.demo {
        submit_demo(&http, &api, &admin).await?;
        println!("xced: submitted service `web` (examples/web.toml)");
        println!("xced: try `xcecli service endpoints web` or `xcecli host list` in another shell");
    }
    crate::daemon::shutdown_signal().await;
    tracing::info!("stopping replicas and shutting down");
    workers.stop().await;
    running.shutdown().await;
    Ok(())
}

/// The credentials of a dev cluster: the given tokens file, or a generated admin token.
/// Dev workers run in this process; any worker credential missing from the file is
/// generated.
struct DevCredentials {
    /// The tokens in force.
    tokens: Tokens,
    /// The admin token this process uses itself; written to the client config only when
    /// it is the sole admin (no `--tokens`).
    admin: String,
    /// Each dev host's worker secret, in the order of the hosts.
    workers: Vec<String>,
    /// With `--tokens`: what the file is completed with, at start and at every reload.
    completion: Option<Completion>,
}

impl DevCredentials {
    fn new(args: &DevArgs, hosts: &[String]) -> Result<Self> {
        let (generated, admin) = Tokens::generate_dev(hosts)
            .map_err(|e| anyhow::anyhow!("generating dev credentials: {e}"))?;
        let (tokens, completion) = match &args.tokens {
            Some(path) => {
                let given = crate::daemon::load_tokens(path)?;
                let completion = Completion::new(path, &given, &generated, hosts)?;
                (completion.complete(given)?, Some(completion))
            }
            None => (generated, None),
        };
        let workers = hosts
            .iter()
            .map(|h| {
                tokens
                    .worker(h)
                    .and_then(|w| w.key.secret())
                    .map(|s| s.expose().to_owned())
                    .context("worker credential")
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            tokens,
            admin: admin.expose().to_owned(),
            workers,
            completion,
        })
    }
}

/// What a tokens file given to `xced dev` is completed with: the dev hosts' worker
/// credentials and the process's own admin token, fixed at start (the workers run with
/// them).
struct Completion {
    path: PathBuf,
    dev_workers: Vec<WorkerCredential>,
    dev_admin: UserToken,
}

impl Completion {
    /// The dev hosts' credentials: the file's (`given`), else the `generated` ones.
    fn new(path: &Path, given: &Tokens, generated: &Tokens, hosts: &[String]) -> Result<Self> {
        let mut dev_workers = Vec::new();
        for h in hosts {
            let w = match given.worker(h) {
                Some(w) if w.key.secret().is_none() => bail!(
                    "invalid tokens file {}: [[worker]] host {h:?}: xced dev runs this \
                     host's worker itself and needs its `secret`, not a `secret_sha256` \
                     (or leave the entry out: one is generated)",
                    path.display()
                ),
                Some(w) => w,
                None => generated.worker(h).context("generated worker credential")?,
            };
            dev_workers.push(w.clone());
        }
        // The dev process itself keeps the generated admin token (principal `xced-dev`,
        // a random secret that exists only in this process's memory) to wait for its
        // hosts and submit the demo, whatever the file grants.
        let mut dev_admin = generated.users()[0].clone();
        dev_admin.principal = "xced-dev".into();
        Ok(Self {
            path: path.to_owned(),
            dev_workers,
            dev_admin,
        })
    }

    /// `given` (the file as read) completed.
    fn complete(&self, given: Tokens) -> Result<Tokens> {
        merged(given, &self.dev_workers, &self.dev_admin)
            .with_context(|| format!("invalid tokens file {}", self.path.display()))
    }
}

/// Starts the dev cluster's controller (which serves the API itself) on `--listen`; every
/// dev host advertises a loopback address.
async fn start_controller(
    args: &DevArgs,
    keyring: Keyring,
    store: xce_store::RedbStore,
    tls_files: Option<xce_serve::TlsFiles>,
) -> Result<(xce_controller::RunningController, Arc<xce_dns::Dns>)> {
    let address_policy = host_address::PolicyConfig {
        allow_loopback_hosts: vec!["*".into()],
        ..Default::default()
    };
    let ccfg = ControllerConfig {
        listen: args.listen,
        data_dir: args.data_dir.clone(),
        grace_period: args.grace_period,
        tls: crate::tls::serve_tls(tls_files)?,
        dns_ttl: args.dns.map(|_| args.dns_config().ttl),
        ..ControllerConfig::default()
    };
    let (plugins, dns) = crate::plugins::controller_plugins(
        address_policy,
        endpoint_table::TableConfig::default(),
        &args.dns_config(),
        None,
    )?;
    let running = xce_controller::start(ccfg, keyring, plugins, Arc::new(store)).await?;
    Ok((running, dns))
}

/// Where the client config goes: `--client-config`, else `$XCE_CONFIG` or
/// `~/.config/xce/xcecli.toml`.
fn client_config_path(args: &DevArgs) -> Result<PathBuf> {
    match &args.client_config {
        Some(p) => Ok(p.clone()),
        None => clientconf::default_path(
            std::env::var_os("XCE_CONFIG"),
            std::env::var_os("XDG_CONFIG_HOME"),
            std::env::var_os("HOME"),
        )
        .context("cannot tell where to write the client config: set XCE_CONFIG or HOME"),
    }
}

/// The dev workers, each in a task of its own, sharing one shutdown signal.
struct DevWorkers {
    stop: watch::Sender<Option<ShutdownMode>>,
    tasks: tokio::task::JoinSet<()>,
}

impl DevWorkers {
    /// Starts a worker for each of `hosts`, with the credential of the same position in
    /// `creds`, on the controller at `api` (trusting `ca_file`).
    fn spawn(
        args: &DevArgs,
        hosts: &[String],
        creds: &[String],
        api: &str,
        ca_file: Option<&Path>,
    ) -> Result<Self> {
        let (stop, stopped) = watch::channel(None::<ShutdownMode>);
        let mut tasks = tokio::task::JoinSet::new();
        for (i, (host, cred)) in hosts.iter().zip(creds).enumerate() {
            let ip = host_ip(args.first_host_ip, i as u16)?;
            let address = host_address::AddressConfig {
                advertise: Some(host_address::Advertise::Ip(IpAddr::V4(ip))),
                allow_loopback: true,
                ..Default::default()
            };
            let ports = port_resource::WorkerPortsConfig {
                range: args.port_range.clone(),
                ..Default::default()
            };
            let plugins = crate::plugins::worker_plugins(address, ports)?;
            let wcfg = WorkerConfig {
                host: host.clone(),
                controller: api.to_owned(),
                credential: cred.clone(),
                ca_file: ca_file.map(Path::to_owned),
                data_dir: args.data_dir.join("workers").join(host),
                stop_timeout: Duration::from_secs(5),
                facts_interval: Duration::from_secs(30),
                replicas: xce_worker::ReplicaSettings {
                    log_writer: Some(crate::daemon::log_writer()?),
                    ..Default::default()
                },
                orphan_drain: xce_worker::DEFAULT_ORPHAN_DRAIN,
            };
            tasks.spawn(run_worker(wcfg, plugins, stopped.clone()));
        }
        Ok(Self { stop, tasks })
    }

    /// Stops every worker, each stopping its replicas, and waits for them.
    async fn stop(mut self) {
        let _ = self.stop.send(Some(ShutdownMode::StopReplicas));
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Runs one dev worker until `stop` says how to shut down (stopping the replicas when
/// the sender is gone).
async fn run_worker(
    cfg: WorkerConfig,
    plugins: xce_worker::WorkerPlugins,
    mut stop: watch::Receiver<Option<ShutdownMode>>,
) {
    let host = cfg.host.clone();
    let shutdown = async move {
        loop {
            if let Some(mode) = *stop.borrow_and_update() {
                return mode;
            }
            if stop.changed().await.is_err() {
                return ShutdownMode::StopReplicas;
            }
        }
    };
    if let Err(e) = xce_worker::run(cfg, plugins, shutdown).await {
        tracing::error!(%host, "worker failed: {e:#}");
    }
}

/// The given tokens file completed for `xced dev`: its users and the other hosts' worker
/// credentials, with the dev hosts' credentials and the in-process admin token.
fn merged(
    given: Tokens,
    dev_workers: &[WorkerCredential],
    dev_admin: &UserToken,
) -> Result<Tokens> {
    let mut workers: Vec<WorkerCredential> = given
        .workers()
        .iter()
        .filter(|w| {
            let dev = dev_workers.iter().find(|d| d.host == w.host);
            if dev.is_some_and(|d| d.key.digest() != w.key.digest()) {
                tracing::warn!(
                    host = %w.host,
                    "the tokens file changed the credential of a dev host: the dev worker keeps the one it started with"
                );
            }
            dev.is_none()
        })
        .cloned()
        .collect();
    workers.extend(dev_workers.iter().cloned());
    let mut users = given.users().to_vec();
    users.push(dev_admin.clone());
    Ok(Tokens::new(users, workers)?)
}

/// The certificate to serve and the CA the dev clients trust: generated (`--tls`), given
/// (`--tls-cert`, `--tls-key`, `--ca-file`), or none (plain HTTP).
fn dev_tls(args: &DevArgs) -> Result<(Option<xce_serve::TlsFiles>, Option<PathBuf>)> {
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let files = xce_serve::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        };
        let ca = args
            .ca_file
            .as_deref()
            .map(std::path::absolute)
            .transpose()?;
        return Ok((Some(files), ca));
    }
    if !args.tls {
        return Ok((None, None));
    }
    // Valid for every address a dev client may use: the listen address, loopback, and the
    // dev hosts' own addresses.
    let mut ips: Vec<IpAddr> = vec![
        Ipv4Addr::LOCALHOST.into(),
        std::net::Ipv6Addr::LOCALHOST.into(),
    ];
    if !args.listen.ip().is_unspecified() && !ips.contains(&args.listen.ip()) {
        ips.push(args.listen.ip());
    }
    for i in 0..args.hosts {
        ips.push(IpAddr::V4(host_ip(args.first_host_ip, i)?));
    }
    let dir = std::path::absolute(args.data_dir.join("tls"))?;
    let spec = control_tls::dev::DevCertSpec {
        ips,
        dns: vec!["localhost".to_owned()],
        valid_years: 2020..2100,
    };
    let certs = control_tls::dev::generate(&dir, &spec)?;
    println!(
        "xced: TLS certificate generated in {} (clients trust {})",
        dir.display(),
        certs.ca.display()
    );
    let files = xce_serve::TlsFiles {
        cert: certs.cert,
        key: certs.key,
    };
    Ok((Some(files), Some(certs.ca)))
}

/// The dev process's own client (waiting for hosts, the demo), trusting `ca_file`.
fn http_client(ca_file: Option<&std::path::Path>) -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .tls_backend_preconfigured(control_tls::client::client_config(ca_file)?)
        .build()
        .context("building the http client")
}

fn write_client_config(
    path: &std::path::Path,
    api: &str,
    token: &str,
    ca_file: Option<&std::path::Path>,
) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let file = ClientFile {
        api: Some(api.to_owned()),
        token: Some(token.to_owned()),
        ca_file: ca_file.map(std::path::Path::to_owned),
        project: None,
    };
    let text = toml::to_string(&file).context("encoding the client config")?;
    // The file holds a secret: readable by its owner only.
    xce_stdx::atomic_file::write_atomic_private(path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Waits (bounded) until `n` hosts are ready. A one-off startup wait on our own workers,
/// which register within milliseconds; there is no host-registered feed to subscribe to.
/// The pause between looks grows (`Backoff`) while the hosts take longer.
async fn wait_for_hosts(client: &reqwest::Client, api: &str, token: &str, n: usize) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut pauses = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
    loop {
        let ready = async {
            let v: serde_json::Value = client
                .get(format!("{api}/v1/hosts"))
                .bearer_auth(token)
                .send()
                .await?
                .json()
                .await?;
            Ok::<_, reqwest::Error>(
                v["hosts"]
                    .as_array()
                    .map_or(0, |h| h.iter().filter(|h| h["state"] == "ready").count()),
            )
        }
        .await
        .unwrap_or(0);
        if ready >= n {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("only {ready} of {n} dev hosts registered within 30s");
        }
        tokio::time::sleep(pauses.next_pause()).await;
    }
}

/// Submits the demo profile unless the service already exists (a restarted dev cluster
/// keeps its services in the store).
async fn submit_demo(client: &reqwest::Client, api: &str, token: &str) -> Result<()> {
    let resp = client
        .post(format!("{api}/v1/services"))
        .bearer_auth(token)
        .header("content-type", "application/toml")
        .body(DEMO_PROFILE)
        .send()
        .await
        .context("submitting the demo service")?;
    match resp.status().as_u16() {
        201 | 409 => Ok(()),
        s => bail!(
            "submitting the demo service: HTTP {s}: {}",
            resp.text().await.unwrap_or_default()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::DEMO_PROFILE;
    use plugin_api::{HostFacts, ResourcePlugin};

    /// `--demo` on hosts whose `--port-range` lies inside the kernel's ephemeral range
    /// (none of which is handed out) is refused for its ports alone: the demo's readiness
    /// probe names the port it declares, so that is no second problem.
    #[test]
    fn demo_on_a_range_inside_the_ephemeral_range_is_refused_for_the_ports_alone() {
        let (mut plugins, _) = crate::plugins::controller_plugins(
            Default::default(),
            Default::default(),
            &Default::default(),
            None,
        )
        .unwrap();
        let mut facts = HostFacts::default();
        facts.sections.insert(
            port_resource::PLUGIN_NAME.into(),
            port_resource::HostPortsFacts {
                range: port_resource::PortRange::try_new(40000, 40999).unwrap(),
                reserved: Vec::new(),
                ephemeral: Some(port_resource::PortRange::try_new(32768, 60999).unwrap()),
            }
            .to_value(),
        );
        for p in &mut plugins.resources {
            p.host_up(&"exec-01".to_owned(), &facts).unwrap();
        }
        let refs: Vec<&dyn ResourcePlugin> = plugins.resources.iter().map(|p| &**p as _).collect();
        let doc = xce_proto::profile::toml_to_json(DEMO_PROFILE).unwrap();
        let errs = xce_proto::profile::validate(&doc, &refs).unwrap_err();
        let errs: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        expect_test::expect![[r#"
            [
                "service.ports: 1 \"any free\" tcp ports are more than any host's range can hold (at most 0)",
            ]
        "#]]
        .assert_debug_eq(&errs);
    }
}
