//===- Demo.cpp - `pagedc demo`: a paged decode loop, checked -------------===//
//
// Compiles a few mods of the examples/ corpus with the CPU JIT and serves
// three sequences of different lengths from one paged KV cache: reserve and
// assign the prompts (pages handed out in a shuffled order), a prefill per
// sequence, then decode steps that append one token to every sequence. Each
// attention call goes through the runtime's flexAttention() and is compared
// with the float64 reference; the demo prints what it does and exits 1 if
// any step is off by more than 1e-4. When CUDA is usable (as for `pagedc run
// --device auto`) it runs on cuda:0 instead: mods also compiled to CUDA
// code, a bf16 cache in device memory, inputs rounded to bf16 (the
// reference reads the rounded values) and a tolerance of 1e-2.
//
//===----------------------------------------------------------------------===//

#include "Run.h"
#include "RunSupport.h"

#include "JIT/CompileSource.h"
#include "cpu/Reference.h"
#include "pagedc/Attention.h"
#include "pagedc/CudaDriver.h"
#include "pagedc/Error.h"
#include "pagedc/KernelOptions.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <fmt/format.h>

#include <cmath>
#include <random>

using namespace pagedc;
using namespace pagedc::driver;

namespace {

constexpr const char *kDemoUsage =
    "usage: pagedc demo [--examples DIR] [--steps N] [--page-size N] "
    "[--seed S] [--threads N] [--device auto|cpu|cuda|emu]\n"
    "  --device emu runs the CUDA kernels on the SIMT emulator (CPU), every\n"
    "  checker on; auto (the default) takes a usable GPU, else the CPU.\n";

/// One attention variant of the demo: mods of one corpus file.
struct Variant {
  const char *title;
  const char *file;
  const char *mask;
  const char *score;
  std::vector<ConstOverride> defines;
};

/// Settings of a demo run.
struct DemoOptions {
  std::string examples = PAGEDC_EXAMPLES_DIR;
  int steps = 5;
  int64_t pageSize = 16;
  uint64_t seed = 2024;
  int threads = 0;
  std::string device = "auto";
};

constexpr int64_t kQHeads = 8, kKVHeads = 2, kHeadDim = 64;
constexpr double kTolerance = 1e-4, kCudaTolerance = 1e-2;

/// Where the demo's attention runs.
struct DemoDevice {
  bool cuda = false; // cuda:0, bf16 (else the CPU, f32)
  /// The kernel options of every call: the $PAGEDC_* variables, mapped at
  /// the tool's edge (the runtime reads none).
  KernelOptions kernel;
  double tolerance() const { return cuda ? kCudaTolerance : kTolerance; }
};

/// `value` as the device stores it (bf16-rounded on CUDA).
float stored(const DemoDevice &device, float value) {
  return device.cuda ? bf16ToFloat(floatToBF16(value)) : value;
}

/// Uniform in [-1, 1], never exactly zero.
float randomValue(std::mt19937 &random) {
  float value = std::uniform_real_distribution<float>(-1.0f, 1.0f)(random);
  return value == 0.0f ? 0.5f : value;
}

/// The K/V history of every sequence, dense, for the reference.
struct History {
  int64_t capacity;
  std::vector<int64_t> lengths;
  HostTensor k, v; // [B, Hkv, capacity, D]

  History(int64_t batch, int64_t capacity)
      : capacity(capacity), lengths(batch, 0),
        k(DType::F32, {batch, kKVHeads, capacity, kHeadDim}),
        v(DType::F32, {batch, kKVHeads, capacity, kHeadDim}) {}

  float *row(HostTensor &t, int64_t b, int64_t h, int64_t position) {
    return t.dataAs<float>() + ((b * kKVHeads + h) * capacity + position) *
                                   kHeadDim;
  }
};

/// Appends `count` random tokens to sequence `b`: reserve (shuffled), then
/// assign into the cache and the dense history.
void appendTokens(PagedKVCache &cache, PageShuffler &shuffler, History &history,
                  int64_t b, int64_t count, std::mt19937 &random,
                  const DemoDevice &device) {
  int64_t start = history.lengths[b];
  shuffler.reserve({b}, {start + count});
  HostTensor k(DType::F32, {1, kKVHeads, count, kHeadDim});
  HostTensor v(DType::F32, {1, kKVHeads, count, kHeadDim});
  for (int64_t h = 0; h < kKVHeads; ++h)
    for (int64_t t = 0; t < count; ++t)
      for (int64_t d = 0; d < kHeadDim; ++d) {
        float kv[2] = {stored(device, randomValue(random)),
                       stored(device, randomValue(random))};
        k.dataAs<float>()[(h * count + t) * kHeadDim + d] = kv[0];
        v.dataAs<float>()[(h * count + t) * kHeadDim + d] = kv[1];
        history.row(history.k, b, h, start + t)[d] = kv[0];
        history.row(history.v, b, h, start + t)[d] = kv[1];
      }
  HostTensor batchIdx(DType::I32, {1});
  batchIdx.dataAs<int32_t>()[0] = static_cast<int32_t>(b);
  HostTensor positions(DType::I32, {1, count});
  for (int64_t t = 0; t < count; ++t)
    positions.dataAs<int32_t>()[t] = static_cast<int32_t>(start + t);
  if (device.cuda) {
    DeviceTensor kDevice = uploadTensor(fromF32(k, DType::BF16), 0);
    DeviceTensor vDevice = uploadTensor(fromF32(v, DType::BF16), 0);
    cache.assign(batchIdx.view(), positions.view(), kDevice.view,
                 vDevice.view); // synchronous: the uploads may go after
  } else {
    cache.assign(batchIdx.view(), positions.view(), k.view(), v.view());
  }
  history.lengths[b] = start + count;
}

std::string pageTableString(const PagedKVCache &cache, int64_t slot) {
  std::string text = "[";
  const std::vector<int32_t> &table = cache.pageTable(slot);
  for (size_t i = 0; i < table.size(); ++i)
    text += (i ? ", " : "") + std::to_string(table[i]);
  return text + "]";
}

/// One attention call through the runtime and its check against the
/// reference. `slots` are the sequences in the call (batch entries), each
/// with `qLength` query rows ending at its last token.
bool attendAndCheck(const std::string &label, const PagedKVCache &cache,
                    const History &history, const std::vector<int64_t> &slots,
                    int64_t qLength, const BlockMask &blockMask,
                    const CompiledMods &mods, const Bindings &bindings,
                    const ResolvedBindings &resolved, int threads,
                    std::mt19937 &random, const DemoDevice &device) {
  const int64_t batch = static_cast<int64_t>(slots.size());
  HostTensor q(DType::F32, {batch, kQHeads, qLength, kHeadDim});
  for (int64_t i = 0; i < q.numel(); ++i)
    q.dataAs<float>()[i] = stored(device, randomValue(random));
  AttentionOptions options;
  for (int64_t slot : slots) {
    options.batchIdx.push_back(static_cast<int32_t>(slot));
    options.kvLength.push_back(static_cast<int32_t>(history.lengths[slot]));
    options.qOffset.push_back(
        static_cast<int32_t>(history.lengths[slot] - qLength));
  }
  options.returnLse = true;
  options.threads = threads;
  options.kernel = device.kernel;
  AttentionResult result;
  HostTensor outF32(DType::F32, {batch, kQHeads, qLength, kHeadDim});
  HostTensor lseOut(DType::F32, {batch, kQHeads, qLength});
  if (device.cuda) {
    // q and the bound buffers uploaded, out (bf16) and lse downloaded.
    const Device gpu = Device::cuda(0);
    DeviceTensor qDevice = uploadTensor(fromF32(q, DType::BF16), 0);
    HostTensor out16(DType::BF16, outF32.shape());
    DeviceBuffer outDevice(out16.numel() * 2, 0);
    DeviceBuffer lseDevice(lseOut.numel() * sizeof(float), 0);
    outDevice.fill(0xff); // NaN: an unwritten element fails the check
    Bindings deviceBindings;
    deviceBindings.params = bindings.params;
    std::vector<DeviceTensor> buffers;
    buffers.reserve(bindings.buffers.size());
    for (const auto &[name, view] : bindings.buffers) {
      HostTensor host(view.dtype(), view.shape());
      std::copy_n(static_cast<const char *>(view.data()),
                  host.numel() * dtypeSize(view.dtype()),
                  static_cast<char *>(host.data()));
      buffers.push_back(uploadTensor(host, 0));
      deviceBindings.buffers[name] = buffers.back().view;
    }
    options.out =
        TensorView(outDevice.data(), DType::BF16, outF32.shape(), gpu);
    options.lse = TensorView(lseDevice.data(), DType::F32, lseOut.shape(), gpu);
    flexAttention(qDevice.view, cache, &blockMask, mods, deviceBindings,
                  options);
    outDevice.download(out16.data(), outDevice.size());
    lseDevice.download(lseOut.data(), lseDevice.size());
    outF32 = toF32(std::move(out16));
    result.out = outF32.view();
    result.lse = lseOut.view();
  } else {
    result = flexAttention(q.view(), cache, &blockMask, mods, bindings, options);
  }

  // The reference reads the same sequences from the dense history.
  HostTensor k(DType::F32, {batch, kKVHeads, history.capacity, kHeadDim});
  HostTensor v(DType::F32, {batch, kKVHeads, history.capacity, kHeadDim});
  int64_t perSequence = kKVHeads * history.capacity * kHeadDim;
  for (int64_t i = 0; i < batch; ++i) {
    std::copy_n(history.k.dataAs<float>() + slots[i] * perSequence,
                perSequence, k.dataAs<float>() + i * perSequence);
    std::copy_n(history.v.dataAs<float>() + slots[i] * perSequence,
                perSequence, v.dataAs<float>() + i * perSequence);
  }
  cpu::ReferenceArgs args;
  args.q = q.view();
  args.k = k.view();
  args.v = v.view();
  args.kvLength = options.kvLength.data();
  args.qOffset = options.qOffset.data();
  args.mods = &mods;
  args.context = &resolved.context();
  args.scale = 1.0 / std::sqrt(double(kHeadDim));
  cpu::ReferenceResult reference = cpu::referenceAttention(args);

  double maxError = 0, maxLseError = 0;
  bool finite = true;
  const float *out = result.out.dataAs<float>();
  for (size_t i = 0; i < reference.out.size(); ++i) {
    finite &= std::isfinite(out[i]);
    maxError = std::max(maxError, std::abs(out[i] - reference.out[i]));
  }
  const float *lse = result.lse.dataAs<float>();
  for (size_t i = 0; i < reference.lse.size(); ++i) {
    if (std::isinf(reference.lse[i]) && std::isinf(lse[i]) && lse[i] < 0)
      continue; // a fully masked row on both sides
    finite &= std::isfinite(lse[i]);
    maxLseError = std::max(maxLseError, std::abs(lse[i] - reference.lse[i]));
  }
  bool pass = finite && maxError <= device.tolerance() &&
              maxLseError <= device.tolerance();
  std::string lengths;
  for (int64_t slot : slots)
    lengths += (lengths.empty() ? "" : ", ") +
               std::to_string(history.lengths[slot]);
  llvm::outs() << fmt::format(
      "  {:<26} kv lengths [{}]  max |out - ref| {:.2e}  max |lse - ref| "
      "{:.2e}  {}\n",
      label, lengths, maxError, maxLseError, pass ? "PASS" : "FAIL");
  return pass;
}

bool runVariant(const Variant &variant, const DemoOptions &options,
                const DemoDevice &device) {
  std::string path = options.examples + "/" + variant.file;
  llvm::outs() << "\n== " << variant.title << " (" << variant.file;
  if (*variant.mask)
    llvm::outs() << ", mask " << variant.mask;
  if (*variant.score)
    llvm::outs() << ", score " << variant.score;
  for (const ConstOverride &define : variant.defines)
    llvm::outs() << ", -D " << define.name << "=" << define.value;
  llvm::outs() << ")\n";

  jit::SourceCompileOptions compileOptions;
  compileOptions.constOverrides = variant.defines;
  compileOptions.withCuda = device.cuda;
  auto compiled = jit::compileModsFromFile(path, variant.mask, variant.score,
                                           compileOptions, llvm::errs());
  if (!compiled)
    throw Error(llvm::toString(compiled.takeError()));
  const CompiledMods &mods = *compiled;
  llvm::outs() << "  compiled with the CPU JIT: "
               << (mods.maskRow ? "mask row function" : "no mask")
               << (mods.maskBlockClass ? " + block classifier" : "") << ", "
               << (mods.scoreRow ? "score row function" : "no score")
               << (device.cuda ? " (+ CUDA mod code)" : "") << "\n";

  // Bindings the mods read: ALiBi slopes and the softcap.
  std::vector<float> slopes(kQHeads);
  for (int64_t h = 0; h < kQHeads; ++h)
    slopes[h] = std::exp2(-8.0f * float(h + 1) / float(kQHeads));
  Bindings bindings;
  for (const BufferDecl &decl : mods.buffers) {
    if (decl.name != "slopes")
      throw Error("the demo has no values for buffer '" + decl.name + "'");
    bindings.buffers["slopes"] = TensorView(slopes.data(), DType::F32, {kQHeads});
  }
  for (const ParamDecl &decl : mods.params)
    if (decl.name == "softcap")
      bindings.params["softcap"] = ParamValue::ofF32(5.0f);
  ResolvedBindings resolved = resolveBindings(mods, bindings, Device::cpu());

  // Three sequences whose prompts are not multiples of the page size; each
  // crosses into a new page during the decode steps.
  const std::vector<int64_t> prompts = {29, 46, 13};
  const int64_t batch = static_cast<int64_t>(prompts.size());
  const int64_t finalLength = 46 + options.steps;
  KVCacheConfig config;
  config.pageSize = options.pageSize;
  config.heads = kKVHeads;
  config.headDim = kHeadDim;
  config.valueHeadDim = kHeadDim;
  config.maxBatch = batch + 1; // + a scratch slot that scatters pages
  config.dtype = device.cuda ? DType::BF16 : DType::F32;
  config.device = device.cuda ? Device::cuda(0) : Device::cpu();
  int64_t pages = 0;
  for (int64_t prompt : prompts)
    pages += (prompt + options.steps + options.pageSize - 1) / options.pageSize;
  config.numPages = pages * 2 + 4;
  PagedKVCache cache(config);
  PageShuffler shuffler(cache, batch, options.seed);
  std::mt19937 random(static_cast<uint32_t>(options.seed));
  History history(batch, finalLength);

  llvm::outs() << fmt::format(
      "  cache: {} pages of {} tokens, {} KV heads x {} dims, {}, on {}\n",
      config.numPages, config.pageSize, kKVHeads, kHeadDim,
      dtypeName(config.dtype), device.cuda ? "cuda:0" : "cpu");
  // Reserve every prompt's pages in one shuffled interleaving, then assign.
  std::vector<int64_t> all(batch);
  for (int64_t b = 0; b < batch; ++b)
    all[b] = b;
  shuffler.reserve(all, prompts);
  for (int64_t b = 0; b < batch; ++b)
    appendTokens(cache, shuffler, history, b, prompts[b], random, device);
  for (int64_t b = 0; b < batch; ++b)
    llvm::outs() << fmt::format(
        "  reserve + assign: sequence {} prompt of {} tokens -> pages {}\n", b,
        prompts[b], pageTableString(cache, b));

  // One block mask for the longest sequence serves every step: mods see
  // logical positions, so a mask over positions never changes. Its batch
  // extent is 1, which needs a mask that does not read b.
  if (mods.hasMask() && mods.maskDependence.b)
    throw Error("the demo's block mask assumes a mask that does not read b");
  // (The CUDA kernels read kv blocks in tiles of 64.)
  const int32_t block = device.cuda ? 64 : 16;
  BlockMask blockMask = createBlockMask(mods, resolved.context(), 1, kQHeads,
                                        finalLength, finalLength, block, block);
  llvm::outs() << fmt::format(
      "  block mask: {}x{} positions in {}x{} blocks ({} x {} extent)\n",
      finalLength, finalLength, block, block, blockMask.batch,
      blockMask.heads);

  bool pass = true;
  for (int64_t b = 0; b < batch; ++b)
    pass &= attendAndCheck(fmt::format("prefill sequence {}", b), cache,
                           history, {b}, prompts[b], blockMask, mods, bindings,
                           resolved, options.threads, random, device);
  for (int step = 1; step <= options.steps; ++step) {
    for (int64_t b = 0; b < batch; ++b)
      appendTokens(cache, shuffler, history, b, 1, random, device);
    pass &= attendAndCheck(fmt::format("decode step {} (batch {})", step, batch),
                           cache, history, all, 1, blockMask, mods, bindings,
                           resolved, options.threads, random, device);
  }
  for (int64_t b = 0; b < batch; ++b)
    llvm::outs() << fmt::format("  sequence {} now holds {} tokens in pages {}\n",
                                b, history.lengths[b],
                                pageTableString(cache, b));
  return pass;
}

DemoOptions parseDemoOptions(llvm::ArrayRef<const char *> args) {
  DemoOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    llvm::StringRef arg = args[i], name = arg, value;
    if (arg.contains('='))
      std::tie(name, value) = arg.split('=');
    else if (i + 1 < args.size())
      value = args[i + 1], ++i;
    else
      throw Error("missing value for '" + arg.str() + "'");
    int64_t number = 0;
    bool numeric = !value.getAsInteger(10, number) && number >= 0;
    if (name == "--examples")
      options.examples = value.str();
    else if (name == "--steps" && numeric && number <= 1000)
      options.steps = static_cast<int>(number);
    else if (name == "--page-size" && numeric && number >= 1 &&
             number <= 1024 && !(number & (number - 1)))
      options.pageSize = number;
    else if (name == "--seed" && numeric)
      options.seed = static_cast<uint64_t>(number);
    else if (name == "--threads" && numeric && number <= 1024)
      options.threads = static_cast<int>(number);
    else if (name == "--device" &&
             (value == "auto" || value == "cpu" || value == "cuda" || value == "emu"))
      options.device = value.str();
    else
      throw Error("bad option '" + arg.str() + "'" +
                  (value.empty() ? "" : " value '" + value.str() + "'"));
  }
  return options;
}

} // namespace

int pagedc::driver::runDemoCommand(llvm::ArrayRef<const char *> args) {
  for (llvm::StringRef arg : args)
    if (arg == "--help" || arg == "-h") {
      llvm::outs() << kDemoUsage;
      return kExitSuccess;
    }
  DemoOptions options;
  try {
    options = parseDemoOptions(args);
  } catch (const Error &error) {
    llvm::errs() << "pagedc demo: error: " << error.what() << "\n"
                 << kDemoUsage;
    return kExitUsageError;
  }
  if (!llvm::sys::fs::is_directory(options.examples)) {
    llvm::errs() << "pagedc demo: error: examples directory '"
                 << options.examples << "' not found (use --examples DIR)\n";
    return kExitInputError;
  }
  // The same rule as `pagedc run --device`.
  std::string reason = "--device cpu";
  DemoDevice device;
  if (options.device == "emu")
    selectEmulatorDriver();
  if (options.device != "cpu")
    device.cuda = cudaExecutionUsable(reason);
  if (!device.cuda && (options.device == "cuda" || options.device == "emu")) {
    llvm::errs() << "pagedc demo: error: --device " << options.device
                 << ": CUDA execution is not available: " << reason << "\n";
    return kExitInputError;
  }
  llvm::outs() << "pagedc demo: paged decoding with JIT-compiled mods, every "
                  "step checked against the float64 reference\n";
  if (device.cuda)
    llvm::outs() << fmt::format("device: cuda:0 ({}), bf16\n",
                                cudaDeviceInfo(0).name);
  else
    llvm::outs() << "device: cpu (CUDA not used: " << reason << ")\n";

  const std::vector<Variant> variants = {
      {"causal", "causal.attn", "causal", "", {}},
      {"sliding window + soft-capped ALiBi", "mods.attn", "sliding", "capped",
       {{"WINDOW", "19"}}},
      {"ALiBi", "alibi.attn", "", "alibi", {}},
  };
  bool pass = true;
  try {
    device.kernel = kernelOptionsFromEnvironment();
    for (const Variant &variant : variants)
      pass &= runVariant(variant, options, device);
  } catch (const Error &error) {
    llvm::errs() << "pagedc demo: error: " << error.what() << "\n";
    return kExitInputError;
  }
  llvm::outs() << "\n" << (pass ? "PASS" : "FAIL") << ": every step within "
               << fmt::format("{:.0e}", device.tolerance())
               << " of the float64 reference\n";
  return pass ? kExitSuccess : kExitInputError;
}
