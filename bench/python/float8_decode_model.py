#!/usr/bin/env python3
"""8-bit float KV caches against bf16 in decode, MODELLED: one new token for
each of B sequences of `context` keys (Hq 32, Hkv 8, D 128, pages of 16,
causal), with the caches in f16 and in f8e4m3 (scales per KV head; q and
out f16 both), run
once each through BatchAttention's decode kernels on the SIMT emulator with
its counters on, each launch put through the H100 roofline exactly as
bench/python/cascade_cuda_model.py does (its `counted`: 32 sampled decode
blocks, `--registers 128`, `--dram requested`, its label). Every sequence
reads the same pages (the block table's rows are equal), so that B 64 x 32k
fits in this machine's memory; with `--dram requested` a launch's DRAM bytes
are the bytes its CTAs request, as if each sequence had pages of its own.
f16 stands for bf16 (NumPy has no bf16 arrays): the bytes are the same,
and the model counts no ALU issue, so the bf16 conversion's extra
instructions (Float8.cuh) would not show in it either. No GPU ran these
kernels.

    PYTHONPATH=build/python python3 bench/python/float8_decode_model.py \
        [--batches 16,64] [--contexts 8192,32768] [--json FILE]
"""
import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cascade_cuda_model import LABEL, counted, parse_with_pagedc_gpu, write_entry  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--contexts", default="8192,32768")
    parser.add_argument("--json", help="write the results here")
    args = parse_with_pagedc_gpu(parser)
    os.environ.setdefault("PAGEDC_CUDA_DRIVER", "emu")
    os.environ["PAGEDC_EMU_CHECKS"] = "none"
    os.environ["PAGEDC_EMU_SAMPLE_BLOCKS"] = "32"
    os.environ["PAGEDC_EMU_SAMPLE_KERNELS"] = "pagedc_decode,pagedc_prefill"
    import pagedc

    hq, hkv, d, page = 32, 8, 128, 16
    rng = np.random.default_rng(0)
    k_scale = [0.02 + 0.005 * h for h in range(hkv)]
    v_scale = [0.03 + 0.004 * h for h in range(hkv)]
    directory = tempfile.mkdtemp()
    # (A decode row's causal mask keeps every key: the mask the GPU benchmark's
    # decode shapes run with.)
    mods = pagedc.compile("mask causal(b, h, q, kv) = q >= kv\n", cuda=True)
    for context in (int(x) for x in args.contexts.split(",")):
        pages = context // page
        # One sequence's pages (NHD), its codes and its f16 values.
        codes = [rng.integers(0, 0x7f, size=(pages, page, hkv, d), dtype=np.uint8)
                 | (rng.integers(0, 2, size=(pages, page, hkv, d), dtype=np.uint8) << 7)
                 for _ in range(2)]
        halves = [rng.standard_normal((pages, page, hkv, d)).astype(np.float16)
                  for _ in range(2)]
        for batch in (int(x) for x in args.batches.split(",")):
            table = np.tile(np.arange(pages, dtype=np.int32), (batch, 1))
            lens = np.full(batch, context, dtype=np.int32)
            qsl = np.arange(batch + 1, dtype=np.int32)
            q = pagedc.to_device(rng.standard_normal((batch, hq, d)).astype(np.float16),
                                 device="emu")
            result = {"label": LABEL,
                      "shape": dict(batch=batch, context=context, hq=hq, hkv=hkv, d=d,
                                    page_size=page, q_dtype="f16", mask="causal",
                                    kernel="BatchAttention decode (Decode.cuh, packed)")}
            for name, kv_dtype, caches, extra in (
                    ("f16", None, halves, {}),
                    ("f8e4m3", "float8_e4m3fn", codes,
                     dict(kv_dtype="float8_e4m3fn", k_scale=k_scale, v_scale=v_scale))):
                attention = pagedc.BatchAttention(mods, hq, hkv, d, page, max_num_seqs=batch,
                                                  max_num_tokens=batch, device="emu",
                                                  dtype="f16", kv_dtype=kv_dtype)
                attention.plan(qsl, lens, table)
                kd, vd = (pagedc.to_device(c, device="emu") for c in caches)
                result[name] = counted(
                    os.path.join(directory, f"{name}.jsonl"),
                    lambda: attention.run(q, kd, vd, return_lse=True, **extra),
                    args.pagedc_gpu)
            b, f = result["f16"], result["f8e4m3"]
            result["requested_bytes_ratio"] = (f["requested_global_bytes"] /
                                               b["requested_global_bytes"])
            result["modelled_speedup"] = b["modelled_us"] / f["modelled_us"]
            print(f"B {batch} context {context}: bytes f8/f16 "
                  f"{result['requested_bytes_ratio']:.3f}, modelled H100 "
                  f"{b['modelled_us']:.1f} us f16, {f['modelled_us']:.1f} us f8e4m3 "
                  f"({result['modelled_speedup']:.2f}x)")
            for key in ("f16", "f8e4m3"):
                for launch in result[key]["launches"]:
                    print(f"  {key} {launch['kernel']}: grid {launch['grid_blocks']}, "
                          f"{launch['requested_global_bytes'] / 1e6:.2f} MB, "
                          f"{launch['bound']}-bound, {launch['terms_us']}, "
                          f"{launch['modelled_us']:.1f} us")
            if args.json:
                write_entry(args.json, f"B{batch} ctx{context} hq{hq} hkv{hkv} d{d}", result,
                            section="float8_decode")


if __name__ == "__main__":
    main()
