#!/bin/sh
# Runs the endpoint-table benchmarks (README "Benchmarks"): about 4-6 minutes on 2 cores.
#
# etcd: the comparison needs Debian's `etcd-server` (etcd 3.4). When `etcd` is missing and
# this runs as root with apt-get, it is installed; otherwise the bench prints that it skips
# the etcd rows. The 10,000-watcher runs need `ulimit -n` >= 10,100 (20,000 here).
set -eu
cd "$(dirname "$0")/.."
if ! command -v etcd >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get install -y --no-install-recommends etcd-server ||
            echo "bench.sh: could not install etcd-server, the etcd rows will be skipped"
    else
        echo "bench.sh: no etcd on PATH and cannot apt-get install etcd-server (not root)," \
            "the etcd rows will be skipped"
    fi
fi
ulimit -n 20000 2>/dev/null || true
echo "load before: $(uptime)"
cargo bench -p endpoint-table --bench fanout
echo "load after: $(uptime)"
