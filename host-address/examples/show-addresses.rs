//! Prints what this machine would report under an `[address]` config given as TOML text.
//!
//! `cargo run -p host-address --example show-addresses -- 'prefer = "ipv6"'`

fn main() {
    let toml_text = std::env::args().nth(1).unwrap_or_default();
    let config: host_address::AddressConfig = match toml::from_str(&toml_text) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let interfaces = host_address::read_interfaces().expect("read interfaces");
    match host_address::choose(&interfaces, &config) {
        Ok(choice) => {
            println!("ip_addr {}", choice.ip_addr);
            for a in choice.addresses {
                println!("  {} {}", a.interface.as_deref().unwrap_or("-"), a.ip);
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
