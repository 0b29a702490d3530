//===- BindingsTest.cpp - resolveBindings checks and layout ---------------===//
#include "pagedc/Mods.h"

#include "TestUtil.h"

using namespace pagedc;
using namespace pagedc::test;

namespace {

BufferDim fixed(int64_t size) {
  BufferDim dim;
  dim.kind = BufferDim::Fixed;
  dim.size = size;
  return dim;
}
BufferDim named(const std::string &name) {
  BufferDim dim;
  dim.kind = BufferDim::Named;
  dim.name = name;
  return dim;
}
BufferDim any() { return BufferDim(); }

/// A program declaring `bias: f32[H, S]`, `doc: i32[S]`, `table: u8[4, ?]`
/// and params `window: i32 = 128`, `cap: f32`, `causal: bool`.
CompiledMods makeMods() {
  CompiledMods mods;
  mods.maskName = "m";
  mods.buffers = {{"bias", DType::F32, {named("H"), named("S")}},
                  {"doc", DType::I32, {named("S")}},
                  {"table", DType::U8, {fixed(4), any()}}};
  ParamDecl window{"window", ScalarKind::I32, ParamValue::ofI32(128)};
  ParamDecl cap{"cap", ScalarKind::F32, std::nullopt};
  ParamDecl causal{"causal", ScalarKind::Bool, std::nullopt};
  mods.params = {window, cap, causal};
  return mods;
}

struct BindingsTest : ::testing::Test {
  BindingsTest() : bias(6 * 10), doc(10), table(4 * 7) {
    bindings.buffers["bias"] = TensorView(bias.data(), DType::F32, {6, 10});
    bindings.buffers["doc"] = TensorView(doc.data(), DType::I32, {10});
    bindings.buffers["table"] = TensorView(table.data(), DType::U8, {4, 7});
    bindings.params["cap"] = ParamValue::ofF32(30.0f);
    bindings.params["causal"] = ParamValue::ofBool(true);
  }
  std::vector<float> bias;
  std::vector<int32_t> doc;
  std::vector<uint8_t> table;
  CompiledMods mods = makeMods();
  Bindings bindings;
};

} // namespace

TEST_F(BindingsTest, LaysOutBuffersAndParamsInDeclarationOrder) {
  ResolvedBindings resolved = resolveBindings(mods, bindings, Device::cpu());
  const PagedcModContext &context = resolved.context();
  EXPECT_EQ(context.buffers[0].data, bias.data());
  EXPECT_EQ(context.buffers[0].sizes[0], 6);
  EXPECT_EQ(context.buffers[0].sizes[1], 10);
  EXPECT_EQ(context.buffers[0].strides[0], 10);
  EXPECT_EQ(context.buffers[0].strides[1], 1);
  EXPECT_EQ(context.buffers[1].data, doc.data());
  EXPECT_EQ(context.buffers[2].data, table.data());
  EXPECT_EQ(context.buffers[2].sizes[1], 7);
  EXPECT_EQ(context.params[0].i32, 128); // the default
  EXPECT_EQ(context.params[1].f32, 30.0f);
  EXPECT_EQ(context.params[2].i32, 1);

  // Copies keep their own context pointing at their own storage.
  ResolvedBindings copy = resolved;
  EXPECT_NE(copy.context().buffers, resolved.context().buffers);
  EXPECT_EQ(copy.context().buffers[1].data, doc.data());
  EXPECT_EQ(copy.context().params[1].f32, 30.0f);
}

TEST_F(BindingsTest, StridedBuffersKeepTheirStrides) {
  bindings.buffers["bias"] = TensorView(bias.data(), DType::F32, {6, 10}, {1, 6}, Device::cpu());
  ResolvedBindings resolved = resolveBindings(mods, bindings, Device::cpu());
  EXPECT_EQ(resolved.context().buffers[0].strides[0], 1);
  EXPECT_EQ(resolved.context().buffers[0].strides[1], 6);
}

TEST_F(BindingsTest, OverridesADefault) {
  bindings.params["window"] = ParamValue::ofI32(7);
  EXPECT_EQ(resolveBindings(mods, bindings, Device::cpu()).context().params[0].i32, 7);
}

TEST_F(BindingsTest, EachProblemIsNamed) {
  auto resolve = [&] { resolveBindings(mods, bindings, Device::cpu()); };
  {
    Bindings saved = bindings;
    bindings.buffers.erase("doc");
    EXPECT_PAGEDC_ERROR(resolve(), "missing binding for buffer 'doc' (declared i32[S])");
    bindings = saved;
  }
  {
    Bindings saved = bindings;
    bindings.buffers["docs"] = bindings.buffers["doc"];
    EXPECT_PAGEDC_ERROR(resolve(), "unknown buffer 'docs' in the bindings (the program "
                                   "declares: bias, doc, table)");
    bindings = saved;
  }
  {
    Bindings saved = bindings;
    bindings.buffers["doc"] = TensorView(doc.data(), DType::I64, {5});
    EXPECT_PAGEDC_ERROR(resolve(), "buffer 'doc' is declared i32 but the bound tensor is i64");
    bindings = saved;
  }
  {
    Bindings saved = bindings;
    bindings.buffers["doc"] = TensorView(doc.data(), DType::I32, {2, 5});
    EXPECT_PAGEDC_ERROR(resolve(), "buffer 'doc' is declared i32[S] (rank 1) but the bound "
                                   "tensor has shape [2, 5] (rank 2)");
    bindings = saved;
  }
  {
    Bindings saved = bindings;
    bindings.buffers["table"] = TensorView(table.data(), DType::U8, {7, 4});
    EXPECT_PAGEDC_ERROR(resolve(), "buffer 'table' dimension 0 must be 4 but the bound tensor "
                                   "has shape [7, 4]");
    bindings = saved;
  }
  {
    Bindings saved = bindings;
    bindings.buffers["doc"] = TensorView(doc.data(), DType::I32, {9});
    EXPECT_PAGEDC_ERROR(resolve(), "size 'S' is 10 in buffer 'bias' dimension 1 but 9 in "
                                   "buffer 'doc' dimension 0");
    bindings = saved;
  }
  {
    Bindings saved = bindings;
    bindings.buffers["doc"] = TensorView(doc.data(), DType::I32, {10}, Device::cuda(0));
    EXPECT_PAGEDC_ERROR(resolve(), "buffer 'doc' is on cuda:0 but the call runs on cpu");
    bindings = saved;
  }
  {
    Bindings saved = bindings;
    bindings.params.erase("cap");
    EXPECT_PAGEDC_ERROR(resolve(), "missing value for param 'cap' (f32, no default)");
    bindings = saved;
  }
  {
    Bindings saved = bindings;
    bindings.params["causal"] = ParamValue::ofI32(1);
    EXPECT_PAGEDC_ERROR(resolve(),
                        "param 'causal' is declared bool but was given a value of type i32");
    bindings = saved;
  }
  {
    Bindings saved = bindings;
    bindings.params["windw"] = ParamValue::ofI32(1);
    EXPECT_PAGEDC_ERROR(resolve(), "unknown param 'windw' in the bindings (the program "
                                   "declares: window, cap, causal)");
    bindings = saved;
  }
  EXPECT_NO_THROW(resolve());
}

TEST(Bindings, NoDeclarationsGiveAnEmptyContext) {
  CompiledMods mods;
  ResolvedBindings resolved = resolveBindings(mods, Bindings(), Device::cpu());
  EXPECT_EQ(resolved.context().buffers, nullptr);
  EXPECT_EQ(resolved.context().params, nullptr);
  Bindings extra;
  extra.params["x"] = ParamValue::ofF32(1.0f);
  EXPECT_PAGEDC_ERROR(resolveBindings(mods, extra, Device::cpu()),
                      "unknown param 'x' in the bindings (the program declares: none)");
}
