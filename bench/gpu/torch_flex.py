#!/usr/bin/env python3
"""PyTorch anchors of the GPU benchmark (docs/gpu.md, bench/README.md targets §4).

For every benchmark configuration of a pack (gpu-pack/pack.json, written by
pagedc-gpu-prepare), on the same GPU and in the same run as `pagedc-gpu bench`:

* compiled ``flex_attention`` over PyTorch's ``PagedAttention`` cache (page
  size 128: PyTorch requires the page size to equal the KV block size), with
  the same mask and score mods as bench/gpu/bench.attn;
* SDPA with the flash backend on contiguous K/V, for the mods it supports
  (none; causal, which for a decode query at the end of the sequence is no
  mask at all);
* the device-to-device copy bandwidth (bytes read + written per second).

Timing: CUDA events, warm-up first (compilation happens there), median,
minimum and maximum of ``--iters`` launches, twice, as ``pagedc-gpu bench`` times its own: call by
call with the host waiting for each (``*_ms``), and queued back to back, each
call after a ``--flush-mib`` write that evicts L2 (``*_queued_ms``). A deadline (``--budget-s``) stops starting new
configurations so that the whole GPU check fits its 10 minutes; skipped and
failed configurations are recorded with the reason, never silently dropped.

The pure parts (the plan from pack.json, byte and FLOP counts, medians) take no
torch and are unit-tested on machines without it (test/unit/gpu).
"""

import argparse
import datetime
import json
import os
import sys
import time

PYTORCH_PAGE_SIZE = 128


# --------------------------------------------------------------------------
# Pure helpers (no torch)
# --------------------------------------------------------------------------

def median(values):
    """The median of a non-empty list (the mean of the middle two when even)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of nothing")
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return 0.5 * (ordered[middle - 1] + ordered[middle])


def decode_bytes(config, kept_fraction=None):
    """Bytes a decode call must move: the kept K and V rows, q and out (bf16)."""
    kept = config.get("kept_fraction", 1.0) if kept_fraction is None else kept_fraction
    element = 2
    kv = 2.0 * config["batch"] * config["heads_kv"] * config["kv_len"] * kept * config["head_dim"]
    qo = 2.0 * config["batch"] * config["heads_q"] * config["q_len"] * config["head_dim"]
    return element * (kv + qo)


def attention_flops(config):
    """FLOPs of unmasked work: 4 * B * Hq * Lq * Lkv * D * kept fraction."""
    return (4.0 * config["batch"] * config["heads_q"] * config["q_len"] * config["kv_len"]
            * config["head_dim"] * config.get("kept_fraction", 1.0))


def load_plan(pack_dir):
    """The benchmark configurations of a pack, in the order to run them.

    PyTorch's paged cache needs page == block size, so the flex anchor runs
    at page 128 only; the configurations of other page sizes are compared with
    the page-128 anchor of the same shape. Each entry is the pack's entry plus
    ``anchor`` (the name the anchor is filed under: the page-128 name).
    """
    with open(os.path.join(pack_dir, "pack.json")) as f:
        pack = json.load(f)
    plan = []
    seen = set()
    for config in pack["bench"]:
        anchor = anchor_name(config["name"])
        if anchor in seen:
            continue
        seen.add(anchor)
        entry = dict(config)
        entry["anchor"] = anchor
        entry["page_size"] = PYTORCH_PAGE_SIZE
        plan.append(entry)
    # Most informative first: long contexts and large batches, then the rest.
    plan.sort(key=lambda c: (-(c["batch"] * c["kv_len"] * c["q_len"]), c["name"]))
    return plan


def anchor_name(name):
    """The page-128 name of a configuration name ('...-p16' -> '...-p128')."""
    stem, _, page = name.rpartition("-p")
    if stem and page.isdigit():
        return stem + "-p%d" % PYTORCH_PAGE_SIZE
    return name


def sdpa_supported(config):
    """Whether SDPA (flash) computes the same function: no score mod and a
    mask that is none or causal (at the end of the sequence for decode)."""
    if config.get("score"):
        return False
    mask = config.get("mask", "")
    return mask in ("", "causal")


def reserve_plan(batch, kv_len, page_size, chunk_pages=4):
    """(slot, length) reserves, round robin, chunk_pages pages at a time: the
    same scattered page tables as pagedc-gpu bench."""
    plan = []
    reserved = 0
    while reserved < kv_len:
        reserved = min(kv_len, reserved + chunk_pages * page_size)
        for slot in range(batch):
            plan.append((slot, reserved))
    return plan


# --------------------------------------------------------------------------
# The PyTorch side
# --------------------------------------------------------------------------

def spread(times):
    """(median, minimum, maximum) of a run's times."""
    return median(times), min(times), max(times)


def record(result, name, timing):
    """Files a (median, minimum, maximum) under `name`_ms, `name`_min_ms and
    `name`_max_ms (ms, min_ms, max_ms when `name` is empty)."""
    stem = name + "_" if name else ""
    result[stem + "ms"], result[stem + "min_ms"], result[stem + "max_ms"] = timing


def time_cuda(torch, fn, warmup, iters):
    """Median, minimum and maximum milliseconds of fn() with CUDA events,
    after warm-up."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return spread(times)


def time_cuda_queued(torch, fn, iters, flush):
    """Median, minimum and maximum milliseconds of fn() queued back to back, as
    `pagedc-gpu bench` times its `queued_median_ms`: each call after a write
    of `flush` (larger than L2), between its own pair of events, one wait at
    the end. The host queues the next call while the GPU writes the flush,
    so the events time the GPU's work, not the launch."""
    torch.cuda.synchronize()
    pairs = []
    for i in range(iters):
        flush.fill_(i & 0xff)
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        pairs.append((start, stop))
    pairs[-1][1].synchronize()
    times = [start.elapsed_time(stop) for start, stop in pairs]
    return spread(times)


def copy_bandwidth(torch, mib, iters):
    source = torch.empty(mib << 20, dtype=torch.uint8, device="cuda").random_(0, 255)
    target = torch.empty_like(source)
    ms = time_cuda(torch, lambda: target.copy_(source), 3, iters)[0]
    return 2.0 * source.numel() / (ms * 1e-3)


def mods_for(torch, config, buffers):
    """mask_mod / score_mod closures equal to bench/gpu/bench.attn's."""
    mask = config.get("mask", "")
    score = config.get("score", "")
    softcap = 30.0
    for param in config.get("params", []):
        if param["name"] == "softcap":
            softcap = float(param["value"])
    offset = buffers.get("q_offset")
    slopes = buffers.get("slopes")
    document = buffers.get("document_id")

    def position(b, q):
        return q + offset[b] if offset is not None else q

    mask_mod = None
    if mask == "causal":
        def mask_mod(b, h, q, kv):
            return position(b, q) >= kv
    elif mask in ("sliding_4k", "sliding_1k"):
        window = 4096 if mask == "sliding_4k" else 1024

        def mask_mod(b, h, q, kv):
            p = position(b, q)
            return (p >= kv) & (p - kv < window)
    elif mask == "document":
        def mask_mod(b, h, q, kv):
            p = position(b, q)
            return (document[p] == document[kv]) & (p >= kv)
    elif mask:
        raise ValueError("no PyTorch mirror of mask '%s'" % mask)

    score_mod = None
    if score == "alibi":
        def score_mod(s, b, h, q, kv):
            return s + slopes[h] * (kv - position(b, q))
    elif score == "softcap_tanh":
        def score_mod(s, b, h, q, kv):
            return softcap * torch.tanh(s / softcap)
    elif score:
        raise ValueError("no PyTorch mirror of score '%s'" % score)
    return mask_mod, score_mod


def bench_inputs(torch, config, pack_dir, device):
    """A configuration's q [B, Hq, Lq, D], k, v [B, Hkv, Lkv, D] (bf16,
    uniform in [-1, 1), one fixed seed: every script times the same values)
    and its buffers: the pack's files, and q_offset, the query's position
    behind the keys (a decode's query is the sequence's last token)."""
    import numpy as np
    B, Hq, Hkv = config["batch"], config["heads_q"], config["heads_kv"]
    Lq, Lkv, D = config["q_len"], config["kv_len"], config["head_dim"]
    buffers = {}
    for buffer in config.get("buffers", []):
        array = np.load(os.path.join(pack_dir, buffer["file"]))
        buffers[buffer["name"]] = torch.from_numpy(array).to(device)
    buffers["q_offset"] = torch.full((B,), Lkv - Lq, dtype=torch.int32, device=device)
    generator = torch.Generator(device=device).manual_seed(1234)
    dtype = torch.bfloat16
    q = torch.rand(B, Hq, Lq, D, device=device, generator=generator, dtype=torch.float32)
    q = (q * 2 - 1).to(dtype)
    k = (torch.rand(B, Hkv, Lkv, D, device=device, generator=generator) * 2 - 1).to(dtype)
    v = (torch.rand(B, Hkv, Lkv, D, device=device, generator=generator) * 2 - 1).to(dtype)
    return q, k, v, buffers


def run_config(torch, config, pack_dir, args):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from torch.nn.attention.experimental._paged_attention import PagedAttention

    device = "cuda"
    B, Hq, Hkv = config["batch"], config["heads_q"], config["heads_kv"]
    Lq, Lkv, D = config["q_len"], config["kv_len"], config["head_dim"]
    page = PYTORCH_PAGE_SIZE
    dtype = torch.bfloat16
    result = {"name": config["anchor"], "kind": config["kind"], "batch": B, "q_len": Lq,
              "kv_len": Lkv, "page_size": page, "bytes": decode_bytes(config)
              if config["kind"] == "decode" else 0.0, "flops": attention_flops(config)}

    q, k, v, buffers = bench_inputs(torch, config, pack_dir, device)
    mask_mod, score_mod = mods_for(torch, config, buffers)

    # Paged flex attention.
    pages_per_sequence = -(-Lkv // page)
    n_pages = B * pages_per_sequence + B
    paged = PagedAttention(n_pages, page, B, device=device)
    for slot, length in reserve_plan(B, Lkv, page):
        paged.reserve(torch.tensor(slot, device=device), torch.tensor(length, device=device))
    k_cache = torch.zeros(1, Hkv, n_pages * page, D, device=device, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    batch_idx = torch.arange(B, device=device, dtype=torch.int32)
    input_pos = torch.arange(Lkv, device=device, dtype=torch.int32).unsqueeze(0).expand(B, Lkv)
    paged.assign(batch_idx, input_pos, k, v, k_cache, v_cache)
    logical_mask_mod = mask_mod or (lambda b, h, q_, kv: q_ >= 0)
    block_mask = create_block_mask(logical_mask_mod, B, None, Lq, Lkv, device=device,
                                   BLOCK_SIZE=page)
    physical_mask = paged.convert_logical_block_mask(block_mask)
    physical_score = paged.get_score_mod(score_mod) if score_mod else None
    # Every configuration compiles afresh: dynamo's cache of flex_attention
    # otherwise fills after 8 configurations and PyTorch falls back to its
    # unfused eager path (a first GPU run timed that path for 17 anchors).
    torch._dynamo.reset()
    compiled = torch.compile(flex_attention)

    def flex():
        return compiled(q, k_cache, v_cache, block_mask=physical_mask, score_mod=physical_score,
                        enable_gqa=True)

    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        timing = time_cuda(torch, flex, args.warmup, args.iters)
    unfused = [w for w in caught if "without torch.compile" in str(w.message)]
    if unfused:
        raise RuntimeError("flex_attention ran unfused (not compiled): %s" %
                           str(unfused[0].message).splitlines()[0])
    record(result, "flex_paged", timing)
    flush = torch.empty(args.flush_mib << 20, dtype=torch.uint8, device=device)
    record(result, "flex_paged_queued", time_cuda_queued(torch, flex, args.iters, flush))

    # SDPA flash on contiguous K/V.
    if sdpa_supported(config):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F
        causal = config.get("mask") == "causal" and config["kind"] == "prefill"
        def native():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                timing = time_cuda(torch, native, args.warmup, args.iters)
            sdpa = native
            result["sdpa_flash_gqa"] = "native"
        except RuntimeError:
            # Flash without native GQA here: expanded K/V (reads Hq/Hkv times more).
            ke = k.repeat_interleave(Hq // Hkv, dim=1)
            ve = v.repeat_interleave(Hq // Hkv, dim=1)

            def sdpa():
                return F.scaled_dot_product_attention(q, ke, ve, is_causal=causal)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                timing = time_cuda(torch, sdpa, args.warmup, args.iters)
            result["sdpa_flash_gqa"] = "expanded"
        record(result, "sdpa_flash", timing)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            record(result, "sdpa_flash_queued", time_cuda_queued(torch, sdpa, args.iters, flush))
    result["status"] = "ok"
    return result


def write_json(path, data):
    """Writes a result file and says so."""
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
    print("wrote", path)


def timing_arguments(parser, budget_s):
    """The options this script and baselines.py share: the pack, the output,
    the timing and the deadline."""
    parser.add_argument("--pack", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--flush-mib", type=int, default=256,
                        help="bytes written before each queued call (evicts L2)")
    parser.add_argument("--budget-s", type=float, default=budget_s)
    parser.add_argument("--filter", default="",
                        help="only the configurations whose name holds one of these "
                             "comma-separated texts (as pagedc-gpu bench --filter)")


def row_wanted(filter_text, name):
    """Whether `name` holds one of filter_text's comma-separated texts (all
    names when filter_text is empty)."""
    texts = [t for t in filter_text.split(",") if t]
    return not texts or any(t in name for t in texts)


def import_torch():
    """PyTorch with dynamo's recompile limit raised: every configuration
    compiles its own flex_attention."""
    import torch  # only here: the helpers above run without it
    import torch._dynamo
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)
    return torch


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    timing_arguments(parser, budget_s=300.0)
    parser.add_argument("--copy-mib", type=int, default=1024)
    args = parser.parse_args(argv)
    torch = import_torch()

    started = time.monotonic()
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "cuda": torch.version.cuda,
        "copy_bandwidth_bytes_per_s": copy_bandwidth(torch, args.copy_mib, args.iters),
        "configurations": [],
    }
    for config in load_plan(args.pack):
        if not row_wanted(args.filter, config["name"]):
            continue
        entry = {"name": config["anchor"], "status": "skipped"}
        if time.monotonic() - started > args.budget_s:
            entry["message"] = "time budget of %.0f s used up" % args.budget_s
        else:
            try:
                entry = run_config(torch, config, args.pack, args)
            except Exception as error:  # recorded, the run goes on
                entry = {"name": config["anchor"], "status": "error",
                         "message": "%s: %s" % (type(error).__name__, str(error)[:2000])}
            finally:
                torch.cuda.empty_cache()
        entry["elapsed_s"] = round(time.monotonic() - started, 1)
        print("%-8s %-44s %s" % (entry["status"], entry["name"],
                                 "flex %.4f ms" % entry["flex_paged_ms"]
                                 if "flex_paged_ms" in entry else entry.get("message", "")),
              flush=True)
        report["configurations"].append(entry)
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
