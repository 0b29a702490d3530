#!/usr/bin/env python3
"""The warpgroup prefill's K/V copies at page sizes the GPU pack does not
hold, on the SIMT emulator (every checker on).

The gather looks each page a tile touches up once (one per row at page 1,
one per tile when a page holds it) and stages the indices in shared memory;
tensor-map copies (the default) take pages of 16 rows or more. Each run is
`pagedc run --device emu` of causal attention
(150 query rows against 333 keys, GQA 2, shuffled pages) against the float64
reference, for 64- and 128-key tiles (32-key at head dim 256), with tensor
maps off (PAGEDC_PREFILL_TMA=0) and on. Prints one line per run and a summary; exit status 1 on any failure.

Usage: wgmma_pages.py EXAMPLES WORK
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from seeded_bugs import make_npy, rel_l2  # noqa: E402

# (head dim, page sizes, tile shapes): pages under, at and over the gather's
# row step (4 rows at D 256), under and over the tile; at D 256 the tile is
# 64 x 32 (one consumer warpgroup), the sm_90a default there.
MATRIX = [(128, (2, 8, 32, 256), ("128x64x64", "128x128x64")),
          (64, (8, 32), ("128x64x64", "128x128x64")),
          (256, (4, 16), ("64x32x64",))]


def main():
    examples, work = sys.argv[1:3]
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("PAGEDC_CACHE_DIR", os.path.join(work, "cache"))
    runs = failures = 0
    for dim, pages, shapes in MATRIX:
        q, k, v = (os.path.join(work, "%s%d.npy" % (n, dim)) for n in "qkv")
        make_npy(q, (1, 4, 150, dim), 21)
        make_npy(k, (1, 2, 333, dim), 22)
        make_npy(v, (1, 2, 333, dim), 23)
        for page in pages:
            args = ["pagedc", "run", os.path.join(examples, "causal.attn"), "--mask=causal",
                    "--q", q, "--k", k, "--v", v, "--page-size", str(page),
                    "--shuffle-pages", "5", "--q-offset", "end"]
            reference = os.path.join(work, "ref-%d-%d.npy" % (dim, page))
            subprocess.run(args + ["--reference", "-o", reference], check=True, env=env,
                           capture_output=True)
            for shape in shapes:
                for tma in ("0", "1"):
                    child = dict(env, PAGEDC_PREFILL_SHAPE=shape, PAGEDC_PREFILL_TMA=tma)
                    out = os.path.join(work, "out.npy")
                    result = subprocess.run(args + ["--device", "emu", "-o", out], env=child,
                                            capture_output=True, text=True)
                    label = "d%d page %d %s tma %s" % (dim, page, shape, tma)
                    runs += 1
                    if result.returncode != 0 or "pagedc-emu:" in result.stderr:
                        print("%s: FAILED (exit %d)\n%s" % (label, result.returncode,
                                                            result.stderr))
                        failures += 1
                        continue
                    error = rel_l2(out, reference)
                    ok = error <= 1e-2
                    failures += not ok
                    print("%s: no report, relative L2 %.1e %s" %
                          (label, error, "agrees" if ok else "DISAGREES"))
    print("wgmma pages: %d of %d runs agree" % (runs - failures, runs))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
