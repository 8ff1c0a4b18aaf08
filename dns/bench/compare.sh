#!/usr/bin/env bash
# Answers/s of our DNS server against unbound serving the same records as a static zone
# (local-data, from memory), both over UDP on loopback, measured with dnsperf.
#
#   cargo build --release -p xced && dns/bench/compare.sh [SECONDS] [SERVICES]
#
# Starts `xced dev --dns` with SERVICES (default 100) services of 3 sleeping replicas each,
# reads every A and SRV answer with dig, writes those same records into unbound's config
# (so both servers answer the same record sets), then runs dnsperf against each for
# SECONDS (default 10). Our listener limits each source address (per_source_qps, 5000 by
# default in xced dev), so dnsperf runs from 16 loopback addresses in turn and the script
# prints how many queries the limit dropped. Needs dnsperf, unbound and dig (Debian:
# apt-get install dnsperf unbound bind9-dnsutils). Prints one SUMMARY line.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-10}
services=${2:-100}
xced=${XCED:-target/release/xced}
for tool in dnsperf unbound dig; do
  command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || { echo "missing $tool" >&2; exit 1; }
done
[ -x "$xced" ] || { echo "$xced is missing: cargo build --release -p xced" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ours=$(free_port); theirs=$(free_port)

XCE_CONFIG=$tmp/cli.toml "$xced" dev --hosts 3 --listen 127.0.0.1:0 --data-dir "$tmp/data" \
  --client-config "$tmp/cli.toml" --dns "127.0.0.1:$ours" >"$tmp/xced.out" 2>&1 &
pids+=($!)
until grep -q "apiserver listening" "$tmp/xced.out"; do sleep 0.2; done
export XCE_CONFIG=$tmp/cli.toml
xcecli=${xced%xced}xcecli
for i in $(seq 1 "$services"); do
  printf '[service]\nname = "svc-%d"\nreplicas = 3\ncommand = ["sleep", "3600"]\n[[service.ports]]\nname = "http"\n' "$i" >"$tmp/p.toml"
  "$xcecli" service submit "$tmp/p.toml" >/dev/null
done
for i in $(seq 1 "$services"); do
  "$xcecli" service endpoints "svc-$i" --wait-ready 3 --timeout 120s >/dev/null
done

: >"$tmp/queries"
{
  echo "server:"
  echo "  interface: 127.0.0.1@$theirs"
  echo "  port: $theirs"
  echo "  do-ip6: no"
  echo "  username: \"\""
  echo "  chroot: \"\""
  echo "  directory: \"$tmp\""
  echo "  pidfile: \"\""
  echo "  use-syslog: no"
  echo "  logfile: \"\""
  echo "  module-config: \"iterator\""
  echo "  access-control: 127.0.0.0/8 allow"
  echo "  num-threads: 1"
  echo "  local-zone: \"xce.\" static"
} >"$tmp/unbound.conf"
for i in $(seq 1 "$services"); do
  for q in "svc-$i.default.xce A" "_http._tcp.svc-$i.default.xce SRV"; do
    echo "$q" >>"$tmp/queries"
    # shellcheck disable=SC2086
    dig @127.0.0.1 -p "$ours" +noall +answer $q | while read -r line; do
      echo "  local-data: \"$line\"" >>"$tmp/unbound.conf"
    done
  done
done
for h in $(dig @127.0.0.1 -p "$ours" +short _http._tcp.svc-1.default.xce SRV | awk '{print $4}' | sort -u); do
  dig @127.0.0.1 -p "$ours" +noall +answer "$h" A | while read -r line; do
    echo "  local-data: \"$line\"" >>"$tmp/unbound.conf"
  done
done
unbound -d -c "$tmp/unbound.conf" >"$tmp/unbound.out" 2>&1 &
pids+=($!)
until dig @127.0.0.1 -p "$theirs" +short +time=1 svc-1.default.xce A | grep -q .; do sleep 0.2; done

# The record sets must be the same (order aside) before their speeds mean anything.
same=yes
for q in "svc-1.default.xce A" "_http._tcp.svc-$services.default.xce SRV"; do
  # shellcheck disable=SC2086
  a=$(dig @127.0.0.1 -p "$ours" +short $q | sort); b=$(dig @127.0.0.1 -p "$theirs" +short $q | sort)
  [ "$a" = "$b" ] || same=no
done

qps() { # port -> queries per second (16 source addresses, one dnsperf each, in parallel)
  local port=$1 total=0 out
  for s in $(seq 2 17); do
    dnsperf -s 127.0.0.1 -p "$port" -a "127.0.0.$s" -d "$tmp/queries" -l "$secs" -c 1 -q 20 \
      >"$tmp/perf.$port.$s" 2>&1 &
  done
  wait_perf
  for s in $(seq 2 17); do
    out=$(awk '/Queries per second/ {print $4}' "$tmp/perf.$port.$s")
    total=$(python3 -c "print(${total} + ${out:-0})")
  done
  python3 -c "print(round(${total}))"
}
wait_perf() { while pgrep -f "dnsperf -s 127.0.0.1" >/dev/null; do sleep 0.5; done; }
ours_qps=$(qps "$ours")
theirs_qps=$(qps "$theirs")
api=$(sed -n 's/^api = "\(.*\)"/\1/p' "$tmp/cli.toml"); token=$(sed -n 's/^token = "\(.*\)"/\1/p' "$tmp/cli.toml")
limited=$(curl -s -H "Authorization: Bearer $token" "$api/metrics" | awk '/^xce_dns_dropped_total.*rate_limited/ {s+=$2} END {print s+0}')
ratio=$(python3 -c "print(round(${ours_qps}/${theirs_qps}, 2))")
echo "SUMMARY dns-bench services=$services queries=$(wc -l <"$tmp/queries") seconds=$secs qps_ours=$ours_qps qps_unbound_static=$theirs_qps ratio_unbound=$ratio same_records=$same rate_limited_drops=$limited"
