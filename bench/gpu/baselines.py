#!/usr/bin/env python3
"""The strongest attention baselines of the GPU benchmark, side by side
(docs/gpu.md, "Baselines"; bench/README.md targets §4).

For every benchmark configuration of a pack (gpu-pack/pack.json), on the same
GPU and in the same run as `pagedc-gpu bench` and bench/gpu/torch_flex.py, in
one process:

* ``sdpa_cudnn``: PyTorch's SDPA with the cuDNN backend on contiguous K/V
  (no mask, causal);
* ``fa4``: FlashAttention-4 (``flash_attn.cute``, the CuTe DSL package
  ``flash-attn-4``): dense K/V for prefill, the paged cache (the
  configuration's page size) for decode, packed documents as a varlen batch;
  causal, sliding windows and soft-capping (its interface takes no ALiBi);
* ``flashinfer``: FlashInfer's paged decode and prefill wrappers on an NHD
  cache of the configuration's page size (ALiBi, windows, soft-capping), and
  its ragged prefill for packed documents (each document a sequence);
* ``flex_flash``: compiled ``flex_attention`` with ``BACKEND="FLASH"`` (the
  CuTe DSL kernels) on dense K/V, the mods of bench/gpu/bench.attn.

A baseline whose package does not import is recorded once as unavailable
(with the import error), a configuration it cannot express as unsupported
(with the reason); nothing is dropped silently. Every timed baseline is first
checked against a float32 reference of a sample of rows (batch 0, the query
heads of KV head 0), computed from the same mods as torch_flex.py's: a
baseline that computes another function (relative L2 error above
``--tolerance``) is recorded as a mismatch and is not an anchor.

Timing is torch_flex.py's: CUDA events after warm-up, median, minimum and
maximum of ``--iters`` calls, call by call and queued after an L2 flush. A
deadline (``--budget-s``) stops starting new configurations.

The pure parts (capabilities, page tables, FlashInfer's indices, document
spans) take no torch and are unit-tested without it (test/unit/gpu).
"""

import argparse
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_flex  # noqa: E402

BASELINES = ("sdpa_cudnn", "fa4", "flashinfer", "flex_flash")
SOFTCAP = 30.0
WORKSPACE_MIB = 256
# Where the tensors live: the tests of the torch side run it on the CPU.
DEVICE = "cuda"


# --------------------------------------------------------------------------
# Pure helpers (no torch)
# --------------------------------------------------------------------------

def window_of(mask):
    """The keys a sliding-window mask keeps behind the query, itself
    included (bench.attn: q - kv < W), or None."""
    return {"sliding_4k": 4096, "sliding_1k": 1024}.get(mask)


def supports(baseline, config):
    """(True, "") when `baseline` can compute `config`'s function, else
    (False, why). The mods are bench.attn's: masks none, causal, sliding_4k,
    sliding_1k, document (causal inside documents); scores alibi and
    softcap_tanh."""
    mask, score = config.get("mask", ""), config.get("score", "")
    decode = config["kind"] == "decode"
    known_masks = ("", "causal", "sliding_4k", "sliding_1k", "document")
    if mask not in known_masks or score not in ("", "alibi", "softcap_tanh"):
        return False, "no mirror of mask '%s' / score '%s'" % (mask, score)
    if baseline == "sdpa_cudnn":
        if score:
            return False, "SDPA takes no score mod"
        if mask not in ("", "causal"):
            return False, "SDPA's cuDNN backend takes no mask but causal"
        return True, ""
    if baseline == "fa4":
        if score == "alibi":
            return False, "FlashAttention-4's interface takes no ALiBi slopes"
        if mask == "document" and decode:
            return False, "documents are a prefill configuration"
        return True, ""
    if baseline == "flashinfer":
        if mask == "document" and decode:
            return False, "documents are a prefill configuration"
        if mask == "document" and score:
            return False, "the ragged documents run takes the plain causal mask only"
        return True, ""
    if baseline == "flex_flash":
        return True, ""
    raise ValueError("unknown baseline '%s'" % baseline)


def page_table(batch, kv_len, page_size, chunk_pages=4):
    """Each sequence's pages, handed out as torch_flex.reserve_plan reserves
    them (chunk_pages pages per sequence in turn), so the tables are
    scattered as pagedc-gpu bench's and PyTorch's are."""
    tables = [[] for _ in range(batch)]
    next_page = 0
    for slot, length in torch_flex.reserve_plan(batch, kv_len, page_size, chunk_pages):
        needed = -(-length // page_size)
        while len(tables[slot]) < needed:
            tables[slot].append(next_page)
            next_page += 1
    return tables


def flashinfer_indices(tables, kv_lens, page_size):
    """FlashInfer's paged-KV description of `tables`: (indptr [B + 1],
    indices [indptr[B]], last_page_len [B]), as plain lists."""
    indptr, indices, last = [0], [], []
    for table, length in zip(tables, kv_lens):
        used = -(-length // page_size)
        if used > len(table):
            raise ValueError("a sequence of %d keys needs %d pages, its table has %d" %
                             (length, used, len(table)))
        indices.extend(table[:used])
        indptr.append(len(indices))
        last.append(length - (used - 1) * page_size if used else 0)
    return indptr, indices, last


def document_spans(document_ids):
    """[start, end) of each run of equal ids (bench.attn's documents are
    contiguous runs of one id)."""
    spans = []
    start = 0
    for i in range(1, len(document_ids) + 1):
        if i == len(document_ids) or document_ids[i] != document_ids[start]:
            spans.append((start, i))
            start = i
    return spans


def varlen_offsets(batch, length, spans):
    """Cumulative sequence starts of `batch` sequences of `length` tokens
    each cut into `spans`: a packed varlen batch of the documents."""
    offsets = [0]
    for b in range(batch):
        for start, end in spans:
            offsets.append(b * length + end)
    return offsets


def sample_rows(q_len, count=64):
    """Query rows the reference checks: the last rows (their rows see the
    most keys) and rows spread over the rest, sorted, no repeats."""
    tail = list(range(max(0, q_len - count // 2), q_len))
    step = max(1, q_len // max(1, count - len(tail)))
    spread = list(range(0, max(0, q_len - len(tail)), step))
    return sorted(set(spread + tail))


# --------------------------------------------------------------------------
# The GPU side
# --------------------------------------------------------------------------

def probe(torch):
    """Which baselines import here: {name: "" or the reason they do not}."""
    reasons = {}
    from torch.nn.attention import SDPBackend
    if not hasattr(SDPBackend, "CUDNN_ATTENTION"):
        reasons["sdpa_cudnn"] = "this PyTorch has no SDPBackend.CUDNN_ATTENTION"
    elif not torch.backends.cudnn.is_available():
        reasons["sdpa_cudnn"] = "cuDNN is not available to PyTorch"
    else:
        reasons["sdpa_cudnn"] = ""
    for name, module in (("fa4", "flash_attn.cute"), ("flashinfer", "flashinfer")):
        try:
            __import__(module)
            reasons[name] = ""
        except Exception as error:  # any import failure: recorded, not raised
            reasons[name] = "import %s: %s: %s" % (module, type(error).__name__, error)
    # The FLASH backend of compiled flex runs FlashAttention-4's kernels.
    reasons["flex_flash"] = reasons["fa4"] and "needs flash_attn.cute: " + reasons["fa4"]
    return reasons


def flashinfer_jit_modules():
    """The FlashInfer modules compiled on this machine so far (its JIT
    cache's libraries): what the run compiled is the difference, and none
    when the modules shipped ahead of time (bench/gpu/flashinfer_aot.py)
    covered its rows."""
    from flashinfer.jit import env
    root = str(env.FLASHINFER_JIT_DIR)
    if not os.path.isdir(root):
        return set()
    return {name for name in os.listdir(root)
            if os.path.exists(os.path.join(root, name, name + ".so"))}


class Inputs:
    """One configuration's tensors: torch_flex.py's q, k, v (same seed, so
    the same values), the mods, and what the paged baselines need."""

    def __init__(self, torch, config, pack_dir):
        self.torch = torch
        self.config = config
        self.shape = (config["batch"], config["heads_q"], config["heads_kv"], config["q_len"],
                      config["kv_len"], config["head_dim"])
        self.q, self.k, self.v, self.buffers = torch_flex.bench_inputs(torch, config, pack_dir,
                                                                       DEVICE)
        self.mask_mod, self.score_mod = torch_flex.mods_for(torch, config, self.buffers)
        self._paged = None

    @staticmethod
    def sequence_major(x):
        """[B, H, L, D] as [B, L, H, D], contiguous: the layout of
        FlashAttention's dense calls."""
        return x.transpose(1, 2).contiguous()

    @staticmethod
    def tokens(x):
        """[B, H, L, D] as packed tokens [B * L, H, D]: the layout of the
        varlen, ragged and paged-prefill calls."""
        return x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3]).contiguous()

    def from_tokens(self, out):
        """Packed query tokens [B * Lq, Hq, D] back as [B, Hq, Lq, D]."""
        B, Hq, _, Lq, _, D = self.shape
        return out.view(B, Lq, Hq, D).transpose(1, 2)

    def paged(self):
        """(k_cache, v_cache [pages, page, Hkv, D], table [B, pages a
        sequence] int32, lens [B] int32, the lists behind them)."""
        if self._paged is None:
            torch = self.torch
            B, _, Hkv, _, Lkv, D = self.shape
            page = self.config["page_size"]
            tables = page_table(B, Lkv, page)
            per_sequence = len(tables[0])
            pages = sum(len(t) for t in tables)
            table = torch.tensor(tables, dtype=torch.int32, device=DEVICE)
            padded = per_sequence * page

            def fill(x):
                rows = torch.zeros(B, padded, Hkv, D, dtype=x.dtype, device=DEVICE)
                rows[:, :Lkv] = x.permute(0, 2, 1, 3)
                cache = torch.zeros(pages, page, Hkv, D, dtype=x.dtype, device=DEVICE)
                cache[table.long()] = rows.view(B, per_sequence, page, Hkv, D)
                return cache
            lens = torch.full((B,), Lkv, dtype=torch.int32, device=DEVICE)
            self._paged = (fill(self.k), fill(self.v), table, lens, tables)
        return self._paged

    def reference(self, rows):
        """float32 attention of batch 0's rows `rows`, query heads 0 .. G - 1
        (KV head 0): [G, len(rows), D]."""
        torch = self.torch
        B, Hq, Hkv, Lq, Lkv, D = self.shape
        group = Hq // Hkv
        r = torch.tensor(rows, device=DEVICE, dtype=torch.int64)
        qs = self.q[0, :group, r].float()
        scores = qs @ self.k[0, 0].float().t() * (D ** -0.5)
        b = torch.zeros(1, 1, 1, dtype=torch.int64, device=DEVICE)
        h = torch.arange(group, device=DEVICE).view(group, 1, 1)
        qi = r.view(1, -1, 1)
        kv = torch.arange(Lkv, device=DEVICE).view(1, 1, Lkv)
        if self.score_mod is not None:
            scores = self.score_mod(scores, b, h, qi, kv)
        if self.mask_mod is not None:
            keep = self.mask_mod(b, h, qi, kv)
            scores = scores.masked_fill(~keep.expand_as(scores), float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return weights @ self.v[0, 0].float()

    def document_offsets(self):
        """cu_seqlens of the packed documents ([B * documents + 1] int32)
        and the longest document's length."""
        B, _, _, Lq, _, _ = self.shape
        spans = document_spans(self.buffers["document_id"][:Lq].tolist())
        offsets = self.torch.tensor(varlen_offsets(B, Lq, spans), dtype=self.torch.int32,
                                    device=DEVICE)
        return offsets, max(end - start for start, end in spans)


def build_sdpa_cudnn(torch, inputs):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    B, Hq, Hkv, Lq, Lkv, D = inputs.shape
    causal = inputs.config.get("mask") == "causal" and inputs.config["kind"] == "prefill"
    q, k, v = inputs.q, inputs.k, inputs.v

    def native():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    try:
        native()
        return native, "dense, native GQA", lambda out: out
    except RuntimeError:
        pass
    ke = k.repeat_interleave(Hq // Hkv, dim=1)
    ve = v.repeat_interleave(Hq // Hkv, dim=1)

    def expanded():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, ke, ve, is_causal=causal)
    return expanded, "dense, K/V expanded to the query heads", lambda out: out


def build_fa4(torch, inputs):
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
    config = inputs.config
    mask, score = config.get("mask", ""), config.get("score", "")
    window = window_of(mask)
    options = {"softcap": SOFTCAP if score == "softcap_tanh" else 0.0}
    if window:
        options["window_size"] = (window - 1, 0)
    else:
        options["causal"] = mask in ("causal", "document")

    def first(result):
        return result[0] if isinstance(result, tuple) else result
    if config["kind"] == "decode":
        k_cache, v_cache, table, lens, _ = inputs.paged()
        qt = inputs.sequence_major(inputs.q)  # [B, 1, Hq, D]

        def paged():
            return first(flash_attn_varlen_func(qt, k_cache, v_cache, seqused_k=lens,
                                                page_table=table, num_splits=0, **options))
        return paged, "paged, page %d" % config["page_size"], lambda out: out.transpose(1, 2)
    if mask == "document":
        offsets, longest = inputs.document_offsets()
        qp, kp, vp = (inputs.tokens(x) for x in (inputs.q, inputs.k, inputs.v))

        def varlen():
            return first(flash_attn_varlen_func(qp, kp, vp, cu_seqlens_q=offsets,
                                                cu_seqlens_k=offsets, max_seqlen_q=longest,
                                                max_seqlen_k=longest, **options))
        return varlen, "dense, documents as a varlen batch", inputs.from_tokens
    qt, kt, vt = (inputs.sequence_major(x) for x in (inputs.q, inputs.k, inputs.v))

    def dense():
        return first(flash_attn_func(qt, kt, vt, **options))
    return dense, "dense", lambda out: out.transpose(1, 2)


def build_flashinfer(torch, inputs):
    import flashinfer
    B, Hq, Hkv, Lq, Lkv, D = inputs.shape
    config = inputs.config
    mask, score = config.get("mask", ""), config.get("score", "")
    window = window_of(mask)
    workspace = torch.empty(WORKSPACE_MIB << 20, dtype=torch.uint8, device=DEVICE)
    options = {"pos_encoding_mode": "ALIBI" if score == "alibi" else "NONE",
               "window_left": window - 1 if window else -1,
               "logits_soft_cap": SOFTCAP if score == "softcap_tanh" else None,
               "q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    if mask == "document":
        offsets, _ = inputs.document_offsets()
        wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
        wrapper.plan(offsets, offsets, Hq, Hkv, D, causal=True, **options)
        qp, kp, vp = (inputs.tokens(x) for x in (inputs.q, inputs.k, inputs.v))
        return (lambda: wrapper.run(qp, kp, vp)), "dense, documents as a ragged batch", \
            inputs.from_tokens
    k_cache, v_cache, _, _, tables = inputs.paged()
    page = config["page_size"]
    indptr, indices, last = (torch.tensor(x, dtype=torch.int32, device=DEVICE)
                             for x in flashinfer_indices(tables, [Lkv] * B, page))
    layout = "paged NHD, page %d" % page
    if config["kind"] == "decode":
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=Hq // Hkv >= 4)
        wrapper.plan(indptr, indices, last, Hq, Hkv, D, page, **options)
        qd = inputs.q[:, :, 0].contiguous()  # [B, Hq, D]
        return (lambda: wrapper.run(qd, (k_cache, v_cache))), layout, \
            lambda out: out.unsqueeze(2)
    # FlashInfer's Hopper prefill takes no ALiBi; its FA2 kernels do.
    backend = "fa2" if score == "alibi" else "auto"
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
    qo_indptr = torch.arange(0, (B + 1) * Lq, Lq, dtype=torch.int32, device=DEVICE)
    wrapper.plan(qo_indptr, indptr, indices, last, Hq, Hkv, D, page,
                 causal=mask != "", **options)
    qp = inputs.tokens(inputs.q)
    return (lambda: wrapper.run(qp, (k_cache, v_cache))), layout + (", " + backend), \
        inputs.from_tokens


def build_flex_flash(torch, inputs):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    B, Hq, Hkv, Lq, Lkv, D = inputs.shape
    block_mask = None
    if inputs.mask_mod is not None:
        block_mask = create_block_mask(inputs.mask_mod, B, None, Lq, Lkv, device=DEVICE)
    torch._dynamo.reset()
    compiled = torch.compile(flex_attention)
    q, k, v, score_mod = inputs.q, inputs.k, inputs.v, inputs.score_mod

    def flex():
        return compiled(q, k, v, block_mask=block_mask, score_mod=score_mod, enable_gqa=True,
                        kernel_options={"BACKEND": "FLASH"})
    return flex, "dense", lambda out: out


BUILDERS = {"sdpa_cudnn": build_sdpa_cudnn, "fa4": build_fa4,
            "flashinfer": build_flashinfer, "flex_flash": build_flex_flash}
# Baselines whose inputs are the dense tensors: the same for every page size.
DENSE = {"sdpa_cudnn", "flex_flash"}


def timed(torch, fn, args, flush):
    """torch_flex.py's two timings of fn(), each with its spread."""
    result = {}
    torch_flex.record(result, "", torch_flex.time_cuda(torch, fn, args.warmup, args.iters))
    torch_flex.record(result, "queued", torch_flex.time_cuda_queued(torch, fn, args.iters, flush))
    return result


def run_baseline(torch, name, inputs, args, flush):
    fn, layout, to_bhld = BUILDERS[name](torch, inputs)
    entry = {"layout": layout}
    out = to_bhld(fn())
    rows = sample_rows(inputs.shape[3])
    group = inputs.shape[1] // inputs.shape[2]
    got = out[0, :group][:, rows].float()
    want = inputs.reference(rows)
    error = float((got - want).norm() / want.norm().clamp_min(1e-30))
    entry["rel_l2"] = error
    if not error <= args.tolerance:
        entry["status"] = "mismatch"
        entry["message"] = ("relative L2 error %.3g against the float32 reference "
                            "(tolerance %.3g): another function, not an anchor" %
                            (error, args.tolerance))
        return entry
    entry.update(timed(torch, fn, args, flush))
    entry["status"] = "ok"
    return entry


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    torch_flex.timing_arguments(parser, budget_s=240.0)
    parser.add_argument("--tolerance", type=float, default=0.03,
                        help="largest relative L2 error against the reference (bf16)")
    parser.add_argument("--only", default=",".join(BASELINES),
                        help="comma list of the baselines to run (default: all)")
    parser.add_argument("--commit", default="", help="the commit the results are of")
    parser.add_argument("--dry-run", action="store_true",
                        help="no torch, no GPU: what each baseline would run on each row")
    args = parser.parse_args(argv)
    chosen = [b for b in args.only.split(",") if b]
    for name in chosen:
        if name not in BASELINES:
            parser.error("unknown baseline '%s' (known: %s)" % (name, ", ".join(BASELINES)))

    torch = None if args.dry_run else torch_flex.import_torch()
    started = time.monotonic()
    unavailable = {} if args.dry_run else probe(torch)
    versions = {} if args.dry_run else {"torch": torch.__version__}
    for name, module in (("fa4", "flash_attn.cute"), ("flashinfer", "flashinfer")):
        if not args.dry_run and not unavailable.get(name):
            versions[name] = getattr(sys.modules[module], "__version__", "unknown")
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": args.commit, "dry_run": args.dry_run,
        "gpu": None if args.dry_run else torch.cuda.get_device_name(0),
        "cuda": None if args.dry_run else torch.version.cuda,
        "versions": versions, "baselines": chosen,
        "unavailable": {b: unavailable[b] for b in chosen if unavailable.get(b)},
        "tolerance": args.tolerance, "configurations": [],
    }
    for b, why in report["unavailable"].items():
        print("unavailable %-11s %s" % (b, why), flush=True)
    with open(os.path.join(args.pack, "pack.json")) as f:
        plan = json.load(f)["bench"]
    plan.sort(key=lambda c: (-(c["batch"] * c["kv_len"] * c["q_len"]), c["name"]))
    flush = None if args.dry_run else torch.empty(args.flush_mib << 20, dtype=torch.uint8,
                                                  device=DEVICE)
    dense_done = {}
    flashinfer_before = None
    if "flashinfer" in chosen and not args.dry_run and not unavailable.get("flashinfer"):
        flashinfer_before = flashinfer_jit_modules()
    for config in plan:
        if not torch_flex.row_wanted(args.filter, config["name"]):
            continue
        row = {"name": config["name"], "kind": config["kind"], "baselines": {}}
        # Rows that differ only in page size share the dense baselines' run.
        anchor = torch_flex.anchor_name(config["name"])
        over = time.monotonic() - started > args.budget_s
        inputs = None
        for name in chosen:
            ok, why = supports(name, config)
            if unavailable.get(name):
                entry = {"status": "unavailable"}
            elif not ok:
                entry = {"status": "unsupported", "message": why}
            elif args.dry_run:
                entry = {"status": "planned"}
            elif name in DENSE and (name, anchor) in dense_done:
                entry = dict(dense_done[(name, anchor)])
                entry["same_as"] = anchor
            elif over:
                entry = {"status": "skipped",
                         "message": "time budget of %.0f s used up" % args.budget_s}
            else:
                try:
                    inputs = inputs or Inputs(torch, config, args.pack)
                    entry = run_baseline(torch, name, inputs, args, flush)
                except Exception as error:  # recorded, the run goes on
                    entry = {"status": "error",
                             "message": "%s: %s" % (type(error).__name__, str(error)[:2000])}
                if name in DENSE:
                    dense_done[(name, anchor)] = entry
            row["baselines"][name] = entry
        inputs = None
        if torch is not None:
            torch.cuda.empty_cache()
        row["elapsed_s"] = round(time.monotonic() - started, 1)
        print("%-44s %s" % (row["name"], "  ".join(
            "%s %s" % (b, "%.4f ms" % e["ms"] if e.get("status") == "ok" else e["status"])
            for b, e in row["baselines"].items())), flush=True)
        report["configurations"].append(row)
    if flashinfer_before is not None:
        compiled = sorted(flashinfer_jit_modules() - flashinfer_before)
        report["flashinfer_compiled_here"] = compiled
        print("flashinfer: %d kernel module(s) compiled on this machine%s" % (
            len(compiled), "".join("\n  " + name for name in compiled)), flush=True)
    torch_flex.write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
