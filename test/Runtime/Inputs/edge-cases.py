#!/usr/bin/env python3
"""Runs each score mod of edge-cases.attn through `pagedc run` on the CPU
JIT, the float64 reference (--reference) and the SIMT emulator
(--device emu, every checker on) and compares the lse of every row: the
three must agree within 1e-4, and the lse must vary between rows and between
mods (so the scores really depend on the edge-case results).

  edge-cases.py DIR FILE.attn      DIR holds q.npy k.npy v.npy iv.npy fv.npy grid.npy

Prints one FAIL line per disagreement and a summary line."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_npy import read_npy  # noqa: E402

# The buffers each mod reads (pagedc run refuses a buffer no mod reads).
MODS = {"floordiv": ["iv"], "floormod": ["iv"], "shifts": ["iv"],
        "power": ["iv"], "wrapping": ["iv"], "to_int": ["iv", "fv"],
        "out_of_range": ["iv", "fv", "grid"]}
work, source = sys.argv[1], sys.argv[2]
env = dict(os.environ, PAGEDC_CACHE_DIR=os.path.join(work, "cache"))
failures = 0


def fail(message):
    global failures
    failures += 1
    print("FAIL " + message)


def run(mod, backend):
    lse = os.path.join(work, "%s-%s-lse.npy" % (mod, backend))
    command = ["pagedc", "run", source, "--score=" + mod,
               "--q", os.path.join(work, "q.npy"), "--k", os.path.join(work, "k.npy"),
               "--v", os.path.join(work, "v.npy"),
               "-o", os.path.join(work, "%s-%s.npy" % (mod, backend)), "--lse", lse]
    for buffer in MODS[mod]:
        command += ["--buffer", "%s=%s" % (buffer, os.path.join(work, buffer + ".npy"))]
    if backend == "reference":
        command.append("--reference")
    elif backend == "emu":
        command += ["--device", "emu", "--page-size", "4", "--shuffle-pages", "7"]
    result = subprocess.run(command, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    if result.returncode != 0:
        fail("%s on %s: exit %d: %s" % (mod, backend, result.returncode,
                                         result.stdout.decode()[-2000:]))
        return None
    return read_npy(lse)[1]


rows_by_mod = {}
for mod in MODS:
    lse = {backend: run(mod, backend) for backend in ("cpu", "reference", "emu")}
    if any(v is None for v in lse.values()):
        continue
    for backend in ("cpu", "emu"):
        for row, (x, y) in enumerate(zip(lse[backend], lse["reference"])):
            if not abs(x - y) <= 1e-4:
                fail("%s: row %d: lse %r on %s, %r in the reference" % (
                    mod, row, x, backend, y))
    if len(set(lse["reference"])) < 2:
        fail("%s: every row has the same lse %r: the mod does not test much" % (
            mod, lse["reference"][0]))
    rows_by_mod[mod] = tuple(lse["reference"])
if len(set(rows_by_mod.values())) != len(rows_by_mod):
    fail("two mods give the same lse in every row")
if failures:
    print("edge-cases: %d failures" % failures)
    sys.exit(1)
print("edge-cases: %d score mods, lse of emu == cpu == reference" % len(MODS))
