//===- Emulator.h - CUDA kernels executed on the CPU -----------*- C++ -*-===//
//
// The SIMT emulator runs kernel images (the kernel's CUDA unit compiled by
// the host compiler, KernelAbi.h) on the CPU: every CUDA thread is a fiber,
// the blocks of a grid run on a pool of OS threads, warp collectives
// (shuffles, ballots, ldmatrix, mma.sync) meet at a warp rendezvous,
// cp.async copies land only at the issuing thread's wait_group, and the
// sm_90 instructions (mbarriers, bulk and tensor-map copies, wgmma, named
// barriers, setmaxnreg) are ordered by vector clocks. Checkers
// (memcheck, racecheck, initcheck, synccheck) report with the kernel, block,
// thread, source line and address; counters describe each launch for the
// performance model. It needs neither LLVM nor the compiler; the emulated
// CUDA driver (Driver.cpp, libpagedc-emu-cuda.so) is its one user in the
// runtime's path, tests use this interface directly.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_EMU_EMULATOR_H
#define PAGEDC_EMU_EMULATOR_H

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace pagedc::emu {

/// What the checkers look for; all on by default ($PAGEDC_EMU_CHECKS:
/// "all", "none" or a comma list of memcheck,racecheck,initcheck,synccheck;
/// Settings.h).
struct Checks {
  bool memcheck = true;
  bool racecheck = true;
  bool initcheck = true;
  bool synccheck = true;
  /// Settings::checks of the environment; all on when it does not parse
  /// (the emulated driver refuses such settings at cuInit).
  static Checks fromEnvironment();
};

/// One checker finding.
struct Report {
  /// memcheck, racecheck, initcheck, synccheck.
  std::string checker;
  std::string message;
  std::string kernel;
  unsigned block[3] = {0, 0, 0};
  unsigned thread[3] = {0, 0, 0};
  /// "Prefill.cuh:123" (or the image offset when no line is known).
  std::string location;
  uint64_t address = 0;
  /// Identical findings (checker, location, message) folded into this one.
  uint64_t count = 1;
  std::string format() const;
};

/// Per-launch counters (emulator-counted events, not hardware measurements).
struct Counters {
  /// Blocks of the grid, and blocks run (fewer when sampling).
  uint64_t gridBlocks = 0;
  uint64_t blocks = 0, threads = 0;
  /// Warp-level mma.sync m16n8k16 instructions (4096 FLOP each).
  uint64_t mma = 0;
  /// Warp-level ldmatrix .x4 instructions, their shared-memory wavefronts
  /// and the conflict-free count (4 per instruction).
  uint64_t ldmatrix = 0, ldmatrixWavefronts = 0, ldmatrixIdealWavefronts = 0;
  /// Plain shared loads and stores: bytes, warp-level requests, wavefronts
  /// and the conflict-free count.
  uint64_t sharedLoadBytes = 0, sharedStoreBytes = 0;
  uint64_t sharedRequests = 0, sharedWavefronts = 0, sharedIdealWavefronts = 0;
  /// Global loads and stores by threads (not cp.async).
  uint64_t globalLoadBytes = 0, globalStoreBytes = 0;
  /// 32-byte sectors: summed over warp-level requests, and distinct over the
  /// launch (cp.async sources included).
  uint64_t globalRequests = 0, globalSectorsRequested = 0, globalSectorsUnique = 0;
  /// cp.async: instructions, bytes read from global, bytes zero-filled.
  uint64_t cpAsync = 0, cpAsyncBytes = 0, cpAsyncZeroFillBytes = 0;
  /// sm_90: warpgroup-level wgmma.mma_async instructions and their FLOPs
  /// (2 * 64 * N * 16 each); bulk copies (cp.async.bulk) and their bytes.
  uint64_t wgmma = 0, wgmmaFlop = 0, bulkCopies = 0, bulkCopyBytes = 0;
  /// Operand bytes wgmma reads from shared memory (A when not in registers,
  /// and B).
  uint64_t wgmmaSharedBytes = 0;
  uint64_t barriers = 0, shuffles = 0, ballots = 0, atomics = 0;
  /// ex2.approx / tanh.approx calls (thread-level).
  uint64_t transcendentals = 0;
  /// Prefill kernels' warp-level KV-tile visits by path (all kept, masked
  /// per element) and 16-row groups whose output a tile rescaled
  /// (PAGEDC_EMU_TALLY_*; the issue term of bench/gpu/issue_model.py).
  uint64_t tilesKept = 0, tilesMasked = 0, rowGroupsRescaled = 0;
  void add(const Counters &other);
  /// Calls visit(name, value) for every counter, in json()'s order.
  void forEach(const std::function<void(const char *, uint64_t)> &visit) const;
  /// One JSON object of every counter (snake_case names).
  std::string json() const;
};

/// A loaded kernel image.
class Module;

/// One kernel of a module.
struct Kernel {
  std::string name;
  void (*entry)(void **params) = nullptr;
  /// The byte size of each parameter, in order.
  std::vector<unsigned long> parameterSizes;
  /// The minimum CTAs an SM of the kernel's __launch_bounds__, which the
  /// image exports as pagedc_emu_ctas_per_sm_<name>; 0 where it does not
  /// (launches then start from one CTA's registers, and the occupancy
  /// counts DeviceLimits::defaultRegisters instead of what the bounds give).
  unsigned ctasPerSm = 0;
  const Module *module = nullptr;
};

/// The result of one launch.
struct LaunchResult {
  /// False when a checker reported or the launch was aborted.
  bool ok = true;
  /// An abort that is not a checker finding (bad launch configuration, ...).
  std::string error;
  std::vector<Report> reports;
  Counters counters;
  double seconds = 0;
};

/// Device memory: host memory the checkers know about. Fresh allocations
/// are "never written" for initcheck until something writes them.
void *allocate(size_t bytes);
/// False when `pointer` is not an allocation's start.
bool release(void *pointer);
/// Host-side writes (uploads, memset, device copies) mark bytes written.
/// False when the range is not inside one allocation.
bool markWritten(const void *pointer, size_t bytes);
/// Whether [pointer, pointer + bytes) lies in one allocation.
bool isAllocated(const void *pointer, size_t bytes);

/// A tiled tensor map as cuTensorMapEncodeTiled describes it (the emulated
/// driver's encoding of the 128 opaque bytes; dimension 0 innermost).
struct TensorMap {
  unsigned rank = 0;
  /// Bytes per element (1, 2, 4 or 8).
  unsigned elementBytes = 0;
  /// 0 none, 1 32-byte, 2 64-byte, 3 128-byte swizzle
  /// (CU_TENSOR_MAP_SWIZZLE_*).
  unsigned swizzle = 0;
  uint64_t address = 0;
  uint64_t dims[5] = {0, 0, 0, 0, 0};
  /// Byte strides of dimensions 1 to rank - 1 (dimension 0 is dense).
  uint64_t strides[5] = {0, 0, 0, 0, 0};
  unsigned box[5] = {0, 0, 0, 0, 0};
};
/// Checks the arguments as the driver does and writes the 128-byte map;
/// returns an empty string or what is wrong. Interleaved layouts, element
/// strides other than 1 and NaN fill are not emulated (reported).
std::string encodeTensorMap(void *map128, const TensorMap &map);
/// Reads a map encodeTensorMap wrote; false when the bytes are not one.
bool decodeTensorMap(const void *map128, TensorMap *map);

/// Loads an image (KernelAbi.h: magic, size, shared object). Returns null
/// with `error` set when it is not a valid image.
std::shared_ptr<Module> loadModule(const void *image, std::string *error);
/// The kernel `name` of `module`, or null.
const Kernel *findKernel(const Module &module, const std::string &name);

struct LaunchConfig {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned dynamicSharedBytes = 0;
  /// Most dynamic shared memory the kernel may use (cuFuncSetAttribute).
  unsigned maxDynamicSharedBytes = 48 * 1024;
  /// > 0: run only this many blocks, spread over the grid, to count
  /// (the performance model); outputs of the other blocks are not written.
  uint64_t sampleBlocks = 0;
  /// Registers per thread at launch: setmaxnreg's starting count for every
  /// warp, and times the block's threads the CTA's register pool. 0: the
  /// most ctasPerSm CTAs of the block's size may hold on an SM (65536 /
  /// ctasPerSm / threads, rounded down to the 8-register granule, at most
  /// 255), which is what ptxas gives a kernel whose __launch_bounds__ asks
  /// for that many CTAs an SM (one: 168 at 384 threads, 255 at 256; two:
  /// 128 at 256), the kind that hands registers between warpgroups with
  /// setmaxnreg.
  unsigned launchRegisters = 0;
  /// The CTAs an SM the kernel is built for (Kernel::ctasPerSm; 0 as 1).
  unsigned ctasPerSm = 1;
};

/// The registers a thread of a `threads`-thread CTA holds at launch when
/// the kernel is built for `ctasPerSm` CTAs an SM: 65536 / ctasPerSm /
/// threads (threads rounded up to whole warps), rounded down to the
/// 8-register granule, at most 255 (LaunchConfig::launchRegisters' 0).
unsigned boundedRegisters(unsigned threads, unsigned ctasPerSm);

/// Runs `kernel` over the grid; `params` as cuLaunchKernel takes them.
LaunchResult launch(const Kernel &kernel, const LaunchConfig &config, void **params,
                    const Checks &checks);

/// The emulated device's limits (H100 SXM figures, used for planning).
struct DeviceLimits {
  int multiprocessors = 132;
  int maxSharedMemoryPerBlockOptin = 227 * 1024;
  int maxThreadsPerBlock = 1024;
  size_t memoryBytes = size_t(80) << 30;
  // Per SM, for cuOccupancyMaxActiveBlocksPerMultiprocessor (an H100's).
  int sharedMemoryPerSm = 228 * 1024;
  int reservedSharedPerCta = 1024;
  int registersPerSm = 65536;
  int threadsPerSm = 2048;
  int ctasPerSm = 32;
  /// Registers per thread of a kernel that PAGEDC_EMU_REGISTERS does not
  /// name (the emulator runs no ptxas).
  int defaultRegisters = 128;
};

} // namespace pagedc::emu

#endif // PAGEDC_EMU_EMULATOR_H
