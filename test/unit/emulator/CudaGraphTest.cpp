//===- CudaGraphTest.cpp - Stream capture and graphs on the emulator ------===//
//
// The emulated driver (PAGEDC_CUDA_DRIVER=emu) through the runtime's
// CudaGraph wrapper: work put on a capturing stream is recorded, not run; a
// graph launch runs it in order and reads device memory as it is then, so
// inputs uploaded between launches change each launch's output; and every
// call that capture forbids fails with CUDA's error code, says which call it
// was, and invalidates the capture so that ending it fails.
//
//===----------------------------------------------------------------------===//

#include "cuda/CudaGraph.h"
#include "pagedc/CudaDriver.h"
#include "pagedc/EmulatorBuild.h"
#include "pagedc/Error.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace pagedc;

// CUresult values of cuda.h.
constexpr cu::Result kSuccess = 0;
constexpr cu::Result kCaptureUnsupported = 900; // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
constexpr cu::Result kCaptureInvalidated = 901; // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
constexpr cu::Result kCaptureImplicit = 906;    // CUDA_ERROR_STREAM_CAPTURE_IMPLICIT

/// Two kernels whose order matters: mirror reads what other blocks of
/// scale_add wrote.
constexpr const char *kKernels = R"(
extern "C" __global__ void scale_add(const float *a, const float *b, float *out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = 2.0f * a[i] + b[i];
}
extern "C" __global__ void mirror(const float *in, float *out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = in[i] - in[n - 1 - i];
}
PAGEDC_EMU_ENTRY(scale_add)
PAGEDC_EMU_ENTRY(mirror)
)";

constexpr int kCount = 300; // not a multiple of the block
constexpr unsigned kBlock = 128;
constexpr unsigned kGrid = (kCount + kBlock - 1) / kBlock;
constexpr size_t kBytes = kCount * sizeof(float);

class CudaGraphs : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    ::setenv("PAGEDC_CUDA_DRIVER", "emu", 1);
    std::string reason;
    ASSERT_TRUE(CudaDriver::available(&reason)) << reason;
    const CudaDriver &driver = CudaDriver::get();
    ASSERT_TRUE(driver.emulated());
    ASSERT_TRUE(cudaGraphsAvailable(driver));
    CompileResult compiled =
        compileEmulatorUnit(emulatorPrologue() + kKernels, "the graph test kernels");
    image_ = new std::string(compiled.image);
    module_ = new CudaModule(driver, *image_);
    scaleAdd_ = module_->function("scale_add");
    mirror_ = module_->function("mirror");
  }
  static void TearDownTestSuite() {
    delete module_;
    module_ = nullptr;
    delete image_;
    image_ = nullptr;
  }

  void SetUp() override {
    for (cu::DevicePointer *pointer : {&a_, &b_, &sum_, &copy_, &out_}) {
      ASSERT_EQ(api().memAlloc(pointer, kBytes), kSuccess);
      ASSERT_EQ(api().memsetD8(*pointer, 0, kBytes), kSuccess);
    }
    ASSERT_EQ(api().streamCreate(&stream_, 0), kSuccess);
  }
  void TearDown() override {
    api().streamDestroy(stream_);
    for (cu::DevicePointer pointer : {a_, b_, sum_, copy_, out_})
      api().memFree(pointer);
  }

  static const CudaDriver::Api &api() { return CudaDriver::get().api(); }

  cu::Result launchScaleAdd(cu::Stream stream) {
    int n = kCount;
    void *params[] = {&a_, &b_, &sum_, &n};
    return api().launchKernel(scaleAdd_, kGrid, 1, 1, kBlock, 1, 1, 0, stream, params, nullptr);
  }
  cu::Result launchMirror(cu::Stream stream) {
    int n = kCount;
    void *params[] = {&sum_, &out_, &n};
    return api().launchKernel(mirror_, kGrid, 1, 1, kBlock, 1, 1, 0, stream, params, nullptr);
  }

  std::vector<float> download(cu::DevicePointer pointer) {
    std::vector<float> values(kCount);
    EXPECT_EQ(api().memcpyDtoH(values.data(), pointer, kBytes), kSuccess);
    return values;
  }

  static std::string *image_;
  static CudaModule *module_;
  static cu::Function scaleAdd_, mirror_;
  cu::DevicePointer a_ = 0, b_ = 0, sum_ = 0, copy_ = 0, out_ = 0;
  cu::Stream stream_ = nullptr;
};
std::string *CudaGraphs::image_ = nullptr;
CudaModule *CudaGraphs::module_ = nullptr;
cu::Function CudaGraphs::scaleAdd_ = nullptr;
cu::Function CudaGraphs::mirror_ = nullptr;

TEST_F(CudaGraphs, ReplaysReadTheBuffersAsTheyAreAtEachLaunch) {
  const CudaDriver &driver = CudaDriver::get();
  // Inputs whose sums are not zero, so that work run at capture would show.
  std::vector<float> ramp(kCount);
  for (int i = 0; i < kCount; ++i)
    ramp[i] = static_cast<float>(i);
  ASSERT_EQ(api().memcpyHtoD(a_, ramp.data(), kBytes), kSuccess);
  ASSERT_EQ(api().memcpyHtoD(b_, ramp.data(), kBytes), kSuccess);
  CudaStreamCapture capture(driver, stream_);
  EXPECT_EQ(streamCaptureStatus(driver, stream_), cu::kStreamCaptureStatusActive);
  ASSERT_EQ(launchScaleAdd(stream_), kSuccess);
  ASSERT_EQ(api().memcpyDtoDAsync(copy_, sum_, kBytes, stream_), kSuccess);
  ASSERT_EQ(launchMirror(stream_), kSuccess);
  CudaGraphExec graph = capture.end();
  EXPECT_EQ(streamCaptureStatus(driver, stream_), cu::kStreamCaptureStatusNone);
  // Recorded, not run: the outputs are still the memset's zeros.
  for (float value : download(out_))
    ASSERT_EQ(value, 0.0f);
  for (float value : download(copy_))
    ASSERT_EQ(value, 0.0f);

  std::mt19937 random(20);
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  for (int replay = 0; replay < 10; ++replay) {
    std::vector<float> a(kCount), b(kCount);
    for (int i = 0; i < kCount; ++i) {
      a[i] = uniform(random);
      b[i] = uniform(random);
    }
    ASSERT_EQ(api().memcpyHtoD(a_, a.data(), kBytes), kSuccess);
    ASSERT_EQ(api().memcpyHtoD(b_, b.data(), kBytes), kSuccess);
    graph.launch(stream_);
    ASSERT_EQ(api().streamSynchronize(stream_), kSuccess);
    std::vector<float> sum(kCount);
    for (int i = 0; i < kCount; ++i)
      sum[i] = 2.0f * a[i] + b[i];
    const std::vector<float> copied = download(copy_), out = download(out_);
    for (int i = 0; i < kCount; ++i) {
      ASSERT_FLOAT_EQ(copied[i], sum[i]) << "replay " << replay << ", element " << i;
      ASSERT_FLOAT_EQ(out[i], sum[i] - sum[kCount - 1 - i])
          << "replay " << replay << ", element " << i;
    }
  }
}

class CapturedViolations : public CudaGraphs {
protected:
  /// Captures a launch, makes the violation, and checks the code, the
  /// message, the invalidated capture and the stream afterwards.
  void check(const char *call, cu::Result code, const std::function<cu::Result()> &violate,
             int mode = cu::kStreamCaptureModeGlobal) {
    SCOPED_TRACE(call);
    const CudaDriver &driver = CudaDriver::get();
    {
      CudaStreamCapture capture(driver, stream_, mode);
      ASSERT_EQ(launchScaleAdd(stream_), kSuccess);
      ::testing::internal::CaptureStderr();
      const cu::Result result = violate();
      const std::string printed = ::testing::internal::GetCapturedStderr();
      EXPECT_EQ(result, code);
      EXPECT_NE(printed.find(call), std::string::npos) << printed;
      EXPECT_NE(printed.find("capturing"), std::string::npos) << printed;
      EXPECT_NE(printed.find("the capture is invalidated"), std::string::npos) << printed;
      const char *description = nullptr;
      api().getErrorString(result, &description);
      ASSERT_NE(description, nullptr);
      EXPECT_NE(std::string(description).find(call), std::string::npos) << description;
      EXPECT_EQ(streamCaptureStatus(driver, stream_), cu::kStreamCaptureStatusInvalidated);
      // Later work on the stream is refused too, until the capture ends.
      EXPECT_EQ(launchScaleAdd(stream_), kCaptureInvalidated);
      ::testing::internal::CaptureStderr();
      try {
        capture.end();
        ADD_FAILURE() << "the capture ended with a graph";
      } catch (const Error &error) {
        const std::string what = error.what();
        EXPECT_NE(what.find("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"), std::string::npos) << what;
        EXPECT_NE(what.find(std::string("invalidated by ") + call), std::string::npos) << what;
      }
      ::testing::internal::GetCapturedStderr();
    }
    // The stream runs work again.
    EXPECT_EQ(streamCaptureStatus(driver, stream_), cu::kStreamCaptureStatusNone);
    EXPECT_EQ(launchScaleAdd(stream_), kSuccess);
    EXPECT_EQ(api().streamSynchronize(stream_), kSuccess);
  }
};

TEST_F(CapturedViolations, UploadsAndSynchronizationAreReported) {
  std::vector<float> host(kCount, 1.0f);
  check("cuMemcpyHtoD", kCaptureUnsupported,
        [&] { return api().memcpyHtoD(a_, host.data(), kBytes); });
  check("cuMemcpyHtoDAsync", kCaptureUnsupported,
        [&] { return api().memcpyHtoDAsync(a_, host.data(), kBytes, stream_); });
  check("cuMemcpyDtoH", kCaptureUnsupported,
        [&] { return api().memcpyDtoH(host.data(), a_, kBytes); });
  check("cuStreamSynchronize", kCaptureUnsupported,
        [&] { return api().streamSynchronize(stream_); });
  check("cuCtxSynchronize", kCaptureUnsupported, [&] { return api().ctxSynchronize(); });
  // The legacy stream waits for the capturing (blocking) stream.
  check("cuLaunchKernel", kCaptureImplicit, [&] { return launchScaleAdd(nullptr); });
}

TEST_F(CapturedViolations, AllocationAndModuleLoadingAreReported) {
  cu::DevicePointer extra = 0;
  check("cuMemAlloc", kCaptureUnsupported, [&] { return api().memAlloc(&extra, 256); });
  check("cuMemFree", kCaptureUnsupported, [&] { return api().memFree(copy_); });
  cu::Module loaded = nullptr;
  check("cuModuleLoadData", kCaptureUnsupported,
        [&] { return api().moduleLoadData(&loaded, image_->data()); });
  ASSERT_EQ(api().moduleLoadData(&loaded, image_->data()), kSuccess);
  cu::Function function = nullptr;
  check("cuModuleGetFunction", kCaptureUnsupported,
        [&] { return api().moduleGetFunction(&function, loaded, "mirror"); });
  EXPECT_EQ(api().moduleGetFunction(&function, loaded, "mirror"), kSuccess);
  EXPECT_EQ(api().moduleUnload(loaded), kSuccess);
}

TEST_F(CudaGraphs, RelaxedCaptureAllowsAllocation) {
  const CudaDriver &driver = CudaDriver::get();
  cu::DevicePointer extra = 0;
  CudaGraphExec graph = captureGraph(
      driver, stream_,
      [&] {
        ASSERT_EQ(api().memAlloc(&extra, 256), kSuccess);
        ASSERT_EQ(launchScaleAdd(stream_), kSuccess);
      },
      cu::kStreamCaptureModeRelaxed);
  EXPECT_TRUE(graph);
  EXPECT_EQ(api().memFree(extra), kSuccess);
  graph.launch(stream_);
}

TEST_F(CudaGraphs, TheLegacyStreamCannotCapture) {
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(CudaStreamCapture(CudaDriver::get(), nullptr), Error);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("legacy stream"), std::string::npos);
}

} // namespace
