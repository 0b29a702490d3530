#!/usr/bin/env python3
"""A mixed serving step on the CUDA backend, MODELLED: 64 decoding
sequences of 2048 keys (one new token each) and 2 chunked prefills of 512
new tokens at the end of 2048-key contexts; Hq 32, Hkv 8, D 128, shuffled
pages of 16, f16, causal. Run as one BatchAttention call, and as the same
work in two calls (one BatchAttention holding the two chunks, one holding
the 64 decodes), on the SIMT emulator with its counters on, each launch put
through the H100 roofline exactly as bench/python/cascade_cuda_model.py
does (its `counted`: the same sampling, model inputs and label). No GPU ran
these kernels.

    PYTHONPATH=build/python python3 bench/python/mixed_step_cuda_model.py \
        [--decodes 64] [--context 2048] [--chunks 2] [--chunk 512] [--json FILE]
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
    parser.add_argument("--decodes", type=int, default=64)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--chunks", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--json", help="write the results here")
    args = parse_with_pagedc_gpu(parser)
    os.environ.setdefault("PAGEDC_CUDA_DRIVER", "emu")
    os.environ["PAGEDC_EMU_CHECKS"] = "none"
    os.environ["PAGEDC_EMU_SAMPLE_BLOCKS"] = "32"
    os.environ["PAGEDC_EMU_SAMPLE_KERNELS"] = "pagedc_decode,pagedc_prefill"
    import pagedc

    rng = np.random.default_rng(0)
    hq, hkv, d, page = 32, 8, 128, 16
    # The chunks first, then the decodes (BatchAttention splits by new
    # tokens whatever the order).
    news = [args.chunk] * args.chunks + [1] * args.decodes
    lens = np.full(len(news), args.context, dtype=np.int32)
    pages_each = -(-args.context // page)
    n_pages = pages_each * len(news)
    order = rng.permutation(n_pages).astype(np.int32)
    table = order.reshape(len(news), pages_each)
    cache = [rng.standard_normal((n_pages, page, hkv, d)).astype(np.float16) for _ in range(2)]
    qsl = np.concatenate([[0], np.cumsum(news)]).astype(np.int32)
    tokens = int(qsl[-1])
    q = rng.standard_normal((tokens, hq, d)).astype(np.float16)
    mods = pagedc.compile("mask causal(b, h, q, kv) = q >= kv\n", cuda=True)

    def batch(first, end):
        """A BatchAttention planned for sequences [first, end) of the step,
        and the rows of q they hold."""
        rows = slice(int(qsl[first]), int(qsl[end]))
        attention = pagedc.BatchAttention(mods, hq, hkv, d, page, max_num_seqs=end - first,
                                          max_num_tokens=rows.stop - rows.start, device="emu",
                                          dtype="f16")
        attention.plan(qsl[first:end + 1] - qsl[first], lens[first:end], table[first:end])
        return attention, rows

    kd, vd = (pagedc.to_device(c, device="emu") for c in cache)
    one, _ = batch(0, len(news))
    prefill, prefill_rows = batch(0, args.chunks)
    decode, decode_rows = batch(args.chunks, len(news))
    q_all = pagedc.to_device(q, device="emu")
    q_prefill = pagedc.to_device(q[prefill_rows], device="emu")
    q_decode = pagedc.to_device(q[decode_rows], device="emu")
    directory = tempfile.mkdtemp()
    separate = [counted(os.path.join(directory, "prefill.jsonl"),
                        lambda: prefill.run(q_prefill, kd, vd, return_lse=True), args.pagedc_gpu),
                counted(os.path.join(directory, "decode.jsonl"),
                        lambda: decode.run(q_decode, kd, vd, return_lse=True), args.pagedc_gpu)]
    result = {
        "label": LABEL,
        "shape": dict(decodes=args.decodes, chunks=args.chunks, chunk=args.chunk,
                      context=args.context, hq=hq, hkv=hkv, d=d, page_size=page, dtype="f16",
                      mask="causal"),
        "one_batch_call": counted(os.path.join(directory, "one.jsonl"),
                                  lambda: one.run(q_all, kd, vd, return_lse=True), args.pagedc_gpu),
        "separate_calls": dict(
            launches=separate[0]["launches"] + separate[1]["launches"],
            requested_global_bytes=sum(r["requested_global_bytes"] for r in separate),
            modelled_us=round(sum(r["modelled_us"] for r in separate), 3)),
    }
    for name in ("one_batch_call", "separate_calls"):
        r = result[name]
        print(f"{name}: {len(r['launches'])} launches, "
              f"{r['requested_global_bytes'] / 1e6:.1f} MB requested, "
              f"{sum(x['dram_bytes'] for x in r['launches']) / 1e6:.1f} MB DRAM, "
              f"{r['modelled_us']:.1f} us MODELLED H100")
        for launch in r["launches"]:
            print(f"  {launch['kernel']}: grid {launch['grid_blocks']}, "
                  f"{launch['requested_global_bytes'] / 1e6:.2f} MB, {launch['bound']}-bound, "
                  f"wave efficiency {launch['wave_efficiency']}, {launch['modelled_us']:.1f} us")
    if args.json:
        write_entry(args.json, f"{args.decodes}x{args.context} + {args.chunks}x{args.chunk}",
                    result, section="mixed_step_cuda")


if __name__ == "__main__":
    main()
