#!/usr/bin/env python3
"""Page runs of the tensor-map copies on the SIMT emulator (every checker on).

With tensor maps, a KV tile of several pages whose pages are consecutive
comes in one box per 64 head dims (the warpgroup prefill: each segment of
up to 64 rows of the tile): in the warpgroup prefill
(templates/PrefillWgmma.cuh, tma_kv_stage) and in the decode kernel's whole
tiles (templates/Decode.cuh, copy_tile). The allocator hands a sequence's
pages out in descending order, so such a run usually lands page-reversed
and the kernels read the tile's columns through an XOR. Each run here is
`pagedc run --device emu` of causal attention with an ALiBi score (which
depends on kv, so a column read as the wrong key changes the output),
against the float64 reference, with the pages in three orders: reserved at
once (descending runs), one at a time (`--ascending-pages`) and shuffled;
and, for the prefill at pages of 16 rows, four at a time
(`--pages-per-reserve 4`: descending runs of 4 pages that are not one run
together) and, on 64-key tiles, two at a time (runs of 2 pages: a 4-page
box's pages are not a run, which must copy as shuffled pages do); and with the runs on (the default) and off
(PAGEDC_PREFILL_TMA_RUNS=0, PAGEDC_DECODE_TMA_RUNS=0). Prefill: 150 query rows against 333 keys; decode:
one token against 1,100 keys (split). The emulator's counters must show the
runs: with them on, the kernel issues box rows / page_size times fewer bulk
tensor copies for the same bytes in every run order (the prefill's run
boxes cover up to 64 rows, the decode kernel's a tile), and no fewer in the
shuffled order than a run per tile would need. Prints one line per run and
a summary; exit status 1 on any failure.

Usage: page_runs.py WORK
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from seeded_bugs import make_npy, rel_l2  # noqa: E402

PROGRAM = """\
const H = 4
mask causal(b, h, q, kv) = q >= kv
score alibi(s, b, h, q, kv) = s + (kv - q) * exp2(-(h + 1) * 8.0 / H)
"""

# Pages reserved 4 at a time: descending runs of 4 pages, each above the
# one before (a sequence grown a few pages at a time; the GPU benchmark's
# page tables).
RUNS_OF_4 = ("runs of 4", ["--pages-per-reserve", "4"], True)
# Pages reserved 2 at a time under 64-row run boxes of 4 pages: each box's
# pages are two runs, not one (as shuffled pages: no run boxes).
RUNS_OF_2 = ("runs of 2", ["--pages-per-reserve", "2"], False)

# (kernel, head dim, page size, environment, pages per run box, orders
# besides ORDERS). The warpgroup prefill's run boxes cover up to 64 rows
# (PrefillWgmma.cuh, kRunRows): a 128-key tile of 16-row pages is two.
MATRIX = [("prefill", 128, 16, {"PAGEDC_PREFILL_SHAPE": "128x64x64"}, 4, [RUNS_OF_4, RUNS_OF_2]),
          ("prefill", 128, 32, {"PAGEDC_PREFILL_SHAPE": "128x64x64"}, 2, []),
          ("prefill", 128, 16, {"PAGEDC_PREFILL_SHAPE": "128x128x64"}, 4, [RUNS_OF_4]),
          ("prefill", 64, 16, {"PAGEDC_PREFILL_SHAPE": "128x64x64"}, 4, []),
          ("decode", 128, 16, {}, 4, []),
          ("decode", 128, 32, {}, 2, []),
          ("decode", 256, 16, {}, 4, [])]
# (name, pagedc run arguments, whether every whole box's pages are a run).
ORDERS = [("reserved", [], True), ("ascending", ["--ascending-pages"], True),
          ("shuffled", ["--shuffle-pages", "7"], False)]
KERNEL = {"prefill": "pagedc_prefill", "decode": "pagedc_decode"}
RUNS_SWITCH = {"prefill": "PAGEDC_PREFILL_TMA_RUNS", "decode": "PAGEDC_DECODE_TMA_RUNS"}


def bulk(counters, kernel):
    """(bulk tensor copies, their bytes) of the kernel's launches."""
    copies = nbytes = 0
    with open(counters) as f:
        for line in f:
            launch = json.loads(line)
            if launch["kernel"] == kernel:
                copies += launch["counters"]["bulk_copies"]
                nbytes += launch["counters"]["bulk_copy_bytes"]
    return copies, nbytes


def main():
    work = sys.argv[1]
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("PAGEDC_CACHE_DIR", os.path.join(work, "cache"))
    program = os.path.join(work, "alibi_causal.attn")
    with open(program, "w") as f:
        f.write(PROGRAM)
    runs = failures = 0

    def fail(label, why):
        nonlocal failures
        failures += 1
        print("%s: FAILED (%s)" % (label, why))

    for kernel, dim, page, kernel_env, per_tile, extra_orders in MATRIX:
        rows, keys, heads_q = (150, 333, 4) if kernel == "prefill" else (1, 1100, 8)
        q, k, v = (os.path.join(work, "%s-%s%d.npy" % (kernel, n, dim)) for n in "qkv")
        make_npy(q, (1, heads_q, rows, dim), 31)
        make_npy(k, (1, 2, keys, dim), 32)
        make_npy(v, (1, 2, keys, dim), 33)
        args = ["pagedc", "run", program, "--mask=causal", "--score=alibi", "--q", q, "--k", k,
                "--v", v, "--page-size", str(page), "--q-offset", "end"]
        reference = os.path.join(work, "ref-%s-%d.npy" % (kernel, dim))
        subprocess.run(args + ["--reference", "-o", reference], check=True, env=env,
                       capture_output=True)
        shape = kernel_env.get("PAGEDC_PREFILL_SHAPE", "")
        name = "%s d%d page %d%s" % (kernel, dim, page, " " + shape if shape else "")
        for order, order_args, all_runs in ORDERS + extra_orders:
            copies = {}
            for runs_on in ("1", "0"):
                label = "%s %s runs %s" % (name, order, "on" if runs_on == "1" else "off")
                counters = os.path.join(work, "counters.jsonl")
                if os.path.exists(counters):
                    os.remove(counters)
                child = dict(env, PAGEDC_PREFILL_TMA="1", PAGEDC_DECODE_TMA="1",
                             PAGEDC_EMU_COUNTERS=counters, **kernel_env)
                child[RUNS_SWITCH[kernel]] = runs_on
                out = os.path.join(work, "out.npy")
                result = subprocess.run(args + order_args + ["--device", "emu", "-o", out],
                                        env=child, capture_output=True, text=True)
                runs += 1
                if result.returncode != 0 or "pagedc-emu:" in result.stderr:
                    fail(label, "exit %d\n%s" % (result.returncode, result.stderr))
                    continue
                copies[runs_on] = bulk(counters, KERNEL[kernel])
                error = rel_l2(out, reference)
                if error > 1e-2:
                    fail(label, "relative L2 %.1e DISAGREES" % error)
                    continue
                print("%s: no report, relative L2 %.1e agrees, %d bulk copies of %d bytes" %
                      ((label, error) + copies[runs_on]))
            if len(copies) != 2:
                continue
            (on, on_bytes), (off, off_bytes) = copies["1"], copies["0"]
            label = "%s %s" % (name, order)
            if on_bytes != off_bytes or off == 0:
                fail(label, "bulk bytes %d with runs, %d without" % (on_bytes, off_bytes))
            elif all_runs and on * per_tile != off:
                fail(label, "%d bulk copies with runs, %d without: not 1/%d" %
                     (on, off, per_tile))
            elif not all_runs and on * per_tile <= off:
                fail(label, "%s pages ran as runs (%d copies, %d without)" % (order, on, off))
            else:
                print("%s: runs take %d of %d copies" % (label, on, off))
    print("page runs: %d runs, %d failed" % (runs, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
