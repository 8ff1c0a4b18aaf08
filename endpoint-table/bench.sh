#!/bin/sh
# Runs the endpoint-table benchmarks (README "Benchmarks").
#
#   endpoint-table/bench.sh                      # everything once: about 4-6 minutes on 2 cores
#   endpoint-table/bench.sh --runs N [--base C]  # N alternated runs, medians (README, issue 31)
#       [--xced-base BIN [--xced BIN] [--xced-only]]  # + reads through a real `xced dev`, A/B
#
# With --runs: N runs of the fan-out (W = 1,000 and 10,000; SSE over one HTTP/1.1 connection
# each, SSE and blocking queries over HTTP/2 at 100 per connection, etcd's native gRPC
# watch at 100 per stream and 10 streams per connection, and etcd's gRPC watch with one
# connection per watch: the peer of our connection-per-watcher SSE) and N of the reads (svc-3,
# svc-100; ours under RBAC, etcd linearizable and serializable), each run's load average
# printed beside it, then the median of each row over the runs and `SUMMARY delivery ...`
# / `SUMMARY reads ...` lines with the ratios computed from those medians. With --base
# COMMIT, the same bench (this checkout's bench code) is also built against the crates of
# COMMIT, in a temporary git worktree (target dir target/bench-base), and the runs alternate
# between the two binaries (base, this, base, this, ...), so the A/B ratios come from one
# stretch of time on a machine whose load moves. With --xced-base BIN (a release `xced` of
# the previous release), each run also reads through a real `xced dev` (the host's whole
# read path: accept loop, connection accounting, audit layer, credential watch) of BIN and
# of --xced (default: target/release/xced, build it first), alternated, and prints
# `SUMMARY reads A/B xced ...` from the medians; --xced-only runs only those.
#
# etcd: the comparison needs Debian's `etcd-server` (etcd 3.4). When `etcd` is missing and
# this runs as root with apt-get, it is installed; otherwise the bench prints that it skips
# the etcd rows. The 10,000-watcher runs need `ulimit -n` >= 10,100 (20,000 here).
set -eu
cd "$(dirname "$0")/.."
runs=0
base=""
xced_base=""
xced_this="target/release/xced"
xced_only=""
while [ $# -gt 0 ]; do
    case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --base) base="$2"; shift 2 ;;
    --xced-base) xced_base="$2"; shift 2 ;;
    --xced) xced_this="$2"; shift 2 ;;
    --xced-only) xced_only=1; shift ;;
    *) echo "bench.sh: unknown argument $1 (expected --runs N, --base COMMIT, --xced-base BIN, --xced BIN)" >&2; exit 2 ;;
    esac
done
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
if [ "$runs" = 0 ]; then
    echo "load before: $(uptime)"
    cargo bench -p endpoint-table --bench fanout
    echo "load after: $(uptime)"
    exit 0
fi

# The bench binary that `cargo bench --no-run` builds for the manifest $1.
bench_bin() {
    cargo bench --manifest-path "$1" -p endpoint-table --bench fanout --no-run \
        --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*fanout[^"]*\)".*/\1/p' | tail -1
}
tmp=$(mktemp -d)
cleanup() {
    if [ -n "$base" ] && [ -d "$tmp/base" ]; then
        git worktree remove --force "$tmp/base" || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
this_bin=$(bench_bin Cargo.toml)
[ -n "$this_bin" ] || { echo "bench.sh: the bench did not build" >&2; exit 1; }
cp "$this_bin" "$tmp/this"
labels="this"
if [ -n "$base" ]; then
    git worktree add --detach "$tmp/base" "$base" >/dev/null
    # The bench's own code is this checkout's: only the server side differs.
    rm -rf "$tmp/base/endpoint-table/benches"
    cp -r endpoint-table/benches "$tmp/base/endpoint-table/"
    # The bench's servers log as xced does (a dev-dependency the base may not have).
    if ! grep -q '^tracing-subscriber' "$tmp/base/endpoint-table/Cargo.toml"; then
        sed -i '/^\[dev-dependencies\]/a tracing-subscriber.workspace = true' \
            "$tmp/base/endpoint-table/Cargo.toml"
    fi
    # A target dir of its own (crates of one name and version from two checkouts would
    # overwrite each other's artifacts in one), seeded once from this one's release
    # build so that only the workspace's own crates are compiled again.
    if [ ! -d target/bench-base/release ] && [ -d target/release ]; then
        mkdir -p target/bench-base && cp -r target/release target/bench-base/
    fi
    base_bin=$(CARGO_TARGET_DIR="$PWD/target/bench-base" bench_bin "$tmp/base/Cargo.toml")
    if [ -z "$base_bin" ]; then
        # The base's crates may lack what this `--serve` process uses: serve its way.
        git show "$base:endpoint-table/benches/fanout/server.rs" \
            >"$tmp/base/endpoint-table/benches/fanout/server.rs"
        base_bin=$(CARGO_TARGET_DIR="$PWD/target/bench-base" bench_bin "$tmp/base/Cargo.toml")
    fi
    [ -n "$base_bin" ] || { echo "bench.sh: the base bench did not build" >&2; exit 1; }
    cp "$base_bin" "$tmp/base-bin"
    labels="base this"
fi
bin_of() { if [ "$1" = base ]; then echo "$tmp/base-bin"; else echo "$tmp/this"; fi; }

kinds='xce sse,xce sse h2,xce blocking h2,etcd grpc,etcd grpc conn'
i=1
while [ "$i" -le "$runs" ]; do
    for label in $labels; do
        [ -n "$xced_only" ] && break
        for w in 1000 10000; do
            load=$(cut -d' ' -f1 /proc/loadavg)
            FANOUT_KINDS="$kinds" FANOUT_W=$w "$(bin_of "$label")" --bench 2>&1 |
                awk -v l="$label" -v r="$i" -v load="$load" \
                    '/^(xce|etcd) .* [0-9]+ +[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+/ {print "FANOUT", l, r, load, $0}'
        done
        load=$(cut -d' ' -f1 /proc/loadavg)
        READS_ONLY=1 READ_ROUNDS=1 "$(bin_of "$label")" --bench 2>&1 |
            awk -v l="$label" -v r="$i" -v load="$load" \
                '/ svc-[0-9]+ / && !/@/ && !/^SUMMARY/ {print "READS", l, r, load, $0}'
    done
    if [ -n "$xced_base" ]; then
        for label in previous this; do
            bin=$xced_this
            [ "$label" = previous ] && bin=$xced_base
            load=$(cut -d' ' -f1 /proc/loadavg)
            XCED_READS="$bin" XCED_LABEL="$label" READ_ROUNDS=1 "$tmp/this" --bench 2>&1 |
                awk -v r="$i" -v load="$load" '/^xced .* web / {print "XREADS", $2, r, load, $0}'
        done
    fi
    i=$((i + 1))
done | tee "$tmp/rows"

echo
echo "medians over $runs runs each (load average, 1 min, at the start of each run: min-max)"
# Lines go out as "section<TAB>key<TAB>text" and are sorted by section, then key.
awk -f - "$tmp/rows" <<'AWK' | sort -t "$(printf '\t')" -k1,1n -k2,2 | cut -f3-
function median(list,   n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function emit(section, key, text) { printf "%d\t%s\t%s\n", section, key, text }
$1 == "XREADS" {
    xl = $2; xrps[xl] = xrps[xl] " " $(5 + 4); xp99[xl] = xp99[xl] " " $(5 + 6); xload[xl] = xload[xl] " " $4
    next
}
{
    label = $2; load = $4
    if (!(label in lo) || load < lo[label]) lo[label] = load
    if (!(label in hi) || load > hi[label]) hi[label] = load
    # The row's name: the words before its first number (or its service).
    name = ""; k = 5
    while ($k !~ /^[0-9.]+$/ && $k !~ /^svc-/) { name = name (name == "" ? "" : " ") $k; k++ }
    key = label "|" name "|" $k
    if ($1 == "FANOUT") {
        last[key] = last[key] " " $(k + 4); spread[key] = spread[key] " " $(k + 6); fkeys[key] = 1
    } else {
        rps[key] = rps[key] " " $(k + 2); rp99[key] = rp99[key] " " $(k + 4); rkeys[key] = 1
    }
}
END {
    for (l in lo) emit(1, l, sprintf("load %s: %s-%s", l, lo[l], hi[l]))
    emit(2, " ", sprintf("%-6s %-18s %6s %12s %12s", "build", "system", "W", "p50 last ms", "spread ms"))
    for (key in fkeys) {
        split(key, p, "|")
        ml[key] = median(last[key]); ms[key] = median(spread[key])
        emit(2, sprintf("%s %05d %s", p[1], p[3] / 10, p[2]), sprintf("%-6s %-18s %6s %12.3f %12.3f", p[1], p[2], p[3], ml[key], ms[key]))
    }
    for (key in fkeys) {
        split(key, p, "|")
        # Like against like: a connection per watcher against etcd's, multiplexed against
        # etcd's multiplexed watch streams.
        peer = (p[2] == "xce sse") ? "etcd grpc conn" : "etcd grpc"
        e = p[1] "|" peer "|" p[3]
        if (p[2] ~ /^etcd/ || !(e in ml)) continue
        tag = (p[2] == "xce sse") ? "etcd-grpc-conn" : "etcd-grpc"
        emit(3, sprintf("%s %05d %s", p[1], p[3] / 10, p[2]), sprintf("SUMMARY delivery %s W=%s %s: p50 last ours=%.2fms %s=%.2fms ratio=%.2f; spread ours=%.2fms %s=%.2fms", \
            p[1], p[3], p[2], ml[key], tag, ml[e], ml[key] / ml[e], ms[key], tag, ms[e]))
    }
    for (key in fkeys) {
        split(key, p, "|")
        b = "base|" p[2] "|" p[3]
        if (p[1] == "this" && p[2] !~ /^etcd/ && b in ml)
            emit(4, sprintf("%05d %s", p[3] / 10, p[2]), sprintf("SUMMARY delivery A/B W=%s %s: p50 last this=%.2fms base=%.2fms ratio=%.2f", p[3], p[2], ml[key], ml[b], ml[key] / ml[b]))
    }
    emit(5, " ", sprintf("%-6s %-30s %8s %10s %9s", "build", "variant", "service", "req/s", "p99 ms"))
    for (key in rkeys) {
        split(key, p, "|")
        mr[key] = median(rps[key])
        emit(5, p[1] " " p[3] " " p[2], sprintf("%-6s %-30s %8s %10.0f %9.3f", p[1], p[2], p[3], mr[key], median(rp99[key])))
    }
    for (key in rkeys) {
        split(key, p, "|")
        if (p[2] !~ /^xce job.view/) continue
        lin = p[1] "|etcd range (linearizable)|" p[3]; ser = p[1] "|etcd range (serializable)|" p[3]
        if (lin in mr && ser in mr)
            emit(6, p[1] " " p[3], sprintf("SUMMARY reads %s %s job.view: ours=%.0f/s vs etcd linearizable=%.0f/s (%.2fx), serializable=%.0f/s (%.2fx)", \
                p[1], p[3], mr[key], mr[lin], mr[key] / mr[lin], mr[ser], mr[key] / mr[ser]))
        b = "base|" p[2] "|" p[3]
        if (p[1] == "this" && b in mr)
            emit(7, p[3], sprintf("SUMMARY reads A/B %s job.view: this=%.0f/s base=%.0f/s ratio=%.2f", p[3], mr[key], mr[b], mr[key] / mr[b]))
    }
    if (("previous" in xrps) && ("this" in xrps)) {
        mp = median(xrps["previous"]); mt = median(xrps["this"])
        emit(8, "a", sprintf("xced dev reads (web, 3 replicas, admin token, 50 connections): previous %.0f/s p99 %.3fms, this %.0f/s p99 %.3fms", \
            mp, median(xp99["previous"]), mt, median(xp99["this"])))
        emit(8, "b", sprintf("SUMMARY reads A/B xced web: this=%.0f/s previous-release=%.0f/s ratio=%.2f (load%s)", mt, mp, mt / mp, xload["this"]))
    }
}
AWK
