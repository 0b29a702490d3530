#!/usr/bin/env python3
"""Static figures of the mma.sync prefill holding the mods' row values across
the KV loop against recomputing them per KV tile (kRecomputeModRows), for
corpus selections with row state, from ptxas (no GPU needed).

For each selection (a mask and/or score of examples/*.attn; two files'
texts joined where they come from two), compiles the prefill kernel at
sm_80, bf16, D 128, page 16 with `pagedc --emit=cubin --ptxas-report` for
the tiles $PAGEDC_PREFILL_SHAPE names: 128x32x32 (holding the row values),
128x32x32r (recomputing them) and 64x64x16 (the fallback before
recomputing existed). Records registers and spill bytes and, with
--cuobjdump PATH, the main loop's static SASS instructions other than MMA
per 64 keys and 16 query rows, the K/V copy loop's trips included
(ptxas_shapes.py's rules).

Usage: ptxas_rows.py --pagedc build/bin/pagedc --examples examples
       [--cuobjdump PATH] [--json OUT]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from ptxas_shapes import copy_trips, cubin_instructions, loop_counts, ptxas_figures

# (label, mask file:name or None, score file:name or None)
SELECTIONS = [
    ("causal", "causal.attn:causal", None),
    ("causal + tanh_softcap_approx", "causal.attn:causal", "softcap.attn:tanh_softcap_approx"),
    ("natten", "natten.attn:natten", None),
    ("document_causal", "document_mask.attn:document_causal", None),
    ("add_bias_qk", None, "learnable_bias_positional.attn:add_bias_qk"),
    ("query_scale", None, "learnable_bias_vector.attn:query_scale"),
    ("causal + add_bias_hqk", "causal.attn:causal", "learnable_bias_positional.attn:add_bias_hqk"),
    ("natten + query_scale", "natten.attn:natten", "learnable_bias_vector.attn:query_scale"),
    ("natten_morton + relative_bias", "natten_morton.attn:natten_morton",
     "relative_bias.attn:relative_bias"),
    ("document_causal + add_bias_bhqk", "document_mask.attn:document_causal",
     "learnable_bias_positional.attn:add_bias_bhqk"),
]
# (label, $PAGEDC_PREFILL_SHAPE, block_n, warp_rows, threads)
TILES = [
    ("128x32 w32, rows held", "128x32x32", 32, 32, 128),
    ("128x32 w32, rows recomputed", "128x32x32r", 32, 32, 128),
    ("64x64 w16", "64x64x16", 64, 16, 128),
]
HEAD_DIM = 128


def program(examples, directory, index, mask, score):
    """Writes the selection's program; returns (path, mask name, score name)."""
    files = []
    names = []
    for spec in (mask, score):
        if spec is None:
            names.append(None)
            continue
        name_of_file, name = spec.split(":")
        if name_of_file not in files:
            files.append(name_of_file)
        names.append(name)
    path = os.path.join(directory, f"s{index}.attn")
    with open(path, "w") as out:
        out.write("\n".join(open(os.path.join(examples, f)).read() for f in files))
    return path, names[0], names[1]


def compile_one(pagedc, path, mask, score, shape, cubin):
    command = [pagedc, path, "--emit=cubin", "--arch=sm_80", f"--head-dim={HEAD_DIM}",
               "--page-size=16", "--ptxas-report", "-o", cubin]
    if mask:
        command.append(f"--mask={mask}")
    if score:
        command.append(f"--score={score}")
    run = subprocess.run(command, capture_output=True, text=True,
                         env={**os.environ, "PAGEDC_PREFILL_SHAPE": shape})
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{run.stderr}")
    figures = ptxas_figures(run.stderr, "pagedc_prefill")
    if figures["registers"] is None:
        raise RuntimeError(f"no ptxas report in:\n{run.stderr}")
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pagedc", required=True)
    parser.add_argument("--examples", required=True)
    parser.add_argument("--cuobjdump")
    parser.add_argument("--json")
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for index, (label, mask, score) in enumerate(SELECTIONS):
            path, mask_name, score_name = program(options.examples, directory, index, mask,
                                                  score)
            for tile, shape, block_n, warp_rows, threads in TILES:
                cubin = os.path.join(directory, "kernel.cubin")
                figures = compile_one(options.pagedc, path, mask_name, score_name, shape, cubin)
                row = {"mods": label, "tile": tile, "arch": "sm_80", "head_dim": HEAD_DIM,
                       "page_size": 16, "registers": figures["registers"],
                       "spill_store_bytes": figures["spill_store_bytes"],
                       "spill_load_bytes": figures["spill_load_bytes"]}
                if options.cuobjdump:
                    mma, other, copy = loop_counts(cubin_instructions(options.cuobjdump, cubin),
                                                   copies=True)
                    per = 64 / block_n / (warp_rows // 16)
                    trips = copy_trips(block_n, threads, HEAD_DIM) if copy else 1
                    row["loop_mma"] = mma
                    row["loop_other"] = other
                    row["tile_other_per_64_keys_16_rows"] = round(
                        (other + (trips - 1) * (copy or 0)) * per, 1)
                rows.append(row)
                print(f"{label:<34} {tile:<28} regs {row['registers']:>3} spills "
                      f"{row['spill_store_bytes']:>3}/{row['spill_load_bytes']:<3}"
                      + (f" other per 64 keys x 16 rows {row['tile_other_per_64_keys_16_rows']}"
                         if "loop_mma" in row else ""), flush=True)
    if options.json:
        with open(options.json, "w") as file:
            json.dump({"what": "mma.sync prefill, sm_80, bf16, D 128, page 16: the mods' row "
                               "values held across the KV loop or recomputed per KV tile; ptxas "
                               "-v through NVRTC, SASS by cuobjdump (static counts of one loop "
                               "body)",
                       "rows": rows}, file, indent=1)
            file.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
