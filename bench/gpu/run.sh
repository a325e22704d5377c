#!/usr/bin/env bash
# The one command of a GPU benchmark run (README.md beside this file says how to prepare
# it): runs the prebuilt cleave-gpu-bench, then compare.py, each under its own time
# limit so that a hang in one still leaves the other's results, and writes everything to $OUT.
#
#   bash bench/gpu/run.sh [KERNEL...]       all kernels of kernels.yaml, or only these
#
# Environment (all optional):
#   OUT                where results go (default bench/gpu/out)
#   CLEAVE_BENCH_DATA  the check's raw tensors, kept off $OUT because they are large
#                      (default /tmp/cleave-gpu-bench-data)
#   PROBE_LIMIT_S      time limit of the memory-system probe, bin/probe (default 60)
#   BENCH_LIMIT_S      time limit of the bench binary (default 120)
#   COMPARE_LIMIT_S    time limit of compare.py (default 180)
#   COMPARE_BUDGET_S   compare.py's own budget: torch.compile cases that would not fit it are
#                      skipped, so it finishes before its limit (default 150)
#   BENCH_ARGS         extra options of the binary, e.g. "--l2 warm" (word-split)
#   COMPARE_ARGS       extra options of compare.py, e.g. "--no-compile" (word-split)
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${OUT:-$here/out}"
data="${CLEAVE_BENCH_DATA:-/tmp/cleave-gpu-bench-data}"
bin="$here/bin/cleave-gpu-bench"
export PYTHONUNBUFFERED=1

mkdir -p "$out" "$data" || exit 2
if [[ ! -x "$bin" ]]; then
  echo "run.sh: $bin is missing: build it and copy bench/gpu/bin here (see bench/gpu/README.md)" >&2
  exit 2
fi

# What the numbers were measured on: a few seconds, and the first thing to read if they look off.
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S') UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu \
    --format=csv 2>&1
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  python3 -c 'import triton; print("triton", triton.__version__)' 2>&1
  nproc
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

# The memory-system probe first (a few seconds): what the cost model's bandwidth constants
# should be on this GPU, measured before anything else has warmed it.
if [[ -x "$here/bin/probe" ]]; then
  timeout --kill-after=5 "${PROBE_LIMIT_S:-60}" "$here/bin/probe" --json "$out/probe.json" >"$out/probe.md" 2>&1
  echo "run.sh: probe exited with $? (124: stopped at its time limit); its tables are probe.md"
else
  echo "run.sh: $here/bin/probe is missing; the memory-system probe is skipped (see bench/gpu/README.md)"
fi

# shellcheck disable=SC2086 # BENCH_ARGS and COMPARE_ARGS are option lists, split on purpose.
timeout --kill-after=10 "${BENCH_LIMIT_S:-120}" \
  "$bin" --out "$out" --data "$data" ${BENCH_ARGS:-} "$@" 2>&1 | tee "$out/bench.log"
bench_rc=${PIPESTATUS[0]}
echo "run.sh: cleave-gpu-bench exited with $bench_rc (124: stopped at its time limit)"

# shellcheck disable=SC2086
timeout --kill-after=10 "${COMPARE_LIMIT_S:-180}" \
  python3 "$here/compare.py" --manifest "$out/manifest.json" --timings "$out/timings.json" --out "$out" \
  --budget-s "${COMPARE_BUDGET_S:-150}" ${COMPARE_ARGS:-} "$@" >"$out/compare.log" 2>&1
compare_rc=$?
echo "run.sh: compare.py exited with $compare_rc (124: stopped at its time limit); its log is compare.log"
if ((compare_rc != 0)); then tail -n 15 "$out/compare.log"; fi

# The table last, so that it is what the tail of the output shows.
if [[ -f "$out/results.md" ]]; then
  cat "$out/results.md"
else
  tail -n 40 "$out/compare.log"
fi
if ((bench_rc != 0)); then exit "$bench_rc"; fi
exit "$compare_rc"
