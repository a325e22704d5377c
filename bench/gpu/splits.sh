#!/usr/bin/env bash
# The launcher's split-count rule against measurement: every kernel whose launcher chooses a
# split count (the attention-shaped decodes) timed at each count from 1 to 32, with the count
# pinned (`Args::split_count`), next to the launcher's own choice, at several batch sizes and
# context lengths. Writes $OUT/splits/<kernel>.<case>.json (the bench binary's timings) and
# $OUT/splits.md (splits.py's table). Complements run.sh, which times the chosen counts only.
#
#   bash bench/gpu/splits.sh [KERNEL...]     the decodes below, or these
#
# Environment (optional): OUT (default bench/gpu/out); CASES, the --bench-dims of each case
# separated by spaces (default "b=16,l=4096 b=64,l=4096 b=16,l=16384 b=1,l=16384"); SPLITS
# (default 1,2,3,4,6,8,10,12,16,20,24,32); CASE_LIMIT_S, the time limit of one kernel at one
# case (default 40).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${OUT:-$here/out}"
bin="$here/bin/cleave-gpu-bench"
mkdir -p "$out/splits" || exit 2
if [[ ! -x "$bin" ]]; then
  echo "splits.sh: $bin is missing (see README.md)" >&2
  exit 2
fi
if (($# > 0)); then
  kernels=("$@")
else
  kernels=(mha_d64_decode mha_d128_decode gqa_decode mqa_decode mla_decode matmul_matmul_decode)
fi
read -r -a cases <<<"${CASES:-b=16,l=4096 b=64,l=4096 b=16,l=16384 b=1,l=16384}"
for k in "${kernels[@]}"; do
  for c in "${cases[@]}"; do
    tag="$k.${c//[=,]/_}"
    timeout --kill-after=5 "${CASE_LIMIT_S:-40}" "$bin" "$k" --no-check --bench-dims "$c" \
      --splits "${SPLITS:-1,2,3,4,6,8,10,12,16,20,24,32}" --out "$out/splits/$tag" >"$out/splits/$tag.log" 2>&1
    echo "splits.sh: $k $c exited with $?"
  done
done
python3 "$here/splits.py" "$out/splits" >"$out/splits.md"
cat "$out/splits.md"
