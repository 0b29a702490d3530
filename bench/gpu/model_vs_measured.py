#!/usr/bin/env python3
"""The performance model's times against a GPU's measured ones.

  model_vs_measured.py MODEL_JSON BENCH_JSON [--device H100] [--filter TEXT]
                       [--json OUT]

MODEL_JSON: `pagedc-gpu model --json` output (or an object holding such
outputs by name, as bench/results/model-prefill-wgmma.json does: --key picks
one). BENCH_JSON: `pagedc-gpu bench --json` output from a GPU. For every
configuration in both: the modelled time, the measured median, and
measured / modelled (above 1: the model was optimistic). Prints a table and
the geometric mean of the ratio per kind.
"""
import argparse
import json
import math
import sys


def model_rows(model, device):
    rows = {}
    for c in model.get("configurations", []):
        d = c.get("devices", {}).get(device)
        if c.get("status") == "modelled" and d and d.get("modelled_us"):
            rows[c["name"]] = d["modelled_us"]
    return rows


def compare(model, bench, device="H100", text=""):
    modelled = model_rows(model, device)
    out = []
    for c in bench.get("configurations", []):
        name = c["name"]
        if text not in name or name not in modelled or c.get("status") != "ok":
            continue
        measured_us = c["median_ms"] * 1000.0
        out.append({"name": name, "kind": c.get("kind", name.split("-")[0]),
                    "modelled_us": modelled[name], "measured_us": measured_us,
                    "measured_over_modelled": measured_us / modelled[name]})
    return out


def geomean(values):
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("bench")
    parser.add_argument("--device", default="H100")
    parser.add_argument("--key", default="")
    parser.add_argument("--filter", default="")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    model = json.load(open(args.model))
    if args.key:
        model = model[args.key]
    rows = compare(model, json.load(open(args.bench)), args.device, args.filter)
    if not rows:
        print("no configuration is in both files", file=sys.stderr)
        return 1
    print("%-48s %12s %12s %9s" % ("configuration", "modelled us", "measured us", "meas/mod"))
    for r in rows:
        print("%-48s %12.1f %12.1f %9.2f" % (r["name"], r["modelled_us"], r["measured_us"],
                                           r["measured_over_modelled"]))
    summary = {}
    for kind in sorted({r["kind"] for r in rows}):
        ratios = [r["measured_over_modelled"] for r in rows if r["kind"] == kind]
        summary[kind] = {"rows": len(ratios), "geomean": geomean(ratios),
                         "min": min(ratios), "max": max(ratios)}
        print("%s: %d rows, measured / modelled geomean %.2f (%.2f-%.2f)" %
              (kind, len(ratios), summary[kind]["geomean"], min(ratios), max(ratios)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "bench": args.bench, "device": args.device,
                       "rows": rows, "summary": summary}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
