#!/usr/bin/env python3
"""Checks the emulator's KV-tile tallies of the one prefill launch in a
counters file (PAGEDC_EMU_COUNTERS): the block's thread count (which kernel
ran), the warp visits on the all-kept and masked paths exactly, and the
rescaled 16-row groups within a range.

  tile_tallies.py COUNTERS.jsonl --threads N --kept K --masked M --rescaled LO,HI

Prints the counters and "tallies as expected", or what differs and exits 1.
"""
import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("counters")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--kept", type=int, required=True)
    parser.add_argument("--masked", type=int, required=True)
    parser.add_argument("--rescaled", required=True)
    args = parser.parse_args()
    low, high = (int(x) for x in args.rescaled.split(","))
    launches = [json.loads(line) for line in open(args.counters) if line.strip()]
    prefill = [l for l in launches if l["kernel"] == "pagedc_prefill"]
    if len(prefill) != 1:
        sys.exit("expected one pagedc_prefill launch, found %d" % len(prefill))
    launch = prefill[0]
    counters = launch["counters"]
    kept, masked = counters["tiles_kept"], counters["tiles_masked"]
    rescaled = counters["row_groups_rescaled"]
    print("block %d threads, %d kept and %d masked warp visits, %d row groups rescaled" %
          (launch["block"][0], kept, masked, rescaled))
    problems = []
    if launch["block"][0] != args.threads:
        problems.append("block of %d threads, expected %d" % (launch["block"][0], args.threads))
    if counters["blocks"] != counters["grid_blocks"]:
        problems.append("sampled: %d of %d blocks ran" % (counters["blocks"],
                                                          counters["grid_blocks"]))
    if kept != args.kept:
        problems.append("kept %d, expected %d" % (kept, args.kept))
    if masked != args.masked:
        problems.append("masked %d, expected %d" % (masked, args.masked))
    if not low <= rescaled <= high:
        problems.append("rescaled %d, expected %d-%d" % (rescaled, low, high))
    if problems:
        sys.exit("; ".join(problems))
    print("tallies as expected")


if __name__ == "__main__":
    main()
