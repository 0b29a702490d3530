#!/usr/bin/env python3
"""bench/README.md targets §6: `pagedc run` on a 537 MB decode input.

Writes q [1, 32, 1, 128] and K, V [1, 8, 65536, 128] (f32, 537 MB in all,
fresh random values) as .npy files, then in the same run and on the same
files (all in the page cache, so every side reads memory, not disk):

  numpy     a fresh process: np.load of the three files (import not counted)
  attention the same causal decode step through the Python package, the
            inputs already in memory (median of --reps calls): the attention
            time alone
  run       a fresh `pagedc run` process (causal, --q-offset end, page 16)
            under /usr/bin/time -v: wall time and peak resident memory; also
            the same command on a tiny input, for its fixed start-up and
            JIT-compile cost

Targets: run wall <= 1.5 x (numpy load + attention); peak memory <= 1.3 x the
input size. The run's output is checked against the Python package's.

    PYTHONPATH=build/python python3 bench/cpu/large_input.py --pagedc build/bin/pagedc \\
        [--reps 3] [--json bench/results/large-input.json]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

CAUSAL = "mask causal(b, h, q, kv) = q >= kv\n"


def timed_run(command):
    """Runs `command` under /usr/bin/time -v; returns (wall s, peak RSS bytes)."""
    start = time.perf_counter()
    result = subprocess.run(["/usr/bin/time", "-v"] + command, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit("failed: %s\n%s" % (" ".join(command), result.stderr[-3000:]))
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr).group(1))
    return wall, peak_kb * 1024


def numpy_load_seconds(paths):
    code = ("import numpy as np, time, sys\n"
            "t = time.perf_counter()\n"
            "arrays = [np.load(p) for p in sys.argv[1:]]\n"
            "print(time.perf_counter() - t)\n")
    out = subprocess.run([sys.executable, "-c", code] + paths, check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return float(out.strip())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pagedc", default="build/bin/pagedc")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--kv", type=int, default=65536)
    parser.add_argument("--json")
    args = parser.parse_args()
    import pagedc

    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    B, Hq, Hkv, D, S = 1, 32, 8, 128, args.kv
    with tempfile.TemporaryDirectory(prefix="pagedc-large-", dir=os.environ.get("TMPDIR")) as work:
        attn = os.path.join(work, "causal.attn")
        with open(attn, "w") as f:
            f.write(CAUSAL)
        q = rng.standard_normal((B, Hq, 1, D), dtype=np.float32)
        k = rng.standard_normal((B, Hkv, S, D), dtype=np.float32)
        v = rng.standard_normal((B, Hkv, S, D), dtype=np.float32)
        paths = [os.path.join(work, n + ".npy") for n in ("q", "k", "v")]
        for path, x in zip(paths, (q, k, v)):
            np.save(path, x)
        input_bytes = sum(os.path.getsize(p) for p in paths)
        tiny = [os.path.join(work, n + "-tiny.npy") for n in ("q", "k", "v")]
        for path, x in zip(tiny, (q[:, :, :, :], k[:, :, :16], v[:, :, :16])):
            np.save(path, np.ascontiguousarray(x))

        # The attention alone, through the package (same mods, page 16).
        mods = pagedc.compile(CAUSAL)
        cache = pagedc.PagedKVCache(S // 16, 16, 1, Hkv, D)
        cache.reserve([0], S)
        cache.assign(np.zeros(1, np.int32), np.arange(S, dtype=np.int32)[None], k, v)
        expected = None
        attention = []
        for _ in range(args.reps + 1):
            t = time.perf_counter()
            expected = pagedc.flex_attention(q, cache, mods=mods, q_offset="end", enable_gqa=True)
            attention.append(time.perf_counter() - t)
        attention = statistics.median(attention[1:])
        del cache

        def command(inputs, out):
            return [args.pagedc, "run", attn, "--q", inputs[0], "--k", inputs[1], "--v", inputs[2],
                    "-o", out, "--q-offset", "end", "--page-size", "16", "--device", "cpu"]

        rows = []
        out = os.path.join(work, "out.npy")
        for _ in range(args.reps):
            load = numpy_load_seconds(paths)
            wall, peak = timed_run(command(paths, out))
            tiny_wall, _ = timed_run(command(tiny, os.path.join(work, "tiny-out.npy")))
            rows.append({"numpy_load_s": load, "pagedc_run_s": wall, "peak_rss_bytes": peak,
                         "tiny_run_s": tiny_wall})
            print(f"numpy load {load:.3f} s + attention {attention:.3f} s = "
                  f"{load + attention:.3f} s | pagedc run {wall:.3f} s "
                  f"({wall / (load + attention):.2f}x), peak {peak / 1e6:.0f} MB "
                  f"({peak / input_bytes:.2f}x the input) | tiny-input run {tiny_wall:.3f} s",
                  flush=True)
        got = np.load(out)
        diff = float(np.max(np.abs(got - np.asarray(expected))))
        if not diff <= 1e-5:
            raise SystemExit("pagedc run and the package differ by %g" % diff)

    med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    summary = {"input_bytes": input_bytes, "attention_s": round(attention, 4),
               "numpy_load_s": round(med["numpy_load_s"], 4),
               "pagedc_run_s": round(med["pagedc_run_s"], 4),
               "tiny_run_s": round(med["tiny_run_s"], 4),
               "ratio_run_over_load_plus_attention":
                   round(med["pagedc_run_s"] / (med["numpy_load_s"] + attention), 2),
               "peak_over_input": round(med["peak_rss_bytes"] / input_bytes, 3),
               "max_abs_diff_vs_package": diff}
    print("medians: " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "bench/cpu/large_input.py", "shape":
                       {"q": [B, Hq, 1, D], "k": [B, Hkv, S, D], "dtype": "f32"},
                       "date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(),
                       "summary": summary, "runs": rows}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
