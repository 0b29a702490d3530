#!/usr/bin/env python3
"""How evenly persistent prefill CTAs share the query tiles (MODELLED).

  persistent_schedule.py --pack PACK [--ctas 132] [--batch 4] [--heads 32]
                         [--block 128] [--overhead 0,1,2] [--json OUT]

For the prefill shapes of the GPU benchmark (causal, sliding_1k, document;
S 1k, 4k, 16k; the document ids of PACK/bench/document_id_S.npy, which
pagedc-gpu-prepare writes), this gives each query tile a cost in KV blocks
visited (a block of the 128 x 128 block mask is visited whole when any of
its elements is kept, the kernel's visit rule; a query tile is one block
row, as with the 128-row tiles) plus `overhead` blocks per
tile, numbers the tiles as the kernel does (prefill_tile: query head
fastest, then batch, then query tiles from the last) and hands them to
the CTAs two ways:

  snake    fixed rounds (prefill_round_tile): tile r*G + g in even rounds
           and r*G + G - 1 - g in odd ones;
  counter  the work counter (next_counted_tile): the CTA's own tile first,
           then the next tile in order to whichever CTA is free first;
  ahead    the same counter taken a round ahead, as the kernel's producer
           takes it: a CTA takes its next tile when it
           starts a tile (at launch, besides its own), not when it is free.

It prints each way's efficiency: the total cost / (G x the busiest CTA's
cost), 1.0 when every CTA finishes at once. Nothing here is a measurement:
it assumes a tile's time is proportional to its blocks and ignores memory
and the tensor cores' sharing between CTAs.
"""
import argparse
import heapq
import json
import os
import struct
import sys


def read_int32_npy(path):
    """The values of a 1-D little-endian int32 .npy file."""
    with open(path, "rb") as f:
        if f.read(6) != b"\x93NUMPY":
            raise ValueError("%s: not a .npy file" % path)
        major = f.read(2)[0]
        size = struct.unpack("<H" if major == 1 else "<I", f.read(2 if major == 1 else 4))[0]
        header = f.read(size).decode("latin1")
        if "'<i4'" not in header:
            raise ValueError("%s: not int32 (%s)" % (path, header.strip()))
        data = f.read()
    return list(struct.unpack("<%di" % (len(data) // 4), data))


def block_visits(mask, length, block, documents):
    """Per query block: the KV blocks with any kept element (documents are
    runs of equal, non-decreasing ids, as the pack writes them)."""
    blocks = (length + block - 1) // block
    visits = []
    for qb in range(blocks):
        q_first = qb * block
        count = 0
        for kb in range(qb + 1):  # causal: nothing past the diagonal block
            k_last = min((kb + 1) * block, length) - 1
            if kb == qb or mask == "causal":
                hit = True
            elif mask == "sliding_1k":
                hit = q_first - k_last < 1024
            elif mask == "document":
                # Keys all before the rows: a shared document is the last
                # key's and the first row's.
                hit = documents[k_last] == documents[q_first]
            else:
                raise ValueError("unknown mask " + mask)
            count += hit
        visits.append(count)
    return visits


def tile_costs(visits, batch, heads, overhead):
    """Costs in the kernel's tile order: head fastest, then batch, then the
    query tiles (one block row each) from the last."""
    order = []
    for count in reversed(visits):
        order.extend([count + overhead] * (batch * heads))
    return order


def snake(costs, ctas):
    load = [0.0] * ctas
    for index, cost in enumerate(costs):
        r, g = divmod(index, ctas)
        load[g if r % 2 == 0 else ctas - 1 - g] += cost
    return max(load)


def counter(costs, ctas):
    # Each CTA's first tile is its own; then the next tile goes to the CTA
    # that is free first (ties: the lower index, as good as any).
    free = [(costs[g], g) for g in range(min(ctas, len(costs)))]
    heapq.heapify(free)
    for cost in costs[ctas:]:
        at, g = heapq.heappop(free)
        heapq.heappush(free, (at + cost, g))
    return max(at for at, _ in free)


def counter_ahead(costs, ctas):
    # Each CTA holds one tile taken ahead: it takes the next when it starts
    # one (all at time 0 in CTA order, then in the order the starts come).
    count = len(costs)
    taken = min(ctas, count)

    def take():
        nonlocal taken
        if taken >= count:
            return None
        taken += 1
        return taken - 1

    starts = [(costs[g], g, take()) for g in range(min(ctas, count))]
    heapq.heapify(starts)
    finish = 0.0
    while starts:
        at, g, reserved = heapq.heappop(starts)
        if reserved is None:
            finish = max(finish, at)
            continue
        heapq.heappush(starts, (at + costs[reserved], g, take()))
    return finish


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pack", required=True, help="a pack from pagedc-gpu-prepare")
    parser.add_argument("--ctas", type=int, default=132)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--block", type=int, default=128,
                        help="query tile rows = mask block size (128)")
    parser.add_argument("--overhead", default="0,1,2",
                        help="extra blocks' worth of time per tile, comma-separated")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows = []
    print("persistent CTAs' share of the query tiles (MODELLED): efficiency = total / "
          "(CTAs x busiest CTA)")
    print("%-11s %6s %8s %6s %6s %6s %8s %8s" % ("mask", "S", "overhead", "snake", "counter",
                                                  "ahead", "counter/snake", "ahead/counter"))
    for mask in ("causal", "sliding_1k", "document"):
        for length in (1024, 4096, 16384):
            documents = None
            if mask == "document":
                path = os.path.join(args.pack, "bench", "document_id_%d.npy" % length)
                documents = read_int32_npy(path)
            visits = block_visits(mask, length, args.block, documents)
            for overhead in [float(x) for x in args.overhead.split(",")]:
                costs = tile_costs(visits, args.batch, args.heads, overhead)
                total = sum(costs)
                ideal = total / args.ctas
                s, c = snake(costs, args.ctas), counter(costs, args.ctas)
                a = counter_ahead(costs, args.ctas)
                row = dict(mask=mask, S=length, overhead=overhead, tiles=len(costs),
                           snake_efficiency=ideal / s, counter_efficiency=ideal / c,
                           ahead_efficiency=ideal / a, counter_over_snake=s / c,
                           ahead_over_counter=c / a)
                rows.append(row)
                print("%-11s %6d %8g %6.3f %6.3f %6.3f %8.3f %8.3f" %
                      (mask, length, overhead, ideal / s, ideal / c, ideal / a, s / c, c / a))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(modelled=True, ctas=args.ctas, batch=args.batch, heads=args.heads,
                           block=args.block, rows=rows), f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
