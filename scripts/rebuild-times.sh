#!/usr/bin/env bash
# Times an incremental release rebuild of xced after touching each named file of a tree
# (a checkout of this repository, this one or an older one to compare with).
# usage: scripts/rebuild-times.sh TREE FILE...   (CARGO_TARGET_DIR shared so both trees reuse the deps)
set -euo pipefail
tree=$1; shift
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$(cd "$(dirname "$0")/.." && pwd)/target/rebuild-times}
cd "$tree"
cargo build --release --bin xced -q
for f in "$@"; do
  touch "$f"
  s=$(date +%s%N)
  cargo build --release --bin xced -q
  e=$(date +%s%N)
  ms=$(( (e - s) / 1000000 ))
  printf '%s %s %d.%d s (load %s)\n' "$(basename "$tree")" "$f" $((ms / 1000)) $((ms % 1000 / 100)) "$(cut -d' ' -f1 /proc/loadavg)"
done
