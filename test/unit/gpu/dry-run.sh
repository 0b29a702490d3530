#!/usr/bin/env bash
# gpu.dry-run: the GPU check as far as it goes without a GPU.
#   dry-run.sh SOURCE_DIR BUILD_DIR WORK_DIR
# Prepares a small pack with this build's tools (the real gpu-prepare.sh),
# then runs the real gpu-check.sh --dry-run, which configures and builds the
# runtime-only tree (as on the GPU machine, fmt from the pack) and plans every
# case and benchmark. Fails unless every case variant is planned.
set -euo pipefail
source_dir=$1 build_dir=$2 work=$3
mkdir -p "$work"
export PAGEDC_CACHE_DIR="$build_dir/kernel-cache"
PAGEDC_GPU_BUILD="$build_dir" PAGEDC_GPU_SKIP_BUILD=1 \
  bash "$source_dir/scripts/gpu-prepare.sh" --quick "$work/pack"
rm -rf "$work/out" "$work/pack-z"
# A pack as scripts/gpu-prepare-ab.sh leaves it: cases linked, bundles in
# bundles.tar.gz (gpu-check.sh unpacks them).
mkdir -p "$work/pack-z"
cp "$work/pack/pack.json" "$work/pack-z/"
cp -r "$work/pack/bench" "$work/pack-z/" 2>/dev/null || true
ln -s ../pack/cases "$work/pack-z/cases"
ln -s ../pack/deps "$work/pack-z/deps"
tar -czf "$work/pack-z/bundles.tar.gz" -C "$work/pack" bundles
OUT="$work/out" PAGEDC_GPU_RT_BUILD="$work/build-rt" PAGEDC_GPU_RT_BUILD_TYPE=None \
  PAGEDC_FORCE_PACK_FMT=1 PAGEDC_JOBS=2 \
  bash "$source_dir/scripts/gpu-check.sh" --dry-run --prefill-options --decode-options \
  --also "$work/pack" \
  --also "$work/pack" --also-with "PAGEDC_PREFILL_PERSISTENT=1" "$work/pack-z" "$work/pack"
test -d "$work/pack-z/bundles" || { echo "gpu.dry-run: bundles.tar.gz was not unpacked"; exit 1; }
python3 - "$work/pack/pack.json" "$work/out/gpu-check.json" "$work/out/gpu-bench-pagedc.json" \
  "$work/out/also-gpu-check.json" "$work/out" <<'PY'
import json, os, sys
pack = json.load(open(sys.argv[1]))
check = json.load(open(sys.argv[2]))
bench = json.load(open(sys.argv[3]))
# Two --also packs: files also-* and also2-*.
for also_file in (sys.argv[4], os.path.join(sys.argv[5], "also2-gpu-check.json")):
    also = json.load(open(also_file))
    assert [c["status"] for c in also["cases"]] == [c["status"] for c in check["cases"]], also_file
# --also-with: the third pack's checks planned under its settings (persistent
# CTAs, 3 of them for the checks), the first two's without.
def persistent_launches(path):
    return [launch for case in json.load(open(path))["cases"] for launch in case["launches"]
            if "persistent (" in launch]
also3 = persistent_launches(os.path.join(sys.argv[5], "also3-gpu-check.json"))
assert also3 and all(l.startswith("pagedc_prefill grid (") for l in also3), also3
assert any(l.startswith("pagedc_prefill grid (3, 1, 1)") for l in also3), also3
assert not persistent_launches(sys.argv[4]), "--also took --also-with's settings"
# --prefill-options: each launch option's prefill cases planned.
prefill = [c["status"] for c in check["cases"] if c["name"].find("prefill") >= 0]
for label in ("gather", "pingpong", "page-boxes", "persistent", "per-tile"):
    option = json.load(open(os.path.join(sys.argv[5], label + "-gpu-check.json")))
    assert [c["status"] for c in option["cases"]] == prefill and prefill, label
# "persistent": the benchmark's warpgroup prefills planned with one CTA per
# SM of the 132 the dry run assumes, each then taking several query tiles.
persistent = [launch for config in json.load(open(os.path.join(
    sys.argv[5], "persistent-gpu-bench-pagedc.json")))["configurations"]
    for launch in config["launches"] if launch.startswith("pagedc_prefill grid")]
assert persistent and all(l.startswith("pagedc_prefill grid (132, 1, 1)") and
                          l.endswith("persistent (132 CTAs)") for l in persistent), persistent
# Its checks take 3 CTAs (PAGEDC_PREFILL_PERSISTENT_CTAS=3, for the checks
# only), so that the pack's small cases run several query tiles per CTA.
checked = [launch for case in json.load(open(os.path.join(
    sys.argv[5], "persistent-gpu-check.json")))["cases"]
    for launch in case["launches"] if "persistent (" in launch]
assert checked and all(l.startswith(("pagedc_prefill grid (3, 1, 1)",
                                     "pagedc_prefill grid (2, 1, 1)",
                                     "pagedc_prefill grid (1, 1, 1)")) for l in checked), checked
assert any(l.startswith("pagedc_prefill grid (3, 1, 1)") for l in checked), checked
# --decode-options: the decode cases planned with the gather, and with twice
# the splits; the benchmark's decodes (long enough to split) planned with
# twice the CTAs of their default plans.
decode = [c["status"] for c in check["cases"] if c["name"].find("decode") >= 0]
for label in ("decode-gather", "decode-page-boxes", "decode-splits2", "decode-merge1"):
    option = json.load(open(os.path.join(sys.argv[5], label + "-gpu-check.json")))
    assert [c["status"] for c in option["cases"]] == decode and decode, label

def decode_ctas(configurations):
    ctas = {}
    for config in configurations:
        for launch in config["launches"]:
            if launch.startswith("pagedc_decode grid"):
                x, y, z = launch.split("(")[1].split(")")[0].split(", ")
                ctas[config["name"]] = int(x) * int(y) * int(z)
    return ctas
default = decode_ctas(bench["configurations"])
doubled = decode_ctas(json.load(open(os.path.join(
    sys.argv[5], "decode-splits2-gpu-bench-pagedc.json")))["configurations"])
assert default and set(doubled) == set(default), ("decode-splits2 plans", default, doubled)
assert all(doubled[k] == 2 * default[k] for k in default), ("decode-splits2", default, doubled)
# decode-merge1: the same split launches, and one merge CTA a query row
# (grid x = q_len) where the default divides some rows' columns.
def merge_grids(configurations):
    return {config["name"]: launch.split("(")[1].split(")")[0]
            for config in configurations for launch in config["launches"]
            if launch.startswith("pagedc_decode_merge grid")}
merge1_configs = json.load(open(os.path.join(
    sys.argv[5], "decode-merge1-gpu-bench-pagedc.json")))["configurations"]
assert decode_ctas(merge1_configs) == default, "decode-merge1 changed the split launches"
merged, merged1 = merge_grids(bench["configurations"]), merge_grids(merge1_configs)
assert merged and set(merged1) == set(merged), ("decode-merge1 merges", merged, merged1)
assert all(g.split(", ")[0] == "1" for g in merged1.values()), merged1
assert any(g.split(", ")[0] != "1" for g in merged.values()), merged
variants = sum(2 if c["q_block"] else 1 for c in pack["cases"])
statuses = [c["status"] for c in check["cases"]]
assert check["dry_run"] is True
assert len(statuses) == variants, (len(statuses), variants)
assert all(s == "planned" for s in statuses), statuses
assert any(c["name"].startswith("cli-") for c in pack["cases"]), "no case for the CLI bundle"
for case in check["cases"]:
    kernels = " ".join(case["launches"])
    assert ("pagedc_prefill" in kernels) != ("pagedc_decode " in kernels), case
    if case["variant"] == "block-mask":
        assert "pagedc_build_block_mask" in kernels, case
configs = bench["configurations"]
assert len(configs) == len(pack["bench"]) and all(c["status"] == "planned" for c in configs)
print("gpu.dry-run: %d case variants and %d benchmark configurations planned" %
      (len(statuses), len(configs)))
PY
# The pack names the commit it was prepared from, and the check's summary
# carries it (every result of a GPU run says what it ran).
commit=$(cat "$work/pack/commit.txt")
[[ $commit =~ ^([0-9a-f]{40}(-modified)?|unknown)$ ]] ||
  { echo "gpu.dry-run: commit.txt holds '$commit'"; exit 1; }
grep -q "commit=$commit " "$work/out/summary.txt" ||
  { echo "gpu.dry-run: the summary does not name commit $commit"; exit 1; }
# The baselines planned on every benchmark row (no torch here): each row has
# each baseline, planned or unsupported with its reason; cuDNN SDPA only
# where the row has no score and at most a causal mask.
python3 - "$work/pack/pack.json" "$work/out/gpu-bench-baselines.json" "$commit" <<'PY'
import json, sys
pack, planned = (json.load(open(p)) for p in sys.argv[1:3])
assert planned["dry_run"] and planned["commit"] == sys.argv[3], planned["commit"]
rows = {r["name"]: r["baselines"] for r in planned["configurations"]}
assert sorted(rows) == sorted(b["name"] for b in pack["bench"]), "rows differ from the pack"
for bench in pack["bench"]:
    entries = rows[bench["name"]]
    assert sorted(entries) == sorted(planned["baselines"]) and len(entries) == 4, entries
    for name, entry in entries.items():
        assert entry["status"] in ("planned", "unsupported"), (bench["name"], name, entry)
        assert entry["status"] == "planned" or entry["message"], (bench["name"], name)
    cudnn = not bench["score"] and bench["mask"] in ("", "causal")
    assert (entries["sdpa_cudnn"]["status"] == "planned") == cudnn, bench["name"]
print("gpu.dry-run: baselines planned on %d rows" % len(rows))
PY
# --rows: the benchmarks (pagedc's, each --also pack's, each launch option's
# and the baselines') plan only the rows it names, the checks every case; a
# launch option whose kind --rows does not name is not benchmarked.
first_prefill=$(python3 -c 'import json, sys
print(next(b["name"] for b in json.load(open(sys.argv[1]))["bench"] if b["kind"] == "prefill"))' \
  "$work/pack/pack.json")
rm -rf "$work/out-rows"
OUT="$work/out-rows" PAGEDC_GPU_RT_BUILD="$work/build-rt" PAGEDC_GPU_RT_BUILD_TYPE=None \
  PAGEDC_FORCE_PACK_FMT=1 PAGEDC_JOBS=2 \
  bash "$source_dir/scripts/gpu-check.sh" --dry-run --prefill-options --decode-options \
  --rows "$first_prefill,no-such-row" --also "$work/pack" "$work/pack" >/dev/null
python3 - "$work/out" "$work/out-rows" "$first_prefill" <<'PY'
import json, os, sys
full, rows, wanted = sys.argv[1:4]
def names(path):
    return [c["name"] for c in json.load(open(path))["configurations"]]
assert names(os.path.join(rows, "gpu-bench-pagedc.json")) == [wanted]
assert names(os.path.join(rows, "persistent-gpu-bench-pagedc.json")) == [wanted]
assert names(os.path.join(rows, "gpu-bench-baselines.json")) == [wanted]
assert not os.path.exists(os.path.join(rows, "decode-splits2-gpu-bench-pagedc.json"))
for check in ("gpu-check.json", "also-gpu-check.json", "decode-splits2-gpu-check.json"):
    assert (len(json.load(open(os.path.join(rows, check)))["cases"]) ==
            len(json.load(open(os.path.join(full, check)))["cases"])), check
print("gpu.dry-run: --rows benchmarked %s alone; the checks ran every case" % wanted)
PY
if bash "$source_dir/scripts/gpu-check.sh" --dry-run --rows "a b" "$work/pack" 2>/dev/null; then
  echo "gpu.dry-run: --rows took a text with a space"; exit 1
fi
