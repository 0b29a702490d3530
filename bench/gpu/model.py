#!/usr/bin/env python3
"""pagedc's GPU performance model: MODELLED, not measured.

  model.py BUILD_DIR PACK [-o RESULT.json] [--filter TEXT] [--sample-blocks N]
           [--max-kv-bytes BYTES]

PACK is a GPU check pack built for the SIMT emulator
(`pagedc-gpu-prepare -o PACK --arch emu`); its bench plan holds the decode and
prefill shapes of the GPU benchmark (bench/README.md). For each configuration:

1. `pagedc-gpu bench` runs it once through the runtime's CUDA path on the
   emulator (PAGEDC_CUDA_DRIVER=emu, checkers off, PAGEDC_EMU_SAMPLE_BLOCKS
   blocks of each grid) and the emulator writes its counters per launch;
   counts are scaled by grid blocks / blocks run. A configuration whose K/V
   would exceed --max-kv-bytes runs with a smaller batch and is scaled by
   batch (marked "batch scaled").
2. `pagedc --emit=cubin --ptxas-report` compiles the same mods and kernel for
   sm_90 and sm_80: registers, spills and the kernel's shared memory give the
   occupancy (CTAs per SM).
3. The roofline of docs/emulator.md ("The performance model") turns counts,
   occupancy and the device's figures into a time per launch, summed over a
   call; decode reports bandwidth over the bytes that must move, prefill
   TFLOP/s of unmasked work.
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

# Device figures (public specifications) and the model's assumptions; each is
# stated in docs/emulator.md.
DEVICES = {
    "H100": dict(peak_tflops=989.0, mma_sync_fraction=0.66, hbm=3.35e12, l2=7.0e12, sms=132,
                 clock=1.755e9, smem_per_sm=228 * 1024, regs_per_sm=65536, max_threads=2048,
                 arch="sm_90"),
    "A100": dict(peak_tflops=312.0, mma_sync_fraction=1.0, hbm=2.039e12, l2=5.0e12, sms=108,
                 clock=1.41e9, smem_per_sm=164 * 1024, regs_per_sm=65536, max_threads=2048,
                 arch="sm_80"),
}
LAUNCH_OVERHEAD_S = 3e-6  # per kernel launch, back to back on a stream
SMEM_BYTES_PER_CLOCK = 128  # per SM: one wavefront
MUFU_PER_CLOCK = 16  # per SM


def run(command, env=None):
    return subprocess.run(command, env=env, capture_output=True, text=True)


def ptxas_figures(build, attn, case, arch, cache, work):
    """registers, spill bytes per kernel for this case's mods on `arch`."""
    key = (case["mask"], case["score"], case["kind"], case["page_size"],
           case["heads_q"] // case["heads_kv"], arch)
    if key in cache:
        return cache[key]
    command = [os.path.join(build, "bin", "pagedc"), "--emit=cubin", "--ptxas-report",
               "--kernel=" + case["kind"], "--head-dim=%d" % case["head_dim"], "--dtype=bf16",
               "--page-size=%d" % case["page_size"],
               "--gqa=%d" % (case["heads_q"] // case["heads_kv"]), "--arch=" + arch,
               "-o", os.path.join(work, "kernel.cubin"), attn]
    if case["mask"]:
        command.insert(-1, "--mask=" + case["mask"])
    if case["score"]:
        command.insert(-1, "--score=" + case["score"])
    result = run(command)
    figures = {}
    current = None
    for line in result.stderr.splitlines():
        match = re.search(r"Compiling entry function '(\w+)'", line)
        if match:
            current = figures.setdefault(match.group(1), {"registers": 0, "spill_bytes": 0})
            continue
        if current is None:
            continue
        match = re.search(r"Used (\d+) registers", line)
        if match:
            current["registers"] = int(match.group(1))
        match = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if match:
            current["spill_bytes"] = int(match.group(1)) + int(match.group(2))
    if result.returncode != 0 or not figures:
        figures = {"error": (result.stderr or result.stdout).strip()[-400:]}
    cache[key] = figures
    return figures


def occupancy(device, registers, threads, shared):
    limits = [32, device["max_threads"] // threads]
    if registers:
        per_warp = math.ceil(registers * 32 / 256) * 256  # allocation granularity
        limits.append(device["regs_per_sm"] // (per_warp * (threads // 32)))
    limits.append(device["smem_per_sm"] // (shared + 1024))  # 1 KiB reserved per CTA
    return max(0, min(limits))


def model_launch(device, launch, ptxas, must_move_bytes):
    c = launch["counters"]
    scale = launch["scale"]
    # Distinct bytes do not scale with the blocks run: CTAs of other heads /
    # query blocks re-read the same K/V. The main kernel's DRAM traffic is
    # taken as the bytes the call must move (L2 catches re-reads across CTAs;
    # their cost is the L2 term), never less than what the sample itself read.
    dram_bytes = c["global_sectors_unique"] * 32.0 * scale
    if launch["kernel"] in ("pagedc_prefill", "pagedc_decode"):
        dram_bytes = max(min(dram_bytes, must_move_bytes), c["global_sectors_unique"] * 32.0)
    grid = c["grid_blocks"]
    threads = launch["block"][0] * launch["block"][1] * launch["block"][2]
    registers = ptxas.get(launch["kernel"], {}).get("registers", 0)
    per_sm = occupancy(device, registers, threads, launch["dynamic_shared_bytes"])
    if per_sm == 0:
        return None
    slots = device["sms"] * per_sm
    waves = math.ceil(grid / slots)
    efficiency = grid / (waves * slots)
    clock, sms = device["clock"], device["sms"]
    wavefronts = (c["ldmatrix_wavefronts"] + c["shared_wavefronts"] +
                  (c["cp_async_bytes"] + c["cp_async_zero_fill_bytes"]) / 128.0)
    terms = {
        "tensor": c["mma"] * 4096.0 * scale /
                  (device["peak_tflops"] * 1e12 * device["mma_sync_fraction"]),
        "shared": wavefronts * scale / (sms * clock),
        "dram": dram_bytes / device["hbm"],
        "l2": c["global_sectors_requested"] * 32.0 * scale / device["l2"],
        "mufu": c["transcendentals"] * scale / (sms * MUFU_PER_CLOCK * clock),
    }
    bound = max(terms, key=terms.get)
    seconds = terms[bound] / efficiency + LAUNCH_OVERHEAD_S
    return dict(kernel=launch["kernel"], grid_blocks=grid, ctas_per_sm=per_sm, waves=waves,
                wave_efficiency=round(efficiency, 4), bound=bound,
                terms_us={k: round(v * 1e6, 3) for k, v in terms.items()},
                modelled_us=round(seconds * 1e6, 3),
                global_bytes_read=dram_bytes,
                global_sectors_unique_scaled=c["global_sectors_unique"] * scale)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("pack")
    parser.add_argument("-o", "--output")
    parser.add_argument("--filter", default="")
    parser.add_argument("--sample-blocks", type=int, default=32)
    parser.add_argument("--max-kv-bytes", type=float, default=2.5e9)
    parser.add_argument("--attn", default=os.path.join(os.path.dirname(__file__), "bench.attn"))
    args = parser.parse_args()
    pack = json.load(open(os.path.join(args.pack, "pack.json")))
    if pack.get("arch") != "emu":
        sys.exit("model.py: the pack is for %s; build it with --arch emu" % pack.get("arch"))
    env = dict(os.environ, PAGEDC_CUDA_DRIVER="emu", PAGEDC_EMU_CHECKS="none",
               PAGEDC_EMU_QUIET="1", PAGEDC_EMU_SAMPLE_BLOCKS=str(args.sample_blocks),
               PAGEDC_EMU_SAMPLE_KERNELS="pagedc_prefill,pagedc_decode")
    work = tempfile.mkdtemp(prefix="pagedc-model-")
    ptxas_cache = {}
    rows = []
    try:
        for case in pack["bench"]:
            if args.filter not in case["name"]:
                continue
            # A copy of the pack with this one configuration (batch maybe cut).
            kv_bytes = 2.0 * case["batch"] * case["heads_kv"] * case["kv_len"] * case["head_dim"] * 2
            batch = case["batch"]
            while batch > 1 and kv_bytes * batch / case["batch"] > args.max_kv_bytes:
                batch //= 2
            run_case = dict(case, batch=batch)
            case_pack = os.path.join(work, "pack")
            shutil.rmtree(case_pack, ignore_errors=True)
            os.makedirs(case_pack)
            for entry in os.listdir(args.pack):
                if entry != "pack.json":
                    os.symlink(os.path.abspath(os.path.join(args.pack, entry)),
                               os.path.join(case_pack, entry))
            json.dump(dict(pack, bench=[run_case], cases=[]),
                      open(os.path.join(case_pack, "pack.json"), "w"))
            counters = os.path.join(work, "counters.jsonl")
            if os.path.exists(counters):
                os.remove(counters)
            result = run([os.path.join(args.build, "bin", "pagedc-gpu"), "bench", case_pack,
                          "--iters", "1", "--warmup", "0", "--copy-mib", "1",
                          "--json", os.path.join(work, "bench.json")],
                         env=dict(env, PAGEDC_EMU_COUNTERS=counters))
            if result.returncode != 0 or not os.path.exists(counters):
                print("%-44s error: %s" % (case["name"], (result.stderr or result.stdout)[-300:]))
                rows.append(dict(name=case["name"], status="error"))
                continue
            launches = [json.loads(line) for line in open(counters)]
            for launch in launches:
                c = launch["counters"]
                launch["scale"] = (c["grid_blocks"] / max(c["blocks"], 1)) * case["batch"] / batch
            row = dict(name=case["name"], kind=case["kind"], batch=case["batch"],
                       run_batch=batch, kv_len=case["kv_len"], q_len=case["q_len"],
                       page_size=case["page_size"], kept_fraction=case["kept_fraction"],
                       launches=[dict(kernel=l["kernel"], grid=l["grid"], block=l["block"],
                                      dynamic_shared_bytes=l["dynamic_shared_bytes"],
                                      blocks_run=l["counters"]["blocks"],
                                      counters=l["counters"]) for l in launches],
                       devices={})
            elements = 2  # bf16
            must_bytes = elements * (
                2.0 * case["batch"] * case["heads_kv"] * case["kv_len"] * case["kept_fraction"] *
                case["head_dim"] + 2.0 * case["batch"] * case["heads_q"] * case["q_len"] *
                case["head_dim"])
            flops = 4.0 * case["batch"] * case["heads_q"] * case["q_len"] * case["kv_len"] * \
                case["head_dim"] * case["kept_fraction"]
            row["must_move_bytes"] = must_bytes
            row["unmasked_flops"] = flops
            for name, device in DEVICES.items():
                ptxas = ptxas_figures(args.build, args.attn, case, device["arch"], ptxas_cache, work)
                modelled = [model_launch(device, l, ptxas, must_bytes) for l in launches]
                if any(m is None for m in modelled):
                    row["devices"][name] = dict(error="a kernel does not fit on an SM", ptxas=ptxas)
                    continue
                seconds = sum(m["modelled_us"] for m in modelled) * 1e-6
                read = sum(m["global_bytes_read"] for m in modelled)
                entry = dict(ptxas=ptxas, launches=modelled, modelled_us=round(seconds * 1e6, 3))
                if case["kind"] == "decode":
                    entry["modelled_bandwidth_fraction"] = round(must_bytes / seconds / device["hbm"], 4)
                    # Decode CTAs read disjoint K/V: the sample's distinct
                    # sectors scale, and show any over-fetch.
                    scaled = sum(m["global_sectors_unique_scaled"] for m in modelled) * 32.0
                    entry["global_bytes_over_must_move"] = round(scaled / must_bytes, 4)
                else:
                    entry["modelled_tflops"] = round(flops / seconds * 1e-12, 1)
                    entry["modelled_fraction_of_peak"] = round(
                        flops / seconds / (device["peak_tflops"] * 1e12), 4)
                row["devices"][name] = entry
            rows.append(row)
            h, a = row["devices"]["H100"], row["devices"]["A100"]
            figure = (lambda d: ("%.3f of HBM" % d["modelled_bandwidth_fraction"])
                      if "modelled_bandwidth_fraction" in d else
                      ("%.0f TFLOP/s" % d["modelled_tflops"]) if "modelled_tflops" in d else "error")
            print("%-46s MODELLED H100 %9.1f us %-16s A100 %9.1f us %-16s%s" % (
                case["name"], h.get("modelled_us", 0), figure(h), a.get("modelled_us", 0),
                figure(a), "  (batch scaled from %d)" % batch if batch != case["batch"] else ""),
                flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    document = dict(
        label="MODELLED, not measured: emulator counters + ptxas figures + roofline "
              "(docs/emulator.md, 'The performance model'); no GPU ran these kernels",
        devices=DEVICES, launch_overhead_s=LAUNCH_OVERHEAD_S, sample_blocks=args.sample_blocks,
        configurations=rows)
    if args.output:
        with open(args.output, "w") as out:
            json.dump(document, out, indent=1)
            out.write("\n")
    return 0 if rows and all(r.get("status") != "error" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
