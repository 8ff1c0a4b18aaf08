#!/bin/sh
# Scaling-out benchmark (README "Scaling out: apiservers on etcd"): 10,000 blocking-query
# watchers on 1 and on 3 `xced apiserver`s fed by one etcd; fan-out time of one readiness
# change, apiserver memory and CPU per watcher, read requests/s. About 1-2 minutes on 2
# cores, plus the release build.
#
# `sh bench-scale.sh controller_scale` runs the other real-process bench instead (README
# "The real controller at scale"): 1,000 fake workers, 50,000 replicas, redb and etcd.
#
# etcd: needs Debian's `etcd-server` (etcd 3.4). When `etcd` is missing and this runs as
# root with apt-get, it is installed (with service starts denied, so no system etcd runs);
# otherwise the bench fails to start etcd and says so. `$ETCD` names another binary.
set -eu
BENCH="${1:-scale}"
cd "$(dirname "$0")/.."
if ! command -v etcd >/dev/null 2>&1 && [ -z "${ETCD:-}" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        # etcd-server's package would start a system etcd: deny service starts during the
        # install (policy-rc.d exit 101, Debian's standard switch) unless a policy exists.
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
            chmod +x /usr/sbin/policy-rc.d
            trap 'rm -f /usr/sbin/policy-rc.d' EXIT
        fi
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends etcd-server
        if [ -d /run/systemd/system ]; then
            systemctl disable --now etcd >/dev/null 2>&1 || true
        fi
    else
        echo "bench-scale.sh: no etcd on PATH and cannot apt-get install etcd-server" \
            "(not root): install it, or name a binary in \$ETCD" >&2
        exit 1
    fi
fi
# 10,000 client sockets in the bench, 10,000 server sockets in one apiserver.
ulimit -n 65536 2>/dev/null || ulimit -n 20000
cargo build --release --bin xced
echo "load before: $(uptime)"
cargo bench -p integration-tests --bench "$BENCH"
echo "load after: $(uptime)"
