#!/usr/bin/env bash
# Installs a pinned nvcc from PyPI into a venv, for CI checks that compile generated kernels
# (no GPU or driver is needed to compile). Safe to run again: an up-to-date venv is reused.
#
#   CLEAVE_NVCC_VENV   where the venv lives (default: $HOME/.cache/cleave-ci/nvcc-venv)
#   PYTHON             the interpreter that creates it (default: python3)
#
# Progress goes to stderr; the last line on stdout is NVCC=<path to nvcc>, so a caller can do
#   export "$(.ci/install-nvcc.sh | tail -n 1)"
set -euo pipefail

venv="${CLEAVE_NVCC_VENV:-${HOME:?HOME or CLEAVE_NVCC_VENV must be set}/.cache/cleave-ci/nvcc-venv}"
python="${PYTHON:-python3}"

# The CUDA 13.0 toolchain: nvcc and ptxas, cicc and libdevice (nvvm), the runtime and C runtime
# headers nvcc includes implicitly, and CCCL (libcu++) headers.
packages=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-cccl==13.0.85
  nvidia-nvvm==13.0.88
)

log() { printf 'install-nvcc: %s\n' "$*" >&2; }

# The stamp records what the venv was built with; a different pin list rebuilds it.
stamp="$venv/.cleave-nvcc-packages"
wanted="${packages[*]}"

find_nvcc() {
  # The wheels install into site-packages/nvidia/cu13; the python3.X directory name depends
  # on the interpreter, so look it up rather than guess it.
  local candidate
  for candidate in "$venv"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc; do
    if [[ -x "$candidate" ]]; then
      printf '%s\n' "$candidate"
      return 0
    fi
  done
  return 1
}

nvcc=""
if [[ -f "$stamp" && "$(cat "$stamp")" == "$wanted" ]] && nvcc="$(find_nvcc)" && "$nvcc" --version >/dev/null 2>&1; then
  log "reusing $venv"
else
  if [[ ! -x "$venv/bin/python" ]]; then
    log "creating venv $venv"
    mkdir -p "$(dirname "$venv")"
    if ! "$python" -m venv "$venv" >&2; then
      log "could not create a venv with $python (on Debian/Ubuntu: apt-get install python3-venv)"
      exit 1
    fi
  fi
  log "installing ${packages[*]}"
  "$venv/bin/python" -m pip install --disable-pip-version-check --no-input --quiet "${packages[@]}" >&2
  if ! nvcc="$(find_nvcc)"; then
    log "nvcc is missing from $venv after installation"
    exit 1
  fi
  printf '%s' "$wanted" >"$stamp"
fi

log "$("$nvcc" --version | tail -n 2 | head -n 1)"
echo "NVCC=$nvcc"
