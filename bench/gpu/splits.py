"""Tables of splits.sh's sweeps: per kernel and case, the launcher's split count and its time
against the fastest pinned count, and every count's time.

    python3 bench/gpu/splits.py DIR    (DIR holds one folder of timings.json per run)
"""

import json
import sys
from pathlib import Path


def cases(root: Path):
    for path in sorted(root.glob("*/timings.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            print(f"<!-- {path}: unreadable ({e}) -->")
            continue
        for case in doc.get("cases", []):
            yield case


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    rows, sweeps = [], []
    for c in cases(Path(sys.argv[1])):
        sweep = [s for s in c.get("split_sweep", []) if "median_us" in s and s["median_us"] > 0]
        if not sweep:
            continue
        chosen, own = c.get("split_chosen"), c.get("median_us")
        best = min(sweep, key=lambda s: s["median_us"])
        at_chosen = next((s["median_us"] for s in sweep if s["count"] == chosen), None)
        rows.append(
            f"| {c['kernel']} | {c['case']} | {chosen} | {own:.1f} | "
            + (f"{at_chosen:.1f}" if at_chosen else "–")
            + f" | {best['count']} | {best['median_us']:.1f} | {own / best['median_us']:.2f} |"
        )
        sweeps.append((c["kernel"], c["case"], {s["count"]: s["median_us"] for s in sweep}))
    print("| kernel | case | launcher's count | its µs | pinned to it µs | fastest count | µs | launcher / fastest |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    counts = sorted({n for _, _, s in sweeps for n in s})
    print()
    print("| kernel | case | " + " | ".join(str(n) for n in counts) + " |")
    print("|---|---|" + "---:|" * len(counts))
    for k, case, s in sweeps:
        print(f"| {k} | {case} | " + " | ".join(f"{s[n]:.1f}" if n in s else "–" for n in counts) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
