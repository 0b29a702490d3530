#!/usr/bin/env python3
"""Cascade against the flat step on the CUDA backend, MODELLED: the step of
bench/python/cascade.py (64 decoding sequences sharing a 4096-token prefix
on the same pages, each with 1-128 further keys; Hq 32, Hkv 8, D 128, pages
of 16, causal; f16 here) run once each way on the SIMT emulator with its
counters on (PAGEDC_EMU_COUNTERS; checks off; the attention grids sampled
as pagedc-gpu model samples them, PAGEDC_EMU_SAMPLE_BLOCKS=32, counts
scaled by grid / blocks run), then each call's launches through the
performance model (`pagedc-gpu model --launches`, tools/pagedc-gpu/Model.cpp;
this script only gathers the counters and formats them) on the H100. No
GPU ran these kernels.

Two departures from `pagedc-gpu model PACK`, both because no pack holds
these launches: registers per thread are the emulated driver's default
(`--registers 128`; no ptxas figures), and a decode or merge launch's DRAM
bytes are the bytes it requests (`--dram requested`: cp.async and plain
global loads, scaled, plus its stores), i.e. no reuse of one sequence's
pages by another's CTAs through L2: what a step without prefix sharing,
each sequence on its own copy of the prefix, reads. (The flat step here
shares the pages, so its distinct sectors would understate that step's
traffic.) A prefill launch's DRAM bytes are its distinct sectors, as the
model has them: the CTAs of one KV head's query heads re-read its K/V,
assumed caught by L2. The GQA-packed tiles (pagedc_prefill_group, where
CascadeAttention's prefix level goes) count as a decode launch: DRAM moves
what they request, each row tile's copy of the prefix included.

    PYTHONPATH=build/python python3 bench/python/cascade_cuda_model.py \
        [--sequences 64] [--prefix 4096] [--hq 32] [--hkv 8] [--json FILE] \
        [--group-registers N] [--pagedc-gpu build/bin/pagedc-gpu]

--group-registers N gives pagedc_prefill_group ptxas's registers per thread
(the emulated driver's occupancy, which the plan's split count reads, and
the model's): its 256-row tile takes 237-255 at D 128, so one CTA per SM, where the
default 128 allows two.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
LABEL = ("MODELLED, not measured: emulator counters + roofline (docs/emulator.md, "
         "'The performance model'); 128 registers per thread assumed; no GPU ran these kernels")
# The emulated driver's registers per thread for a kernel it is not told of.
REGISTERS = 128
# The GQA-packed tiles' rows per CTA at head dim 128 with a 16-bit cache
# (KernelConfig::chooseGroupRowsShape: 8 warps of 32 rows).
GROUP_TILE_ROWS = 256
# What each launch of the result keeps of `pagedc-gpu model --launches`'s.
LAUNCH_FIELDS = ("kernel", "grid_blocks", "blocks_run", "ctas_per_sm", "wave_efficiency",
                 "bound", "requested_global_bytes", "dram_bytes", "terms_us", "modelled_us")


def modelled(counters, pagedc_gpu, registers=REGISTERS, dram="requested"):
    """The H100 model of the launches in the counter file `counters`, with
    `registers` per thread and `dram` as pagedc-gpu model's --dram (None:
    its default)."""
    out = counters + ".model.json"
    command = [pagedc_gpu, "model", "--launches", counters, "--device", "H100",
               "--registers", str(registers), "--json", out]
    if dram is not None:
        command += ["--dram", dram]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{pagedc_gpu} model --launches {counters} failed:\n{run.stderr}")
    with open(out) as f:
        model = json.load(f)
    os.remove(out)
    return model


def counted(path, call, pagedc_gpu, registers=None):
    """The modelled launches of `call`; `registers` (kernel -> registers per
    thread) overrides the default for those kernels' launches."""
    os.environ["PAGEDC_EMU_COUNTERS"] = path
    try:
        call()
    finally:
        del os.environ["PAGEDC_EMU_COUNTERS"]
    if registers:
        with open(path) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        with open(path, "w") as f:
            for line in lines:
                if line.get("kernel") in registers:
                    line["registers"] = registers[line["kernel"]]
                f.write(json.dumps(line) + "\n")
    model = modelled(path, pagedc_gpu)
    os.remove(path)
    launches = [{k: launch[k] for k in LAUNCH_FIELDS} for launch in model["launches"]]
    return dict(launches=launches, requested_global_bytes=model["requested_global_bytes"],
                modelled_us=model["modelled_us"])


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


def parse_with_pagedc_gpu(parser):
    """Adds --pagedc-gpu (the binary that models the launches) to `parser`,
    parses, and refuses a path that is not an executable."""
    parser.add_argument("--pagedc-gpu", default=os.path.join(ROOT, "build", "bin", "pagedc-gpu"),
                        help="the pagedc-gpu that models the launches")
    args = parser.parse_args()
    if not os.access(args.pagedc_gpu, os.X_OK):
        parser.error(f"--pagedc-gpu: no executable {args.pagedc_gpu} (build the pagedc-gpu "
                     "target)")
    return args


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--prefix", type=int, default=4096)
    parser.add_argument("--hq", type=int, default=32)
    parser.add_argument("--hkv", type=int, default=8)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--group-registers", type=int,
                        help="registers per thread of pagedc_prefill_group (ptxas's figure) "
                             "for the emulated driver's occupancy and the model, instead of "
                             "the default")
    args = parse_with_pagedc_gpu(parser)
    registers = {}
    if args.group_registers:
        registers["pagedc_prefill_group"] = args.group_registers
        os.environ["PAGEDC_EMU_REGISTERS"] = f"pagedc_prefill_group={args.group_registers}"
    os.environ.setdefault("PAGEDC_CUDA_DRIVER", "emu")
    os.environ["PAGEDC_EMU_CHECKS"] = "none"
    os.environ["PAGEDC_EMU_SAMPLE_BLOCKS"] = "32"
    os.environ["PAGEDC_EMU_SAMPLE_KERNELS"] = "pagedc_decode,pagedc_prefill,pagedc_prefill_group"
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
                        lambda: flat.run(qd, kd, vd, return_lse=True), args.pagedc_gpu,
                        registers),
        "cascade": counted(os.path.join(directory, "cascade.jsonl"),
                           lambda: cascade.run(qd, kd, vd, return_lse=True), args.pagedc_gpu,
                           registers),
        "cascade_8_token_entries": counted(os.path.join(directory, "chunked.jsonl"), chunked,
                                              args.pagedc_gpu, registers),
    }
    # The prefix level's GQA-packed launch reads the prefix's K/V once per
    # KV head and row tile (ceil(sequences x hq / hkv / GROUP_TILE_ROWS)
    # tiles), plus q once per split: what its counters must show.
    group = [x for x in result["cascade"]["launches"] if x["kernel"] == "pagedc_prefill_group"]
    assert len(group) == 1, "the prefix level goes to the GQA-packed tiles"
    tiles = -(-seqs * (hq // hkv) // GROUP_TILE_ROWS)
    splits = group[0]["grid_blocks"] // (hkv * tiles)
    expected = tiles * result["prefix_kv_bytes_once_per_kv_head"] + splits * seqs * hq * d * 2
    result["prefix_level_reads_per_kv_head"] = tiles
    print(f"prefix level: {tiles} read(s) of the prefix per KV head, {splits} splits; "
          f"requested {group[0]['requested_global_bytes'] / 1e6:.2f} MB, "
          f"K/V + q {expected / 1e6:.2f} MB")
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
        key = f"{seqs}x{prefix} hq{hq} hkv{hkv}"
        if args.group_registers:
            result["group_registers"] = args.group_registers
            key += f" group-registers {args.group_registers}"
        write_entry(args.json, key, result)


if __name__ == "__main__":
    main()
