#!/usr/bin/env bash
# Answers/s of our DNS server against NSD, Knot DNS, dnsmasq and unbound serving the same
# records, all over UDP on loopback, measured with dnsperf, in one run.
#
#   cargo build --release -p xced && dns/bench/compare.sh [SECONDS] [SERVICES] [ROUNDS]
#
# Starts `xced dev --dns` with SERVICES (default 100) services of 3 sleeping replicas each,
# reads every A and SRV answer with dig and writes those same records into a static zone
# file (served by NSD and Knot, both authoritative), unbound's local-data and dnsmasq's
# host-record/srv-host lines, checks that every server answers the same record sets, then
# runs dnsperf against each server for SECONDS (default 10), ROUNDS (default 3) times with
# the order rotated every round. Each of the others is pinned to one worker where it has
# the setting (NSD server-count 1, Knot udp-workers 1, unbound num-threads 1; dnsmasq is
# single-threaded); ours runs its listener on xced's tokio runtime. Like NSD (its response
# rate limit off), ours runs with its per-source limit off (--dns-per-source-qps 0, i.e.
# `[dns] per_source_qps = 0`; PER_SOURCE_QPS=N sets another): the bench measures answers,
# not the limiter. dnsperf runs from 16 loopback addresses at once for every server and
# the script prints how many queries a limit dropped. Then it sends half of our best rate
# (dnsperf -Q, from HALF_SOURCES=2 processes) with -v and takes the
# 99th percentile of the per-query latencies dnsperf printed, ours and NSD's at that same
# rate (p99_half_ms_nsd: what the machine and dnsperf add whatever the server).
# Needs dnsperf, nsd, knot, dnsmasq, unbound and dig (Debian: apt-get install dnsperf nsd
# knot dnsmasq unbound bind9-dnsutils). Prints one ROUND line per round and one SUMMARY
# line (the best of the rounds for each server).
#
# ONE_CORE=1: every server (ours with XCED_WORKER_THREADS=1, so one UDP reader) runs pinned
# to core SERVER_CORE (default 1) with taskset, and dnsperf to the other cores: a one-core
# comparison. Unset: ours runs as deployed (a worker thread per core, as many UDP readers),
# the others with their one worker, none pinned.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-10}
services=${2:-100}
rounds=${3:-3}
xced=${XCED:-target/release/xced}
for tool in dnsperf nsd knotd dnsmasq unbound dig; do
  command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || { echo "missing $tool" >&2; exit 1; }
done
export PATH=$PATH:/usr/sbin
[ -x "$xced" ] || { echo "$xced is missing: cargo build --release -p xced" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
declare -A port
for s in ours nsd knot dnsmasq unbound; do port[$s]=$(free_port); done
ours=${port[ours]}

pin=() perf_pin=() mode=deployed
if [ "${ONE_CORE:-}" = 1 ]; then
  core=${SERVER_CORE:-1}
  others=$(python3 -c "import os; print(','.join(str(c) for c in sorted(os.sched_getaffinity(0)) if c != $core) or '$core')")
  pin=(taskset -c "$core") perf_pin=(taskset -c "$others") mode=one-core
  export XCED_WORKER_THREADS=1
fi

XCE_CONFIG=$tmp/cli.toml "${pin[@]}" "$xced" dev --hosts 3 --listen 127.0.0.1:0 --data-dir "$tmp/data" \
  --client-config "$tmp/cli.toml" --dns "127.0.0.1:$ours" \
  --dns-per-source-qps "${PER_SOURCE_QPS:-0}" >"$tmp/xced.out" 2>&1 &
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

# Our answers, as zone-file lines: every service's A and SRV set and the hosts' A records.
: >"$tmp/queries"
: >"$tmp/records"
for i in $(seq 1 "$services"); do
  for q in "svc-$i.default.xce A" "_http._tcp.svc-$i.default.xce SRV"; do
    echo "$q" >>"$tmp/queries"
    # shellcheck disable=SC2086
    dig @127.0.0.1 -p "$ours" +noall +answer $q >>"$tmp/records"
  done
done
for h in $(awk '$4 == "SRV" {print $8}' "$tmp/records" | sort -u); do
  dig @127.0.0.1 -p "$ours" +noall +answer "$h" A >>"$tmp/records"
done

{
  echo '$ORIGIN xce.'
  echo '@ 3600 IN SOA ns.xce. hostmaster.xce. 1 3600 600 86400 5'
  echo '@ 3600 IN NS ns.xce.'
  echo 'ns 3600 IN A 127.0.0.1'
  cat "$tmp/records"
} >"$tmp/xce.zone"

cat >"$tmp/nsd.conf" <<NSD
server:
  ip-address: 127.0.0.1@${port[nsd]}
  port: ${port[nsd]}
  server-count: 1
  # NSD's response rate limit (on by default in Debian's build) would cap the bench itself.
  rrl-ratelimit: 0
  rrl-whitelist-ratelimit: 0
  username: ""
  chroot: ""
  database: ""
  zonelistfile: "$tmp/nsd.zonelist"
  xfrdfile: "$tmp/nsd.xfrd"
  xfrdir: "$tmp"
  pidfile: "$tmp/nsd.pid"
  logfile: "$tmp/nsd.log"
remote-control:
  control-enable: no
zone:
  name: xce.
  zonefile: "$tmp/xce.zone"
NSD
mkdir -p "$tmp/knot"
cat >"$tmp/knot.conf" <<KNOT
server:
  rundir: "$tmp/knot"
  listen: 127.0.0.1@${port[knot]}
  udp-workers: 1
  tcp-workers: 1
  background-workers: 1
log:
  - target: stderr
    any: warning
database:
  storage: "$tmp/knot"
template:
  - id: default
    storage: "$tmp/knot"
zone:
  - domain: xce.
    file: "$tmp/xce.zone"
KNOT
{
  echo "port=${port[dnsmasq]}"
  echo "listen-address=127.0.0.1"
  echo "bind-interfaces"
  echo "no-resolv"
  echo "no-hosts"
  echo "local=/xce/"
  echo "pid-file=$tmp/dnsmasq.pid"
  echo "user=root"
  echo "addn-hosts=$tmp/dnsmasq.hosts"
  awk '$4 == "SRV" {sub(/\.$/, "", $1); sub(/\.$/, "", $8); printf "srv-host=%s,%s,%s,%s,%s\n", $1, $8, $7, $5, $6}' "$tmp/records"
} >"$tmp/dnsmasq.conf"
awk '$4 == "A" {sub(/\.$/, "", $1); print $5, $1}' "$tmp/records" >"$tmp/dnsmasq.hosts"
{
  echo "server:"
  echo "  interface: 127.0.0.1@${port[unbound]}"
  echo "  port: ${port[unbound]}"
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
  sed 's/.*/  local-data: "&"/' "$tmp/records"
} >"$tmp/unbound.conf"

"${pin[@]}" nsd -d -c "$tmp/nsd.conf" >"$tmp/nsd.out" 2>&1 &
pids+=($!)
"${pin[@]}" knotd -c "$tmp/knot.conf" >"$tmp/knot.out" 2>&1 &
pids+=($!)
"${pin[@]}" dnsmasq -k -C "$tmp/dnsmasq.conf" >"$tmp/dnsmasq.out" 2>&1 &
pids+=($!)
"${pin[@]}" unbound -d -c "$tmp/unbound.conf" >"$tmp/unbound.out" 2>&1 &
pids+=($!)
for s in nsd knot dnsmasq unbound; do
  tries=0
  until dig @127.0.0.1 -p "${port[$s]}" +short +time=1 svc-1.default.xce A | grep -q .; do
    tries=$((tries + 1))
    [ "$tries" -lt 100 ] || { echo "$s does not answer:" >&2; cat "$tmp/$s.out" >&2; exit 1; }
    sleep 0.2
  done
done

# The record sets must be the same (order aside) before their speeds mean anything: every
# query of the bench, on every server.
same=yes
while read -r q; do
  # shellcheck disable=SC2086
  a=$(dig @127.0.0.1 -p "$ours" +short $q | sort)
  for s in nsd knot dnsmasq unbound; do
    # shellcheck disable=SC2086
    b=$(dig @127.0.0.1 -p "${port[$s]}" +short $q | sort)
    [ "$a" = "$b" ] || { same=no; echo "differs from ours on $s: $q" >&2; }
  done
done <"$tmp/queries"

wait_perf() { while pgrep -f "dnsperf -s 127.0.0.1" >/dev/null; do sleep 0.5; done; }
qps() { # server -> queries per second (16 source addresses, one dnsperf each, in parallel)
  local p=${port[$1]} total=0 out
  for s in $(seq 2 17); do
    "${perf_pin[@]}" dnsperf -s 127.0.0.1 -p "$p" -a "127.0.0.$s" -d "$tmp/queries" -l "$secs" -c 1 -q 20 \
      >"$tmp/perf.$p.$s" 2>&1 &
  done
  wait_perf
  for s in $(seq 2 17); do
    out=$(awk '/Queries per second/ {print $4}' "$tmp/perf.$p.$s")
    # A dnsperf without a figure counts 0: show why rather than hide it.
    [ -n "$out" ] || { echo "dnsperf against $1 from 127.0.0.$s gave no figure:" >&2; tail -5 "$tmp/perf.$p.$s" >&2; }
    total=$(python3 -c "print(${total} + ${out:-0})")
  done
  python3 -c "print(round(${total}))"
}
declare -A best
order=(ours nsd knot dnsmasq unbound)
for r in $(seq 1 "$rounds"); do
  line="ROUND $r load=$(cut -d' ' -f1 /proc/loadavg)"
  for s in "${order[@]}"; do
    q=$(qps "$s")
    line="$line $s=$q"
    [ "${best[$s]:-0}" -ge "$q" ] || best[$s]=$q
  done
  echo "$line"
  order=("${order[@]:1}" "${order[0]}")
done

# p99 latency at half our best rate: HALF_SOURCES (default 2) dnsperf processes, each
# sending its share of the rate. Then NSD at that same rate, the same way: what the machine
# and dnsperf themselves add (the cores are shared by the server, the dnsperf processes
# and whatever else runs) shows in its figure too, so ours is read against it. Two
# processes send half our best rate without taking the cores from the server: with the
# 16 of the throughput phase, each printing every query's latency (-v), the tail measured
# dnsperf's own scheduling (6.7 ms for ours and 6.9 ms for NSD on a quiet machine, against
# 0.49 and 0.64 ms with 2).
half_sources=${HALF_SOURCES:-2}
half=$(python3 -c "print(max(1, ${best[ours]} // 2 // $half_sources))")
p99_at() { # server -> "p99_ms lost" at $half queries/s from each of the sources
  local p=${port[$1]}
  rm -f "$tmp"/half.*
  for s in $(seq 2 $((half_sources + 1))); do
    "${perf_pin[@]}" dnsperf -s 127.0.0.1 -p "$p" -a "127.0.0.$s" -d "$tmp/queries" -l "$secs" -c 1 -q 20 \
      -Q "$half" -v >"$tmp/half.$s" 2>&1 &
  done
  wait_perf
  cat "$tmp"/half.* | awk '/^> / {print $NF}' | sort -g | awk '{v[NR]=$1} END {i=int(NR*0.99); if (i<1) i=1; printf "%.3f ", v[i]*1000}'
  cat "$tmp"/half.* | awk '/Queries lost/ {s+=$3} END {print s+0}'
}
read -r p99 lost < <(p99_at ours)
read -r p99_nsd lost_nsd < <(p99_at nsd)

api=$(sed -n 's/^api = "\(.*\)"/\1/p' "$tmp/cli.toml"); token=$(sed -n 's/^token = "\(.*\)"/\1/p' "$tmp/cli.toml")
limited=$(curl -s -H "Authorization: Bearer $token" "$api/metrics" | awk '/^xce_dns_dropped_total.*rate_limited/ {s+=$2} END {print s+0}')
slipped=$(curl -s -H "Authorization: Bearer $token" "$api/metrics" | awk '/^xce_dns_slipped_total/ {s+=$2} END {print s+0}')
cache() { curl -s -H "Authorization: Bearer $token" "$api/metrics" | awk -v r="result=\"$1\"" 'index($0, "xce_dns_answer_cache_total") == 1 && index($0, r) {s+=$2} END {print s+0}'; }
hits=$(cache hit); misses=$(cache miss)
threads=$(ls "/proc/${pids[0]}/task" | wc -l)
readers=$(sed -n 's/.*, \([0-9]*\) udp readers\..*/\1/p' "$tmp/xced.out")
ratio() { python3 -c "print(round(${best[ours]}/max(1, ${best[$1]}), 2))"; }
echo "SUMMARY dns services=$services queries=$(wc -l <"$tmp/queries") seconds=$secs rounds=$rounds qps_ours=${best[ours]} qps_nsd=${best[nsd]} qps_knot=${best[knot]} qps_dnsmasq=${best[dnsmasq]} qps_unbound=${best[unbound]} ratio_nsd=$(ratio nsd) ratio_knot=$(ratio knot) ratio_dnsmasq=$(ratio dnsmasq) ratio_unbound=$(ratio unbound) p99_half_ms=$p99 half_qps=$((half * half_sources)) half_sources=$half_sources half_lost=$lost p99_half_ms_nsd=$p99_nsd half_lost_nsd=$lost_nsd same_records=$same rate_limited_drops=$limited slipped=$slipped per_source_qps=${PER_SOURCE_QPS:-0} cache_hits=$hits cache_misses=$misses mode=$mode xced_workers=${XCED_WORKER_THREADS:-cores} udp_readers=${readers:-?} xced_threads=$threads"
