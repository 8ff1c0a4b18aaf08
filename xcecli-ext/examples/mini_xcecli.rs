//! The smallest host of `xcecli-ext`: what the real `xcecli` binary (in the `xced` crate)
//! does around it, minus the config file. Used to measure the client's own cost:
//!
//! ```text
//! cargo run --release --example fake_endpoints -- 127.0.0.1:7499 &
//! cargo run --release --example mini_xcecli -- --api http://127.0.0.1:7499 \
//!     service endpoints web -o plain
//! ```
use clap::Parser;
use std::io::IsTerminal;

#[derive(Parser)]
#[command(name = "xcecli")]
struct Cli {
    /// The apiserver's URL
    #[arg(long, default_value = "http://127.0.0.1:7480")]
    api: String,
    /// The bearer token
    #[arg(long)]
    token: Option<String>,
    #[command(subcommand)]
    command: xcecli_ext::Command,
}

fn main() {
    let cli = Cli::parse();
    // One thread is plenty for one request, and starts faster than a thread pool.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut io = xcecli_ext::Io::new(
        Box::new(std::io::stdout()),
        Box::new(std::io::stderr()),
        std::io::stdout().is_terminal(),
        std::io::stderr().is_terminal(),
    );
    let config = xcecli_ext::ClientConfig {
        api: cli.api,
        ca_file: None,
        token: cli.token,
        // The real binary fills this from XCE_PROJECT or the config file.
        project: None,
    };
    let code = rt.block_on(xcecli_ext::execute(cli.command, config, &mut io));
    std::process::exit(code);
}
