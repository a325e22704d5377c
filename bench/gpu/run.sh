#!/usr/bin/env bash
# The one command of a GPU benchmark run (README.md beside this file says how to prepare
# it): runs the memory-system probe, the prebuilt cleave-gpu-bench once per kernel, then
# compare.py, each under its own time limit so that a hang in one still leaves the others'
# results, and writes everything to $OUT.
#
#   bash bench/gpu/run.sh [KERNEL...]       all kernels of kernels.yaml, or only these
#
# Environment (all optional):
#   OUT                where results go (default bench/gpu/out)
#   CLEAVE_BENCH_DATA  the check's raw tensors, kept off $OUT because they are large
#                      (default /tmp/cleave-gpu-bench-data)
#   PROBE_LIMIT_S      time limit of the memory-system probe, bin/probe (default 60)
#   BENCH_LIMIT_S      time limit of all the bench binary's runs together (default 150)
#   KERNEL_LIMIT_S     time limit of one kernel's run (default 45)
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

# Each kernel runs in a process of its own, so that a sticky CUDA error (an illegal address
# poisons the context for every later launch) or a hang in one kernel costs only its own
# results; merge.py then joins the parts into the manifest.json and timings.json compare.py reads.
if (($# > 0)); then
  kernels=("$@")
else
  mapfile -t kernels < <("$bin" --list | awk '{print $1}')
fi
deadline=$((SECONDS + ${BENCH_LIMIT_S:-150}))
parts=()
bench_rc=0
: >"$out/bench.log"
for k in "${kernels[@]}"; do
  left=$((deadline - SECONDS))
  if ((left < 5)); then
    echo "run.sh: $k skipped: the bench's time limit is spent" | tee -a "$out/bench.log"
    bench_rc=124
    continue
  fi
  limit=$((left < ${KERNEL_LIMIT_S:-45} ? left : ${KERNEL_LIMIT_S:-45}))
  part="$out/parts/$k"
  mkdir -p "$part"
  # shellcheck disable=SC2086 # BENCH_ARGS is an option list, split on purpose.
  timeout --kill-after=5 "$limit" "$bin" --out "$part" --data "$data" ${BENCH_ARGS:-} "$k" 2>&1 | tee -a "$out/bench.log"
  rc=${PIPESTATUS[0]}
  if ((rc != 0)); then
    echo "run.sh: $k: cleave-gpu-bench exited with $rc (124: stopped at its time limit of $limit s)" | tee -a "$out/bench.log"
    bench_rc=$rc
  fi
  parts+=("$part")
done
python3 "$here/merge.py" --out "$out" "${parts[@]}" 2>&1 | tee -a "$out/bench.log"

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
