#!/usr/bin/env python3
"""The table of scripts/gpu-decode-splits.sh: decode rows by split count.

    decode_splits.py OUT N [N...]

OUT holds decode-splits-planned-gpu-bench-pagedc.json (the planner's own
split counts) and decode-splits-<N>-gpu-bench-pagedc.json for each N asked
(`pagedc-gpu bench --kernel-option decode_splits=N --launch-times`). Prints,
per row, the queued time at each count and the fastest; writes
OUT/decode-splits.json (per row and run: the count asked, the split count
the launch took, queued and call-by-call microseconds, and the split
kernel's and the merge's apart). Exit status 1 when no run has a row, 2 on
a usage error.
"""
import json
import os
import sys


def splits_of(config):
    """The split count of a configuration's decode launch (its grid x)."""
    for launch in config.get("launches", []):
        if launch.startswith("pagedc_decode grid"):
            return int(launch.split("(")[1].split(",")[0])
    return 0


def load(out, label):
    path = os.path.join(out, "decode-splits-%s-gpu-bench-pagedc.json" % label)
    if not os.path.exists(path):
        return {}
    return {c["name"]: c for c in json.load(open(path))["configurations"]
            if c.get("status") == "ok"}


def summarize(out, counts):
    """Rows of the planned run with each asked count's figures."""
    planned = load(out, "planned")
    runs = {n: load(out, str(n)) for n in counts}
    names = list(planned) or sorted({name for run in runs.values() for name in run})
    rows = []
    for name in names:
        config = planned.get(name, {})
        row = {"name": name, "planned_splits": splits_of(config),
               "planned_queued_us": config.get("queued_median_ms", 0) * 1e3, "runs": []}
        for n in counts:
            c = runs[n].get(name)
            if not c:
                continue
            row["runs"].append({
                "asked": n, "splits": splits_of(c),
                "queued_us": c.get("queued_median_ms", 0) * 1e3,
                "median_us": c.get("median_ms", 0) * 1e3,
                "launch_queued_us": [t * 1e3 for t in c.get("launch_queued_median_ms", [])]})
        timed = [r for r in row["runs"] if r["queued_us"] > 0]
        row["fastest"] = min(timed, key=lambda r: r["queued_us"]) if timed else None
        rows.append(row)
    return rows


def main():
    try:
        if len(sys.argv) < 3:
            raise ValueError
        out, counts = sys.argv[1], [int(n) for n in sys.argv[2:]]
    except ValueError:
        print("usage: decode_splits.py OUT N [N...]  (N: split counts)", file=sys.stderr)
        sys.exit(2)
    rows = summarize(out, counts)
    print("%-34s %15s  %s" % ("row (queued us)", "planned", "  ".join("%7s" % ("s%d" % n)
                                                                     for n in counts)))
    for row in rows:
        by_count = {r["asked"]: r for r in row["runs"]}
        cells = ["%7.1f" % by_count[n]["queued_us"] if n in by_count else "%7s" % "-"
                 for n in counts]
        best = row["fastest"]
        print("%-34s %5d %9.1f  %s%s" % (
            row["name"], row["planned_splits"], row["planned_queued_us"], "  ".join(cells),
            "   fastest: %d splits, %.1f us" % (best["splits"], best["queued_us"]) if best else ""))
    path = os.path.join(out, "decode-splits.json")
    with open(path, "w") as f:
        json.dump({"splits_asked": counts, "rows": rows}, f, indent=1)
    print("wrote", path)
    if not any(row["runs"] for row in rows):
        sys.exit("decode_splits.py: no run has a row")


if __name__ == "__main__":
    main()
