#!/usr/bin/env python3
"""A new attention variant's cold cost from Python: pagedc.from_torch vs
torch.compile(flex_attention), each in a fresh process with empty caches
(bench/README.md, Python targets).

For every variant of the FlexAttention gallery below, the script starts one
child process per side and times, inside the child, from the user's mod
functions to the first output in hand:

  pagedc   pagedc.from_torch(mask_mod, score_mod) (trace, emit .attn, compile
           through the CPU JIT) + pagedc.flex_attention(q, k, v, ...)
  torch    create_block_mask(mask_mod, ...) + torch.compile(flex_attention)
           + the first call (Inductor codegen and C++ compile of the kernel)

Imports are timed apart (`import pagedc`, `import torch`) and not counted.
Every child gets its own empty PAGEDC_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and
TRITON_CACHE_DIR, so nothing compiled by an earlier run is reused. The two
outputs of each variant are compared (max |pagedc - torch| <= 1e-4), so a
fast wrong answer cannot count. The ratio is torch seconds / pagedc seconds
(> 1: pagedc is faster), from the same run.

Needs PyTorch (scripts/python-torch-tests.sh installs it in a venv):

    PYTHONPATH=build/python build/torch-venv/bin/python bench/python/cold_variant.py \\
        [--reps 2] [--threads 2] [--json bench/results/python-cold-variant.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from results import write_results

B, H, S, D = 1, 4, 256, 64
VARIANTS = ["causal", "sliding", "prefix_lm", "document", "alibi", "softcap"]


def mods_of(name, torch, flex):
    """The gallery's mask_mod / score_mod for `name` (module-level tensors are
    captured, as users write them)."""
    doc = torch.repeat_interleave(torch.arange(4, dtype=torch.int32), S // 4)
    slopes = torch.exp2(-torch.arange(1, H + 1, dtype=torch.float32))
    prefix = torch.tensor([37])

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    if name == "causal":
        return causal, None
    if name == "sliding":
        return (lambda b, h, q, kv: (q >= kv) & (q - kv <= 64)), None
    if name == "prefix_lm":
        return flex.or_masks(lambda b, h, q, kv: kv <= prefix[b], causal), None
    if name == "document":
        return (lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv)), None
    if name == "alibi":
        return causal, (lambda s, b, h, q, kv: s + slopes[h] * (kv - q))
    if name == "softcap":
        return None, (lambda s, b, h, q, kv: 20.0 * torch.tanh(s / 20.0))
    raise SystemExit("unknown variant " + name)


def inputs(torch):
    import numpy as np
    rng = np.random.default_rng(11)
    return [torch.from_numpy(rng.standard_normal((B, H, S, D), dtype=np.float32))
            for _ in range(3)]


def child(side, name, threads, out_path):
    t = time.perf_counter()
    import torch
    import torch.nn.attention.flex_attention as flex
    torch.set_num_threads(threads)
    import_torch = time.perf_counter() - t
    import_pagedc = 0.0
    if side == "pagedc":
        t = time.perf_counter()
        import pagedc
        import_pagedc = time.perf_counter() - t
    q, k, v = inputs(torch)
    mask_mod, score_mod = mods_of(name, torch, flex)

    start = time.perf_counter()
    if side == "pagedc":
        mods = pagedc.from_torch(mask_mod=mask_mod, score_mod=score_mod)
        out = pagedc.flex_attention(q, k, v, mods=mods, threads=threads)
    else:
        block_mask = None
        if mask_mod is not None:
            block_mask = flex.create_block_mask(mask_mod, B, H, S, S, device="cpu")
        compiled = torch.compile(flex.flex_attention)
        out = compiled(q, k, v, score_mod=score_mod, block_mask=block_mask)
    first_call = time.perf_counter() - start

    import numpy as np
    np.save(out_path, np.asarray(out.detach().numpy() if hasattr(out, "detach") else out))
    print(json.dumps({"first_call_s": first_call, "import_torch_s": import_torch,
                      "import_pagedc_s": import_pagedc,
                      "torch_version": torch.__version__}))


def run_child(side, name, threads, work):
    env = dict(os.environ)
    for var in ("PAGEDC_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env[var] = tempfile.mkdtemp(prefix=var.lower() + "-", dir=work)
    env["OMP_NUM_THREADS"] = str(threads)
    out_path = os.path.join(work, f"{side}-{name}.npy")
    start = time.perf_counter()
    result = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", side,
                             "--variant", name, "--threads", str(threads), "--out", out_path],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{side} {name}: exit {result.returncode}\n{result.stderr[-3000:]}")
    record = json.loads(result.stdout.strip().splitlines()[-1])
    record["process_wall_s"] = wall
    return record, out_path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2, help="fresh processes per side and variant")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--child", choices=["pagedc", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.variant, args.threads, args.out)
        return

    import numpy as np
    rows = []
    torch_version = None
    with tempfile.TemporaryDirectory(prefix="pagedc-cold-") as work:
        for name in args.variants.split(","):
            times = {"pagedc": [], "torch": []}
            walls = {"pagedc": [], "torch": []}
            worst = 0.0
            for _ in range(args.reps):
                outs = {}
                for side in ("pagedc", "torch"):  # alternate, so drift hits both
                    record, outs[side] = run_child(side, name, args.threads, work)
                    times[side].append(record["first_call_s"])
                    walls[side].append(record["process_wall_s"])
                    torch_version = record["torch_version"]
                diff = float(np.max(np.abs(np.load(outs["pagedc"]) - np.load(outs["torch"]))))
                worst = max(worst, diff)
                if not diff <= 1e-4:
                    raise SystemExit(f"{name}: pagedc and torch outputs differ by {diff}")
            med = {side: statistics.median(v) for side, v in times.items()}
            row = {"variant": name, "pagedc_s": round(med["pagedc"], 4),
                   "torch_compile_s": round(med["torch"], 3),
                   "ratio_torch_over_pagedc": round(med["torch"] / med["pagedc"], 1),
                   "pagedc_samples_s": [round(x, 4) for x in times["pagedc"]],
                   "torch_samples_s": [round(x, 3) for x in times["torch"]],
                   "pagedc_process_wall_s": round(statistics.median(walls["pagedc"]), 3),
                   "torch_process_wall_s": round(statistics.median(walls["torch"]), 3),
                   "max_abs_diff": worst}
            rows.append(row)
            print(f"{name:10s} pagedc.from_torch + first call {med['pagedc']:.3f} s | "
                  f"torch.compile(flex_attention) first call {med['torch']:.2f} s | "
                  f"{row['ratio_torch_over_pagedc']}x | max |diff| {worst:.1e}", flush=True)
    if args.json:
        write_results(args.json, "bench/python/cold_variant.py", rows,
                      what="new variant, fresh process, empty caches: seconds from the mod "
                           "functions to the first output (imports not counted)",
                      shape={"B": B, "H": H, "S": S, "D": D, "dtype": "f32", "device": "cpu"},
                      threads=args.threads, reps=args.reps, torch_version=torch_version)

if __name__ == "__main__":
    main()
