#!/usr/bin/env python3
"""A model that calls pagedc, eager and under torch.compile(fullgraph=True).

The module is a small attention block (a QKV projection, pagedc's
flex_attention with a causal mask_mod and an ALiBi score_mod, an output
projection). Under torch.compile the attention is the custom op
torch.ops.pagedc.flex_attention, so the graph has no break (counted with
torch._dynamo.explain, and the run stops if there is one) and Inductor
fuses the projections around it. Reports the first compiled call (the
compile), then medians of the eager and the compiled step in alternating
rounds, with their ratio. Outputs are compared before timing.

    PYTHONPATH=build/python python bench/python/compiled_module.py \
        [--repeat N] [--json FILE]
"""
import argparse
import statistics
import time

import torch

import pagedc
from results import write_results


def causal(b, h, q, kv):
    return q >= kv


def alibi(score, b, h, q, kv):
    return score - 0.25 * (h + 1) * (q - kv)


class Block(torch.nn.Module):
    def __init__(self, heads, head_dim):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        width = heads * head_dim
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x):
        batch, length, _ = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, self.head_dim) \
            .permute(2, 0, 3, 1, 4).contiguous().unbind(0)
        a = pagedc.flex_attention(q, k, v, score_mod=alibi, mask_mod=causal)
        return self.proj(a.transpose(1, 2).reshape(batch, length, -1))


def median_ms(fn, repeat):
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for batch, length, heads, head_dim in ((1, 16, 4, 32), (2, 256, 8, 64)):
        model = Block(heads, head_dim).eval()
        x = torch.randn(batch, length, heads * head_dim)
        with torch.no_grad():
            torch._dynamo.reset()
            explained = torch._dynamo.explain(model)(x)
            if explained.graph_break_count != 0:
                raise SystemExit(f"graph breaks: {explained.break_reasons}")
            compiled = torch.compile(model, fullgraph=True)
            t0 = time.perf_counter()
            got = compiled(x)
            compile_s = time.perf_counter() - t0
            torch.testing.assert_close(got, model(x), atol=1e-4, rtol=1e-4)
            samples = {"eager": [], "compiled": []}
            for _ in range(args.rounds):
                samples["eager"] += median_ms(lambda: model(x), args.repeat)
                samples["compiled"] += median_ms(lambda: compiled(x), args.repeat)
        eager = statistics.median(samples["eager"]) * 1e3
        comp = statistics.median(samples["compiled"]) * 1e3
        row = {"batch": batch, "length": length, "heads": heads, "head_dim": head_dim,
               "graph_breaks": explained.graph_break_count, "graphs": explained.graph_count,
               "first_compiled_call_s": round(compile_s, 2), "eager_ms": round(eager, 4),
               "compiled_ms": round(comp, 4), "compiled_over_eager": round(comp / eager, 3),
               "steps_per_kind": args.repeat * args.rounds}
        rows.append(row)
        print(f"B={batch} L={length} H={heads} D={head_dim}: eager {eager:.3f} ms, "
              f"torch.compile {comp:.3f} ms ({comp / eager:.2f}x eager), "
              f"{explained.graph_break_count} graph breaks, first call {compile_s:.1f} s")
    if args.json:
        write_results(args.json, "bench/python/compiled_module.py", rows,
                      torch=torch.__version__, unit="milliseconds, medians")


if __name__ == "__main__":
    main()
