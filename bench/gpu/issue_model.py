#!/usr/bin/env python3
"""An instruction-issue term for the prefill model (MODELLED, not measured).

`pagedc-gpu model` has no term for the instructions a kernel issues besides
its MMAs (softmax, mods, address arithmetic, barriers). On the H100 runs of
2026-11-25 Nsight Compute counted them, and the elapsed time of the two
designs that kept their pipelines full matched

    t = max(max(tensor, shared) + issue, L2, DRAM, MUFU) + launch

    issue = warp instructions executed / (SMs x 4 schedulers x clock) / e

(e: the model's wave efficiency) to within a few per cent (`fit`, below).
The tensor / shared / L2 / DRAM / MUFU terms and e are the model's
(docs/emulator.md). The additive form says the consumers' non-MMA work did
not overlap the tensor (or shared-memory) time in those kernels.

For a kernel no GPU has run, `static` estimates the instructions from SASS
(cuobjdump; optional, not in the toolkit subset pagedc builds against): it
compiles the warpgroup prefill with its KV-tile loop's path fixed in a
template copy (all keys kept or masked per element; O rescaled or not;
the softmax scale folded, as for a call with no score mod) and takes, per
path, the fewest and most instructions of one trip round the loop
(ptxas_shapes.loop_paths), and the producer's loop likewise. `predict`
turns those into a range of issue terms for the model's causal prefill
configurations:

    per CTA of query tile i (128 rows; KV tiles of N keys, visited in key
    order): (i + 1) * 128 / N tiles, the last 128 / N masked (the diagonal
    block); a tile is rescaled with probability 1 - (1 - 1/(t + 1))^16 at
    its t-th visit (16 rows per warp; a row's maximum moves at visit t with
    probability 1 / (t + 1) when its scores are exchangeable, as for random
    inputs); consumer warps = 128 / 16, each runs the tile's path; the
    producer warpgroup's 4 warps each run its loop once per tile (one
    thread issues the tensor-map copies, but every producer warp walks
    the visits).

Instructions outside the loops (prologue, epilogue: 3-8% of the counted
total on the H100 runs) are not counted, so the issue term is low by that.

  issue_model.py fit --point NCU.txt MODEL.json[:KEY] BENCH.json NAME [...]
  issue_model.py static --pagedc build/bin/pagedc --cuobjdump PATH
        [--templates DIR] [--shape 128x64x64] [--json OUT]
  issue_model.py predict STATIC.json[:KEY] MODEL.json[:KEY] [--filter TEXT]
        [--ncu NCU.txt NAME]... [--json OUT]
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ptxas_shapes  # noqa: E402

H100_SMS = 132
SCHEDULERS = 4
H100_CLOCK_HZ = 1.83e9  # the model's tensor peak is taken at this clock
LAUNCH_US = 3.0
ROWS_PER_WARP = 16
PRODUCER_WARPS = 4
MASK_BLOCK = 128

# Lines of templates/PrefillWgmma.cuh that `static` rewrites (each must occur
# once): (name, old text, new text with {value}).
FORCED_LINES = [
    ("all_kept", "const bool all_kept = (", "const bool all_kept = {value} || false && ("),
    ("rescale",
     "const bool rescale_out =\n"
     "            !kOverlap || __ballot_sync(0xffffffffu, rescale[0] != 1.0f || rescale[1] != 1.0f) != 0;",
     "const bool rescale_out = {value};"),
    ("scale_folded",
     "const bool scale_in_softmax = !pagedc_mods::kHasScore && args.scale > 0.0f;",
     "const bool scale_in_softmax = !pagedc_mods::kHasScore && {value};"),
    ("tensor_maps",
     "return kTmaPages && wg.tensor_maps != 0 && kv + kBlockN <= kv_len;",
     "return {value};"),
    # the same choice in templates from before the tail tile's gather had
    # its own test (2026-11-26)
    ("tensor_maps",
     "if (use_tma && kv + kBlockN <= kv_len) {",
     "if ({value}) {{"),
]


def ncu_figures(text):
    """Executed instructions, elapsed cycles, SM clock (Hz) and duration
    (µs) of the first kernel in an Nsight Compute details listing."""
    def number(label):
        found = re.search(r"^\s*" + re.escape(label) + r"\s+(\S+)\s+([\d,.]+)\s*$", text, re.M)
        if not found:
            raise ValueError(f"no '{label}' in the Nsight Compute listing")
        return found.group(1), float(found.group(2).replace(",", ""))
    metric = re.search(r"^\s*smsp__inst_executed\.sum\s+inst\s+([\d,]+)\s*$", text, re.M)
    if metric:  # a --metrics listing: the count only
        return {"instructions": float(metric.group(1).replace(",", ""))}
    _, instructions = number("Executed Instructions")
    _, cycles = number("Elapsed Cycles")
    unit, clock = number("SM Frequency")
    unit_d, duration = number("Duration")
    scale = {"Ghz": 1e9, "GHz": 1e9, "Mhz": 1e6, "MHz": 1e6}[unit]
    duration_us = duration * {"ms": 1e3, "us": 1.0, "s": 1e6}[unit_d]
    return {"instructions": instructions, "cycles": cycles, "clock_hz": clock * scale,
            "duration_us": duration_us}


def issue_us(instructions, wave_efficiency, sms=H100_SMS, clock_hz=H100_CLOCK_HZ):
    return instructions / (sms * SCHEDULERS * clock_hz) / wave_efficiency * 1e6


def rule_us(terms, issue):
    """The additive rule: max(max(tensor, shared) + issue, the rest) + launch."""
    rest = [v for k, v in terms.items() if k not in ("tensor", "shared")]
    return max([max(terms.get("tensor", 0.0), terms.get("shared", 0.0)) + issue] + rest) + LAUNCH_US


def load_model(spec):
    path, _, key = spec.partition(":")
    model = json.load(open(path))
    return model[key] if key else model


def prefill_launch(configuration, device="H100"):
    launches = configuration["devices"][device]["launches"]
    return next(launch for launch in launches if launch["kernel"] == "pagedc_prefill")


def configuration(model, name):
    for c in model.get("configurations", []):
        if c["name"] == name:
            return c
    raise KeyError(f"no configuration {name} in the model")


def fit(points):
    rows = []
    for ncu_path, model_spec, bench_path, name in points:
        figures = ncu_figures(open(ncu_path).read())
        c = configuration(load_model(model_spec), name)
        launch = prefill_launch(c)
        e = launch["wave_efficiency"]
        issue = issue_us(figures["instructions"], e)
        measured = next(b["median_ms"] * 1e3 for b in json.load(open(bench_path))["configurations"]
                        if b["name"] == name and b.get("status") == "ok")
        ruled = rule_us(launch["terms_us"], issue)
        rows.append({"ncu": ncu_path, "name": name, "measured_us": measured,
                     "ncu_instructions": figures["instructions"], "terms_us": launch["terms_us"],
                     "issue_us": issue, "modelled_us_without_issue": launch["modelled_us"],
                     "modelled_us_with_issue": ruled, "measured_over_modelled": measured / ruled})
    return rows


def rescale_probability(visit, rows=ROWS_PER_WARP):
    """Chance that some row of a warp's `rows` moves its maximum at its
    visit-th tile (0-based; the first tile always sets it)."""
    return 1.0 - (1.0 - 1.0 / (visit + 1)) ** rows


def causal_instructions(static, batch, heads, q_len, block_m=128, block_n=64):
    """(fewest, most) warp instructions of a causal prefill call from the
    static path ranges (the KV-tile loop's and the producer's)."""
    warps = block_m // ROWS_PER_WARP
    per_block = MASK_BLOCK // block_n
    low = high = 0.0
    for i in range(math.ceil(q_len / block_m)):
        tiles = min((i + 1) * block_m, q_len) // block_n + (1 if q_len % block_n else 0)
        tiles = max(tiles, 1)
        for t in range(tiles):
            path = static["masked"] if t >= tiles - per_block else static["all_kept"]
            p = rescale_probability(t)
            low += warps * (p * path["rescale"][0] + (1 - p) * path["no_rescale"][0])
            high += warps * (p * path["rescale"][1] + (1 - p) * path["no_rescale"][1])
            low += PRODUCER_WARPS * static["producer"][0]
            high += PRODUCER_WARPS * static["producer"][1]
    return low * batch * heads, high * batch * heads


def predict(static, model, text="prefill-causal", ncu=()):
    """Rows of modelled times with the issue term for the model's causal
    prefill configurations. ncu: (listing path, configuration name) pairs
    whose counted instructions the rows of that name also carry."""
    counted = {name: ncu_figures(open(path).read())["instructions"] for path, name in ncu}
    rows = []
    for c in model.get("configurations", []):
        if text not in c["name"] or c.get("mask") != "causal" or c.get("status") != "modelled":
            continue
        launch = prefill_launch(c)
        e = launch["wave_efficiency"]
        low, high = causal_instructions(static, c["batch"], c["heads_q"], c["q_len"],
                                        static["block_m"], static["block_n"])
        times = [rule_us(launch["terms_us"], issue_us(n, e)) for n in (low, high)]
        flops = c["unmasked_flops"]
        rows.append({"name": c["name"], "instructions": [low, high],
                     "issue_us": [issue_us(low, e), issue_us(high, e)],
                     "terms_us": launch["terms_us"],
                     "modelled_us_without_issue": launch["modelled_us"],
                     "modelled_us_with_issue": times,
                     "tflops_with_issue": [flops / t / 1e6 for t in reversed(times)]})
        if c["name"] in counted:
            rows[-1]["ncu_instructions"] = counted[c["name"]]
    return rows


def force(source_dir, directory, values):
    """A copy of source_dir's templates with FORCED_LINES set to `values`
    (name -> 'true' / 'false'); returns (the copy's directory, the names
    whose line the template does not have: older templates, whose path
    ranges then cover both sides)."""
    with open(os.path.join(source_dir, "PrefillWgmma.cuh")) as file:
        text = file.read()
    forced = set()
    for name, old, new in FORCED_LINES:
        if name not in values or name in forced or text.count(old) == 0:
            continue
        if text.count(old) != 1:
            sys.exit(f"PrefillWgmma.cuh has {text.count(old)} copies of {old.strip()!r}")
        text = text.replace(old, new.format(value=values[name]))
        forced.add(name)
    absent = sorted(set(values) - forced)
    if "all_kept" in absent:
        sys.exit("PrefillWgmma.cuh has no all_kept line to fix")
    templates = os.path.join(directory, "templates")
    shutil.copytree(source_dir, templates)
    with open(os.path.join(templates, "PrefillWgmma.cuh"), "w") as file:
        file.write(text)
    return templates, absent


def producer_loop_paths(code):
    """(fewest, most) of the producer's tile loop: the smallest loop with
    no MMA that issues K/V copies (UTMALDG or LDGSTS) and waits on an
    mbarrier (a stage's release) once a trip."""
    flow = ptxas_shapes.ControlFlow(code)
    best = None
    for head, loop in flow.natural_loops():
        texts = flow.texts(loop)
        if any(ptxas_shapes.is_mma(t) for t in texts):
            continue
        if not any("UTMALDG" in t or "LDGSTS" in t for t in texts):
            continue
        if not any("SYNCS.PHASECHK" in t for t in texts):
            continue
        if best is None or len(loop) < len(best[1]):
            best = (head, loop)
    return ptxas_shapes.loop_paths(flow, *best) if best else (0, 0)


def static_counts(pagedc, cuobjdump, templates, shape, head_dim=128, page=128):
    example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                           "causal.attn")
    block_m, block_n, _ = (int(x) for x in shape.split("x"))
    out = {"shape": shape, "block_m": block_m, "block_n": block_n, "head_dim": head_dim,
           "page_size": page, "arch": "sm_90a", "mods": "causal"}
    with tempfile.TemporaryDirectory() as directory:
        for kept in ("true", "false"):
            path = out.setdefault("all_kept" if kept == "true" else "masked", {})
            for rescale in ("true", "false"):
                work = os.path.join(directory, f"{kept}-{rescale}")
                forced, absent = force(templates, work, {"all_kept": kept, "rescale": rescale,
                                                         "scale_folded": "true",
                                                         "tensor_maps": "true"})
                out["not_forced"] = absent
                cubin = os.path.join(work, "kernel.cubin")
                command = [pagedc, example, "--mask=causal", "--emit=cubin", "--arch=sm_90a",
                           f"--head-dim={head_dim}", f"--page-size={page}", "-o", cubin]
                run = subprocess.run(command, capture_output=True, text=True,
                                     env={**os.environ, "PAGEDC_TEMPLATE_DIR": forced,
                                          "PAGEDC_PREFILL_SHAPE": shape})
                if run.returncode != 0:
                    sys.exit(f"{' '.join(command)} failed:\n{run.stderr}")
                code = ptxas_shapes.cubin_instructions(cuobjdump, cubin)
                mma, fewest, most = ptxas_shapes.main_loop_paths(code)
                path["rescale" if rescale == "true" else "no_rescale"] = [fewest, most]
                path["mma"] = mma
                if kept == "true" and rescale == "false":
                    out["producer"] = list(producer_loop_paths(code))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fit")
    f.add_argument("--point", nargs=4, action="append", required=True,
                   metavar=("NCU", "MODEL", "BENCH", "NAME"))
    f.add_argument("--json")
    s = sub.add_parser("static")
    s.add_argument("--pagedc", required=True)
    s.add_argument("--cuobjdump", required=True)
    s.add_argument("--templates", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "templates"))
    s.add_argument("--shape", default="128x64x64")
    s.add_argument("--json")
    p = sub.add_parser("predict")
    p.add_argument("static")
    p.add_argument("model")
    p.add_argument("--filter", default="prefill-causal")
    p.add_argument("--ncu", nargs=2, action="append", default=[], metavar=("NCU", "NAME"),
                   help="an Nsight Compute listing of the configuration NAME: its "
                        "instruction count is shown beside the counted one")
    p.add_argument("--json")
    args = parser.parse_args(argv)

    if args.command == "fit":
        rows = fit(args.point)
        print("%-40s %-30s %9s %9s %9s %10s %8s" % (
            "Nsight Compute listing", "configuration", "measured", "no issue", "issue",
            "with issue", "meas/mod"))
        for r in rows:
            print("%-40s %-30s %9.1f %9.1f %9.1f %10.1f %8.2f" % (
                os.path.basename(r["ncu"]), r["name"], r["measured_us"],
                r["modelled_us_without_issue"], r["issue_us"], r["modelled_us_with_issue"],
                r["measured_over_modelled"]))
        result = rows
    elif args.command == "static":
        result = static_counts(args.pagedc, args.cuobjdump, args.templates, args.shape)
        print(json.dumps(result, indent=2))
    else:
        rows = predict(load_model(args.static), load_model(args.model), args.filter, args.ncu)
        if not rows:
            print("no causal prefill configuration in the model", file=sys.stderr)
            return 1
        print("MODELLED (no GPU ran this):")
        print("%-34s %17s %19s %15s" % ("configuration", "issue us", "modelled us", "TFLOP/s"))
        for r in rows:
            print("%-34s %8.1f-%-8.1f %9.1f-%-9.1f %7.0f-%-7.0f" % (
                r["name"], *r["issue_us"], *r["modelled_us_with_issue"], *r["tflops_with_issue"]))
            if "ncu_instructions" in r:
                low, high = r["instructions"]
                print("    instructions counted %.0fM-%.0fM, Nsight Compute %.0fM (%.2f-%.2f x)" % (
                    low / 1e6, high / 1e6, r["ncu_instructions"] / 1e6,
                    r["ncu_instructions"] / high, r["ncu_instructions"] / low))
        result = rows
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
