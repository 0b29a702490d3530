"""Writes a bench/python result file: the benchmark's own fields plus the
date, machine and CPU count, as indented JSON."""
import json
import os
import platform
import time


def write_results(path, benchmark, rows, **fields):
    result = {"benchmark": benchmark, **fields, "date": time.strftime("%Y-%m-%d"),
              "machine": platform.node(), "cpu_count": os.cpu_count(), "rows": rows}
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
