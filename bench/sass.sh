#!/usr/bin/env bash
# The static main-loop benchmark, reproducible by this one command (no GPU needed):
#   bash bench/sass.sh
# Fetches FlashAttention-2's sources (the candle-flash-attn crate, from crates.io) and
# CUTLASS's headers (the nvidia-cutlass wheel, from PyPI), then runs `cargo bench --bench sass`,
# which compiles our kernels and FA2's forward kernels for sm_90 and prints the table of
# bench/RESULTS.md. nvcc must be on PATH or found as the build finds it (.ci/install-nvcc.sh
# installs one); compiling FA2 takes several minutes per head dim the first time, after which
# the cubins are reused from target/sass-bench/.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$root/target/sass-bench/deps"
mkdir -p "$work"

if [ ! -d "$work/cutlass/cutlass_library/source/include" ]; then
  python3 -m pip download --quiet --no-deps "nvidia-cutlass==4.2.0" -d "$work/wheel"
  python3 -m zipfile -e "$work"/wheel/nvidia_cutlass-*.whl "$work/cutlass"
fi

fa2="$work/fa2crate"
mkdir -p "$fa2/src"
cat > "$fa2/Cargo.toml" <<'TOML'
[package]
name = "fa2-sources"
version = "0.0.0"
edition = "2021"
publish = false
[dependencies]
candle-flash-attn = "=0.9.2"
[workspace]
TOML
echo "fn main() {}" > "$fa2/src/main.rs"
kernels="$(cd "$fa2" && cargo metadata --format-version 1 --manifest-path Cargo.toml \
  | python3 -c 'import json,sys,os; m=json.load(sys.stdin); p=[x for x in m["packages"] if x["name"]=="candle-flash-attn"][0]; print(os.path.join(os.path.dirname(p["manifest_path"]), "kernels"))')"

cd "$root"
CLEAVE_FA2_DIR="$kernels" CLEAVE_CUTLASS_INCLUDE="$work/cutlass/cutlass_library/source/include" \
  cargo bench --bench sass
