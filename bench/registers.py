"""The planner's register estimate against ptxas, for every kernel of kernels.yaml.

    cargo build --release
    NVCC=path/to/nvcc python3 bench/registers.py [ARCHS]      (ARCHS: 90,80 by default)

For each architecture and kernel: the plan `cleave schedule --arch A --json` chooses (its
launches' estimated registers), the CUDA `cleave emit --arch A` writes for it, compiled with
`nvcc -cubin -arch=sm_A -O3 -Xptxas -v`, and the registers and spill bytes ptxas reports per
function. Prints one Markdown row per launch. Needs no GPU.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLEAVE = os.path.join(ROOT, "target", "release", "cleave")
DECLARATIONS = os.path.join(ROOT, "kernels.yaml")


def kernel_names():
    with open(DECLARATIONS) as f:
        return [line.split("name:", 1)[1].strip() for line in f if line.strip().startswith("- name:")]


def ptxas_report(stderr):
    """{function: (registers, spill store bytes)} from `-Xptxas -v` output."""
    out, current = {}, None
    for line in stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
            out[current] = [None, 0]
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and current:
            out[current][1] = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            out[current][0] = int(m.group(1))
    return out


def measure(job, nvcc, scratch):
    name, arch = job
    run = lambda args: subprocess.run(args, capture_output=True, text=True, check=True, cwd=ROOT)
    plan = json.loads(run([CLEAVE, "schedule", "--kernel", name, "--arch", arch, "--json", DECLARATIONS]).stdout)
    chosen = plan["candidates"][0]["kernels"]
    out = os.path.join(scratch, arch, name)
    run([CLEAVE, "emit", "--kernel", name, "--target", "cuda", "--out", out, "--arch", arch, DECLARATIONS])
    compiled = subprocess.run(
        [nvcc, "-cubin", f"-arch=sm_{arch}", "-O3", "-std=c++17", "-I", out, "-Xptxas", "-v",
         os.path.join(out, f"{name}.cu"), "-o", os.devnull],
        capture_output=True, text=True)
    if compiled.returncode != 0:
        sys.exit(f"{name} (sm_{arch}): nvcc failed\n{compiled.stderr}")
    real = ptxas_report(compiled.stderr)
    rows = []
    for i, k in enumerate(chosen):
        regs, spill = real.get(k["symbol"], (None, None))
        rows.append(f"| {name} | sm_{arch} | {i} | {k['threads']} | {k['registers']} | {regs} | {spill} |")
    return rows


def main():
    nvcc = os.environ.get("NVCC")
    if not nvcc:
        sys.exit(__doc__.strip())
    archs = (sys.argv[1] if len(sys.argv) > 1 else "90,80").split(",")
    jobs = [(name, arch) for arch in archs for name in kernel_names()]
    print("| kernel | arch | launch | threads | estimated registers | ptxas registers | spill bytes |")
    print("|---|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for rows in pool.map(lambda j: measure(j, nvcc, scratch), jobs):
            print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()
