#!/usr/bin/env bash
# Per-kernel hardware counters of the decode kernels, with Nsight Compute: where the time of a
# split decode goes (the streaming kernel or the combine), how many bytes each moves, how
# full its SMs are and what its warps wait on. Complements run.sh, which times whole calls.
#
#   bash bench/gpu/ncu.sh [KERNEL...]       the *_decode kernels of kernels.yaml, or these
#
# Each kernel runs once at its declared extents (b=16, l=4096) through `cleave-gpu-bench
# --no-time --check-dims ...` under ncu, which profiles the generated kernels of that one call
# (`--kernel-name regex:^cleave_`) with caches flushed before each (`--cache-control all`, as a
# decode step reads its KV cache and weights from HBM) and the clocks left as they are
# (`--clock-control none`). Writes $OUT/ncu.csv (ncu's raw page, one row per kernel launch)
# and ncu.log.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${OUT:-$here/out}"
bin="$here/bin/cleave-gpu-bench"
mkdir -p "$out" || exit 2
ncu="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)"
if [[ -z "$ncu" || ! -x "$bin" ]]; then
  echo "ncu.sh: needs ncu on the PATH and $bin (see README.md)" >&2
  exit 2
fi
if (($# > 0)); then
  kernels=("$@")
else
  mapfile -t kernels < <("$bin" --list | awk '$1 ~ /_decode$/ {print $1}')
fi
: >"$out/ncu.csv"
: >"$out/ncu.log"
for k in "${kernels[@]}"; do
  # The declared extents: every decode kernel has a batch `b`; the attention ones a context `l`.
  dims="b=16"
  if "$bin" --list "$k" | grep -q ',l='; then dims="b=16,l=4096"; fi
  echo "ncu.sh: $k at $dims" | tee -a "$out/ncu.log"
  timeout --kill-after=5 "${NCU_KERNEL_LIMIT_S:-60}" "$ncu" --clock-control none --cache-control all \
    --kernel-name regex:^cleave_ --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --page raw --csv \
    "$bin" --no-time --check-dims "$dims" --out "/tmp/ncu-bench/$k" --data /tmp/ncu-bench/data "$k" \
    >"/tmp/ncu-$k.csv" 2>>"$out/ncu.log"
  echo "ncu.sh: $k: exit $?" | tee -a "$out/ncu.log"
  # ncu's CSV rows start with a quote; the bench's own progress lines do not.
  grep '^"' "/tmp/ncu-$k.csv" | sed "s/^/\"$k\",/" >>"$out/ncu.csv"
  grep -v '^"' "/tmp/ncu-$k.csv" >>"$out/ncu.log"
done
