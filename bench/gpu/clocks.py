#!/usr/bin/env python3
"""The clock a GPU ran at under load, from gpu-check.sh's clocks.csv.

  clocks.py CLOCKS.csv [--json OUT]

clocks.csv is nvidia-smi's CSV (`--query-gpu=timestamp,clocks.sm,
clocks.max.sm,power.draw,temperature.gpu --format=csv -lms 500`), one
sample every half second from the first launch on. A sample counts as
under load when its power draw is at least half the highest drawn in the
file (idle samples, between steps, sit near the idle clock and would pull
the figures down). Prints, for those samples, the SM clock's median,
lowest and highest, the maximum SM clock nvidia-smi reported, the median
power and the highest temperature: what `issue_model.py calibrate
--clock-ghz` takes, and what a TFLOP/s figure is to be read against (the
model counts at 1.83 GHz).
"""
import argparse
import json
import statistics
import sys


def number(field):
    """The number at the start of an nvidia-smi field ('1980 MHz',
    '650.12 W', '55'), or None ('[N/A]', '[Not Supported]')."""
    try:
        return float(field.strip().split()[0])
    except (ValueError, IndexError):
        return None


def samples(text):
    """Rows of (sm MHz, max sm MHz, power W, temperature C) from the CSV,
    skipping its header(s) and lines nvidia-smi could not fill."""
    rows = []
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) < 5 or fields[0].strip().startswith("timestamp"):
            continue
        values = [number(f) for f in fields[1:5]]
        if values[0] is None or values[2] is None:
            continue
        rows.append(tuple(values))
    return rows


def summary(rows):
    if not rows:
        raise ValueError("no samples with an SM clock and a power draw")
    peak = max(r[2] for r in rows)
    loaded = [r for r in rows if r[2] >= 0.5 * peak]
    clocks = [r[0] for r in loaded]
    temperatures = [r[3] for r in loaded if r[3] is not None]
    maxima = [r[1] for r in rows if r[1] is not None]
    return {"samples": len(rows), "loaded_samples": len(loaded),
            "sm_mhz_median": statistics.median(clocks), "sm_mhz_min": min(clocks),
            "sm_mhz_max": max(clocks), "sm_mhz_reported_max": max(maxima) if maxima else None,
            "power_w_median": statistics.median(r[2] for r in loaded), "power_w_peak": peak,
            "temperature_c_max": max(temperatures) if temperatures else None}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("clocks")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    try:
        with open(args.clocks) as handle:
            result = summary(samples(handle.read()))
    except (OSError, ValueError) as error:
        print(f"clocks.py: {args.clocks}: {error}", file=sys.stderr)
        return 1
    print("under load (%d of %d samples, power >= half the peak %.0f W): SM clock median %.0f MHz "
          "(%.0f-%.0f; nvidia-smi's maximum %s MHz), power median %.0f W, temperature up to %s C" % (
              result["loaded_samples"], result["samples"], result["power_w_peak"],
              result["sm_mhz_median"], result["sm_mhz_min"], result["sm_mhz_max"],
              "%.0f" % result["sm_mhz_reported_max"] if result["sm_mhz_reported_max"] else "?",
              result["power_w_median"],
              "%.0f" % result["temperature_c_max"] if result["temperature_c_max"] is not None
              else "?"))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
