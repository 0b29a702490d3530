// The host time of launching on this machine's GPU, for comparing with
// pagedc's run() (bench/serving): an empty kernel launched with <<<>>>, the
// same with cudaLaunchKernelEx and a programmatic-dependent-launch
// attribute (as pagedc's merge kernels), and one cudaGraphLaunch of a graph
// of two empty kernels (what replaying a captured decode step costs).
// Medians of 2,000 calls; the stream is drained every 32 calls, outside the
// timed calls. Build and run on the GPU machine:
//   nvcc -O2 -arch=sm_90 bench/gpu/launch_floor.cu -o launch_floor && ./launch_floor
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

__global__ void empty_kernel(int *unused) {
  if (unused && threadIdx.x == 1024)
    *unused = 0;
}

static double median_us(cudaStream_t stream, const std::function<void()> &call) {
  std::vector<double> times;
  for (int i = 0; i < 2000; ++i) {
    auto start = std::chrono::steady_clock::now();
    call();
    times.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
    if ((i + 1) % 32 == 0)
      cudaStreamSynchronize(stream);
  }
  cudaStreamSynchronize(stream);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int main() {
  cudaStream_t stream;
  if (cudaStreamCreate(&stream) != cudaSuccess) {
    std::printf("no CUDA device\n");
    return 1;
  }
  empty_kernel<<<1, 32, 0, stream>>>(nullptr);
  cudaStreamSynchronize(stream);
  const double plain = median_us(stream, [&] { empty_kernel<<<132, 128, 0, stream>>>(nullptr); });

  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(132);
  config.blockDim = dim3(128);
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int *null_pointer = nullptr;
  const double ex = median_us(stream, [&] { cudaLaunchKernelEx(&config, empty_kernel, null_pointer); });

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
  empty_kernel<<<132, 128, 0, stream>>>(nullptr);
  empty_kernel<<<132, 128, 0, stream>>>(nullptr);
  cudaStreamEndCapture(stream, &graph);
  cudaGraphInstantiate(&exec, graph, 0);
  const double replay = median_us(stream, [&] { cudaGraphLaunch(exec, stream); });

  std::printf("empty kernel, <<<>>>:                         %.2f us (median of 2000)\n", plain);
  std::printf("empty kernel, cudaLaunchKernelEx + PDL attr:  %.2f us\n", ex);
  std::printf("graph of two empty kernels, cudaGraphLaunch:  %.2f us\n", replay);
  std::printf("errors: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
