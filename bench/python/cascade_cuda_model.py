#!/usr/bin/env python3
"""Cascade against the flat step on the CUDA backend, MODELLED: the step of
bench/python/cascade.py (64 decoding sequences sharing a 4096-token prefix
on the same pages, each with 1-128 further keys; Hq 32, Hkv 8, D 128, pages
of 16, causal; f16 here) run once each way on the SIMT emulator with its
counters on (PAGEDC_EMU_COUNTERS; checks off; the attention grids sampled
as pagedc-gpu model samples them, PAGEDC_EMU_SAMPLE_BLOCKS=32, counts
scaled by grid / blocks run), then each launch through the roofline of
docs/emulator.md, "The performance model" (tools/pagedc-gpu/Model.cpp's
H100 constants), summed per call. No GPU ran these kernels.

Two departures from `pagedc-gpu model`, both because no pack holds these
launches: registers per thread are the emulated driver's default (128; no
ptxas figures), and a decode or merge launch's DRAM bytes are the bytes it
requests (cp.async and plain global loads, scaled, plus its stores), i.e.
no reuse of one sequence's pages by another's CTAs through L2: what a step
without prefix sharing, each sequence on its own copy of the prefix, reads.
(The flat step here shares the pages, so its distinct sectors would
understate that step's traffic.) A prefill launch's DRAM bytes are its
distinct sectors, as the model has them: the CTAs of one KV head's query
heads re-read its K/V, assumed caught by L2.

    PYTHONPATH=build/python python3 bench/python/cascade_cuda_model.py \
        [--sequences 64] [--prefix 4096] [--hq 32] [--hkv 8] [--json FILE]
"""
import argparse
import json
import math
import os
import tempfile

import numpy as np

LABEL = ("MODELLED, not measured: emulator counters + roofline (docs/emulator.md, "
         "'The performance model'); 128 registers per thread assumed; no GPU ran these kernels")
# H100 SXM5 80GB, as tools/pagedc-gpu/Model.cpp.
H100 = dict(peak=989.4e12, mma_fraction=0.66, hbm=3.35e12, l2=7.0e12, clock=1.83e9, sms=132,
            shared_per_sm=228 * 1024, shared_per_block=227 * 1024, registers_per_sm=65536,
            threads_per_sm=2048, ctas_per_sm=32)
LAUNCH_US, DEPENDENT_GAP_US, REGISTERS = 3.0, 1.0, 128


def occupancy(threads, shared):
    d = H100
    ctas = d["ctas_per_sm"]
    warps = -(-threads // 32)
    ctas = min(ctas, d["threads_per_sm"] // threads)
    per_warp = -(-((REGISTERS + 7) // 8 * 8 * 32) // 256) * 256
    ctas = min(ctas, (d["registers_per_sm"] // per_warp) // warps)
    ctas = min(ctas, d["shared_per_sm"] // (shared + 1024))
    return ctas


def model_launch(line):
    """One counter line -> (modelled us, requested bytes scaled, terms)."""
    c, d = line["counters"], H100
    scale = c["grid_blocks"] / max(1, c["blocks"])
    threads = line["block"][0] * line["block"][1] * line["block"][2]
    ctas = occupancy(threads, line["dynamic_shared_bytes"])
    slots = d["sms"] * ctas
    grid = c["grid_blocks"]
    efficiency = grid / (math.ceil(grid / slots) * slots)
    requested = (c["cp_async_bytes"] + c["global_load_bytes"]) * scale
    unique = c["global_sectors_unique"] * 32 * scale
    dram = (unique if line["kernel"] == "pagedc_prefill"
            else requested + c["global_store_bytes"] * scale)
    wavefronts = (c["ldmatrix_wavefronts"] + c["shared_wavefronts"] +
                  (c["cp_async_bytes"] + c["cp_async_zero_fill_bytes"] + c["bulk_copy_bytes"] +
                   c["wgmma_shared_bytes"]) / 128)
    terms = {
        "tensor": c["mma"] * scale * 2 * 16 * 8 * 16 / (d["peak"] * d["mma_fraction"]),
        "shared": wavefronts * scale / (d["sms"] * d["clock"]),
        "dram": dram / d["hbm"],
        "l2": (c["global_sectors_requested"] * 32 + c["bulk_copy_bytes"]) * scale / d["l2"],
        "mufu": c["transcendentals"] * scale / (d["sms"] * 16 * d["clock"]),
    }
    bound = max(terms, key=terms.get)
    overhead = DEPENDENT_GAP_US if line.get("programmatic_dependent") else LAUNCH_US
    us = terms[bound] / efficiency * 1e6 + overhead
    return dict(kernel=line["kernel"], grid_blocks=grid, blocks_run=c["blocks"],
                ctas_per_sm=ctas, wave_efficiency=round(efficiency, 4), bound=bound,
                requested_global_bytes=requested, dram_bytes=dram,
                terms_us={k: round(v * 1e6, 3) for k, v in terms.items()},
                modelled_us=round(us, 3))


def counted(path, call):
    os.environ["PAGEDC_EMU_COUNTERS"] = path
    try:
        call()
    finally:
        del os.environ["PAGEDC_EMU_COUNTERS"]
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    os.remove(path)
    launches = [model_launch(line) for line in lines]
    return dict(launches=launches,
                requested_global_bytes=sum(x["requested_global_bytes"] for x in launches),
                modelled_us=round(sum(x["modelled_us"] for x in launches), 3))


def write_entry(path, key, result, section="cascade_cuda"):
    """Puts `result` under `section`/`key` of the JSON object in `path`
    (bench/results/model-decode.json holds them beside pagedc-gpu model's
    decode figures): the file's other text stays as it is when the section
    is new, so a diff shows only the entry."""
    try:
        with open(path) as f:
            text = f.read()
        document = json.loads(text)
    except FileNotFoundError:
        text, document = "", {}
    entries = document.get(section, {})
    entries[key] = result
    if text and section not in document:
        body = json.dumps(entries, indent=1).replace("\n", "\n ")
        text = text.rstrip()[:-1].rstrip() + ',\n "%s": ' % section + body + "\n}\n"
    else:
        document[section] = entries
        text = json.dumps(document, indent=1) + "\n"
    with open(path, "w") as f:
        f.write(text)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--prefix", type=int, default=4096)
    parser.add_argument("--hq", type=int, default=32)
    parser.add_argument("--hkv", type=int, default=8)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    os.environ.setdefault("PAGEDC_CUDA_DRIVER", "emu")
    os.environ["PAGEDC_EMU_CHECKS"] = "none"
    os.environ["PAGEDC_EMU_SAMPLE_BLOCKS"] = "32"
    os.environ["PAGEDC_EMU_SAMPLE_KERNELS"] = "pagedc_decode,pagedc_prefill"
    import pagedc

    rng = np.random.default_rng(0)
    hq, hkv, d, page = args.hq, args.hkv, 128, 16
    seqs, prefix = args.sequences, args.prefix
    own = rng.integers(1, 129, size=seqs)
    prefix_pages = prefix // page
    own_pages = [-(-int(n) // page) for n in own]
    n_pages = prefix_pages + sum(own_pages)
    cache = [rng.standard_normal((n_pages, page, hkv, d)).astype(np.float16) for _ in range(2)]
    columns = prefix_pages + max(own_pages)
    table = np.zeros((seqs, columns), dtype=np.int32)
    next_page = prefix_pages
    for b in range(seqs):
        table[b, :prefix_pages] = np.arange(prefix_pages)
        table[b, prefix_pages:prefix_pages + own_pages[b]] = np.arange(
            next_page, next_page + own_pages[b])
        next_page += own_pages[b]
    lens = (prefix + own).astype(np.int32)
    qsl = np.arange(seqs + 1, dtype=np.int32)
    q = rng.standard_normal((seqs, hq, d)).astype(np.float16)
    mods = pagedc.compile("mask causal(b, h, q, kv) = q >= kv\n", cuda=True)
    options = dict(max_num_seqs=seqs, max_num_tokens=seqs, device="emu", dtype="f16")
    flat = pagedc.BatchAttention(mods, hq, hkv, d, page, **options)
    flat.plan(qsl, lens, table)
    cascade = pagedc.CascadeAttention(mods, hq, hkv, d, page, **options)
    cascade.plan(qsl, lens, table, [(0, seqs, prefix)])
    # The same cascade with the group's queries as entries of at most 8
    # tokens: each goes to the decode kernel (every query head of a KV head
    # in one CTA, split-KV), reading the prefix once per entry and KV head.
    chunk = 8
    entries = -(-seqs // chunk)
    prefix_level = pagedc.BatchAttention(mods, hq, hkv, d, page, **options)
    prefix_level.plan(np.minimum(np.arange(entries + 1) * chunk, seqs).astype(np.int32),
                      np.full(entries, prefix, dtype=np.int32),
                      np.repeat(table[:1], entries, axis=0),
                      kv_end=np.full(entries, prefix, dtype=np.int32),
                      token_positions=(lens - 1).astype(np.int32),
                      token_batch=np.arange(seqs, dtype=np.int32))
    suffix_level = pagedc.BatchAttention(mods, hq, hkv, d, page, **options)
    suffix_level.plan(qsl, lens, table, kv_start=np.full(seqs, prefix, dtype=np.int32))

    def chunked():
        out, lse = suffix_level.run(qd, kd, vd, return_lse=True)
        prefix_out, prefix_lse = prefix_level.run(qd, kd, vd, return_lse=True)
        pagedc.merge_state_in_place(out, lse, prefix_out, prefix_lse)

    qd = pagedc.to_device(q, device="emu")
    kd, vd = (pagedc.to_device(c, device="emu") for c in cache)
    directory = tempfile.mkdtemp()
    result = {
        "label": LABEL,
        "shape": dict(sequences=seqs, prefix=prefix, own_keys="1-128", hq=hq, hkv=hkv, d=d,
                      page_size=page, dtype="f16", mask="causal"),
        "prefix_kv_bytes_once_per_kv_head": prefix * hkv * 2 * d * 2,
        "flat": counted(os.path.join(directory, "flat.jsonl"),
                        lambda: flat.run(qd, kd, vd, return_lse=True)),
        "cascade": counted(os.path.join(directory, "cascade.jsonl"),
                           lambda: cascade.run(qd, kd, vd, return_lse=True)),
        "cascade_8_token_entries": counted(os.path.join(directory, "chunked.jsonl"), chunked),
    }
    for name in ("flat", "cascade", "cascade_8_token_entries"):
        r = result[name]
        print(f"{name}: {r['requested_global_bytes'] / 1e6:.1f} MB requested, "
              f"{sum(x['dram_bytes'] for x in r['launches']) / 1e6:.1f} MB DRAM, "
              f"{r['modelled_us']:.1f} us MODELLED H100")
        for launch in r["launches"]:
            print(f"  {launch['kernel']}: grid {launch['grid_blocks']}, "
                  f"{launch['requested_global_bytes'] / 1e6:.2f} MB, {launch['bound']}-bound, "
                  f"{launch['modelled_us']:.1f} us")
    if args.json:
        write_entry(args.json, f"{seqs}x{prefix} hq{hq} hkv{hkv}", result)


if __name__ == "__main__":
    main()
