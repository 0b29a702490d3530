#!/usr/bin/env python3
"""MLA decode on the CUDA backend, MODELLED: a decode step of `--sequences`
sequences (one new token each) with `--context` keys each on their own
pages, Hq 128 query heads against one 576-wide latent KV head whose first
512 columns are the values (templates/MlaDecode.cuh), f16, pages of 16,
causal; run once on the SIMT emulator with its counters on
(PAGEDC_EMU_COUNTERS; checks off; the decode grid sampled as pagedc-gpu
model samples it, PAGEDC_EMU_SAMPLE_BLOCKS=32, counts scaled by grid /
blocks run), its launches then through the performance model
(`pagedc-gpu model --launches`, tools/pagedc-gpu/Model.cpp) on the H100,
beside the step's HBM and tensor rooflines. No GPU ran these kernels.

Model inputs that differ from `pagedc-gpu model PACK` (no pack holds MLA
launches): registers per thread are ptxas's figure for the kernel
(`--registers`, default 218: sm_90, causal,
NvrtcCompile.MlaDecodeKernelsCompileWithoutSpills), and DRAM bytes are the
launch's distinct sectors (`--dram distinct`): the four CTAs of a
sequence's 128 heads read the same latent tiles, which L2 is taken to
catch.

    PYTHONPATH=build/python python3 bench/python/mla_cuda_model.py \\
        [--sequences 64] [--context 4096] [--hq 128] [--json FILE] \\
        [--pagedc-gpu build/bin/pagedc-gpu]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cascade_cuda_model import (LAUNCH_FIELDS, modelled, parse_with_pagedc_gpu,  # noqa: E402
                                write_entry)

LABEL = ("MODELLED, not measured: emulator counters + roofline (docs/emulator.md, "
         "'The performance model'); ptxas's registers; no GPU ran these kernels")
D, DV, PAGE = 576, 512, 16


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--hq", type=int, default=128)
    parser.add_argument("--registers", type=int, default=218)
    parser.add_argument("--json", help="write the results here")
    args = parse_with_pagedc_gpu(parser)
    os.environ.setdefault("PAGEDC_CUDA_DRIVER", "emu")
    os.environ["PAGEDC_EMU_CHECKS"] = "none"
    os.environ["PAGEDC_EMU_SAMPLE_BLOCKS"] = "32"
    os.environ["PAGEDC_EMU_SAMPLE_KERNELS"] = "pagedc_decode"
    import pagedc

    rng = np.random.default_rng(0)
    seqs, context, hq = args.sequences, args.context, args.hq
    pages_per_seq = -(-context // PAGE)
    n_pages = seqs * pages_per_seq
    latent = rng.standard_normal((n_pages, PAGE, 1, D), dtype=np.float32).astype(np.float16)
    table = rng.permutation(n_pages).astype(np.int32).reshape(seqs, pages_per_seq)
    lens = np.full(seqs, context, dtype=np.int32)
    qsl = np.arange(seqs + 1, dtype=np.int32)
    q = rng.standard_normal((seqs, hq, D), dtype=np.float32).astype(np.float16)
    mods = pagedc.compile("mask causal(b, h, q, kv) = q >= kv\n", cuda=True)
    attention = pagedc.BatchAttention(mods, hq, 1, D, PAGE, kv_layout="NHD", value_head_dim=DV,
                                      max_num_seqs=seqs, max_num_tokens=seqs, device="emu",
                                      dtype="f16")
    attention.plan(qsl, lens, table)
    qd = pagedc.to_device(q, device="emu")
    kd = pagedc.to_device(latent, device="emu")
    # The values: the latent rows' first 512 columns, a view of the same memory.
    vd = pagedc._pagedc._strided_view(kd, 1, DV)
    out = pagedc._pagedc.empty([seqs, hq, DV], "f16", 0)

    counters = os.path.join(tempfile.mkdtemp(), "mla.jsonl")
    os.environ["PAGEDC_EMU_COUNTERS"] = counters
    try:
        attention.run(qd, kd, vd, scale=1.0 / np.sqrt(192.0), out=out)
        pagedc.to_host(out)
    finally:
        del os.environ["PAGEDC_EMU_COUNTERS"]
    model = modelled(counters, args.pagedc_gpu, args.registers, dram="distinct")
    os.remove(counters)
    explain = counters + ".explain.json"
    subprocess.run([args.pagedc_gpu, "model", "--explain", "--json", explain], check=True,
                   capture_output=True)
    with open(explain) as f:
        h100 = json.load(f)["devices"]["H100"]
    os.remove(explain)
    must_move = seqs * context * D * 2 + 2 * seqs * hq * (D + DV) // 2 * 2
    flop = 2.0 * seqs * hq * context * (D + DV)
    result = {
        "label": LABEL,
        "shape": dict(sequences=seqs, context=context, hq=hq, hkv=1, d=D, dv=DV, page_size=PAGE,
                      dtype="f16", mask="causal", registers=args.registers),
        "must_move_bytes": must_move,
        "flop": flop,
        "hbm_roofline_us": must_move / h100["hbm_bytes_per_s"] * 1e6,
        "mma_sync_roofline_us":
            flop / (h100["peak_tflops"] * 1e12 * h100["mma_sync_fraction"]) * 1e6,
        "launches": [{k: launch[k] for k in LAUNCH_FIELDS if k in launch}
                     for launch in model["launches"]],
        "requested_global_bytes": model["requested_global_bytes"],
        "modelled_us": model["modelled_us"],
    }
    print(f"MODELLED H100: {result['modelled_us']:.1f} us; HBM roofline "
          f"{result['hbm_roofline_us']:.1f} us ({must_move / 1e6:.1f} MB); mma.sync roofline "
          f"{result['mma_sync_roofline_us']:.1f} us ({flop / 1e9:.1f} GFLOP)")
    for launch in result["launches"]:
        print(f"  {launch['kernel']}: grid {launch['grid_blocks']}, run {launch['blocks_run']}, "
              f"{launch['ctas_per_sm']} CTAs/SM, e {launch['wave_efficiency']:.2f}, "
              f"{launch['bound']}-bound, terms {launch['terms_us']}, "
              f"{launch['modelled_us']:.1f} us")
    if args.json:
        write_entry(args.json, f"{seqs}x{context} hq{hq}", result, section="mla_decode")


if __name__ == "__main__":
    main()
