#!/usr/bin/env python3
"""Checks the bytes the decode kernel read with cp.async and bulk tensor
copies (emulator counters, PAGEDC_EMU_COUNTERS; the emulator's code copies
whole tiles of 16-row pages by tensor maps) against what a decode step must
read: every CTA's query rows, and the K and V rows of the kept kv positions
only.

  decode_bytes.py COUNTERS.jsonl --batch B --heads-q HQ --heads-kv HKV
                  --tokens LQ --head-dim D --kept N

Each split loads the query rows of its (batch, KV head), so the Q bytes are
splits x B x HQ x LQ x D x 2; K and V are B x HKV x N x D x 2 each. Prints
both and exits 1 unless the counter equals their sum exactly; then how each
merge launch was made.
"""
import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("counters")
    for name in ("batch", "heads-q", "heads-kv", "tokens", "head-dim", "kept"):
        parser.add_argument("--" + name, type=int, required=True)
    args = parser.parse_args()
    launches = [json.loads(line) for line in open(args.counters) if line.strip()]
    decode = [l for l in launches if l["kernel"] == "pagedc_decode"]
    if len(decode) != 1:
        sys.exit("expected one pagedc_decode launch, found %d" % len(decode))
    splits = decode[0]["grid"][0]
    gathered = decode[0]["counters"]["cp_async_bytes"]
    bulk = decode[0]["counters"].get("bulk_copy_bytes", 0)
    read = gathered + bulk
    q_bytes = splits * args.batch * args.heads_q * args.tokens * args.head_dim * 2
    kv_bytes = 2 * args.batch * args.heads_kv * args.kept * args.head_dim * 2
    print("copied by: cp.async %d bytes, bulk tensor copies %d bytes" % (gathered, bulk))
    print("decode read %d bytes: %d splits; q %d + kept K/V %d = %d: %s"
          % (read, splits, q_bytes, kv_bytes, q_bytes + kv_bytes,
             "exact" if read == q_bytes + kv_bytes else "DIFFER"))
    # The merge of a split decode launches as a programmatic dependent of
    # the split kernel (cuLaunchKernelEx; the emulated device is sm_90).
    merges = [l for l in launches if l["kernel"] == "pagedc_decode_merge"]
    for merge in merges:
        print("merge launch: %s" % ("programmatic dependent"
                                     if merge.get("programmatic_dependent") else "plain"))
    return 0 if read == q_bytes + kv_bytes else 1


if __name__ == "__main__":
    sys.exit(main())
