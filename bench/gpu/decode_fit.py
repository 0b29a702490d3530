#!/usr/bin/env python3
"""Splits decode times into a fixed part and a streaming rate.

    decode_fit.py RESULTS_DIR [--min-mb 60] [--mask none] [--page 128] [--json FILE]

RESULTS_DIR holds a GPU run's gpu-bench-pagedc.json (pagedc's rows: bytes,
launches, `launch_queued_median_ms` where timed) and gpu-bench.json (the
merge, with each baseline's times). For pagedc and every baseline, call by
call and queued, a least-squares line time = fixed + bytes / rate over the
decode rows of one mask and page size that read at least --min-mb MB (rows
larger than L2, so their bytes come from DRAM), and each row's time against
the line. A rate near the HBM's with a large fixed part says the streaming
is sound and the time goes to what every call pays once (launches, a CTA's
first copies, the split's tail, the merge). Series whose small rows are
their call path's time give no such line (flagged: a rate above 1.2x the
copy ceiling).
"""
import argparse
import json
import os
import sys


def fit(points):
    """(fixed_us, us_per_mb) through (mb, us) points, least squares on the
    relative error (each point weighted by 1 / us^2), so the largest rows do
    not decide the fixed part alone."""
    weights = [1.0 / (y * y) for _, y in points]
    sw = sum(weights)
    sx = sum(w * x for w, (x, _) in zip(weights, points))
    sy = sum(w * y for w, (_, y) in zip(weights, points))
    sxx = sum(w * x * x for w, (x, _) in zip(weights, points))
    sxy = sum(w * x * y for w, (x, y) in zip(weights, points))
    den = sw * sxx - sx * sx
    if len(points) < 2 or den == 0:
        return None
    slope = (sw * sxy - sx * sy) / den
    return (sy - slope * sx) / sw, slope


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results")
    parser.add_argument("--min-mb", type=float, default=60.0)
    parser.add_argument("--mask", default="none")
    parser.add_argument("--page", type=int, default=128)
    parser.add_argument("--json")
    args = parser.parse_args()

    pagedc = json.load(open(os.path.join(args.results, "gpu-bench-pagedc.json")))
    merged = json.load(open(os.path.join(args.results, "gpu-bench.json")))
    ours = {c["name"]: c for c in pagedc["configurations"]
            if c["kind"] == "decode" and c["page_size"] == args.page and c["status"] == "ok"
            and c["name"].startswith("decode-%s-B" % args.mask)}
    if not ours:
        sys.exit("decode_fit.py: no decode rows for mask %r at page %d" % (args.mask, args.page))
    rows = [r for r in merged["rows"] if r["name"] in ours]
    series = {"pagedc": "median_ms", "pagedc queued": "queued_median_ms"}
    for key in sorted(rows[0]):
        if key.endswith("_ms") and key not in ("median_ms", "min_ms", "max_ms",
                                                 "queued_median_ms", "queued_min_ms",
                                                 "queued_max_ms", "strongest_ms",
                                                 "queued_strongest_ms"):
            name = key[:-3].replace("queued_", "") + (" queued" if key.startswith("queued_") else "")
            series[name] = key

    out = {"results": args.results, "mask": args.mask, "page": args.page,
           "min_mb": args.min_mb, "fits": {}, "rows": []}
    print("fit over rows of >= %.0f MB (mask %s, page %d): time = fixed + bytes / rate"
          % (args.min_mb, args.mask, args.page))
    copy = pagedc.get("copy_bandwidth_bytes_per_s", 0)
    print("%-26s %10s %10s %6s %9s" % ("series", "fixed us", "rate TB/s", "rows", "worst %"))
    for name, key in series.items():
        points = [(ours[r["name"]]["bytes"] / 1e6, r[key] * 1e3) for r in rows
                  if r.get(key) and ours[r["name"]]["bytes"] / 1e6 >= args.min_mb]
        line = fit(points)
        if line is None:
            continue
        fixed, slope = line
        worst = max(abs(fixed + slope * x - y) / y for x, y in points)
        # A rate well above the copy ceiling (bytes read + written) is no
        # streaming rate: the series' small rows are its call path's time.
        line_like = slope > 0 and (not copy or 1e12 / slope <= 1.2 * copy)
        out["fits"][name] = {"fixed_us": fixed, "us_per_mb": slope,
                             "rate_bytes_per_s": 1e12 / slope if slope > 0 else None,
                             "rows": len(points), "worst_relative_residual": worst,
                             "streaming": line_like}
        print("%-26s %10.1f %10.2f %6d %9.1f%s" % (
            name, fixed, 1.0 / slope if slope > 0 else 0, len(points), 100 * worst,
            "" if line_like else "  (not a streaming line: rate above 1.2x the copy ceiling)"))
    print()
    print("%-32s %9s %10s %10s %10s  %s" % ("row", "MB", "us", "queued us", "line us",
                                           "launches apart (queued us)"))
    queued_fit = out["fits"].get("pagedc queued")
    for r in rows:
        c = ours[r["name"]]
        mb = c["bytes"] / 1e6
        line_us = queued_fit["fixed_us"] + mb * queued_fit["us_per_mb"] if queued_fit else None
        apart = c.get("launch_queued_median_ms", [])
        print("%-32s %9.1f %10.1f %10.1f %10s  %s" % (
            r["name"], mb, c["median_ms"] * 1e3, c.get("queued_median_ms", 0) * 1e3,
            "%.1f" % line_us if line_us else "-",
            " + ".join("%.1f" % (t * 1e3) for t in apart) or "-"))
        out["rows"].append({"name": r["name"], "mb": mb, "median_us": c["median_ms"] * 1e3,
                            "queued_us": c.get("queued_median_ms", 0) * 1e3,
                            "queued_line_us": line_us,
                            "launch_queued_us": [t * 1e3 for t in apart]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print("wrote", args.json)


if __name__ == "__main__":
    main()
