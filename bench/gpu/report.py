#!/usr/bin/env python3
"""Merges `pagedc-gpu bench` and bench/gpu/torch_flex.py results into the
bench/README.md targets §4 table and JSON (docs/gpu.md).

    report.py PAGEDC.json TORCH.json --json OUT.json

Per configuration: our median time, achieved bandwidth as a fraction of the
copy bandwidth (decode) or TFLOP/s of unmasked work (prefill), PyTorch's
paged flex_attention (page 128) and SDPA flash times, the speed-ups, and
which targets are met. A missing anchor is reported as missing, never as met.
Runs without torch or numpy.
"""

import argparse
import json
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0] if "/" in __file__ else ".")
from torch_flex import anchor_name  # noqa: E402


def merge(ours, torch_results):
    anchors = {c["name"]: c for c in (torch_results or {}).get("configurations", [])}
    copy = ours.get("copy_bandwidth_bytes_per_s") or 0.0
    rows = []
    for config in ours.get("configurations", []):
        row = {"name": config["name"], "kind": config["kind"], "status": config["status"],
               "batch": config["batch"], "kv_len": config["kv_len"],
               "page_size": config["page_size"], "median_ms": config["median_ms"]}
        seconds = config["median_ms"] * 1e-3
        if config["kind"] == "decode" and seconds > 0:
            row["bandwidth_bytes_per_s"] = config["bytes"] / seconds
            row["fraction_of_copy"] = row["bandwidth_bytes_per_s"] / copy if copy else None
        if config["kind"] == "prefill" and seconds > 0:
            row["tflops"] = config["flops"] / seconds * 1e-12
        anchor = anchors.get(anchor_name(config["name"]))
        row["anchor"] = anchor_name(config["name"])
        if anchor and anchor.get("status") == "ok":
            row["flex_paged_ms"] = anchor.get("flex_paged_ms")
            if anchor.get("flex_paged_ms") and seconds > 0:
                row["speedup_vs_flex"] = anchor["flex_paged_ms"] / config["median_ms"]
            if anchor.get("sdpa_flash_ms") and seconds > 0:
                row["sdpa_flash_ms"] = anchor["sdpa_flash_ms"]
                row["speedup_vs_sdpa"] = anchor["sdpa_flash_ms"] / config["median_ms"]
        elif anchor:
            row["anchor_status"] = "%s: %s" % (anchor.get("status"), anchor.get("message", ""))
        else:
            row["anchor_status"] = "missing"
        rows.append(row)
    return rows


def targets(rows):
    """Section 4's targets, each with the rows it covers and whether all pass."""
    checks = []

    def add(name, selected, predicate):
        values = [(r["name"], predicate(r)) for r in selected]
        known = [ok for _, ok in values if ok is not None]
        checks.append({"target": name, "rows": len(values),
                       "met": bool(known) and len(known) == len(values) and all(known),
                       "unknown": len(values) - len(known)})

    def value(r, key, test):
        return None if r.get(key) is None else test(r[key])

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
    add("page 16 within 5% of page 128",
        [dict(p16, ratio=(p16["median_ms"] / p128["median_ms"]) if p128["median_ms"] else None)
         for p16, p128 in pairs],
        lambda r: value(r, "ratio", lambda x: x <= 1.05))
    return checks


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ours")
    parser.add_argument("torch", nargs="?")
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    with open(args.ours) as f:
        ours = json.load(f)
    theirs = None
    if args.torch:
        try:
            with open(args.torch) as f:
                theirs = json.load(f)
        except (OSError, ValueError) as error:
            print("note: no PyTorch results (%s)" % error)
    rows = merge(ours, theirs)
    checks = targets(rows)
    print("%-46s %9s %9s %8s %9s %9s %7s %7s" % ("configuration", "ours ms", "GB/s", "of copy",
                                                 "TFLOP/s", "flex ms", "x flex", "x sdpa"))

    def fmt(value, spec):
        return (spec % value) if isinstance(value, (int, float)) else "-"
    for r in rows:
        print("%-46s %9s %9s %8s %9s %9s %7s %7s" % (
            r["name"], fmt(r["median_ms"], "%.4f"),
            fmt(r.get("bandwidth_bytes_per_s", 0) * 1e-9 if "bandwidth_bytes_per_s" in r else None,
                "%.0f"),
            fmt(r.get("fraction_of_copy"), "%.3f"), fmt(r.get("tflops"), "%.1f"),
            fmt(r.get("flex_paged_ms"), "%.4f"), fmt(r.get("speedup_vs_flex"), "%.2f"),
            fmt(r.get("speedup_vs_sdpa"), "%.2f")))
    for check in checks:
        print("target: %-62s %s (%d rows, %d without data)" % (
            check["target"], "MET" if check["met"] else "not met", check["rows"],
            check["unknown"]))
    report = {"date": ours.get("date"), "gpu": ours.get("gpu"),
              "driver_version": ours.get("driver_version"),
              "copy_bandwidth_bytes_per_s": ours.get("copy_bandwidth_bytes_per_s"),
              "torch": (theirs or {}).get("torch"),
              "torch_copy_bandwidth_bytes_per_s":
                  (theirs or {}).get("copy_bandwidth_bytes_per_s"),
              "rows": rows, "targets": checks}
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)
    print("wrote", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
