#!/usr/bin/env python3
"""Merges `pagedc-gpu bench`, bench/gpu/torch_flex.py and
bench/gpu/baselines.py results into the bench/README.md targets §4 table and
JSON (docs/gpu.md).

    report.py PAGEDC.json TORCH.json [--baselines BASELINES.json]
              [--clocks clocks.json] [--commit REV] --json OUT.json

Per configuration and timing (call by call; queued back to back after an L2
flush, where both benchmarks recorded it): our median time, achieved bandwidth
as a fraction of the copy bandwidth (decode) or TFLOP/s of unmasked work
(prefill), PyTorch's paged flex_attention (page 128) and SDPA flash times, each
baseline's time that passed its check, the speed-ups, the strongest anchor of
the row and whether it beats us, and which targets are met on each timing. A
missing anchor is reported as missing, never as met. Runs without torch or
numpy.
"""

import argparse
import json
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0] if "/" in __file__ else ".")
from torch_flex import anchor_name, write_json  # noqa: E402


# The two timings of both benchmarks: call by call (the host waits for each:
# its launch latency and a warm L2 count) and queued back to back after an L2
# flush ("queued_": the GPU's work alone, K/V from DRAM). Each row carries
# both; `targets` is evaluated on each.
TIMINGS = (("", "median_ms", "", "call by call"),
           ("queued_", "queued_median_ms", "_queued", "queued, L2 flushed"))


def merge(ours, torch_results, baseline_results=None):
    anchors = {c["name"]: c for c in (torch_results or {}).get("configurations", [])}
    others = {c["name"]: c.get("baselines", {})
              for c in (baseline_results or {}).get("configurations", [])}
    copy = ours.get("copy_bandwidth_bytes_per_s") or 0.0
    rows = []
    for config in ours.get("configurations", []):
        row = {"name": config["name"], "kind": config["kind"], "status": config["status"],
               "batch": config["batch"], "kv_len": config["kv_len"],
               "page_size": config["page_size"]}
        anchor = anchors.get(anchor_name(config["name"]))
        row["anchor"] = anchor_name(config["name"])
        for prefix, ours_key, theirs_suffix, _ in TIMINGS:
            ms = config.get(ours_key)
            if ms is None:
                continue
            row[prefix + "median_ms"] = ms
            # The spread of the run's calls: a win inside it is no win.
            for bound in ("min_ms", "max_ms"):
                if config.get(prefix + bound) is not None:
                    row[prefix + bound] = config[prefix + bound]
            seconds = ms * 1e-3
            if config["kind"] == "decode" and seconds > 0:
                row[prefix + "bandwidth_bytes_per_s"] = config["bytes"] / seconds
                row[prefix + "fraction_of_copy"] = (
                    row[prefix + "bandwidth_bytes_per_s"] / copy if copy else None)
            if config["kind"] == "prefill" and seconds > 0:
                row[prefix + "tflops"] = config["flops"] / seconds * 1e-12
            if seconds <= 0:
                continue
            # Every timed anchor of the row: (name, speed-up key, median,
            # slowest call).
            timed = []
            if anchor and anchor.get("status") == "ok":
                for theirs, ratio in (("flex_paged", "speedup_vs_flex"),
                                      ("sdpa_flash", "speedup_vs_sdpa")):
                    timed.append((theirs, ratio, anchor.get(theirs + theirs_suffix + "_ms"),
                                  anchor.get(theirs + theirs_suffix + "_max_ms")))
            for theirs, entry in others.get(config["name"], {}).items():
                if entry.get("status") == "ok":
                    timed.append((theirs, "speedup_vs_" + theirs, entry.get(prefix + "ms"),
                                  entry.get(prefix + "max_ms")))
            times, slowest = {}, {}
            for theirs, ratio, value, value_max in timed:
                if value:
                    row[prefix + theirs + "_ms"] = value
                    row[prefix + ratio] = value / ms
                    times[theirs] = value
                    slowest[theirs] = value_max
            if times:
                strongest = min(times, key=times.get)
                row[prefix + "strongest"] = strongest
                row[prefix + "strongest_ms"] = times[strongest]
                row[prefix + "speedup_vs_strongest"] = times[strongest] / ms
                row[prefix + "baseline_wins"] = times[strongest] < ms
                # Beyond the spread: its slowest call faster than our fastest.
                ours_min, theirs_max = row.get(prefix + "min_ms"), slowest[strongest]
                row[prefix + "baseline_wins_beyond_spread"] = (
                    None if ours_min is None or theirs_max is None else theirs_max < ours_min)
        statuses = {theirs: "%s%s" % (entry.get("status"), ": " + entry["message"]
                                      if entry.get("message") else "")
                    for theirs, entry in others.get(config["name"], {}).items()
                    if entry.get("status") != "ok"}
        if statuses:
            row["baselines_not_timed"] = statuses
        if anchor and anchor.get("status") != "ok":
            row["anchor_status"] = "%s: %s" % (anchor.get("status"), anchor.get("message", ""))
        elif not anchor:
            row["anchor_status"] = "missing"
        rows.append(row)
    return rows


def targets(rows, timing=""):
    """Section 4's targets, each with the rows it covers and whether all
    pass, on the call-by-call timing or (timing="queued_") the queued one."""
    checks = []

    def add(name, selected, predicate):
        values = [(r["name"], predicate(r)) for r in selected]
        known = [ok for _, ok in values if ok is not None]
        checks.append({"target": name, "rows": len(values),
                       "met": bool(known) and len(known) == len(values) and all(known),
                       "unknown": len(values) - len(known)})

    def value(r, key, test):
        return None if r.get(timing + key) is None else test(r[timing + key])

    decode_big = [r for r in rows if r["kind"] == "decode" and r["batch"] >= 16
                  and r["kv_len"] >= 8192]
    add("decode >= 85% of copy bandwidth (B >= 16, context >= 8k)", decode_big,
        lambda r: value(r, "fraction_of_copy", lambda x: x >= 0.85))
    add("decode >= 1.3x paged FlexAttention (B >= 16, context >= 8k)", decode_big,
        lambda r: value(r, "speedup_vs_flex", lambda x: x >= 1.3))
    prefill = [r for r in rows if r["kind"] == "prefill"]
    add("prefill >= 1.0x FlexAttention", prefill,
        lambda r: value(r, "speedup_vs_flex", lambda x: x >= 1.0))
    causal = [r for r in prefill if "-causal-" in r["name"]]
    add("prefill causal >= 0.8x SDPA flash", causal,
        lambda r: value(r, "speedup_vs_sdpa", lambda x: x >= 0.8))
    by_name = {r["name"]: r for r in rows}
    pairs = []
    for r in rows:
        if r["name"].endswith("-p16"):
            other = by_name.get(r["name"][:-4] + "-p128")
            if other:
                pairs.append((r, other))
    def ratio(p16, p128):
        a, b = p16.get(timing + "median_ms"), p128.get(timing + "median_ms")
        return a / b if a and b else None
    add("page 16 within 5% of page 128",
        [dict(p16, **{timing + "ratio": ratio(p16, p128)}) for p16, p128 in pairs],
        lambda r: value(r, "ratio", lambda x: x <= 1.05))
    if timing:
        for check in checks:
            check["target"] += " [%s]" % dict((t[0], t[3]) for t in TIMINGS)[timing]
    return checks


def read_optional(path, what):
    """The JSON at `path`, or None (with a note) when it is absent or bad."""
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        print("note: no %s results (%s)" % (what, error))
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ours")
    parser.add_argument("torch", nargs="?")
    parser.add_argument("--baselines", help="bench/gpu/baselines.py's JSON")
    parser.add_argument("--clocks", help="bench/gpu/clocks.py's JSON: the SM clock under load")
    parser.add_argument("--commit", default="", help="the commit the run ran")
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    with open(args.ours) as f:
        ours = json.load(f)
    theirs = read_optional(args.torch, "PyTorch")
    others = read_optional(args.baselines, "baseline")
    clocks = read_optional(args.clocks, "clock")
    rows = merge(ours, theirs, others)
    checks = targets(rows)
    if any("queued_median_ms" in r for r in rows):
        checks += targets(rows, "queued_")

    def fmt(value, spec):
        return (spec % value) if isinstance(value, (int, float)) else "-"
    for prefix, key, _, label in TIMINGS:
        if not any(prefix + "median_ms" in r for r in rows):
            continue
        print("timing: %s" % label)
        print("%-46s %9s %7s %9s %8s %9s %9s %7s %7s %-11s %7s" % (
            "configuration", "ours ms", "spread", "GB/s", "of copy", "TFLOP/s", "flex ms",
            "x flex", "x sdpa", "strongest", "x it"))
        for r in rows:
            bandwidth = r.get(prefix + "bandwidth_bytes_per_s")
            width = (r[prefix + "max_ms"] - r[prefix + "min_ms"]) / r[prefix + "median_ms"] \
                if r.get(prefix + "max_ms") and r.get(prefix + "median_ms") else None
            print("%-46s %9s %7s %9s %8s %9s %9s %7s %7s %-11s %7s" % (
                r["name"], fmt(r.get(prefix + "median_ms"), "%.4f"),
                fmt(width * 100 if width is not None else None, "%.1f%%"),
                fmt(bandwidth * 1e-9 if bandwidth is not None else None, "%.0f"),
                fmt(r.get(prefix + "fraction_of_copy"), "%.3f"),
                fmt(r.get(prefix + "tflops"), "%.1f"),
                fmt(r.get(prefix + "flex_paged_ms"), "%.4f"),
                fmt(r.get(prefix + "speedup_vs_flex"), "%.2f"),
                fmt(r.get(prefix + "speedup_vs_sdpa"), "%.2f"),
                r.get(prefix + "strongest", "-"),
                fmt(r.get(prefix + "speedup_vs_strongest"), "%.2f")))
        for r in rows:
            if r.get(prefix + "baseline_wins"):
                beyond = r.get(prefix + "baseline_wins_beyond_spread")
                print("a baseline wins: %-46s %s %.4f ms against ours %.4f ms (%.2fx; %s)" % (
                    r["name"], r[prefix + "strongest"], r[prefix + "strongest_ms"],
                    r[prefix + "median_ms"], r[prefix + "speedup_vs_strongest"],
                    "beyond both spreads" if beyond else "within the spread" if beyond is False
                    else "spread unknown"))
    for check in checks:
        print("target: %-62s %s (%d rows, %d without data)" % (
            check["target"], "MET" if check["met"] else "not met", check["rows"],
            check["unknown"]))
    for name, why in (others or {}).get("unavailable", {}).items():
        print("baseline %s unavailable: %s" % (name, why))
    report = {"date": ours.get("date"), "commit": args.commit, "gpu": ours.get("gpu"),
              "driver_version": ours.get("driver_version"),
              "copy_bandwidth_bytes_per_s": ours.get("copy_bandwidth_bytes_per_s"),
              "torch": (theirs or {}).get("torch"),
              "torch_copy_bandwidth_bytes_per_s":
                  (theirs or {}).get("copy_bandwidth_bytes_per_s"),
              "baselines": (others or {}).get("baselines"),
              "baseline_versions": (others or {}).get("versions"),
              "baselines_unavailable": (others or {}).get("unavailable"),
              "clocks": clocks, "rows": rows, "targets": checks}
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
