"""The planner's register estimate against ptxas, for the kernels of declaration files.

    cargo build --release
    NVCC=path/to/nvcc python3 bench/registers.py [--arch 90,80] [--at NAME=N,...] [--need] [FILE...]

FILE is kernels.yaml unless given. For each architecture and each kernel of each file: the plan
`cleave schedule --arch A --json` chooses (its launches' estimated registers), the CUDA
`cleave emit --arch A` writes for it, compiled with `nvcc -cubin -arch=sm_A -O3 -Xptxas -v`,
and the registers and spill bytes ptxas reports per function. `--at` plans at other extents of
dynamic dims, as a build does for an `also` extent (kernels without those dims are skipped).

ptxas is free to use up to 255 registers under the generated `__launch_bounds__(threads, 1)`,
and it uses many of them to keep loop-invariant addresses, so the count it reports is more than
a kernel needs. `--need` also finds what it needs: the smallest `-maxrregcount`, in steps of 8,
at which ptxas compiles the function without spilling (the source's launch bounds removed,
since they override the option). That is what the estimate has to cover. Slower: about five
more compiles a kernel.

Prints one Markdown row per launch. Needs no GPU. `CLEAVE_BIN` names another `cleave` binary
than `target/release/cleave` (an earlier build, to compare two versions' kernels).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLEAVE = os.environ.get("CLEAVE_BIN") or os.path.join(ROOT, "target", "release", "cleave")
DECLARATIONS = os.path.join(ROOT, "kernels.yaml")
# The register counts `--need` tries lie on this grid, from the fewest a kernel could use.
NEED_STEP = 8
NEED_FLOOR = 32


def kernel_names(path):
    """The kernels a declarations file names, in order: its `- name: K` entries."""
    with open(path) as f:
        return [line.split("name:", 1)[1].strip() for line in f if line.strip().startswith("- name:")]


def ptxas_report(stderr):
    """{function: (registers, spill store bytes, spill load bytes)} from `-Xptxas -v` output."""
    out, current = {}, None
    for line in stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
            out[current] = [None, 0, 0]
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            out[current][1] = int(m.group(1))
            out[current][2] = int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            out[current][0] = int(m.group(1))
    return out


def ptxas(nvcc, source, include, arch, cap=None):
    args = [nvcc, "-cubin", f"-arch=sm_{arch}", "-O3", "-std=c++17", "-I", include, "-Xptxas", "-v",
            source, "-o", os.devnull]
    if cap is not None:
        args.insert(1, f"-maxrregcount={cap}")
    compiled = subprocess.run(args, capture_output=True, text=True)
    if compiled.returncode != 0:
        sys.exit(f"{source} (sm_{arch}): nvcc failed\n{compiled.stderr}")
    return ptxas_report(compiled.stderr)


def need(nvcc, source, include, arch, symbol, used):
    """The fewest registers, on the grid, at which `symbol` compiles without spilling."""
    with open(source) as f:
        text = re.sub(r"__launch_bounds__\((\d+), 1\)", r"__launch_bounds__(\1)", f.read())
    # `-maxrregcount` is ignored for a function with launch bounds; the minimum-blocks bound is
    # what sets the limit, so it goes, and with it any limit but the option's.
    text = re.sub(r"__launch_bounds__\(\d+\) ", "", text)
    capped = source.replace(".cu", ".capped.cu")
    with open(capped, "w") as f:
        f.write(text)
    clean = lambda cap: sum(ptxas(nvcc, capped, include, arch, cap)[symbol][1:]) == 0
    # `hi` compiles clean (what ptxas used unbounded does), `lo` spills or is below the floor.
    lo, hi = NEED_FLOOR - NEED_STEP, -(-used // NEED_STEP) * NEED_STEP
    while hi - lo > NEED_STEP:
        mid = lo + (hi - lo) // (2 * NEED_STEP) * NEED_STEP
        if clean(mid):
            hi = mid
        else:
            lo = mid
    return hi


def measure(job, nvcc, scratch, at, with_need):
    path, name, arch = job
    run = lambda args: subprocess.run(args, capture_output=True, text=True, check=True, cwd=ROOT)
    extents = ["--at", at] if at else []
    try:
        plan = run([CLEAVE, "schedule", "--kernel", name, "--arch", arch, "--json", *extents, path])
    except subprocess.CalledProcessError as e:
        if at and "--at" in e.stderr:
            return []  # a kernel without the dims --at names
        raise
    chosen = json.loads(plan.stdout)["candidates"][0]["kernels"]
    out = os.path.join(scratch, arch, os.path.basename(path), name)
    run([CLEAVE, "emit", "--kernel", name, "--target", "cuda", "--out", out, "--arch", arch, *extents, path])
    source = os.path.join(out, f"{name}.cu")
    real = ptxas(nvcc, source, out, arch)
    rows = []
    for i, k in enumerate(chosen):
        regs, stores, _ = real.get(k["symbol"], (None, None, None))
        row = f"| {name} | sm_{arch} | {i} | {k['threads']} | {k['registers']} | {regs} | {stores} |"
        if with_need:
            needed = need(nvcc, source, out, arch, k["symbol"], regs) if regs and not stores else "-"
            row += f" {needed} |"
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="90,80", help="architectures, e.g. 90,80")
    parser.add_argument("--at", help="extents of dynamic dims to plan at, e.g. b=64")
    parser.add_argument("--need", action="store_true", help="also find the registers each launch needs")
    parser.add_argument("files", nargs="*", help="declaration files (kernels.yaml by default)")
    args = parser.parse_args()
    nvcc = os.environ.get("NVCC")
    if not nvcc:
        sys.exit(__doc__.strip())
    files = [os.path.abspath(f) for f in args.files] or [DECLARATIONS]
    jobs = [(path, name, arch) for arch in args.arch.split(",") for path in files for name in kernel_names(path)]
    header = "| kernel | arch | launch | threads | estimated registers | ptxas registers | spill bytes |"
    rule = "|---|---|---:|---:|---:|---:|---:|"
    if args.need:
        header += " needed registers |"
        rule += "---:|"
    print(header)
    print(rule)
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for rows in pool.map(lambda j: measure(j, nvcc, scratch, args.at, args.need), jobs):
            if rows:
                print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()
