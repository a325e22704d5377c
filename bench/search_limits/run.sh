#!/usr/bin/env bash
# Runs `cleave search` and `cleave emit` on declarations at the front end's limits (rank 6, up
# to 128 ops, 64 tensors) and prints the wall time and peak resident memory of each, measured
# by /usr/bin/time. Usage: bash bench/search_limits/run.sh [path/to/cleave]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cleave="${1:-$here/../../target/release/cleave}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
printf '| declaration | command | exit | seconds | peak RSS (MB) | result |\n|---|---|---|---|---|---|\n'
for f in "$here"/*.yaml; do
  k="$(basename "$f" .yaml)"
  for cmd in search emit; do
    args=("$cmd" "$f" --kernel "$k")
    [ "$cmd" = emit ] && args+=(--target cuda --out "$out/$k")
    set +e
    /usr/bin/time -f '%e %M' -o "$out/time" "$cleave" "${args[@]}" > "$out/stdout" 2> "$out/stderr"
    code=$?
    set -e
    read -r secs kb < <(tail -1 "$out/time")
    if [ "$cmd" = search ] && [ "$code" = 0 ]; then
      what="$(head -1 "$out/stdout" | sed 's/^kernel [^:]*: //')"
    elif [ "$code" = 0 ]; then
      what="$(grep -c __global__ "$out/$k/$k.cu") kernels"
    else
      what="$(head -1 "$out/stderr" | cut -c1-120)"
    fi
    printf '| %s | %s | %s | %s | %d | %s |\n' "$k" "$cmd" "$code" "$secs" "$((kb / 1024))" "$what"
  done
done
