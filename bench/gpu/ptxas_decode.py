#!/usr/bin/env python3
"""Static figures of the decode kernel, from ptxas (no GPU needed).

For each architecture (sm_90, sm_80), head dim (64, 128, 256), GQA group
(1, 4, 8 query heads per KV head, one query token) and the mods of the GPU
benchmark's decode rows (none; causal + alibi; sliding_4k + softcap_tanh,
bench/gpu/bench.attn), compiles `pagedc --emit=cubin --kernel=decode
--ptxas-report` (NVRTC, bf16, page 16) and records the decode kernel's
registers and spill bytes (of any function of the unit), dynamic shared memory and CTAs per SM
(H100 for sm_90, A100 for sm_80). With --cuobjdump PATH it also counts the
static SASS instructions of the KV-tile loop (ptxas_shapes.loop_counts: the
back edge's natural loop with the most HMMA): one warp's work per 64-key
tile (16 padded query rows x 16 keys: four warps split each tile's columns
when the CTA has at most 16 rows). Static counts of one loop body, both
sides of its branches counted: the output rescale that online_softmax skips
once the row maxima settle is in them.

Usage: ptxas_decode.py --pagedc build/bin/pagedc [--cuobjdump PATH]
       [--json OUT] [--quick]   (sm_90, D 128 only)
With $PAGEDC_TEMPLATE_DIR holding older templates it measures those (for
before/after figures).

--path all-kept|masked counts one path of the tile loop: a copy of
templates/Decode.cuh (or of $PAGEDC_TEMPLATE_DIR's) with the tile's
all_kept flag fixed to true (every row keeps the whole tile: a block every
row sees as full) or to false (the mask, kv_len test and select per
element), and the block size's power-of-two shift taken (the division it
replaces left out). The compiler then emits only that path, so the loop's
static count is what a warp executes per tile on it. Registers and spills
are those of the patched kernel; without --path, the kernel as built.

--copies maps|gather fixes the copy path the same way: every tile by
tensor maps (one bulk tensor copy per page and 64 head dims, issued by
lanes of warp 0; code for sm_90 only, sm_80 code gathers regardless) or
every tile gathered with cp.async. Templates from before the tensor-map
copies have no such line: measure them without --copies.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ptxas_corpus  # noqa: E402
import ptxas_shapes  # noqa: E402

# The lines --path replaces in Decode.cuh (each must occur once).
PATH_LINES = [
    ("    if ((block_size & (block_size - 1)) == 0 && block_size >= kDecodeTileN)\n",
     "    if (true)\n"),
    ("    bool all_kept = !pagedc_mods::kHasMask && kv_begin + kDecodeTileN <= split_end;\n",
     "    bool all_kept = {value};\n"),
    ("      all_kept = (tile_seen[block] & kAllFull) && kv_begin + kDecodeTileN <= split_end;\n",
     "      all_kept = {value};\n"),
]


# The line --copies replaces: whether a tile comes by tensor maps.
COPY_LINES = [
    ("    return use_maps && keep_rows == ~static_cast<uint64_t>(0) &&\n"
     "           split_begin + (which + 1) * kDecodeTileN <= split_end;\n",
     "    return {value};\n"),
]


def template_dir():
    """The templates pagedc compiles: $PAGEDC_TEMPLATE_DIR's, else this tree's."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.environ.get("PAGEDC_TEMPLATE_DIR") or os.path.join(here, "..", "..", "templates")


def force_path(directory, path, copies=None):
    """Writes the templates, Decode.cuh with the tile loop's path (and, with
    copies, its copy path) fixed, into directory and returns it as a
    template dir."""
    source_dir = template_dir()
    with open(os.path.join(source_dir, "Decode.cuh")) as file:
        text = file.read()
    for old, new in PATH_LINES if path else []:
        if text.count(old) != 1:
            sys.exit(f"--path: Decode.cuh has {text.count(old)} copies of {old.strip()!r}")
        text = text.replace(old, new.format(value="true" if path == "all-kept" else "false"))
    for old, new in COPY_LINES if copies else []:
        if text.count(old) != 1:
            sys.exit(f"--copies: Decode.cuh has {text.count(old)} copies of {old.strip()!r}")
        text = text.replace(old, new.format(value="true" if copies == "maps" else "false"))
    return ptxas_shapes.write_templates(source_dir, directory, {"Decode.cuh": text})


MODS = [("none", None, None), ("causal + alibi", "causal", "alibi"),
        ("sliding_4k + softcap_tanh", "sliding_4k", "softcap_tanh")]


def decode_shared_bytes(head_dim, group, tensor_maps=True):
    """KernelConfig::sharedMemoryBytes of the decode kernel (one token);
    tensor_maps=False: templates from before its tensor-map copies, without
    their two mbarriers and 1 KiB of alignment."""
    rows = group  # one CTA serves the whole group up to 64 rows
    padded = 16 if rows <= 16 else 32 if rows <= 32 else 64
    row_bytes = head_dim * 2
    return (padded * row_bytes + 4 * 64 * row_bytes + padded * 64 + 64 + 2 * 64 * 4 + 64 * 4
            + (2 * 8 + 1024 if tensor_maps else 0))


def templates_have_tensor_maps():
    """Whether the Decode.cuh pagedc compiles (template_dir()) has the
    tensor-map copies."""
    with open(os.path.join(template_dir(), "Decode.cuh")) as file:
        return "PagedcDecodeMapArgs" in file.read()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pagedc", required=True)
    parser.add_argument("--cuobjdump")
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--path", choices=("all-kept", "masked"))
    parser.add_argument("--copies", choices=("maps", "gather"),
                        help="fix the copy path: every tile by tensor maps (code for "
                             "sm_90; sm_80 code gathers whatever this says) or gathered")
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        if options.path or options.copies:
            os.environ["PAGEDC_TEMPLATE_DIR"] = force_path(directory, options.path,
                                                           options.copies)
        # compile_one writes its cubin next to the program: a copy here.
        attn = os.path.join(directory, "bench.attn")
        shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench.attn"), attn)
        tensor_maps = templates_have_tensor_maps()
        for arch in ("sm_90",) if options.quick else ("sm_90", "sm_80"):
            for head_dim in (128,) if options.quick else (64, 128, 256):
                for group in (1, 4, 8):
                    for label, mask, score in MODS:
                        figures = ptxas_corpus.compile_one(options.pagedc, attn, mask, score,
                                                           arch, head_dim, kernel="decode",
                                                           gqa=group)
                        if "error" in figures:
                            sys.exit(f"decode {arch} D{head_dim} GQA {group} {label}: "
                                     f"{figures['error']}")
                        shared = decode_shared_bytes(head_dim, group, tensor_maps)
                        row = {"arch": arch, "head_dim": head_dim, "gqa": group,
                               "mods": label, "path": options.path or "as built",
                               "copies": options.copies or "as built",
                               "threads": 128, "shared_bytes": shared,
                               "ctas_per_sm": ptxas_shapes.ctas_per_sm(
                                   arch, figures["registers"], 128, shared),
                               **figures}
                        if options.cuobjdump:
                            cubin = f"{attn}.decode.{arch}.{head_dim}.cubin"
                            mma, other, copy = ptxas_shapes.main_loop_counts(
                                options.cuobjdump, cubin, copies=True)
                            row["loop_mma"] = mma
                            row["loop_other"] = other
                            # The copy loop (unrolled by two) runs its body
                            # trips times per tile; `other` holds it once.
                            trips = ptxas_shapes.copy_trips(64, 128, head_dim)
                            row["copy_loop_other"] = copy
                            row["copy_loop_trips"] = trips if copy else 1
                            row["tile_other"] = other + (trips - 1) * copy if copy else other
                        rows.append(row)
                        print(f"{arch} D{head_dim} GQA {group} {label:<26} regs "
                              f"{row['registers']:>3} spills {row['spill_store_bytes']}/"
                              f"{row['spill_load_bytes']} CTAs/SM {row['ctas_per_sm']}"
                              + (f" loop: {row['loop_mma']} MMA, {row['loop_other']} other"
                                 f" (copy loop {row['copy_loop_other']} x "
                                 f"{row['copy_loop_trips']}): {row['tile_other']} per tile"
                                 if "loop_mma" in row else ""), flush=True)
    if options.json:
        with open(options.json, "w") as file:
            json.dump({"what": "decode kernel, bf16, page 16, one query token, ptxas -v "
                               "through NVRTC (pagedc --emit=cubin --kernel=decode "
                               "--ptxas-report); static figures, no GPU ran",
                       "rows": rows}, file, indent=1)
            file.write("\n")


if __name__ == "__main__":
    main()
