#!/usr/bin/env bash
# The performance model end to end on a quick pack built for the emulator:
# bench/gpu/model.py runs each configuration on the emulator (sampled),
# reads ptxas's report for sm_90 and sm_80, and writes a JSON labelled
# MODELLED with a time and a figure per device for every configuration.
#   emulator-model.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
source=$1
build=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
export PAGEDC_CACHE_DIR=${PAGEDC_CACHE_DIR:-$build/test/emu-kernel-cache}
"$build/bin/pagedc-gpu-prepare" -o "$work/pack" --arch emu --quick >/dev/null
python3 "$source/bench/gpu/model.py" "$build" "$work/pack" -o "$work/model.json"
python3 - "$work/model.json" <<'PY'
import json, sys
document = json.load(open(sys.argv[1]))
assert document["label"].startswith("MODELLED, not measured"), document["label"]
rows = document["configurations"]
assert len(rows) >= 6, len(rows)
for row in rows:
    for device in ("H100", "A100"):
        entry = row["devices"][device]
        assert entry["modelled_us"] > 0, (row["name"], device, entry)
        figure = entry.get("modelled_bandwidth_fraction", entry.get("modelled_tflops"))
        assert figure and figure > 0, (row["name"], device, entry)
        for kernel, figures in entry["ptxas"].items():
            assert figures["registers"] > 0, (row["name"], kernel, figures)
print("emulator model: %d configurations modelled for H100 and A100" % len(rows))
PY
