#!/usr/bin/env python3
"""An instruction-issue term for the prefill model (MODELLED, not measured).

The emulator's counters have no term for the instructions a kernel issues
besides its MMAs (softmax, mods, address arithmetic, barriers). On the H100
runs that Nsight Compute profiled it counted them, and the elapsed time of the
two designs that kept their pipelines full matched the model's issue rule

    t = max(max(tensor, shared) + issue, L2, DRAM, MUFU) + launch

    issue = warp instructions executed / (SMs x 4 schedulers x clock) / e

(e: the model's wave efficiency) to within a few per cent (`fit`, below).
The rule, the terms, e and the devices' figures are the performance
model's, tools/pagedc-gpu/Model.cpp (`pagedc-gpu model --explain`): this
script produces the instruction counts (Nsight Compute's, or SASS counted
by `static` and weighed by `predict`) and hands them with the model's
terms to `pagedc-gpu model --launches` (PAGEDC_GPU or --pagedc-gpu names
the binary; build/bin/pagedc-gpu by default). The additive form says the
consumers' non-MMA work did not overlap the tensor (or shared-memory) time
in those kernels.

For a kernel no GPU has run, `static` estimates the instructions from SASS
(cuobjdump; optional, not in the toolkit subset pagedc builds against): it
compiles the prefill (--kernel warpgroup: PrefillWgmma.cuh, sm_90a; mma:
Prefill.cuh, sm_80 by default) with its KV-tile loop's path fixed in a
template copy (all keys kept or masked per element; O rescaled or not; for
the warpgroup kernel the softmax scale folded, as for a call with no score
mod, tensor-map copies and a pass every row of the warpgroup belongs to;
for the mma.sync kernel, a tile that is not the CTA's last) and takes, per
path, the fewest and most
instructions of one trip round the loop (ptxas_shapes.loop_paths), and the
producer's loop likewise. A fixed path that ptxas compiles with a spill
the kernel itself does not have is refused: its counts would describe code
the GPU never runs (--allow-spills counts it, named in `spilled_paths`). A loop nested in the KV-tile loop counts once
there; the mma.sync kernel's two (the K/V copy loop, the Q K^T loop over
the head dim) add their further trips (`copy_extra`). `predict` turns those
into a range of issue terms for the model's prefill configurations on an
H100 or an A100 (the model's devices). Where the model's counters carry the
emulator's tallies (tiles_kept, tiles_masked, row_groups_rescaled: each
warp's KV-tile visits by path and the 16-row groups a visit rescaled) they
weigh the paths, for any mask (tallied_instructions). Model files from
before the tallies (the H100 runs') take a formula, causal only
(causal_instructions):

    per CTA of rows [r, r + M) (KV tiles of N keys, visited in key order):
    every tile of the 128-key mask blocks up to and including the rows'
    diagonal block, whose 128 / N tiles are masked; a tile is rescaled with
    probability 1 - (1 - 1/(t + 1))^R at its t-th visit (R rows per warp; a
    row's maximum moves at visit t with probability 1 / (t + 1) when its
    scores are exchangeable, as for random inputs); each consumer warp
    (M / 16 of them in the warpgroup kernel, 4 in the mma.sync one) runs
    the tile's path; the warpgroup kernel's 4 producer warps each run
    their loop once per tile: with tensor maps one thread issues the
    copies, so one warp runs up to the loop's longest path and three its
    shortest (wait and arrive); a gather runs in all four.

Instructions outside the loops (prologue, epilogue) are not counted: on the
H100 runs Nsight Compute counted 1.01-1.19x the counted range's instructions,
so the issue term is low by that. Out of sample (the H200's tensor-map run)
the measured figure was 12-18% below the modelled range.

  issue_model.py [--pagedc-gpu PATH] fit --point NCU.txt MODEL.json[:KEY] BENCH.json NAME [...]
  issue_model.py static --pagedc build/bin/pagedc --cuobjdump PATH
        [--kernel warpgroup|mma] [--arch ARCH] [--templates DIR]
        [--shape 128x64x64] [--head-dim 128] [--json OUT]
  issue_model.py predict STATIC.json[:KEY] MODEL.json[:KEY] [--filter TEXT]
        [--device H100|A100] [--ncu NCU.txt NAME]... [--json OUT]
  issue_model.py calibrate --point PREDICTED.json:KEY BENCH.json LABEL [...]
        [--filter TEXT] [--skip TEXT]... [--clock-ghz F] [--heads-q 32]
        [--block-m 128] [--apply PREDICTED.json:KEY LABEL]... [--apply-filter TEXT]
        [--check PREDICTED.json:KEY BENCH.json LABEL]... [--json OUT]

`calibrate` sets `predict`'s rows (the midpoint of each range) beside a GPU's
measured medians and fits, by least squares on the relative error,

    measured = s x modelled + c[LABEL] x query tiles per SM

s: the clock (the model counts at 1.83 GHz, so a GPU running at f takes
1.83 / f as long; --clock-ghz fixes it, e.g. at Nsight Compute's reading);
c: a cost per query tile that the model does not see, one per --point label
(a CTA's start and end: Q and the first K/V arriving, the last P V
draining, O stored; with persistent CTAs, what of it remains between
tiles). --apply prints calibrated figures for other rows with a label's c,
at the fitted clock and at 1.83 GHz (a row with no measured point takes its
tile count from the -B<batch>-S<length>- of its name). MODELLED, and only as
good as the points: a CTA's cost is taken as the same at every sequence
length. --check sets every measured row, whatever its mask or length, beside
the fit: the residuals of the rows the fit left out.
"""
import argparse
import functools
import json
import math
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ptxas_shapes  # noqa: E402

ROWS_PER_WARP = 16
PRODUCER_WARPS = 4
MASK_BLOCK = 128

# Per kernel: its template and the lines `static` rewrites in a copy of the
# templates, (name, file, old text, new text with {value}). Every line of a
# name that the templates have is rewritten (each must occur once); older
# templates may have none for some names (their ranges then cover both
# sides).
KERNELS = {
    "warpgroup": {
        "template": "PrefillWgmma.cuh",
        "lines": [
            ("all_kept", "PrefillWgmma.cuh", "const bool all_kept = (",
             "const bool all_kept = {value} || false && ("),
            ("rescale", "PrefillWgmma.cuh",
             "const bool rescale_out =\n"
             "            !kOverlap || __ballot_sync(0xffffffffu, rescale[0] != 1.0f || "
             "rescale[1] != 1.0f) != 0;",
             "const bool rescale_out = {value};"),
            # since the softmax without the row maximum (kernels with no
            # score mod): rescaled = the maximum-first path
            # (softmax_tile, O rescaled); not rescaled = the fast path, its
            # vote kept and what the vote guards made unreachable
            ("rescale", "PrefillWgmma.cuh", "if (kFastSoftmax && references_known) {",
             "if (kFastSoftmax && !{value}) {{"),
            ("rescale", "PrefillWgmma.cuh",
             "          rescale_out =\n"
             "              !kOverlap || __ballot_sync(0xffffffffu, rescale[0] != 1.0f || "
             "rescale[1] != 1.0f) != 0;",
             "          rescale_out = {value};"),
            # the fast tile's fallback made unreachable by leaving the
            # kernel, not by __trap(): a trap there made ptxas spill 176
            # bytes in the two-CTA 64-row kernel (and serialize its wgmmas),
            # which the kernel with both paths does not
            ("rescale", "PrefillWgmma.cuh",
             "          } else {\n            if (__ballot_sync(0xffffffffu, !(tile_sum[0] < "
             "infinity() &&",
             "          }} else {{\n            if (!{value})\n              return;\n"
             "            if (__ballot_sync(0xffffffffu, !(tile_sum[0] < infinity() &&"),
            # O's rescale for the previous tile, at the top of the next trip
            ("rescale", "PrefillWgmma.cuh", "          if (o_rescale) {",
             "          if ({value}) {{"),
            # the same test in templates from before O's rescale moved under
            # the next S
            ("rescale", "PrefillWgmma.cuh",
             "if (!kOverlap || __ballot_sync(0xffffffffu, rescale[0] != 1.0f || "
             "rescale[1] != 1.0f))",
             "if ({value})"),
            # a visit whose pass some row of the warpgroup belongs to: the
            # tile is computed (without O's overlap, D 256, a warpgroup with
            # no row in the pass releases the stage at once, a path of a few
            # instructions that is not a tile's cost)
            ("group_visible", "PrefillWgmma.cuh", "if (!kOverlap && !group_visible) {",
             "if (!kOverlap && !{value}) {{"),
            ("scale_folded", "PrefillWgmma.cuh",
             "const bool scale_in_softmax = !pagedc_mods::kHasScore && args.scale > 0.0f;",
             "const bool scale_in_softmax = !pagedc_mods::kHasScore && {value};"),
            ("tensor_maps", "PrefillWgmma.cuh",
             "return kTmaPages && wg.tensor_maps != 0 && kv + kBlockN <= kv_len;",
             "return {value};"),
            # the same choice in templates from before the tail tile's
            # gather had its own test
            ("tensor_maps", "PrefillWgmma.cuh", "if (use_tma && kv + kBlockN <= kv_len) {",
             "if ({value}) {{"),
        ],
    },
    "mma": {
        "template": "Prefill.cuh",
        "lines": [
            ("all_kept", "Prefill.cuh", "const bool all_kept = (",
             "const bool all_kept = {value} || false && ("),
            ("rescale", "KernelCommon.cuh",
             "if (__ballot_sync(0xffffffffu, rescale[0] != 1.0f || rescale[1] != 1.0f))",
             "if ({value})"),
            # a tile that is not the CTA's last: the next one is copied
            ("next_tile", "Prefill.cuh",
             "      if (next_list < visits.list_count)\n        copy_tile(stage ^ 1, kv_next);",
             "      if ({value})\n        copy_tile(stage ^ 1, kv_next);"),
            ("next_tile", "Prefill.cuh", "      if (next_list < visits.list_count) {\n",
             "      if ({value}) {{\n"),
            # the copy's test in templates from before its copier
            ("next_tile", "Prefill.cuh",
             "      if (next_list < visits.list_count)\n        load_kv_tiles<",
             "      if ({value})\n        load_kv_tiles<"),
        ],
    },
}
FORCED_VALUES = {"warpgroup": {"scale_folded": "true", "tensor_maps": "true",
                               "group_visible": "true"},
                 "mma": {"next_tile": "true"}}

# The devices the model describes (tools/pagedc-gpu/Model.cpp).
DEVICES = ("A100", "H100")
# The pagedc-gpu that holds the model; --pagedc-gpu sets it.
PAGEDC_GPU = None


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


def pagedc_gpu():
    """The pagedc-gpu binary: --pagedc-gpu, $PAGEDC_GPU, or this checkout's
    build/bin/pagedc-gpu."""
    path = PAGEDC_GPU or os.environ.get("PAGEDC_GPU") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "bin", "pagedc-gpu")
    if not os.access(path, os.X_OK):
        raise OSError(f"no pagedc-gpu at {path} (build the pagedc-gpu target, or name it with "
                      "--pagedc-gpu or PAGEDC_GPU): the model's formulas live there")
    return path


def run_model(args):
    """`pagedc-gpu model ARGS`; a failure raises ValueError with its message."""
    run = subprocess.run([pagedc_gpu(), "model", *args], capture_output=True, text=True)
    if run.returncode != 0:
        raise ValueError(f"pagedc-gpu model {' '.join(args)}: {run.stderr.strip()}")
    return run.stdout


@functools.lru_cache(maxsize=None)
def model_device(name="H100"):
    """The model's figures of a device (sms, clock_hz, ...), from
    `pagedc-gpu model --explain --json`."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "explain.json")
        run_model(["--explain", "--json", path])
        with open(path) as handle:
            return json.load(handle)["devices"][name]


def with_issue(launches, device="H100"):
    """The issue rule on each of `launches` (dicts with a model JSON's
    terms_us and wave_efficiency, and warp_instructions: a count or a list
    of them) on `device`, by `pagedc-gpu model --launches`: per launch its
    issue_us and modelled_us_with_issue, one per count."""
    with tempfile.TemporaryDirectory() as directory:
        lines, out = os.path.join(directory, "launches.jsonl"), os.path.join(directory, "out.json")
        with open(lines, "w") as handle:
            for launch in launches:
                handle.write(json.dumps(launch) + "\n")
        run_model(["--launches", lines, "--device", device, "--json", out])
        with open(out) as handle:
            return json.load(handle)["launches"]


def load_model(spec):
    """FILE, FILE:KEY or FILE:KEY/KEY/...: a JSON file or a value in it (a
    key is taken whole first, then as a path of keys split at '/')."""
    path, _, key = spec.partition(":")
    with open(path) as handle:
        model = json.load(handle)
    if not key:
        return model
    if key in model:
        return model[key]
    for part in key.split("/"):
        model = model[part]
    return model


def prefill_launch(configuration, device="H100"):
    launches = configuration["devices"][device]["launches"]
    return next(launch for launch in launches if launch["kernel"] == "pagedc_prefill")


def configuration(model, name):
    for c in model.get("configurations", []):
        if c["name"] == name:
            return c
    raise KeyError(f"no configuration {name} in the model")


def fit(points):
    """Per point (Nsight Compute listing, model JSON, bench JSON,
    configuration): the measured time beside the issue rule's with the
    instructions Nsight Compute counted (on the H100, as the runs were)."""
    rows = []
    for ncu_path, model_spec, bench_path, name in points:
        figures = ncu_figures(open(ncu_path).read())
        launch = prefill_launch(configuration(load_model(model_spec), name))
        measured = next(b["median_ms"] * 1e3 for b in json.load(open(bench_path))["configurations"]
                        if b["name"] == name and b.get("status") == "ok")
        rows.append({"ncu": ncu_path, "name": name, "measured_us": measured,
                     "ncu_instructions": figures["instructions"], "terms_us": launch["terms_us"],
                     "wave_efficiency": launch["wave_efficiency"],
                     "modelled_us_without_issue": launch["modelled_us"]})
    issued = with_issue([dict(terms_us=r["terms_us"], wave_efficiency=r.pop("wave_efficiency"),
                              warp_instructions=r["ncu_instructions"]) for r in rows])
    for r, i in zip(rows, issued):
        r["issue_us"] = i["issue_us"][0]
        r["modelled_us_with_issue"] = i["modelled_us_with_issue"][0]
        r["measured_over_modelled"] = r["measured_us"] / r["modelled_us_with_issue"]
    return rows


def rescale_probability(visit, rows=ROWS_PER_WARP):
    """Chance that some row of a warp's `rows` moves its maximum at its
    visit-th tile (0-based; the first tile always sets it)."""
    return 1.0 - (1.0 - 1.0 / (visit + 1)) ** rows


def _layout(static):
    """(rows per warp, consumer warps, producer warps, producer warps that
    copy, nested loops' further trips per visit) of a `static` result;
    results written before a field existed take the warpgroup kernel's."""
    rows = static.get("rows_per_warp", ROWS_PER_WARP)
    producer_warps = static.get("producer_warps", PRODUCER_WARPS)
    return (rows, static.get("warps", static["block_m"] // rows), producer_warps,
            static.get("producer_copy_warps", producer_warps), static.get("copy_extra", 0))


def _visit(path, rescaled, end, extra):
    """One warp visit on `path`, rescaled with probability `rescaled`: the
    fewest (end 0) or most (end 1) instructions."""
    return rescaled * path["rescale"][end] + (1 - rescaled) * path["no_rescale"][end] + extra


def _producer(static, end, producer_warps, copy_warps):
    """The producer warps' instructions per CTA visit: all at the loop's
    fewest (end 0); at the most (end 1) the copying warps at its most."""
    low, high = static["producer"]
    return producer_warps * low if end == 0 else \
        (producer_warps - copy_warps) * low + copy_warps * high


def causal_instructions(static, batch, heads, q_len):
    """(fewest, most) warp instructions of a causal prefill call from the
    static path ranges. A CTA of rows [r, r + block_m) visits the KV tiles
    of every 128-key block up to its rows' diagonal block (whole blocks:
    the visits are not cut at the CTA's last row), those of the diagonal
    block masked; each warp runs the tile's path (plus the copy loop's
    further trips, `copy_extra`), each producer warp its loop once a tile."""
    rows, warps, producer_warps, copy_warps, extra = _layout(static)
    per_block = MASK_BLOCK // static["block_n"]
    totals = [0.0, 0.0]
    for r in range(0, q_len, static["block_m"]):
        keys = min((r // MASK_BLOCK + 1) * MASK_BLOCK, q_len)
        tiles = max(math.ceil(keys / static["block_n"]), 1)
        masked = min(per_block, tiles)
        for t in range(tiles):
            path = static["masked"] if t >= tiles - masked else static["all_kept"]
            p = rescale_probability(t, rows)
            for end in (0, 1):
                totals[end] += (warps * _visit(path, p, end, extra)
                                + _producer(static, end, producer_warps, copy_warps))
    return totals[0] * batch * heads, totals[1] * batch * heads


def tallied_instructions(static, counters):
    """(fewest, most) warp instructions of a prefill launch from the
    emulator's tallies (counters tiles_kept, tiles_masked,
    row_groups_rescaled, scaled from the blocks run to the grid): each warp
    visit costs its path's range, rescaled in the tallied fraction of row
    groups, plus the nested loops' further trips; the producer warps run
    their loop once per CTA visit (warp visits / consumer warps)."""
    rows, warps, producer_warps, copy_warps, extra = _layout(static)
    scale = counters["grid_blocks"] / max(1, counters["blocks"])
    kept = counters["tiles_kept"] * scale
    masked = counters["tiles_masked"] * scale
    visits = kept + masked
    rescaled = min(1.0, counters["row_groups_rescaled"] * scale / (visits * (rows // 16))) \
        if visits else 0.0
    result = tuple(
        kept * _visit(static["all_kept"], rescaled, end, extra)
        + masked * _visit(static["masked"], rescaled, end, extra)
        + visits / warps * _producer(static, end, producer_warps, copy_warps)
        for end in (0, 1))
    return result, rescaled


def predict(static, model, text="prefill", ncu=(), device="H100"):
    """Rows of modelled times with the issue term for the model's prefill
    configurations on `device`: the launch's emulator tallies where its
    counters have them (any mask), else the causal formula
    (causal_instructions; other masks are left out). Configurations with a
    score mod are left out: `static` compiles the kernels without one. For
    masks other than causal the masked path's count is the causal one (a
    sliding window's test or a document mask's buffer read costs more per
    element), so those rows are approximate. ncu: (listing path,
    configuration name) pairs whose counted instructions the rows of that
    name also carry."""
    counted = {name: ncu_figures(open(path).read())["instructions"] for path, name in ncu}
    rows = []
    for c in model.get("configurations", []):
        if text not in c["name"] or c.get("kind") != "prefill" or c.get("status") != "modelled":
            continue
        if c.get("score"):
            continue  # the static counts are of kernels without a score mod
        launch = prefill_launch(c, device)
        counters = next((l["counters"] for l in c.get("launches", [])
                         if l["kernel"] == "pagedc_prefill"), {})
        rescaled = None
        if "tiles_kept" in counters:
            (low, high), rescaled = tallied_instructions(static, counters)
            mix = "emulator tallies"
        elif c.get("mask") == "causal" and not c.get("score"):
            low, high = causal_instructions(static, c["batch"], c["heads_q"], c["q_len"])
            mix = "causal formula"
        else:
            continue
        rows.append({"name": c["name"], "device": device, "tile_mix": mix,
                     "instructions": [low, high], "terms_us": launch["terms_us"],
                     "wave_efficiency": launch["wave_efficiency"],
                     "modelled_us_without_issue": launch["modelled_us"],
                     "unmasked_flops": c["unmasked_flops"]})
        if rescaled is not None:
            rows[-1]["rescaled_fraction"] = rescaled
        if c["name"] in counted:
            rows[-1]["ncu_instructions"] = counted[c["name"]]
    if not rows:
        return rows
    issued = with_issue([dict(terms_us=r["terms_us"], wave_efficiency=r.pop("wave_efficiency"),
                              warp_instructions=r["instructions"]) for r in rows], device)
    for r, i in zip(rows, issued):
        times = i["modelled_us_with_issue"]
        flops = r.pop("unmasked_flops")
        r["issue_us"], r["modelled_us_with_issue"] = i["issue_us"], times
        r["tflops_with_issue"] = [flops / t / 1e6 for t in reversed(times)]
    return rows


def _solve(matrix, vector):
    """x with matrix x = vector (Gaussian elimination, partial pivoting)."""
    n = len(vector)
    a = [list(row) + [vector[i]] for i, row in enumerate(matrix)]
    scale = max(abs(x) for row in matrix for x in row) or 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12 * scale:
            raise ValueError("the points do not determine the fit (add points or fix the clock)")
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col])]
    return [a[i][n] / a[i][i] for i in range(n)]


def calibration_points(predicted, bench, label, text="causal", skip=(), heads_q=32, block_m=128):
    """Rows of (modelled us, measured us, query tiles per SM) for the
    configurations in both a `predict` result and a `pagedc-gpu bench`
    result whose names hold `text` and none of `skip`."""
    measured = {c["name"]: c for c in bench["configurations"] if c.get("status") == "ok"}
    sms = bench.get("multiprocessors") or model_device("H100")["sms"]
    rows = []
    for r in predicted:
        name = r["name"]
        if text not in name or any(t in name for t in skip) or name not in measured:
            continue
        c = measured[name]
        tiles = c["batch"] * heads_q * math.ceil(c["q_len"] / block_m)
        low, high = r["modelled_us_with_issue"]
        rows.append({"label": label, "name": name, "modelled_us": (low + high) / 2,
                     "measured_us": c["median_ms"] * 1e3, "tiles_per_sm": tiles / sms})
    return rows


def calibrate(points, clock_ghz=None):
    """Fits s (unless the clock fixes it) and one c per label; returns the
    fit and each point's calibrated time."""
    labels = sorted({p["label"] for p in points}, key=[p["label"] for p in points].index)
    # The model counts at the H100's clock: a GPU at f takes its clock / f
    # as long.
    model_clock_hz = model_device("H100")["clock_hz"]
    fixed = model_clock_hz / (clock_ghz * 1e9) if clock_ghz else None
    columns = labels if fixed else ["s"] + labels
    if len(points) < len(columns):
        raise ValueError(f"{len(points)} points cannot fit {len(columns)} unknowns "
                         "(add points or fix the clock)")
    matrix = [[0.0] * len(columns) for _ in columns]
    vector = [0.0] * len(columns)
    for p in points:
        t = p["measured_us"]
        row = [0.0] * len(columns)
        if not fixed:
            row[0] = p["modelled_us"] / t
        row[columns.index(p["label"])] = p["tiles_per_sm"] / t
        target = 1.0 - (fixed * p["modelled_us"] / t if fixed else 0.0)
        for i in range(len(columns)):
            vector[i] += row[i] * target
            for j in range(len(columns)):
                matrix[i][j] += row[i] * row[j]
    x = _solve(matrix, vector)
    s = fixed if fixed else x[0]
    c = dict(zip(labels, x if fixed else x[1:]))
    for p in points:
        p["calibrated_us"] = s * p["modelled_us"] + c[p["label"]] * p["tiles_per_sm"]
        p["measured_over_calibrated"] = p["measured_us"] / p["calibrated_us"]
    return {"s": s, "clock_ghz": model_clock_hz / s / 1e9, "clock_fixed": bool(fixed),
            "tile_cost_us": c, "points": points}


def residuals(predicted, bench, label, fit, heads_q=32, block_m=128):
    """Every configuration of a `predict` result that `bench` measured,
    whatever its mask or length, against `fit` (calibrate's result) with
    LABEL's cost per query tile: out-of-fit residuals, measured / calibrated;
    in_fit marks the fit's own points."""
    rows = calibration_points(predicted, bench, label, "", (), heads_q, block_m)
    for p in rows:
        p["calibrated_us"] = fit["s"] * p["modelled_us"] + fit["tile_cost_us"][label] * \
            p["tiles_per_sm"]
        p["measured_over_calibrated"] = p["measured_us"] / p["calibrated_us"]
        p["in_fit"] = any(q["name"] == p["name"] and q["label"] == label for q in fit["points"])
    return rows


def tiles_per_sm_of(name, points, heads_q=32, block_m=128):
    """Query tiles per SM of a configuration: a measured point's, else from
    the -B<batch>-S<length>- of its name on the model's SMs (None if
    neither)."""
    match = next((p for p in points if p["name"] == name), None)
    if match is not None:
        return match["tiles_per_sm"]
    shape = re.search(r"-B(\d+)-S(\d+)-", name)
    if not shape:
        return None
    return (int(shape.group(1)) * heads_q * math.ceil(int(shape.group(2)) / block_m) /
            model_device("H100")["sms"])


def force(source_dir, directory, values, kernel="warpgroup"):
    """A copy of source_dir's templates with the kernel's forced lines set
    to `values` (name -> 'true' / 'false'); returns (the copy's directory,
    the names none of whose lines the templates have)."""
    texts = {}
    forced = set()
    for name, file, old, new in KERNELS[kernel]["lines"]:
        if name not in values:
            continue
        if file not in texts:
            with open(os.path.join(source_dir, file)) as handle:
                texts[file] = handle.read()
        count = texts[file].count(old)
        if count == 0:
            continue
        if count != 1:
            sys.exit(f"{file} has {count} copies of {old.strip()!r}")
        texts[file] = texts[file].replace(old, new.format(value=values[name]))
        forced.add(name)
    absent = sorted(set(values) - forced)
    if "all_kept" in absent:
        sys.exit(f"{KERNELS[kernel]['template']} has no all_kept line to fix")
    return ptxas_shapes.write_templates(source_dir, directory, texts), absent


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


def mma_nested_trips(code, block_n, rows, head_dim):
    """The mma.sync kernel's loops inside its KV-tile loop, which a path
    range counts once: the K/V copy loop (ptxas_shapes.copy_trips trips a
    tile) and the Q K^T loop over the head dim (rows/16 x N/8 x D/16 MMAs a
    tile, so many per trip). Returns their counts and `copy_extra`, the
    instructions of their further trips per tile and warp."""
    flow = ptxas_shapes.ControlFlow(code)
    found = ptxas_shapes.main_loop(flow)
    if found is None:
        return {"copy_extra": 0}
    main = found[3]
    copy_loop = qk_loop = 0
    qk_mma = 0
    for _, loop in flow.natural_loops():
        if not loop < main:
            continue
        texts = flow.texts(loop)
        other = sum(1 for t in texts if ptxas_shapes.is_counted(t))
        mma = sum(1 for t in texts if ptxas_shapes.is_mma(t))
        if any("LDGSTS" in t for t in texts):
            copy_loop = max(copy_loop, other)
        elif mma:
            qk_loop, qk_mma = other, mma
    copy_trips = ptxas_shapes.copy_trips(block_n, 128, head_dim) if copy_loop else 1
    qk_trips = (rows // 16) * (block_n // 8) * (head_dim // 16) // qk_mma if qk_mma else 1
    return {"copy_loop": copy_loop, "copy_trips": copy_trips, "qk_loop": qk_loop,
            "qk_trips": qk_trips,
            "copy_extra": (copy_trips - 1) * copy_loop + (qk_trips - 1) * qk_loop}


def spilled_paths(kernel_figures, path_figures):
    """The fixed paths (name -> ptxas_figures) that spill more bytes than
    the kernel with every path (`kernel_figures`): ptxas compiled their
    copy differently from the code the GPU runs, so their counts do not
    describe it. A message naming them, or None."""
    allowed = kernel_figures.get("spill_store_bytes") or 0
    worse = {name: f.get("spill_store_bytes") or 0 for name, f in path_figures.items()
             if (f.get("spill_store_bytes") or 0) > allowed}
    if not worse:
        return None
    listed = ", ".join(f"{name} {size} bytes" for name, size in sorted(worse.items()))
    return (f"ptxas spilled where the kernel itself spills {allowed} bytes: {listed}; "
            "their counts would describe code the GPU never runs")


def compile_counted(pagedc, example, mask, arch, head_dim, page, cubin, shape, templates=None):
    """Compiles the prefill of `mask` to `cubin` (with $PAGEDC_TEMPLATE_DIR
    `templates` when given) and returns ptxas's figures for it."""
    command = [pagedc, example, f"--mask={mask}", "--emit=cubin", f"--arch={arch}",
               f"--head-dim={head_dim}", f"--page-size={page}", "--ptxas-report", "-o", cubin]
    env = {**os.environ, "PAGEDC_PREFILL_SHAPE": shape}
    if templates is not None:
        env["PAGEDC_TEMPLATE_DIR"] = templates
    run = subprocess.run(command, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{run.stderr}")
    figures = ptxas_shapes.ptxas_figures(run.stderr, "pagedc_prefill")
    if figures["spill_store_bytes"] is None:
        sys.exit(f"{' '.join(command)}: no ptxas report of pagedc_prefill's spills in:\n"
                 f"{run.stderr}")
    return figures


def static_counts(pagedc, cuobjdump, templates, shape, kernel="warpgroup", arch="sm_90a",
                  head_dim=128, page=128, example=None, mask="causal", allow_spills=False):
    """Path ranges of the kernel's KV-tile loop (all kept / masked, O
    rescaled or not) and of its producer's loop; for the mma.sync kernel
    also the copy loop's further trips per tile (ptxas_shapes' rules).
    The mods: `mask` of `example` (default: examples/causal.attn's causal;
    the predictions take the causal counts)."""
    example = example or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                      "examples", "causal.attn")
    # The tile's three numbers, without a suffix ("r", "sK", "c2").
    block_m, block_n, rows = (int(x) for x in
                              re.match(r"(\d+)x(\d+)x(\d+)", shape).groups())
    out = {"kernel": kernel, "shape": shape, "block_m": block_m, "block_n": block_n,
           "rows_per_warp": rows if kernel == "mma" else ROWS_PER_WARP,
           "warps": 4 if kernel == "mma" else block_m // ROWS_PER_WARP,
           "producer_warps": 0 if kernel == "mma" else PRODUCER_WARPS,
           "head_dim": head_dim, "page_size": page, "arch": arch, "mods": mask}
    if mask != "causal" or os.path.basename(example) != "causal.attn":
        out["mods_file"] = os.path.basename(example)
    with tempfile.TemporaryDirectory() as directory:
        # The kernel with every path, as the GPU runs it: the fixed paths'
        # copies may spill no more than it does.
        kernel_figures = compile_counted(pagedc, example, mask, arch, head_dim, page,
                                         os.path.join(directory, "kernel.cubin"), shape,
                                         os.path.abspath(templates))
        path_figures = {}
        for kept in ("true", "false"):
            path = out.setdefault("all_kept" if kept == "true" else "masked", {})
            for rescale in ("true", "false"):
                work = os.path.join(directory, f"{kept}-{rescale}")
                values = {"all_kept": kept, "rescale": rescale, **FORCED_VALUES[kernel]}
                forced, absent = force(templates, work, values, kernel)
                out["not_forced"] = absent
                cubin = os.path.join(work, "kernel.cubin")
                name = ("all_kept" if kept == "true" else "masked") + \
                    ("/rescale" if rescale == "true" else "/no_rescale")
                path_figures[name] = compile_counted(pagedc, example, mask, arch, head_dim, page,
                                                     cubin, shape, forced)
                code = ptxas_shapes.cubin_instructions(cuobjdump, cubin)
                mma, fewest, most = ptxas_shapes.main_loop_paths(code)
                path["rescale" if rescale == "true" else "no_rescale"] = [fewest, most]
                path["mma"] = mma
                if kept == "true" and rescale == "false":
                    if kernel == "mma":
                        out["producer"] = [0, 0]
                        out.update(mma_nested_trips(code, block_n, out["rows_per_warp"],
                                                    head_dim))
                    else:
                        out["producer"] = list(producer_loop_paths(code))
                        # With tensor maps one thread issues the copies:
                        # the other three warps take the short path (wait,
                        # arrive); a gather runs in all four.
                        out["producer_copy_warps"] = (
                            PRODUCER_WARPS if "tensor_maps" in absent else 1)
    refused = spilled_paths(kernel_figures, path_figures)
    if refused and not allow_spills:
        sys.exit(f"{shape}: {refused} (--allow-spills counts them, marked)")
    if refused:
        print(f"issue_model.py static: {shape}: {refused}", file=sys.stderr)
        out["spilled_paths"] = refused
    out["ptxas"] = {"kernel": kernel_figures, "paths": path_figures}
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pagedc-gpu", help="the pagedc-gpu whose `model` holds the rule "
                        "(default: $PAGEDC_GPU, else build/bin/pagedc-gpu)")
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
    s.add_argument("--shape", default="128x64x64",
                   help="a $PAGEDC_PREFILL_SHAPE (128x32x32 or 64x64x16 with --kernel mma)")
    s.add_argument("--kernel", choices=sorted(KERNELS), default="warpgroup",
                   help="warpgroup: PrefillWgmma.cuh (sm_90a); mma: Prefill.cuh")
    s.add_argument("--arch", help="default sm_90a (warpgroup), sm_80 (mma)")
    s.add_argument("--head-dim", type=int, choices=(64, 128, 256), default=128)
    s.add_argument("--mods", metavar="FILE.attn:MASK",
                   help="count the kernel of another mask (default examples/causal.attn:causal; "
                        "predict takes causal counts)")
    s.add_argument("--allow-spills", action="store_true",
                   help="count fixed paths that spill more than the kernel (refused by default: "
                        "ptxas compiled their copy differently); the result names them in "
                        "spilled_paths")
    s.add_argument("--json")
    p = sub.add_parser("predict")
    p.add_argument("static")
    p.add_argument("model")
    p.add_argument("--filter", default="prefill",
                   help="configurations whose name holds TEXT (default: every prefill)")
    p.add_argument("--device", choices=DEVICES, default="H100")
    p.add_argument("--ncu", nargs=2, action="append", default=[], metavar=("NCU", "NAME"),
                   help="an Nsight Compute listing of the configuration NAME: its "
                        "instruction count is shown beside the counted one")
    p.add_argument("--json")
    c = sub.add_parser("calibrate")
    c.add_argument("--point", nargs=3, action="append", required=True,
                   metavar=("PREDICTED", "BENCH", "LABEL"),
                   help="`predict --json` rows (FILE[:KEY]), a GPU's `pagedc-gpu bench --json`, "
                        "and a label: points of one label share a cost per query tile")
    c.add_argument("--filter", default="causal")
    c.add_argument("--skip", action="append", default=[],
                   help="leave out configurations whose name holds TEXT (e.g. S1024-)")
    c.add_argument("--clock-ghz", type=float, help="fix the clock instead of fitting it")
    c.add_argument("--heads-q", type=int, default=32)
    c.add_argument("--block-m", type=int, default=128)
    c.add_argument("--apply", nargs=2, action="append", default=[],
                   metavar=("PREDICTED", "LABEL"))
    c.add_argument("--apply-filter",
                   help="the rows --apply takes hold TEXT, whatever --skip says (default: "
                        "those of --filter and none of --skip)")
    c.add_argument("--check", nargs=3, action="append", default=[],
                   metavar=("PREDICTED", "BENCH", "LABEL"),
                   help="out-of-fit residuals: every configuration in both, whatever "
                        "--filter and --skip say, against the fit with LABEL's cost")
    c.add_argument("--json")
    args = parser.parse_args(argv)
    global PAGEDC_GPU
    PAGEDC_GPU = args.pagedc_gpu or PAGEDC_GPU

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
    elif args.command == "calibrate":
        points = []
        for predicted, bench, label in args.point:
            found = calibration_points(load_model(predicted), json.load(open(bench)), label,
                                       args.filter, args.skip, args.heads_q, args.block_m)
            if not found:
                print(f"no configuration of {predicted} is in {bench}", file=sys.stderr)
                return 1
            points += found
        result = calibrate(points, args.clock_ghz)
        print("CALIBRATED MODEL (fitted to measured points; MODELLED elsewhere)")
        print("clock %.3f GHz (%s; s = %.3f)" % (
            result["clock_ghz"], "fixed" if result["clock_fixed"] else "fitted", result["s"]))
        for label, cost in result["tile_cost_us"].items():
            print("cost per query tile, %s: %.2f us" % (label, cost))
        print("%-14s %-32s %10s %10s %10s %8s" % ("label", "configuration", "modelled",
                                                  "measured", "calibrated", "meas/cal"))
        for p in points:
            print("%-14s %-32s %10.1f %10.1f %10.1f %8.3f" % (
                p["label"], p["name"], p["modelled_us"], p["measured_us"], p["calibrated_us"],
                p["measured_over_calibrated"]))
        checked = []
        for predicted, bench, label in args.check:
            checked += residuals(load_model(predicted), json.load(open(bench)), label, result,
                                 args.heads_q, args.block_m)
        if checked:
            print("residuals (measured / calibrated; * = a point of the fit)")
            for p in checked:
                print("%-14s %-32s %10.1f %10.1f %10.1f %8.3f%s" % (
                    p["label"], p["name"], p["modelled_us"], p["measured_us"],
                    p["calibrated_us"], p["measured_over_calibrated"],
                    " *" if p["in_fit"] else ""))
        result["checked"] = checked
        applied = []
        apply_filter, apply_skip = ((args.filter, args.skip) if args.apply_filter is None
                                    else (args.apply_filter, ()))
        for predicted, label in args.apply:
            cost = result["tile_cost_us"][label]
            for r in load_model(predicted):
                if apply_filter not in r["name"] or any(t in r["name"] for t in apply_skip):
                    continue
                tiles_per_sm = tiles_per_sm_of(r["name"], points, args.heads_q, args.block_m)
                if tiles_per_sm is None:
                    continue
                low, high = r["modelled_us_with_issue"]
                flops = r["tflops_with_issue"][0] * 1e6 * high
                row = {"predicted": predicted, "label": label, "name": r["name"],
                       "modelled_us": (low + high) / 2}
                for key, s_value in (("fitted_clock", result["s"]), ("clock_1.83", 1.0)):
                    t = s_value * row["modelled_us"] + cost * tiles_per_sm
                    row[key] = {"us": t, "tflops": flops / t / 1e6}
                applied.append(row)
        if applied:
            print("%-36s %-30s %18s %18s" % ("applied to (rows, label)", "configuration",
                                             "TFLOP/s at %.2f GHz" % result["clock_ghz"],
                                             "TFLOP/s at 1.83 GHz"))
            for row in applied:
                print("%-36s %-30s %18.0f %18.0f" % (
                    row["predicted"].partition(":")[2][-24:] + ", " + row["label"], row["name"],
                    row["fitted_clock"]["tflops"], row["clock_1.83"]["tflops"]))
        result["applied"] = applied
    elif args.command == "static":
        arch = args.arch or ("sm_80" if args.kernel == "mma" else "sm_90a")
        example, mask = None, "causal"
        if args.mods:
            example, _, mask = args.mods.rpartition(":")
            if not example or not mask:
                parser.error("--mods takes FILE.attn:MASK")
        result = static_counts(args.pagedc, args.cuobjdump, args.templates, args.shape,
                               args.kernel, arch, args.head_dim, example=example, mask=mask,
                               allow_spills=args.allow_spills)
        print(json.dumps(result, indent=2))
    else:
        rows = predict(load_model(args.static), load_model(args.model), args.filter, args.ncu,
                       args.device)
        if not rows:
            print("no prefill configuration in the model with emulator tallies or a causal "
                  "mask", file=sys.stderr)
            return 1
        print(f"MODELLED (no GPU ran this), {args.device}:")
        print("%-34s %17s %19s %15s  %s" % ("configuration", "issue us", "modelled us",
                                            "TFLOP/s", "tile mix"))
        for r in rows:
            print("%-34s %8.1f-%-8.1f %9.1f-%-9.1f %7.0f-%-7.0f  %s" % (
                r["name"], *r["issue_us"], *r["modelled_us_with_issue"], *r["tflops_with_issue"],
                r["tile_mix"] + (" (%.0f%% rescaled)" % (100 * r["rescaled_fraction"])
                                 if "rescaled_fraction" in r else "")))
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
    try:
        sys.exit(main())
    except (OSError, KeyError, ValueError, StopIteration) as error:
        # a missing or malformed input file, an unknown key or configuration
        sys.exit(f"issue_model.py: error: {type(error).__name__}: {error}")
