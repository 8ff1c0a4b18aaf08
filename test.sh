#!/usr/bin/env bash
# The test command of README.md: installs what a fresh machine with only Rust lacks
# (python3 for the test replicas, a C compiler, etcd for the etcd store's tests, Chromium
# and chromedriver for the web view's browser test, Prometheus for the SD test, libfaketime
# for the robustness suite's clock jumps, iproute2's `ss` for its socket samples, dig,
# unbound and HAProxy for the DNS tests; Debian
# packages through apt-get, with sudo when not root), then builds the binaries the
# end-to-end tests run and runs every test. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")"

need_apt=()
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ] || need_apt+=(etcd-server)
# The web view's browser test (headless Chromium through WebDriver) and the real
# Prometheus service-discovery test.
command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || [ -x /usr/bin/chromedriver ] || need_apt+=(chromium-driver)
command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ] || need_apt+=(prometheus)
# The robustness suite's clock jumps on a worker (libfaketime; skipped without it).
command -v faketime >/dev/null 2>&1 || need_apt+=(faketime)
# Its samples of listening sockets (`ss`, iproute2; skipped without it).
command -v ss >/dev/null 2>&1 || need_apt+=(iproute2)
# The DNS tests' client: dig (Debian's bind9-dnsutils).
command -v dig >/dev/null 2>&1 || need_apt+=(bind9-dnsutils)
# The DNS tests' real resolver and proxy in front of our server (their system services are
# disabled below, like etcd's).
command -v unbound >/dev/null 2>&1 || [ -x /usr/sbin/unbound ] || need_apt+=(unbound)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need_apt+=(haproxy)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "test.sh: installing ${need_apt[*]} (apt-get)" >&2
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || {
      echo "test.sh: missing ${need_apt[*]}: install them (Debian: apt-get install ${need_apt[*]}) or run as root" >&2
      exit 1
    }
    sudo=(sudo)
  fi
  command -v apt-get >/dev/null 2>&1 || {
    echo "test.sh: missing ${need_apt[*]} and no apt-get here: install them with your package manager" >&2
    exit 1
  }
  export DEBIAN_FRONTEND=noninteractive
  # etcd-server's and prometheus' packages would start system daemons: deny service starts during the
  # install (policy-rc.d exit 101, Debian's standard switch) unless a policy exists.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee /usr/sbin/policy-rc.d >/dev/null
    "${sudo[@]}" chmod +x /usr/sbin/policy-rc.d
    trap '"${sudo[@]}" rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq "${need_apt[@]}"
  # And none at boot either (systemd hosts): the tests run etcds of their own.
  if [[ " ${need_apt[*]} " == *" etcd-server "* ]] && [ -d /run/systemd/system ]; then
    "${sudo[@]}" systemctl disable --now etcd >/dev/null 2>&1 || true
  fi
  if [[ " ${need_apt[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    "${sudo[@]}" systemctl disable --now prometheus prometheus-node-exporter >/dev/null 2>&1 || true
  fi
  if [[ " ${need_apt[*]} " == *" unbound "* || " ${need_apt[*]} " == *" haproxy "* ]] && [ -d /run/systemd/system ]; then
    "${sudo[@]}" systemctl disable --now unbound haproxy >/dev/null 2>&1 || true
  fi
fi
command -v cargo >/dev/null 2>&1 || { echo "test.sh: cargo is missing: install the Rust toolchain (rustup)" >&2; exit 1; }

cargo build --workspace --bins
cargo test --workspace "$@"
# The upgrade from the previous release (UPGRADING.md): it builds that release from git
# first (without debug info: about two minutes of CPU on a 2-core machine, cached under
# target/previous-release/), so it is #[ignore]d in the plain `cargo test` above and run
# here, after every other test, when no test filter was given.
# (`--workspace --test e2e`, not `-p integration-tests`: the same features as the run
# above, so the test binary it built is reused instead of built again.)
if [ "$#" -eq 0 ]; then
  cargo test --workspace --test e2e -- --ignored --exact \
    upgrade::upgrade_from_the_previous_release_one_process_at_a_time_loses_no_request
fi
