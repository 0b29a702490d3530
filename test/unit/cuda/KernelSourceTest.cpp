//===- KernelSourceTest.cpp - Template assembly and config checks ---------===//

#include "pagedc/Error.h"
#include "pagedc/KernelSource.h"

#include <gtest/gtest.h>

using namespace pagedc;

TEST(KernelSource, EmbedsEveryTemplate) {
  auto names = embeddedTemplateNames();
  for (const char *name :
       {"Prelude.cuh", "Hooks.cuh", "KernelCommon.cuh", "Prefill.cuh",
        "Decode.cuh", "BlockMaskBuilder.cuh", "KernelArgs.h",
        "testing/causal.cuh", "testing/alibi.cuh", "testing/softcap.cuh",
        "testing/document.cuh", "testing/none.cuh"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  EXPECT_NE(embeddedTemplate("Prefill.cuh").find("pagedc_prefill"),
            std::string_view::npos);
  EXPECT_THROW(embeddedTemplate("Nope.cuh"), Error);
}

TEST(KernelSource, AssemblesInContractOrder) {
  KernelConfig config;
  config.kind = KernelKind::Decode;
  config.headDim = 64;
  config.groupSize = 4;
  std::string mods(embeddedTemplate("testing/causal.cuh"));
  KernelSource source = assembleKernel(config, mods);
  const std::string &code = source.code;
  size_t prelude = code.find("struct pagedc_bf16");
  size_t args = code.find("typedef struct PagedcAttentionKernelArgs");
  size_t modCode = code.find("return row.q >= kv;");
  size_t hooks = code.find("namespace pagedc_hooks_check");
  size_t configuration = code.find("constexpr int kHeadDim = 64;");
  size_t kernel = code.find("pagedc_decode(");
  ASSERT_NE(kernel, std::string::npos);
  EXPECT_LT(prelude, args);
  EXPECT_LT(args, modCode);
  EXPECT_LT(modCode, hooks);
  EXPECT_LT(hooks, configuration);
  EXPECT_LT(configuration, kernel);
  EXPECT_NE(code.find("constexpr int kGroupSize = 4;"), std::string::npos);
  EXPECT_EQ(source.kernelNames,
            (std::vector<std::string>{"pagedc_decode", "pagedc_decode_merge"}));
  // modFirstLine points at the mod's first line.
  int line = 1;
  size_t at = 0;
  while (line < source.modFirstLine)
    at = code.find('\n', at) + 1, ++line;
  EXPECT_EQ(code.compare(at, mods.find('\n'), mods, 0, mods.find('\n')), 0);
  EXPECT_EQ(source.modLineCount,
            static_cast<int>(std::count(mods.begin(), mods.end(), '\n')));
}

TEST(KernelSource, RejectsUnsupportedConfigs) {
  KernelConfig config;
  // Head dims and value head dims: multiples of 16 in [32, 256], and the
  // message lists them.
  for (int dim : {16, 72, 272}) {
    config = {};
    config.headDim = dim;
    try {
      assembleKernel(config, "");
      FAIL() << "head dim " << dim << " accepted";
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find("multiples of 16 from 32 to 256"),
                std::string::npos)
          << error.what();
    }
    config = {};
    config.valueHeadDim = dim;
    EXPECT_THROW(config.validate(), Error) << dim;
  }
  for (int dim : {32, 48, 80, 96, 112, 160, 192}) {
    config = {};
    config.headDim = dim;
    EXPECT_NO_THROW(assembleKernel(config, "")) << dim;
  }
  config = {};
  config.headDim = 192;
  config.valueHeadDim = 128;
  EXPECT_NE(assembleKernel(config, "").code.find("constexpr int kValueHeadDim = 128;"),
            std::string::npos);
  // The warpgroup prefill takes 64, 128 and 256 with Dv = D alone.
  config.blockM = 128;
  config.warpRows = 64;
  EXPECT_THROW(config.validate(), Error);
  config.headDim = 128;
  config.valueHeadDim = 64;
  EXPECT_THROW(config.validate(), Error);
  config.valueHeadDim = 0;
  EXPECT_NO_THROW(config.validate());
  config.headDim = 96;
  EXPECT_THROW(config.validate(), Error);
  // 32 rows per warp: both head dims up to 128.
  config = {};
  config.headDim = 96;
  config.valueHeadDim = 160;
  config.blockM = 128;
  config.blockN = 32;
  config.warpRows = 32;
  EXPECT_THROW(config.validate(), Error);
  config = {};
  config.pageSize = 24;
  try {
    assembleKernel(config, "");
    FAIL() << "page size 24 accepted";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("page size 24"), std::string::npos);
  }
  config = {};
  config.pageSize = 2048;
  EXPECT_THROW(config.validate(), Error);
  config = {};
  config.elementType = DType::F32;
  EXPECT_THROW(config.validate(), Error);
  config = {};
  config.kind = KernelKind::Decode;
  config.queryTokens = 9;
  EXPECT_THROW(config.validate(), Error);
  for (int pageSize = 1; pageSize <= 1024; pageSize *= 2) {
    config = {};
    config.pageSize = pageSize;
    EXPECT_NO_THROW(config.validate()) << pageSize;
  }
  // Warpgroup tiles whose shared memory a CTA cannot have: 128-key tiles
  // at head dim 256 (320 KiB with two stages); 128 x 64 fits there.
  config = {};
  config.headDim = 256;
  config.blockM = 128;
  config.blockN = 128;
  config.warpRows = 64;
  try {
    config.validate();
    FAIL() << "128 x 128 at head dim 256 accepted";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("128 x 128 at head dim 256 needs 328832 bytes"),
              std::string::npos)
        << error.what();
  }
  config.blockN = 64;
  EXPECT_NO_THROW(config.validate());
  config.headDim = 128;
  config.blockN = 128;
  EXPECT_NO_THROW(config.validate());
}

// Kernels for launches without a block mask: the TU says launches may not
// bind one, which compiles the kernels' block-mask paths out; the flag is
// part of the description and the comparison.
TEST(KernelSource, KernelsWithoutBlockMaskPaths) {
  std::string mods(embeddedTemplate("testing/causal.cuh"));
  for (KernelKind kind : {KernelKind::Prefill, KernelKind::Decode}) {
    KernelConfig config;
    config.kind = kind;
    if (kind == KernelKind::Prefill)
      config.choosePrefillShape();
    const std::string generic = assembleKernel(config, mods).code;
    EXPECT_NE(generic.find("constexpr bool kMayBindBlockMask = true;"), std::string::npos);
    KernelConfig unmasked = config;
    unmasked.noBlockMask = true;
    EXPECT_NE(assembleKernel(unmasked, mods).code.find("constexpr bool kMayBindBlockMask = false;"),
              std::string::npos);
    EXPECT_EQ(unmasked.describe(), config.describe() + " no-block-mask");
    EXPECT_NE(unmasked, config);
  }
}

// The split-KV decode as two units: the split kernel's with the mods, and
// a merge unit without them whose configuration every mod variant, mask
// and cache type of a shape shares. MLA decode and prefill stay whole.
TEST(KernelSource, DecodeSplitAndMergeUnits) {
  std::string mods(embeddedTemplate("testing/causal.cuh"));
  KernelConfig config;
  config.kind = KernelKind::Decode;
  config.headDim = 64;
  config.groupSize = 4;
  config.paramsSize = 0;
  ASSERT_TRUE(hasSeparateMergeUnit(config));
  KernelSource split = assembleKernel(config, mods, KernelUnit::DecodeSplit);
  EXPECT_EQ(split.kernelNames, std::vector<std::string>{"pagedc_decode"});
  EXPECT_NE(split.code.find("#define PAGEDC_UNIT_DECODE_SPLIT 1"), std::string::npos);
  EXPECT_NE(split.code.find("return row.q >= kv;"), std::string::npos);

  const KernelConfig mergeConfig = decodeMergeConfig(config);
  KernelSource merge = assembleKernel(mergeConfig, "", KernelUnit::DecodeMerge);
  EXPECT_EQ(merge.kernelNames, std::vector<std::string>{"pagedc_decode_merge"});
  EXPECT_NE(merge.code.find("#define PAGEDC_UNIT_DECODE_MERGE 1"), std::string::npos);
  EXPECT_EQ(merge.code.find("// ---- generated mod code ----"), std::string::npos);
  EXPECT_EQ(merge.code.find("// ---- Hooks.cuh ----"), std::string::npos);
  KernelConfig withParams = mergeConfig;
  withParams.paramsSize = 8; // no Params in the unit to check the size of
  EXPECT_EQ(assembleKernel(withParams, "", KernelUnit::DecodeMerge)
                .code.find("static_assert(sizeof(pagedc_mods::Params)"),
            std::string::npos);
  EXPECT_EQ(merge.code.find("// ---- Hopper.cuh ----"), std::string::npos);
  EXPECT_THROW(assembleKernel(mergeConfig, mods, KernelUnit::DecodeMerge), Error);

  // What the merge reads is kept; what varies between variants is not.
  KernelConfig other = config;
  other.paramsSize = 24;
  other.noBlockMask = true;
  other.kvFloat8 = DType::F8E4M3;
  other.groupSize = 8;
  other.pageSize = 64;
  EXPECT_EQ(decodeMergeConfig(other), mergeConfig);
  for (auto change : std::vector<void (*)(KernelConfig &)>{
           [](KernelConfig &c) { c.elementType = DType::F16; },
           [](KernelConfig &c) { c.valueHeadDim = 128; },
           [](KernelConfig &c) { c.returnLse = true; },
           [](KernelConfig &c) { c.packedBatch = true; },
       }) {
    KernelConfig changed = config;
    change(changed);
    EXPECT_NE(decodeMergeConfig(changed), mergeConfig) << changed.describe();
  }
  // A packed batch's merge indexes rows by its token count, an unpacked
  // one does not.
  KernelConfig tokens = config;
  tokens.queryTokens = 4;
  EXPECT_EQ(decodeMergeConfig(tokens), mergeConfig);
  tokens.packedBatch = true;
  KernelConfig packed = config;
  packed.packedBatch = true;
  EXPECT_NE(decodeMergeConfig(tokens), decodeMergeConfig(packed));

  KernelConfig prefill;
  EXPECT_FALSE(hasSeparateMergeUnit(prefill));
  EXPECT_THROW(assembleKernel(prefill, mods, KernelUnit::DecodeSplit), Error);
  EXPECT_THROW(decodeMergeConfig(prefill), Error);
  KernelConfig mla = config;
  mla.headDim = KernelConfig::kMlaKeyDim;
  mla.valueHeadDim = KernelConfig::kMlaValueDim;
  mla.packedBatch = true;
  mla.groupSize = 16;
  EXPECT_FALSE(hasSeparateMergeUnit(mla));
}

// BatchAttention's kernels: the flag is a constexpr of the TU (false for
// every other kernel), part of the description and the comparison, and
// refused where no packed path exists (warpgroup tiles, the mask builder).
TEST(KernelSource, PackedBatchKernels) {
  std::string mods(embeddedTemplate("testing/causal.cuh"));
  KernelConfig config;
  config.choosePrefillShape();
  EXPECT_NE(assembleKernel(config, mods).code.find("constexpr bool kPackedBatch = false;"),
            std::string::npos);
  const std::string plain = config.describe();
  KernelConfig packed = config;
  packed.packedBatch = true;
  EXPECT_NE(assembleKernel(packed, mods).code.find("constexpr bool kPackedBatch = true;"),
            std::string::npos);
  EXPECT_EQ(packed.describe(), plain + " packed");
  EXPECT_NE(packed, config);
  packed.kind = KernelKind::Decode;
  packed.blockM = 64;
  packed.warpRows = 16;
  packed.blockN = 64;
  EXPECT_NO_THROW(packed.validate());
  packed.kind = KernelKind::BlockMaskBuilder;
  EXPECT_THROW(packed.validate(), Error);
  packed.kind = KernelKind::Prefill;
  packed.warpRows = 64;
  packed.blockM = 128;
  EXPECT_THROW(packed.validate(), Error);
}

// Kernels of 8-bit float caches: kKvFloat8 is 1 (e4m3) or 2 (e5m2), 0 for
// every other kernel; the type is part of the description (16-bit kernels
// keep theirs) and the comparison, and refused where no 8-bit path exists
// (packed batches, warpgroup tiles, the mask builder, a 16-bit type).
TEST(KernelSource, Float8Kernels) {
  std::string mods(embeddedTemplate("testing/causal.cuh"));
  KernelConfig config;
  config.kind = KernelKind::Decode;
  const std::string plain = config.describe();
  EXPECT_NE(assembleKernel(config, mods).code.find("constexpr int kKvFloat8 = 0;"),
            std::string::npos);
  KernelConfig e4m3 = config, e5m2 = config;
  e4m3.kvFloat8 = DType::F8E4M3;
  e5m2.kvFloat8 = DType::F8E5M2;
  EXPECT_NE(assembleKernel(e4m3, mods).code.find("constexpr int kKvFloat8 = 1;"),
            std::string::npos);
  EXPECT_NE(assembleKernel(e5m2, mods).code.find("constexpr int kKvFloat8 = 2;"),
            std::string::npos);
  EXPECT_EQ(e4m3.describe(), plain + " kv f8e4m3");
  EXPECT_NE(e4m3, config);
  EXPECT_NE(e4m3, e5m2);
  KernelConfig prefill = e4m3;
  prefill.kind = KernelKind::Prefill;
  prefill.groupSize = 1;
  prefill.choosePrefillShape();
  EXPECT_NE(assembleKernel(prefill, mods).code.find("pagedc_prefill("), std::string::npos);
  auto refusal = [](const KernelConfig &refused) {
    try {
      refused.validate();
    } catch (const Error &error) {
      return std::string(error.what());
    }
    return std::string("(accepted)");
  };
  // Packed batches (BatchAttention) read them through the same tiles.
  KernelConfig packed = e4m3;
  packed.packedBatch = true;
  packed.queryTokens = 8;
  EXPECT_EQ(refusal(packed), "(accepted)");
  EXPECT_EQ(packed.describe().substr(packed.describe().size() - 17), " packed kv f8e4m3");
  // An f32 out: packed batches only.
  KernelConfig f32Out = packed;
  f32Out.outputF32 = true;
  EXPECT_EQ(refusal(f32Out), "(accepted)");
  EXPECT_EQ(f32Out.describe(), packed.describe() + " out f32");
  EXPECT_NE(f32Out, packed);
  EXPECT_NE(assembleKernel(f32Out, mods).code.find("constexpr bool kOutputF32 = true;"),
            std::string::npos);
  EXPECT_NE(assembleKernel(packed, mods).code.find("constexpr bool kOutputF32 = false;"),
            std::string::npos);
  f32Out.packedBatch = false;
  EXPECT_EQ(refusal(f32Out), "only packed batches (BatchAttention's kernels) write an f32 out");
  // The warpgroup prefill reads them too (its producer converts the codes),
  // with the template's Float8 units.
  KernelConfig warpgroup = prefill;
  warpgroup.warpRows = 64;
  warpgroup.blockM = 128;
  EXPECT_EQ(refusal(warpgroup), "(accepted)");
  const std::string warpgroupCode = assembleKernel(warpgroup, mods).code;
  EXPECT_NE(warpgroupCode.find("PAGEDC_DEVICE void store_code_chunk("), std::string::npos);
  EXPECT_NE(warpgroupCode.find("constexpr int kKvFloat8 = "), std::string::npos);
  KernelConfig builder = e5m2;
  builder.kind = KernelKind::BlockMaskBuilder;
  EXPECT_NE(refusal(builder).find("not by the block-mask builder"), std::string::npos);
  KernelConfig sixteen = config;
  sixteen.kvFloat8 = DType::BF16;
  EXPECT_NE(refusal(sixteen).find("are f8e4m3 or f8e5m2, not bf16"), std::string::npos);
}

TEST(KernelSource, DecodeRowsFitOneCta) {
  KernelConfig config;
  config.kind = KernelKind::Decode;
  for (int group : {1, 3, 4, 6, 7, 8, 12, 16, 32, 64})
    for (int tokens : {1, 2, 4, 8}) {
      config.groupSize = group;
      config.queryTokens = tokens;
      int heads = config.decodeHeadsPerCta();
      EXPECT_GE(heads, 1);
      EXPECT_LE(heads, group);
      EXPECT_LE(heads * tokens, 64) << group << "x" << tokens;
    }
}

TEST(ParamsLayout, FollowsCLayoutRules) {
  std::vector<ParamDecl> params(3);
  params[0].name = "flag";
  params[0].type = ScalarKind::Bool;
  params[1].name = "window";
  params[1].type = ScalarKind::I32;
  params[2].name = "cap";
  params[2].type = ScalarKind::F32;
  std::vector<BufferDecl> buffers(1);
  buffers[0].name = "slopes";
  buffers[0].dims.resize(2);
  ParamsLayout layout = ParamsLayout::forDeclarations(params, buffers);
  ASSERT_EQ(layout.fields.size(), 6u);
  EXPECT_EQ(layout.fields[0].offset, 0);  // bool flag
  EXPECT_EQ(layout.fields[1].offset, 4);  // int32 window, aligned to 4
  EXPECT_EQ(layout.fields[2].offset, 8);  // float cap
  EXPECT_EQ(layout.fields[3].offset, 16); // pointer, aligned to 8
  EXPECT_EQ(layout.fields[4].offset, 24); // int64 strides[2]
  EXPECT_EQ(layout.fields[5].offset, 40); // int64 sizes[2]
  EXPECT_EQ(layout.size, 56);
  EXPECT_EQ(ParamsLayout::forDeclarations({}, {}).size, 1); // empty struct

  float slopesData[4] = {};
  PagedcBufferRef ref{slopesData, {3, 2, 0, 0}, {2, 1, 0, 0}};
  PagedcParamSlot slots[3];
  slots[0].i32 = 1;
  slots[1].i32 = 4096;
  slots[2].f32 = 30.0f;
  PagedcModContext context{&ref, slots};
  auto bytes = layout.pack(params, buffers, context);
  ASSERT_EQ(bytes.size(), 56u);
  EXPECT_EQ(bytes[0], 1);
  int32_t window;
  std::memcpy(&window, bytes.data() + 4, 4);
  EXPECT_EQ(window, 4096);
  float cap;
  std::memcpy(&cap, bytes.data() + 8, 4);
  EXPECT_EQ(cap, 30.0f);
  const void *pointer;
  std::memcpy(&pointer, bytes.data() + 16, 8);
  EXPECT_EQ(pointer, slopesData);
  int64_t strides[2];
  std::memcpy(strides, bytes.data() + 24, 16);
  EXPECT_EQ(strides[0], 2);
  EXPECT_EQ(strides[1], 1);
  int64_t sizes[2];
  std::memcpy(sizes, bytes.data() + 40, 16);
  EXPECT_EQ(sizes[0], 3);
  EXPECT_EQ(sizes[1], 2);
}
