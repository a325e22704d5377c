#!/usr/bin/env python3
"""Merges the results of cleave-gpu-bench runs of one kernel each (run.sh runs every kernel in
a process of its own, so that a sticky CUDA error or a hang in one cannot take the others' results
with it) into the one manifest.json and timings.json that compare.py reads.

    python3 merge.py --out DIR PART_DIR...

Each PART_DIR holds what one run wrote (manifest.json, timings.json, either may be missing when
that run failed early). The kernels and cases are concatenated in the order of the arguments;
the other top-level fields are taken from the first part that has them.
"""

import argparse
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except ValueError as e:
        print(f"merge.py: {path}: {e}; left out", file=sys.stderr)
        return None


def merge(parts, name, key):
    merged = None
    for part in parts:
        doc = load(os.path.join(part, name))
        if doc is None:
            continue
        if merged is None:
            merged = dict(doc)
            merged[key] = []
        merged[key].extend(doc.get(key, []))
    return merged


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("parts", nargs="+")
    args = ap.parse_args()
    for name, key in (("manifest.json", "kernels"), ("timings.json", "cases")):
        doc = merge(args.parts, name, key)
        if doc is None:
            print(f"merge.py: no part wrote {name}", file=sys.stderr)
            continue
        tmp = os.path.join(args.out, name + ".partial")
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        os.replace(tmp, os.path.join(args.out, name))
        print(f"merge.py: {name}: {len(doc[key])} {key} from {len(args.parts)} runs")


if __name__ == "__main__":
    main()
