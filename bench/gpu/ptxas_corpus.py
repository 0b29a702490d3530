#!/usr/bin/env python3
"""Spills of the prefill (or decode) kernel for every corpus mask x score
combination.

Every mask mod and every score mod of examples/*.attn, and every pair of one
mask and one score (the two files' texts joined into one program; a pair
whose files declare the same name is skipped and counted), compiled with
`pagedc --emit=cubin --ptxas-report` (NVRTC) for the prefill kernel at the
shape pagedc runs (KernelConfig::choosePrefillShapeFor: at head dim 128
on sm_80 the 128x32 tile with 32 rows per warp where it compiles without
spills, else that tile with the mods' row values recomputed per KV tile, else
64x64; rows that fell back say so and name the tile), bf16, page 16, for each
head dim and architecture asked; with --kernel decode, the split-KV
decode kernel for --gqa query heads per KV head (default 4, the GPU
benchmark's). With --no-block-mask, the kernels a call without a block mask
compiles (`pagedc --no-block-mask`). Prints one line per kernel that spills and
a summary; --json writes every kernel's registers and spill bytes.

Usage: ptxas_corpus.py --pagedc build/bin/pagedc --examples examples
       [--kernel prefill|decode] [--gqa N] [--no-block-mask]
       [--arch sm_90,sm_80] [--head-dim 64,128,256] [--no-score] [--jobs N] [--json OUT]
Exit status 1 when any kernel spills or fails to compile.
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile

from ptxas_shapes import ptxas_figures, ptxas_functions  # same directory


def mods_of(text):
    masks, scores = [], []
    for line in text.splitlines():
        found = re.match(r"\s*(mask|score)\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(", line)
        if found:
            (masks if found.group(1) == "mask" else scores).append(found.group(2))
    return masks, scores


def declared_names(text):
    names = set()
    for line in text.splitlines():
        found = re.match(r"\s*(mask|score|param|buffer|const)\s+([A-Za-z_][A-Za-z0-9_]*)", line)
        if found:
            names.add(found.group(2))
    return names


NOTE = re.compile(r"note: the (\d+x\d+) prefill tile with (\d+) rows per warp"
                  r"( and mod rows recomputed per KV tile)? spills (\d+) bytes on \S+; "
                  r"compiling (it with the mods' row values recomputed|the (\d+x\d+) tile "
                  r"with (\d+) rows per warp)")


def fell_back_from(stderr):
    """The tiles the CLI's notes say it gave up because ptxas spilled them
    ("128x32 w32: 20 bytes", then "128x32 w32 r: 8 bytes" where the tile
    with its mod rows recomputed spilled too; KernelConfig::
    usePrefillSpillFallback), joined by "; ", else None."""
    tried = [f"{m.group(1)} w{m.group(2)}{' r' if m.group(3) else ''}: {m.group(4)} bytes"
             for m in NOTE.finditer(stderr)]
    return "; ".join(tried) if tried else None


def settled_tile(stderr):
    """The tile compiled after the CLI's last note ("128x32 w32 r": the mods'
    row values recomputed per KV tile; "64x64 w16"), else None (the tile
    pagedc tried first)."""
    last = None
    for m in NOTE.finditer(stderr):
        last = (f"{m.group(1)} w{m.group(2)} r" if m.group(6) is None
                else f"{m.group(6)} w{m.group(7)}")
    return last


def compile_one(pagedc, path, mask, score, arch, head_dim, kernel="prefill", gqa=1,
                no_block_mask=False):
    command = [pagedc, path, "--emit=cubin", f"--arch={arch}", f"--head-dim={head_dim}",
               f"--kernel={kernel}", "--ptxas-report",
               "-o", path + f".{kernel}.{arch}.{head_dim}.cubin"]
    if no_block_mask:
        command.append("--no-block-mask")
    if kernel == "decode":
        command.append(f"--gqa={gqa}")
    if mask:
        command.append(f"--mask={mask}")
    if score:
        command.append(f"--score={score}")
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "failed"}
    # The unit's main kernel; spills of any function in it (the decode unit
    # holds its merge kernel too) count.
    figures = ptxas_figures(run.stderr, f"pagedc_{kernel}")
    if figures["registers"] is None:
        return {"error": f"no ptxas report of pagedc_{kernel}"}
    result = {key: figures[key] for key in ("registers", "spill_store_bytes", "spill_load_bytes")}
    fallback = fell_back_from(run.stderr)
    if fallback:
        result["fell_back_from"] = fallback
        result["tile"] = settled_tile(run.stderr)
    for name in ptxas_functions(run.stderr):
        other = ptxas_figures(run.stderr, name)
        result["spill_store_bytes"] = max(result["spill_store_bytes"], other["spill_store_bytes"] or 0)
        result["spill_load_bytes"] = max(result["spill_load_bytes"], other["spill_load_bytes"] or 0)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pagedc", required=True)
    parser.add_argument("--examples", required=True)
    parser.add_argument("--arch", default="sm_90,sm_80")
    parser.add_argument("--head-dim", default="64,128,256")
    parser.add_argument("--kernel", choices=("prefill", "decode"), default="prefill")
    parser.add_argument("--gqa", type=int, default=4)
    parser.add_argument("--no-block-mask", action="store_true",
                        help="the kernels for launches without a block mask")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json")
    parser.add_argument("--no-score", action="store_true",
                        help="only the selections without a score mod (each mask mod alone): "
                        "a change to the kernels' no-score path only")
    options = parser.parse_args()

    files = sorted(f for f in os.listdir(options.examples) if f.endswith(".attn"))
    texts = {f: open(os.path.join(options.examples, f)).read() for f in files}
    masks = [(f, m) for f in files for m in mods_of(texts[f])[0]]
    scores = [(f, s) for f in files for s in mods_of(texts[f])[1]]

    programs = []  # (label, text, mask, score)
    skipped = 0
    for f, m in masks:
        programs.append((f"{f}:{m}", texts[f], m, None))
    for f, s in [] if options.no_score else scores:
        programs.append((f"{f}:{s}", texts[f], None, s))
    for mf, m in masks:
        for sf, s in [] if options.no_score else scores:
            if mf == sf:
                programs.append((f"{mf}:{m}+{s}", texts[mf], m, s))
            elif declared_names(texts[mf]) & declared_names(texts[sf]):
                skipped += 1
            else:
                programs.append((f"{mf}:{m}+{sf}:{s}", texts[mf] + "\n" + texts[sf], m, s))

    archs = options.arch.split(",")
    dims = [int(d) for d in options.head_dim.split(",")]
    rows, failures = [], 0
    with tempfile.TemporaryDirectory() as directory:
        jobs = []
        with concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
            for index, (label, text, mask, score) in enumerate(programs):
                path = os.path.join(directory, f"p{index}.attn")
                with open(path, "w") as file:
                    file.write(text)
                for arch in archs:
                    for dim in dims:
                        jobs.append((label, arch, dim, pool.submit(
                            compile_one, options.pagedc, path, mask, score, arch, dim,
                            options.kernel, options.gqa, options.no_block_mask)))
            for label, arch, dim, future in jobs:
                result = future.result()
                row = {"mods": label, "arch": arch, "head_dim": dim, **result}
                rows.append(row)
                if "error" in result or result.get("spill_store_bytes") or \
                        result.get("spill_load_bytes"):
                    failures += 1
                    print(f"{arch} D{dim} {label}: {result}", flush=True)
    kernels = len(rows)
    for tile, what in (("128x32 w32 r", "the 128x32 tile with their mod rows recomputed per KV "
                        "tile"), ("64x64 w16", "the 64x64 tile")):
        count = sum(1 for row in rows if row.get("tile") == tile)
        if count:
            print(f"{count} prefill kernels took {what} where the 128x32 one holding its mod rows "
                  "spills")
    print(f"{kernels} {options.kernel} kernels ({len(programs)} mod selections x {len(archs)} archs x "
          f"{len(dims)} head dims; {skipped} mask x score pairs skipped for a name both files "
          f"declare): {failures} spill or fail")
    if options.json:
        with open(options.json, "w") as file:
            what = ("prefill kernel, bf16, page 16, the shape pagedc runs" if options.kernel ==
                    "prefill" else f"decode kernel, bf16, page 16, GQA {options.gqa}, 1 query "
                    "token")
            json.dump({"what": what + "; ptxas -v through NVRTC", "skipped_pairs": skipped,
                       "rows": rows},
                      file, indent=1)
            file.write("\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
