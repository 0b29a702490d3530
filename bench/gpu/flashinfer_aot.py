#!/usr/bin/env python3
"""FlashInfer's kernels for a pack's benchmark rows, compiled here ahead of
time (docs/gpu.md, "Baselines").

FlashInfer compiles each kernel variant with nvcc the first time a wrapper's
plan() asks for it, minutes of a GPU lease for the baseline rows. This
script compiles, on the machine that prepares the run, the variants that
bench/gpu/baselines.py's FlashInfer rows load, with FlashInfer's own build
(its JIT specs, nvcc, sm_90a), and lays each library out where the installed
package looks for ahead-of-time modules first (flashinfer/data/aot/NAME/
NAME.so), so that the GPU machine loads them instead of compiling. A variant
that is missing there, or whose library does not load on that machine, is
compiled there as before: nothing here can make a row compute something else.

    flashinfer_aot.py modules PACK            the variants, one per line
    flashinfer_aot.py build PACK SITE         compile them into SITE's
                                              flashinfer/data/aot (SITE: where
                                              the flashinfer package is
                                              installed for this Python)
    flashinfer_aot.py check PACK SITE         load each through FlashInfer's
                                              own lookup with its JIT turned
                                              off (FLASHINFER_DISABLE_JIT=1)

`build` and `check` need torch and the flashinfer package importable (SITE on
PYTHONPATH) and nvcc (CUDA_HOME); `modules` needs neither. The variants
mirror the wrappers' choices for bf16 rows: a decode row with four or more
query heads per KV head takes the tensor-core path (FA2 prefill kernels),
fewer the decode kernels; a prefill row takes FA3 where FlashInfer's FA3
takes it (no ALiBi; head dims 64, 128, 256) and FA2 as well (ALiBi, and what
the wrappers pick for short query rows).
"""

import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baselines  # noqa: E402

# FlashInfer's PosEncodingMode values.
POS_NONE, POS_ALIBI = 0, 2
FA3_HEAD_DIMS = (64, 128, 256)


def variants(configs):
    """The kernel variants the FlashInfer rows of `configs` (a pack's bench
    entries) load: sorted tuples (kind, backend, head_dim, pos_encoding,
    sliding_window, soft_cap), kind "decode" or "prefill", backend "fa2",
    "fa3" or "" (decode kernels)."""
    found = set()
    for config in configs:
        if not baselines.supports("flashinfer", config)[0]:
            continue
        mask, score = config.get("mask", ""), config.get("score", "")
        head_dim = config["head_dim"]
        pos = POS_ALIBI if score == "alibi" else POS_NONE
        window = baselines.window_of(mask) is not None
        cap = score == "softcap_tanh"
        if config["kind"] == "decode":
            if config["heads_q"] // config["heads_kv"] >= 4:
                found.add(("prefill", "fa2", head_dim, pos, window, cap))
            else:
                found.add(("decode", "", head_dim, pos, window, cap))
            continue
        found.add(("prefill", "fa2", head_dim, pos, window, cap))
        if pos == POS_NONE and head_dim in FA3_HEAD_DIMS:
            found.add(("prefill", "fa3", head_dim, pos, window, cap))
    return sorted(found)


def describe(variant):
    kind, backend, head_dim, pos, window, cap = variant
    return "%s %s head_dim %d%s%s%s" % (kind, backend or "decode-kernels", head_dim,
                                        " alibi" if pos == POS_ALIBI else "",
                                        " sliding-window" if window else "",
                                        " soft-cap" if cap else "")


def read_configs(pack):
    with open(os.path.join(pack, "pack.json")) as f:
        return json.load(f)["bench"]


def spec_arguments(torch, variant):
    """FlashInfer's module arguments of a bf16 variant (int32 indices)."""
    _, _, head_dim, pos, window, cap = variant
    bf16 = torch.bfloat16
    return (bf16, bf16, bf16, torch.int32, head_dim, head_dim, pos, window, cap)


def jit_spec(torch, variant):
    """The JitSpec FlashInfer builds for `variant` (its module name and
    sources), from the functions its wrappers call."""
    from flashinfer.jit.attention import modules
    kind, backend = variant[0], variant[1]
    arguments = spec_arguments(torch, variant)
    if kind == "decode":
        return modules.gen_batch_decode_module(*arguments)
    if backend == "fa2":
        # get_batch_prefill_module("fa2", ...) loads this primary module.
        return modules._gen_batch_prefill_primary_module("fa2", *arguments, False)
    return modules.gen_batch_prefill_module(backend, *arguments, False)


def aot_library(site, name):
    return os.path.join(site, "flashinfer", "data", "aot", name, name + ".so")


def load_through_flashinfer(torch, variant):
    """Loads `variant` the way the wrappers do (get_batch_*_module)."""
    kind, backend = variant[0], variant[1]
    arguments = spec_arguments(torch, variant)
    if kind == "decode":
        from flashinfer.decode import get_batch_decode_module
        return get_batch_decode_module(*arguments)
    from flashinfer.prefill import get_batch_prefill_module
    return get_batch_prefill_module(backend, *arguments, False)


def check_site(site):
    import flashinfer
    package = os.path.dirname(os.path.abspath(flashinfer.__file__))
    if os.path.realpath(package) != os.path.realpath(os.path.join(site, "flashinfer")):
        raise SystemExit("flashinfer_aot: this Python imports flashinfer from %s, not from "
                         "SITE %s (put SITE first on PYTHONPATH)" % (package, site))


def build(pack, site):
    import torch
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    check_site(site)
    chosen = variants(read_configs(pack))
    for i, variant in enumerate(chosen, 1):
        spec = jit_spec(torch, variant)
        target = aot_library(site, spec.name)
        if os.path.exists(target):
            print("[%d/%d] %s: already built" % (i, len(chosen), describe(variant)), flush=True)
            continue
        started = time.monotonic()
        # FlashInfer's ninja build: a no-op when its objects are up to date.
        print("[%d/%d] %s: building %s (%d sources)" % (i, len(chosen), describe(variant),
                                                        spec.name, len(spec.sources)),
              flush=True)
        spec.build(verbose=False)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(str(spec.jit_library_path), target + ".part")
        os.replace(target + ".part", target)
        print("[%d/%d] %s: %.0f s, %.1f MiB" % (i, len(chosen), describe(variant),
                                                time.monotonic() - started,
                                                os.path.getsize(target) / 2**20), flush=True)
    return 0


def check(pack, site):
    # Read by FlashInfer when a module is not found: it must not compile.
    os.environ["FLASHINFER_DISABLE_JIT"] = "1"
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    import torch
    check_site(site)
    failed = 0
    for variant in variants(read_configs(pack)):
        name = jit_spec(torch, variant).name
        try:
            load_through_flashinfer(torch, variant)
            print("ok      %s (%s)" % (describe(variant), name))
        except Exception as error:  # reported per variant, then the exit status
            failed += 1
            print("FAILED  %s (%s): %s: %s" % (describe(variant), name, type(error).__name__,
                                               str(error)[:300]))
    return 1 if failed else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("modules", "build", "check"))
    parser.add_argument("pack", help="the pack whose benchmark rows are run (pack.json)")
    parser.add_argument("site", nargs="?", help="where flashinfer is installed (build, check)")
    args = parser.parse_args(argv)
    if args.command == "modules":
        for variant in variants(read_configs(args.pack)):
            print(describe(variant))
        return 0
    if not args.site:
        parser.error("%s needs SITE" % args.command)
    return (build if args.command == "build" else check)(args.pack, args.site)


if __name__ == "__main__":
    sys.exit(main())
