#!/usr/bin/env python3
"""Static figures of the prefill kernel designs, from ptxas (no GPU needed).

For each architecture (sm_80, sm_90), head dim (64, 128, 256), page size
(1, 16, 128), mods (causal; causal + tanh_approx softcap) and prefill tile
shape (the first design, 64x64 with 16 query rows per warp; the 32-rows-per-
warp shapes), compiles the prefill kernel with `pagedc --emit=cubin
--ptxas-report` (NVRTC) and records registers, stack frame, spill stores and
loads, threads, dynamic shared memory, CTAs per SM (H100 for sm_90, A100 for
sm_80), and the design's shared-memory bytes read per tensor-core FLOP:

    per warp and KV tile of N keys, rows R = query rows per warp:
      Q fragments R * D * 2 bytes (0 when Q stays in registers, D = 64),
      K and V fragments N * D * 2 bytes each,
      FLOPs 2 * R * N * D (Q K^T) + 2 * R * N * D (P V)

With --cuobjdump PATH (the CUDA toolkit's disassembler; not part of the
toolkit subset pagedc builds against, so optional), it also counts the
static SASS instructions of the main loop (the backward branch whose body
holds the most HMMA instructions): MMA instructions and the others (address
and page arithmetic, softmax, mods, loads, barriers), per 64 keys and 16
query rows. Static counts of one loop body, not a trace: the body has
branches (mask or no mask per tile, the visit seek).

Usage: ptxas_shapes.py --pagedc build/bin/pagedc [--json OUT] [--markdown OUT]
       [--quick]   (D 64/128, page 16 only) [--cuobjdump PATH]
       [--wgmma]   (the warpgroup tiles, sm_90a, instead of the mma.sync shapes)
Shapes that do not apply (32 rows per warp, 128 x 128 warpgroup tiles at
D 256) are left out.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

MODS = """param softcap: f32 = 30.0
mask causal(b, h, q, kv) = q >= kv
score softcap_tanh(s, b, h, q, kv) = softcap * tanh_approx(s / softcap)
"""

# (label, --block, --warp-rows); warp rows 64: warpgroup tiles (wgmma,
# PrefillWgmma.cuh), compiled for sm_90a only.
WGMMA_SHAPES = [
    ("128x64 warpgroups", "128x64", 64),
    ("128x128 warpgroups", "128x128", 64),
    ("64x64 warpgroups", "64x64", 64),
    ("64x32 warpgroups", "64x32", 64),
]
SHAPES = [
    ("64x64 w16 (first design)", "64x64", 16),
    ("128x32 w32", "128x32", 32),
    ("128x64 w32", "128x64", 32),
    ("64x32 w16", "64x32", 16),
]

# Per-SM limits: (shared bytes per SM, per block, registers, threads, CTAs).
LIMITS = {
    "sm_90": (228 * 1024, 227 * 1024, 65536, 2048, 32),  # H100
    "sm_90a": (228 * 1024, 227 * 1024, 65536, 2048, 32),  # H100
    "sm_80": (164 * 1024, 163 * 1024, 65536, 2048, 32),  # A100
}


def ctas_per_sm(arch, registers, threads, shared):
    per_sm, per_block, regs, max_threads, max_ctas = LIMITS[arch]
    if shared > per_block:
        return 0
    warps = threads // 32
    regs_per_warp = -(-(-(-registers // 8) * 8 * 32) // 256) * 256
    by_regs = (regs // regs_per_warp) // warps
    by_shared = per_sm // (shared + 1024)
    return min(max_ctas, max_threads // threads, by_regs, by_shared)


def wgmma_shared_bytes(block_m, block_n, head_dim):
    """Dynamic shared memory of the warpgroup prefill, as
    KernelConfig::sharedMemoryBytes: 1024 (alignment) + Q and the K/V ring
    of the most stages (2 to 4) that fit 227 KiB + 128 (mbarriers), and a
    second Q tile where it fits beside them (prefillQBuffers)."""
    limit = 227 * 1024
    for stages in (4, 3, 2):
        shared = 1024 + (block_m + 2 * stages * block_n) * head_dim * 2 + 128
        if shared <= limit or stages == 2:
            second_q = block_m * head_dim * 2
            return shared + second_q if shared + second_q <= limit else shared


def shared_bytes_per_flop(head_dim, block_n, warp_rows):
    if warp_rows == 64:
        # A consumer warpgroup per tile: wgmma reads Q (64 rows) and K from
        # shared memory for S, V for O (P is in registers).
        return (64 + 2 * block_n) * head_dim * 2 / (4 * 64 * block_n * head_dim)
    q = 0 if head_dim <= 64 else warp_rows * head_dim * 2
    kv = 2 * block_n * head_dim * 2
    flops = 4 * warp_rows * block_n * head_dim
    return (q + kv) / flops


def ptxas_functions(report):
    """{entry function: its section of ptxas -v's report}, in report order."""
    sections, name = {}, None
    for line in report.splitlines():
        found = re.search(r"Compiling entry function '([^']+)'", line)
        if found:
            name = found.group(1)
            sections[name] = ""
        elif name is not None:
            sections[name] += line + "\n"
    return sections


def ptxas_figures(report, kernel=None):
    """Registers, stack and spill bytes of ptxas -v's report (None when
    absent): of entry function `kernel` when given (a decode unit also holds
    its merge kernel), else of the first function reported."""
    if kernel is not None:
        report = ptxas_functions(report).get(kernel, "")
    figures = {}
    for key, pattern in [("registers", r"Used (\d+) registers"),
                         ("stack_bytes", r"(\d+) bytes stack frame"),
                         ("spill_store_bytes", r"(\d+) bytes spill stores"),
                         ("spill_load_bytes", r"(\d+) bytes spill loads")]:
        found = re.search(pattern, report)
        figures[key] = int(found.group(1)) if found else None
    return figures


def write_templates(source_dir, directory, texts):
    """Copies source_dir's templates (its *.cuh) into directory/templates,
    the files named in `texts` (file name -> text) replaced by those texts;
    returns that directory, for $PAGEDC_TEMPLATE_DIR (the scripts' copies
    with a path of a kernel fixed)."""
    templates = os.path.join(directory, "templates")
    os.makedirs(templates)
    for name in os.listdir(source_dir):
        if name.endswith(".cuh") and name not in texts:
            shutil.copy(os.path.join(source_dir, name), templates)
    for name, text in texts.items():
        with open(os.path.join(templates, name), "w") as file:
            file.write(text)
    return templates


def sass_instructions(sass):
    """(address, text) of each instruction in cuobjdump -sass output."""
    code = []
    for line in sass.splitlines():
        found = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if found:
            code.append((int(found.group(1), 16), found.group(2)))
    return code


class ControlFlow:
    """Basic blocks of a SASS listing ((address, text) pairs): `blocks`
    (start, end) indices into code, `successors` and `predecessors` per
    block, `reachable` from the entry, `dominators` per block."""

    def __init__(self, code):
        self.code = code
        index = {address: i for i, (address, _) in enumerate(code)}

        def parse(text):
            predicated = text.startswith("@")
            op = text.split()[1 if predicated else 0]
            target = re.search(r"\b0x([0-9a-f]+)\b", text)
            return predicated, op, int(target.group(1), 16) if target else None

        leaders = {0}
        for i, (_, text) in enumerate(code):
            predicated, op, target = parse(text)
            if op.startswith(("BRA", "EXIT", "RET", "BRX", "JMP")):
                if i + 1 < len(code):
                    leaders.add(i + 1)
                if op.startswith("BRA") and target in index:
                    leaders.add(index[target])
        starts = sorted(leaders)
        block_of = {}
        blocks = []
        for n, start in enumerate(starts):
            end = starts[n + 1] if n + 1 < len(starts) else len(code)
            blocks.append((start, end))
            for i in range(start, end):
                block_of[i] = n
        successors = []
        for n, (start, end) in enumerate(blocks):
            predicated, op, target = parse(code[end - 1][1])
            following = [n + 1] if n + 1 < len(blocks) else []
            if op.startswith("BRA"):
                jump = [block_of[index[target]]] if target in index else []
                conditional = predicated or op != "BRA"
                successors.append(jump + (following if conditional else []))
            elif op.startswith(("EXIT", "RET", "BRX", "JMP")):
                successors.append(following if predicated else [])
            else:
                successors.append(following)
        predecessors = [[] for _ in blocks]
        for n, targets in enumerate(successors):
            for m in targets:
                predecessors[m].append(n)

        # Dominators (iterative): a back edge's target dominates its source;
        # a jump back from out-of-line code (a barrier's retry loop) is not one.
        # Blocks the entry never reaches (padding after the last EXIT) take no
        # part.
        reachable = {0}
        work = [0]
        while work:
            for m in successors[work.pop()]:
                if m not in reachable:
                    reachable.add(m)
                    work.append(m)
        dominators = [set(reachable) if n in reachable else set() for n in range(len(blocks))]
        dominators[0] = {0}
        changed = True
        while changed:
            changed = False
            for n in sorted(reachable - {0}):
                incoming = [dominators[p] for p in predecessors[n] if p in reachable]
                new = {n} | set.intersection(*incoming)
                if new != dominators[n]:
                    dominators[n] = new
                    changed = True

        self.blocks = blocks
        self.successors = successors
        self.predecessors = predecessors
        self.reachable = reachable
        self.dominators = dominators
        self._loops = None

    def texts(self, blocks):
        return [self.code[i][1] for n in blocks for i in range(*self.blocks[n])]

    def natural_loops(self):
        """(head, blocks) of each back edge's natural loop: the edge's target
        dominates its source; the loop is the blocks that reach the source
        without passing the target. Found once per listing."""
        if self._loops is None:
            self._loops = self._find_loops()
        return self._loops

    def _find_loops(self):
        loops = []
        for source, targets in enumerate(self.successors):
            for head in targets:
                if head not in self.dominators[source]:
                    continue
                loop = {head, source}
                work = [source] if source != head else []
                while work:
                    n = work.pop()
                    for p in self.predecessors[n]:
                        if p not in loop and p in self.reachable:
                            loop.add(p)
                            work.append(p)
                loops.append((head, loop))
        return loops


def is_mma(text):
    return "HMMA" in text or "HGMMA" in text


def is_counted(text):
    """Instructions counted as `other`: neither MMA nor NOP padding."""
    return not is_mma(text) and not text.startswith("NOP")


def loop_counts(code, copies=False):
    """(mma, other) instructions of the main loop: the natural loop of a
    back edge (its target dominates its source; the loop is the blocks that
    reach the source without passing the target) holding the most MMA
    instructions among those that hold no other loop with MMA instructions
    (the KV-tile loop, not the block-mask pass loop or the persistent
    CTA's query-tile loop around it), the smallest when several do.
    Blocks that the layout puts between a loop's head and its branch but
    that the loop never enters are not counted; both sides of a branch
    inside the loop are (masked and all-kept tiles, the rescale skipped or
    not). With copies=True, (mma, other, copy_other): copy_other counts
    the instructions of the largest loop nested in the main one that issues
    cp.async copies (LDGSTS; 0 when there is none), which a tile runs as
    many times as its trip count while `other` holds its body once."""
    if not code:
        return (0, 0, 0) if copies else (0, 0)
    flow = ControlFlow(code)
    loops = _loop_table(flow)
    best = main_loop(flow, loops)
    if not copies:
        return best[:2] if best else (0, 0)
    if not best:
        return (0, 0, 0)
    nested = [other for _, loop, other, copy, _ in loops if copy and loop < best[3]]
    return (best[0], best[1], max(nested, default=0))


def _loop_table(flow):
    """(head, blocks, other, copies, mma) of each natural loop; mma is 0 for
    loops without a barrier where some loop with MMA instructions has one."""
    loops = []
    for head, loop in flow.natural_loops():
        texts = flow.texts(loop)
        mma = sum(1 for t in texts if is_mma(t))
        other = sum(1 for t in texts if is_counted(t))
        # A KV-tile loop waits at a barrier every tile (BAR.SYNC in the
        # mma.sync kernels, the mbarrier waits' SYNCS in the warpgroup
        # one); the mma.sync kernels' Q K^T loop over the head dim
        # (D >= 128) holds MMA instructions but no barrier.
        barrier = any(re.search(r"\b(BAR|SYNCS)\.", t) for t in texts)
        loops.append((head, loop, other, any("LDGSTS" in t for t in texts), mma, barrier))
    # Where some loop with MMA instructions waits at a barrier, only such
    # loops are candidates.
    if any(mma and barrier for *_, mma, barrier in loops):
        return [(h, loop, other, copy, mma if barrier else 0)
                for h, loop, other, copy, mma, barrier in loops]
    return [(h, loop, other, copy, mma) for h, loop, other, copy, mma, _ in loops]


def main_loop(flow, loops=None):
    """(mma, other, head, blocks) of the main loop, or None. Of the
    candidates with MMA instructions that hold no other such loop (a
    persistent CTA's loop over query tiles, or the mma.sync kernels' pass
    loop, holds the KV-tile loop), the one with the most, then the fewest
    other instructions."""
    loops = _loop_table(flow) if loops is None else loops
    best = None
    for head, loop, other, _, mma in loops:
        if not mma or any(inner < loop and inner_mma for _, inner, _, _, inner_mma in loops):
            continue
        if best is None or mma > best[0] or (mma == best[0] and other < best[1]):
            best = (mma, other, head, loop)
    return best


def loop_paths(flow, head, loop):
    """(fewest, most) instructions other than MMA on one trip round the
    natural loop `loop` (blocks of `flow`, entered at block `head`): over
    the paths from the head to a back edge, where a loop nested inside
    counts its blocks once (one trip) and an exit from the loop ends no
    trip. None when no path returns to the head."""
    nested = sorted((inner for h, inner in flow.natural_loops() if inner < loop),
                    key=len, reverse=True)
    node = {}
    for inner in nested:  # outermost first: a block takes its outermost nest
        for n in inner:
            node.setdefault(n, min(inner))
    for n in loop:
        node.setdefault(n, n)
    weight = {}
    for n in loop:
        weight[node[n]] = weight.get(node[n], 0) + sum(1 for t in flow.texts([n]) if is_counted(t))
    edges = {x: set() for x in weight}
    latches = set()
    for n in loop:
        for m in flow.successors[n]:
            if m == head:
                latches.add(node[n])
            elif m in loop and node[m] != node[n]:
                edges[node[n]].add(node[m])
    memo = {}

    def walk(x):
        if x not in memo:
            memo[x] = None
            ends = [(0, 0)] if x in latches else []
            ends += [r for r in (walk(y) for y in edges[x]) if r]
            memo[x] = (weight[x] + min(e[0] for e in ends),
                       weight[x] + max(e[1] for e in ends)) if ends else None
        return memo[x]

    return walk(node[head])


def main_loop_paths(code):
    """(mma, fewest, most): the main loop's (loop_counts) MMA count and its
    one-trip path range (loop_paths)."""
    if not code:
        return (0, 0, 0)
    flow = ControlFlow(code)
    best = main_loop(flow)
    if best is None:
        return (0, 0, 0)
    mma, _, head, loop = best
    fewest, most = loop_paths(flow, head, loop) or (0, 0)
    return (mma, fewest, most)


def ex2_before_pv_wait(code):
    """How many ex2 (MUFU.EX2) lie, in address order, between each wait for
    a tile's S (`WARPGROUP.DEPBAR.LE gsb0, 0x1`: the previous tile's P V
    still in flight) and the next wait for everything (`... gsb0, 0x0`):
    the softmax work that can run under that P V. The smallest over the
    kernel's S waits; None when it has none (no P V kept in flight)."""
    counts = []
    open_count = None
    for _, text in code:
        if "DEPBAR.LE gsb0, 0x1" in text:
            open_count = 0
        elif "DEPBAR.LE gsb0, 0x0" in text and open_count is not None:
            counts.append(open_count)
            open_count = None
        elif open_count is not None and "MUFU.EX2" in text:
            open_count += 1
    return min(counts) if counts else None


def copy_trips(rows, threads, head_dim):
    """Trips per tile of the mma.sync kernels' K/V copy loop (KvTileCopier,
    unrolled by two): two chunks of a row per thread where the tile has
    rows enough, one before that change ($PAGEDC_COPIES_PER_ROW=1 says so
    for older templates)."""
    chunks = head_dim * 2 // 16
    per_row = 2 if rows % (2 * threads // chunks) == 0 else 1
    per_row = min(per_row, int(os.environ.get("PAGEDC_COPIES_PER_ROW", "2")))
    rows_per_thread = rows * chunks // per_row // threads
    return max(rows_per_thread // 2, 1)


def cubin_instructions(cuobjdump, cubin):
    sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True,
                          check=True).stdout
    return sass_instructions(sass)


def main_loop_counts(cuobjdump, cubin, copies=False):
    """(mma, other) static SASS instructions of the main loop of `cubin`
    (and its copy loop's, with copies=True: loop_counts)."""
    return loop_counts(cubin_instructions(cuobjdump, cubin), copies)


def compile_one(pagedc, attn, arch, head_dim, page, score, block, warp_rows):
    command = [pagedc, attn, "--mask=causal", "--emit=cubin", f"--arch={arch}",
               f"--head-dim={head_dim}", f"--page-size={page}", f"--block={block}",
               "--ptxas-report", "-o", os.path.join(os.path.dirname(attn), "kernel.cubin")]
    # --block alone means 16 rows per warp (and works with pagedc binaries
    # from before --warp-rows, for before/after figures).
    if warp_rows != 16:
        command.append(f"--warp-rows={warp_rows}")
    if score:
        command.append("--score=softcap_tanh")
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{run.stderr}")
    figures = ptxas_figures(run.stderr)
    missing = [key for key, value in figures.items() if value is None]
    if missing:
        raise RuntimeError(f"no {missing} in the ptxas report of {' '.join(command)}:\n"
                           f"{run.stderr}")
    figures["cubin"] = command[command.index("-o") + 1]
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pagedc", required=True)
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cuobjdump")
    parser.add_argument("--wgmma", action="store_true",
                        help="the warpgroup tiles on sm_90a instead of the mma.sync shapes")
    parser.add_argument("--first-design-only", action="store_true",
                        help="only 64x64 w16 (e.g. with $PAGEDC_TEMPLATE_DIR holding an "
                             "older Prefill.cuh, for before/after figures)")
    options = parser.parse_args()

    dims = [64, 128] if options.quick else [64, 128, 256]
    pages = [16] if options.quick else [1, 16, 128]
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        attn = os.path.join(directory, "shapes.attn")
        with open(attn, "w") as file:
            file.write(MODS)
        for arch in ("sm_90a",) if options.wgmma else ("sm_90", "sm_80"):
            for head_dim in dims:
                for label, block, warp_rows in WGMMA_SHAPES if options.wgmma else SHAPES:
                    if options.first_design_only and block != "64x64":
                        continue
                    if warp_rows == 32 and head_dim > 128:
                        continue
                    # (128 x 128 warpgroup tiles: Q and two K/V stages
                    # need 320 KiB at D 256.)
                    if block == "128x128" and head_dim > 128:
                        continue
                    block_m, block_n = (int(x) for x in block.split("x"))
                    if warp_rows == 64:
                        threads = (block_m // 64 + 1) * 128
                        shared = wgmma_shared_bytes(block_m, block_n, head_dim)
                    else:
                        threads = block_m // warp_rows * 32
                        shared = (block_m + 4 * block_n) * head_dim * 2 + 256
                    for page in pages:
                        for score in (False, True):
                            figures = compile_one(options.pagedc, attn, arch, head_dim, page,
                                                  score, block, warp_rows)
                            cubin = figures.pop("cubin")
                            if options.cuobjdump:
                                code = cubin_instructions(options.cuobjdump, cubin)
                                mma, other, copy = loop_counts(code, copies=True)
                                if warp_rows == 64:
                                    figures["ex2_before_pv_wait"] = ex2_before_pv_wait(code)
                                # per 64 keys and 16 query rows of one warp
                                # (a warp of a warpgroup holds 16 rows)
                                per = 64 / block_n / (1 if warp_rows == 64 else warp_rows // 16)
                                figures["loop_mma"] = mma
                                figures["loop_other"] = other
                                figures["other_per_64_keys_16_rows"] = round(other * per, 1)
                                if copy and warp_rows != 64:
                                    # The K/V copy loop nested in the tile
                                    # loop runs `trips` times per tile.
                                    trips = copy_trips(block_n, threads, head_dim)
                                    figures["copy_loop_other"] = copy
                                    figures["copy_loop_trips"] = trips
                                    figures["tile_other_per_64_keys_16_rows"] = round(
                                        (other + (trips - 1) * copy) * per, 1)
                            row = {
                                "arch": arch, "head_dim": head_dim, "page_size": page,
                                "mods": "causal + softcap" if score else "causal",
                                "shape": label, "block_m": block_m, "block_n": block_n,
                                "warp_rows": warp_rows, "threads": threads,
                                "shared_bytes": shared,
                                "ctas_per_sm": ctas_per_sm(arch, figures["registers"],
                                                           threads, shared),
                                "shared_bytes_per_tensor_flop": round(
                                    shared_bytes_per_flop(head_dim, block_n, warp_rows), 5),
                                **figures,
                            }
                            rows.append(row)
                            print(f"{arch} D{head_dim} page {page:>3} {row['mods']:<16} "
                                  f"{label:<26} regs {row['registers']:>3} spills "
                                  f"{row['spill_store_bytes']:>3}/{row['spill_load_bytes']:<3} "
                                  f"CTAs/SM {row['ctas_per_sm']} smem B/FLOP "
                                  f"{row['shared_bytes_per_tensor_flop']:.4f}"
                                  + (f" loop: {row['loop_mma']} MMA, {row['loop_other']} other,"
                                     f" {row['other_per_64_keys_16_rows']} per 64 keys x 16 rows"
                                     if "loop_mma" in row else "")
                                  + (f"; ex2 under the previous P V: "
                                     f"{row['ex2_before_pv_wait']}"
                                     if "ex2_before_pv_wait" in row else "")
                                  + (f"; copy loop {row['copy_loop_other']} x "
                                     f"{row['copy_loop_trips']}: "
                                     f"{row['tile_other_per_64_keys_16_rows']} per 64 keys x 16"
                                     " rows executed" if "copy_loop_other" in row else ""),
                                  flush=True)
    if options.json:
        with open(options.json, "w") as file:
            json.dump({"what": "prefill kernel, bf16, ptxas -v through NVRTC (pagedc "
                               "--emit=cubin --ptxas-report); static figures, no GPU ran",
                       "rows": rows}, file, indent=1)
            file.write("\n")
    if options.markdown:
        with open(options.markdown, "w") as file:
            file.write("| arch | D | shape | mods | registers (pages 1/16/128) | spill "
                       "stores B | CTAs/SM | threads | shared KiB | smem B / tensor FLOP | "
                       "loop non-MMA SASS per 64 keys x 16 rows |\n")
            file.write("|---|---|---|---|---|---|---|---|---|---|---|\n")
            groups = {}
            for row in rows:
                key = (row["arch"], row["head_dim"], row["shape"], row["mods"])
                groups.setdefault(key, []).append(row)
            for (arch, head_dim, shape, mods), group in groups.items():
                file.write(
                    f"| {arch} | {head_dim} | {shape} | {mods} | "
                    f"{' / '.join(str(r['registers']) for r in group)} | "
                    f"{' / '.join(str(r['spill_store_bytes']) for r in group)} | "
                    f"{' / '.join(str(r['ctas_per_sm']) for r in group)} | "
                    f"{group[0]['threads']} | {group[0]['shared_bytes'] / 1024:g} | "
                    f"{group[0]['shared_bytes_per_tensor_flop']:.4f} | "
                    f"{' / '.join(str(r.get('other_per_64_keys_16_rows', '-')) for r in group)}"
                    " |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
