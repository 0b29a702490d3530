#!/usr/bin/env bash
# gpu.pagedc-gpu-model: `pagedc-gpu model` end to end on a quick pack built for
# the SIMT emulator with ptxas figures for sm_90 and sm_80: every benchmark
# configuration is run (sampled) on the emulator and MODELLED for H100 and
# A100; the table and the JSON must say so and carry the documented fields
# (docs/emulator.md, "The performance model").
#   pagedc-gpu-model.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
export PAGEDC_CACHE_DIR=${PAGEDC_CACHE_DIR:-$build/test/emu-kernel-cache}
"$build/bin/pagedc-gpu-prepare" -o "$work/pack" --arch emu --quick \
    --ptxas-arch sm_90,sm_80 >/dev/null
# Few sampled blocks: the test checks the tool's fields and its two paths'
# agreement, not the figures, and the emulated blocks are its cost.
"$build/bin/pagedc-gpu" model "$work/pack" --json "$work/model.json" \
    --decode-sample-blocks 8 --prefill-sample-blocks 16 | tee "$work/model.txt"
grep -q "^MODELLED, not measured" "$work/model.txt"
# A pack for a real architecture is refused (exit 2, saying why).
sed 's/"arch": "emu"/"arch": "sm_90"/' "$work/pack/pack.json" > "$work/pack.sm90.json"
mkdir -p "$work/sm90" && cp "$work/pack.sm90.json" "$work/sm90/pack.json"
set +e
"$build/bin/pagedc-gpu" model "$work/sm90" > "$work/refused.txt" 2>&1
status=$?
set -e
[ "$status" = 2 ] && grep -q "built with --arch emu" "$work/refused.txt"
python3 - "$work/model.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["label"].startswith("MODELLED, not measured"), doc["label"]
assert doc["modelled"] is True and doc["measured"] is False
assert doc["tool"] == "pagedc-gpu model"
for name in ("H100", "A100"):
    device = doc["devices"][name]
    for field in ("arch", "peak_tflops", "mma_sync_fraction", "hbm_bytes_per_s",
                  "l2_bytes_per_s", "clock_hz", "sms", "shared_per_sm", "note"):
        assert field in device, (name, field)
rows = doc["configurations"]
assert len(rows) == 6, len(rows)
kinds = {row["kind"] for row in rows}
assert kinds == {"decode", "prefill"}, kinds
for row in rows:
    assert row["status"] == "modelled", row
    assert row["must_move_bytes"] > 0 and row["unmasked_flops"] > 0
    assert row["launches"] and all("counters" in l for l in row["launches"])
    for name in ("H100", "A100"):
        entry = row["devices"][name]
        assert entry["modelled_us"] > 0, (row["name"], name)
        assert entry["bound"] in ("tensor", "shared", "dram", "l2", "mufu"), entry["bound"]
        for kernel, figures in entry["ptxas"].items():
            assert figures["known"] and figures["registers"] > 0, (row["name"], kernel)
        for launch in entry["launches"]:
            for field in ("ctas_per_sm", "occupancy_limit", "waves", "wave_efficiency",
                          "terms_us", "modelled_us", "bound"):
                assert field in launch, (row["name"], field)
            assert launch["ctas_per_sm"] >= 1
            assert set(launch["terms_us"]) == {"tensor", "shared", "dram", "l2", "mufu"}
        if row["kind"] == "decode":
            assert 0 < entry["modelled_bandwidth_fraction"] <= 1.0, entry
            assert entry["global_bytes_over_must_move"] >= 0.99, entry
        else:
            assert 0 < entry["modelled_tflops"], entry
            assert entry["modelled_fraction_of_peak"] <= 1.0, entry
print("pagedc-gpu model: %d configurations MODELLED for H100 and A100" % len(rows))
PY

# One model: the pack run's counter lines, with their ptxas registers and
# must-move bytes, through `model --launches` give every launch's figures
# and the calls' times again, on both devices.
python3 - "$work/model.json" "$work/launches" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for device in ("H100", "A100"):
    with open("%s-%s.jsonl" % (sys.argv[2], device), "w") as f:
        for row in doc["configurations"]:
            entry = row["devices"][device]
            for line in row["launches"]:
                f.write(json.dumps(dict(line, must_move_bytes=row["must_move_bytes"],
                                        registers=entry["ptxas"][line["kernel"]]["registers"]))
                        + "\n")
PY
for device in H100 A100; do
  "$build/bin/pagedc-gpu" model --launches "$work/launches-$device.jsonl" --device $device \
      --json "$work/launches-$device.json" > "$work/launches-$device.txt"
  grep -q "^MODELLED, not measured" "$work/launches-$device.txt"
done
python3 - "$work/model.json" "$work/launches" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for device in ("H100", "A100"):
    again = json.load(open("%s-%s.json" % (sys.argv[2], device)))
    assert again["modelled"] is True and again["device"] == device, again
    pack = [l for row in doc["configurations"] for l in row["devices"][device]["launches"]]
    assert len(pack) == len(again["launches"]) > 0, (len(pack), len(again["launches"]))
    for a, b in zip(pack, again["launches"]):
        for field in ("kernel", "ctas_per_sm", "wave_efficiency", "bound", "terms_us",
                      "dram_bytes", "programmatic_dependent", "modelled_us"):
            assert a[field] == b[field], (device, a["kernel"], field, a[field], b[field])
    # The calls without the block-mask builders (each call rounded to 1 ns).
    calls = sum(row["devices"][device]["modelled_us"] for row in doc["configurations"])
    assert abs(again["modelled_us"] - calls) < 0.01, (device, again["modelled_us"], calls)
print("pagedc-gpu model --launches: the pack's %d launches MODELLED alike" % len(pack))
PY
# --explain prints the formulas with the model's constants.
"$build/bin/pagedc-gpu" model --explain --json "$work/explain.json" > "$work/explain.txt"
grep -q "tensor = mma \* 4096 FLOP" "$work/explain.txt"
grep -q "issue = warp_instructions / (SMs \* 4 schedulers \* clock) / e" "$work/explain.txt"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['devices']['H100']['sms'] == 132" \
    "$work/explain.json"

# `pagedc-gpu bench` on the emulated driver, its decode configuration cut to
# one sequence of 512 keys: both timings run (call by call, and queued after
# an L2 flush) and reach the JSON; --no-queued leaves the second out.
mkdir -p "$work/small"
cp -r "$work/pack/." "$work/small/"
python3 - "$work/small/pack.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
bench = [b for b in doc["bench"] if b["kind"] == "decode"][:1]
bench[0].update(batch=1, kv_len=512)
doc["bench"] = bench
json.dump(doc, open(sys.argv[1], "w"))
PY
PAGEDC_CUDA_DRIVER=emu "$build/bin/pagedc-gpu" bench "$work/small" --iters 3 --warmup 1 \
    --flush-mib 1 --copy-mib 1 --json "$work/bench.json" > "$work/bench.txt"
grep -q "queued ms" "$work/bench.txt"
PAGEDC_CUDA_DRIVER=emu "$build/bin/pagedc-gpu" bench "$work/small" --iters 1 --warmup 0 \
    --copy-mib 1 --no-queued --json "$work/bench-sync.json" > /dev/null
python3 - "$work/bench.json" "$work/bench-sync.json" <<'PY'
import json, sys
both, synchronized = (json.load(open(p))["configurations"] for p in sys.argv[1:])
assert len(both) == 1 and both[0]["status"] == "ok", both
assert both[0]["median_ms"] > 0 and both[0]["queued_median_ms"] > 0, both
# Each timing's spread: the fastest and slowest of its calls.
for t in ("", "queued_"):
    c = both[0]
    assert 0 < c[t + "min_ms"] <= c[t + "median_ms"] <= c[t + "max_ms"], (t, c)
assert synchronized[0]["status"] == "ok" and "queued_median_ms" not in synchronized[0]
print("pagedc-gpu bench on the emulator: both timings")
PY

# --bench-head-dim: the benchmark plan at head dim 64 (the cases keep
# theirs); a value the kernels lack is refused, naming it.
"$build/bin/pagedc-gpu-prepare" -o "$work/pack64" --arch emu --quick --bench-head-dim 64 >/dev/null
python3 - "$work/pack64/pack.json" <<'PY'
import json, sys
bench = json.load(open(sys.argv[1]))["bench"]
assert bench and all(b["head_dim"] == 64 for b in bench), [b["head_dim"] for b in bench]
print("pagedc-gpu-prepare --bench-head-dim 64: %d configurations at head dim 64" % len(bench))
PY
set +e
"$build/bin/pagedc-gpu-prepare" -o "$work/pack96" --quick --bench-head-dim 96 > "$work/bad.txt" 2>&1
status=$?
set -e
[ "$status" = 1 ] && grep -q "bench-head-dim: '96' is not 64, 128 or 256" "$work/bad.txt"
