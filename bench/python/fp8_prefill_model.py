#!/usr/bin/env python3
"""The sm_90a warpgroup prefill over an 8-bit float cache against a bf16
cache, MODELLED: causal prefill of B 4, Hq 32, Hkv 8, D 128, S 16384 on
pages taken in turns (pagedc-gpu's bench shape
`prefill-causal-B4-S16384-p128`), bf16 q, both caches read by the
warpgroup kernel at the tile the runtime takes on an H100 (128 x 128,
`prefill_shape` asked for since the emulator's target is not sm_90a) with
a CTA per query tile (`prefill_persistent=0`, as `pagedc-gpu model` runs
it). Each call runs once on the SIMT emulator with its counters on,
sampled as `pagedc-gpu model` samples (checks off,
PAGEDC_EMU_SAMPLE_BLOCKS=32 unless --sample-blocks says; both calls run
the same CTAs), and its launch goes through the H100 roofline
(`pagedc-gpu model --launches`, tools/pagedc-gpu/Model.cpp; this script
holds no formula) with the kernel's 168 registers per thread (the
launch's, ptxas, both caches) and DRAM bytes as the model's prefill rule
has them (distinct sectors: the CTAs of one KV head re-read its K/V,
assumed caught by L2). No GPU ran these kernels.

The producer's conversion instructions are not counted by the emulator;
bench/studies/fp8-prefill-model.md puts them beside these terms. Needs
torch (bf16 q from the host).

    PYTHONPATH=build/python python3 bench/python/fp8_prefill_model.py \
        [--length 16384] [--page 128] [--kv-dtype float8_e4m3fn] \
        [--sample-blocks 32] [--json FILE] [--pagedc-gpu build/bin/pagedc-gpu]
"""
import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cascade_cuda_model import (LAUNCH_FIELDS, modelled, parse_with_pagedc_gpu,  # noqa: E402
                                write_entry)

LABEL = ("MODELLED, not measured: emulator counters + roofline (docs/emulator.md, "
         "'The performance model'), H100, 168 registers per thread (ptxas); no issue term; "
         "no GPU ran these kernels")
# The warpgroup prefill's registers per thread at launch (ptxas, sm_90a,
# 128 x 128 at D 128, both caches; setmaxnreg moves them between the
# warpgroups).
REGISTERS = 168


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--page", type=int, default=128)
    parser.add_argument("--kv-dtype", default="float8_e4m3fn",
                        choices=("float8_e4m3fn", "float8_e5m2"))
    parser.add_argument("--sample-blocks", type=int, default=32,
                        help="CTAs the emulator runs of each grid (counts scaled)")
    parser.add_argument("--json", help="write the results here")
    args = parse_with_pagedc_gpu(parser)
    os.environ.setdefault("PAGEDC_CUDA_DRIVER", "emu")
    os.environ["PAGEDC_EMU_CHECKS"] = "none"
    os.environ["PAGEDC_EMU_SAMPLE_BLOCKS"] = str(args.sample_blocks)
    os.environ["PAGEDC_EMU_SAMPLE_KERNELS"] = "pagedc_prefill"
    import pagedc

    batch, hq, hkv, d, length, page = args.batch, 32, 8, 128, args.length, args.page
    rng = np.random.default_rng(0)
    q = rng.uniform(-2, 2, (batch, hq, length, d))
    mods = pagedc.compile("mask causal(b, h, q, kv) = q >= kv\n", cuda=True)
    import torch
    q_device = pagedc.to_device(torch.from_numpy(q).to(torch.bfloat16), device="emu")
    pages = batch * (length // page) + 1
    options = {"prefill_shape": "128x128x64", "prefill_persistent": False}

    def run(dtype, scale):
        """The causal prefill over a cache of `dtype`; its launch modelled."""
        cache = pagedc.PagedKVCache(pages, page, batch, hkv, d, dtype=dtype, k_scale=scale,
                                    v_scale=scale, device="emu")
        # Pages in turns: each round gives every slot one more page, so no
        # sequence's pages are consecutive.
        for n in range(page, length + page, page):
            for b in range(batch):
                cache.reserve(b, n)
        for b in range(batch):
            # (An 8-bit cache quantizes f32 host values; a bf16 one takes
            # bf16 values on the device.)
            values = [torch.from_numpy(rng.uniform(-1, 1, (1, hkv, length, d)).astype(np.float32))
                      for _ in range(2)]
            if scale is None:
                values = [pagedc.to_device(v.to(torch.bfloat16), device="emu") for v in values]
            cache.assign(np.array([b], np.int32), np.arange(length, dtype=np.int32)[None],
                         *values)
        counters = os.path.join(tempfile.mkdtemp(), "counters.jsonl")
        os.environ["PAGEDC_EMU_COUNTERS"] = counters
        try:
            pagedc.flex_attention(q_device, cache, mods=mods, enable_gqa=True,
                                  return_lse=True, kernel_options=options)
        finally:
            del os.environ["PAGEDC_EMU_COUNTERS"]
        model = modelled(counters, args.pagedc_gpu, REGISTERS, dram=None)
        launches = [{k: launch[k] for k in LAUNCH_FIELDS} for launch in model["launches"]]
        return dict(launches=launches, modelled_us=model["modelled_us"])

    result = {
        "label": LABEL,
        "sample_blocks": args.sample_blocks,
        "shape": dict(batch=batch, hq=hq, hkv=hkv, d=d, length=length, page_size=page,
                      q_dtype="bf16", mask="causal", prefill_shape=options["prefill_shape"]),
        "bf16": run("bf16", None),
        args.kv_dtype: run(args.kv_dtype, 1.0 / 448),
    }
    for name in ("bf16", args.kv_dtype):
        for launch in result[name]["launches"]:
            terms = ", ".join(f"{k} {v:.0f}" for k, v in launch["terms_us"].items())
            print(f"{name}: {launch['kernel']} grid {launch['grid_blocks']}, "
                  f"{launch['bound']}-bound ({terms} us), {launch['modelled_us']:.0f} us")
    ratio = result[args.kv_dtype]["modelled_us"] / result["bf16"]["modelled_us"]
    result["time_ratio_to_bf16"] = round(ratio, 4)
    print(f"{args.kv_dtype} / bf16 time: {ratio:.3f} (MODELLED H100)")
    if args.json:
        write_entry(args.json, f"causal B{batch} S{length} p{page} {args.kv_dtype}", result,
                    section="fp8_prefill")


if __name__ == "__main__":
    main()
