//===- Emulator.cpp - CUDA kernels executed on the CPU --------------------===//
//
// Execution model (docs/emulator.md has the long form):
//  - a launch hands its blocks to a pool of OS threads; a block runs on one
//    of them, each CUDA thread on its own fiber;
//  - a fiber runs until it blocks: at __syncthreads, or at a warp collective
//    until all lanes the collective needs have arrived; the last arrival
//    computes the collective (the fragment mappings of the PTX ISA) and
//    carries on; a pass over the block in which no fiber could run is a
//    deadlock;
//  - cp.async copies are queued per thread and land at its wait_group, so
//    a missing or short wait reads data that is not there yet;
//  - loads and stores come in through the compiler's instrumentation and are
//    checked against the block's shared window, the registered device
//    allocations and the fiber's own stack; an access outside all of them,
//    or misaligned, ends the launch as a GPU fault would.
//
// This file is the public interface (pagedc-emu/Emulator.h): launches and
// tensor maps. The rest lives along its seams: Memory.cpp (device memory,
// memory checks), Modules.cpp (kernel images), Scheduling.cpp (blocks on
// fibers, worker pool), Reports.cpp (findings, request counters),
// Settings.cpp (the PAGEDC_EMU_* variables), RuntimeTable.cpp and Hopper.cpp
// (the operations the kernels call), sharing EmulatorInternal.h.
//
//===----------------------------------------------------------------------===//

#include "EmulatorInternal.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace pagedc::emu {

using namespace detail;

namespace {

/// Numbers launches, so that racecheck tells this launch's writes from
/// earlier ones (Launch::serial).
std::atomic<uint32_t> launchSerial{0};

constexpr uint64_t kTensorMapMagic = 0x50414d5443444750ull; // "PGDCTMAP"

} // namespace

std::string encodeTensorMap(void *map128, const TensorMap &map) {
  if (map.rank < 1 || map.rank > 5)
    return "tensorRank " + std::to_string(map.rank) + " (1 to 5)";
  if (map.elementBytes != 1 && map.elementBytes != 2 && map.elementBytes != 4 &&
      map.elementBytes != 8)
    return "element size " + std::to_string(map.elementBytes) + " bytes";
  if (map.address % 16 != 0)
    return "globalAddress " + hex(map.address) + " is not 16-byte aligned";
  if (map.swizzle > 3)
    return "swizzle " + std::to_string(map.swizzle) + " (0 to 3)";
  for (unsigned d = 0; d < map.rank; ++d) {
    if (map.dims[d] == 0 || map.dims[d] > (uint64_t(1) << 32))
      return "globalDim[" + std::to_string(d) + "] = " + std::to_string(map.dims[d]) +
             " (1 to 2^32)";
    if (map.box[d] == 0 || map.box[d] > 256)
      return "boxDim[" + std::to_string(d) + "] = " + std::to_string(map.box[d]) +
             " (1 to 256)";
    if (d > 0 && (map.strides[d] % 16 != 0 || map.strides[d] >= (uint64_t(1) << 40)))
      return "globalStrides[" + std::to_string(d - 1) + "] = " +
             std::to_string(map.strides[d]) + " (a multiple of 16 below 2^40)";
  }
  const uint64_t innerBytes = uint64_t(map.box[0]) * map.elementBytes;
  if (innerBytes % 16 != 0)
    return "boxDim[0] * element size = " + std::to_string(innerBytes) +
           " bytes, not a multiple of 16";
  if (map.swizzle && innerBytes > (16u << map.swizzle))
    return "boxDim[0] * element size = " + std::to_string(innerBytes) +
           " bytes exceeds the swizzle span of " + std::to_string(16u << map.swizzle);
  unsigned char bytes[128] = {};
  std::memcpy(bytes, &kTensorMapMagic, 8);
  std::memcpy(bytes + 8, &map.address, 8);
  std::memcpy(bytes + 16, map.dims, 40);
  std::memcpy(bytes + 56, map.strides, 40);
  for (unsigned d = 0; d < 5; ++d) {
    const uint16_t box = static_cast<uint16_t>(map.box[d]);
    std::memcpy(bytes + 96 + 2 * d, &box, 2);
  }
  bytes[106] = static_cast<unsigned char>(map.rank);
  bytes[107] = static_cast<unsigned char>(map.elementBytes);
  bytes[108] = static_cast<unsigned char>(map.swizzle);
  std::memcpy(map128, bytes, 128);
  return "";
}

bool decodeTensorMap(const void *map128, TensorMap *map) {
  const auto *bytes = static_cast<const unsigned char *>(map128);
  uint64_t magic;
  std::memcpy(&magic, bytes, 8);
  if (magic != kTensorMapMagic)
    return false;
  std::memcpy(&map->address, bytes + 8, 8);
  std::memcpy(map->dims, bytes + 16, 40);
  std::memcpy(map->strides, bytes + 56, 40);
  for (unsigned d = 0; d < 5; ++d) {
    uint16_t box;
    std::memcpy(&box, bytes + 96 + 2 * d, 2);
    map->box[d] = box;
  }
  map->rank = bytes[106];
  map->elementBytes = bytes[107];
  map->swizzle = bytes[108];
  return map->rank >= 1 && map->rank <= 5;
}

unsigned boundedRegisters(unsigned threads, unsigned ctasPerSm) {
  return std::min(255u, 65536u / std::max(ctasPerSm, 1u) / ((threads + 31) / 32 * 32) / 8 * 8);
}

LaunchResult launch(const Kernel &kernel, const LaunchConfig &config, void **params,
                    const Checks &checks) {
  LaunchResult result;
  const auto start = std::chrono::steady_clock::now();
  const uint64_t threads = uint64_t(config.block[0]) * config.block[1] * config.block[2];
  const uint64_t blocks = uint64_t(config.grid[0]) * config.grid[1] * config.grid[2];
  if (threads == 0 || threads > kMaxThreads || blocks == 0) {
    result.ok = false;
    result.error = "invalid launch: block of " + std::to_string(threads) + " threads (1.." +
                   std::to_string(kMaxThreads) + "), grid of " + std::to_string(blocks) + " blocks";
    return result;
  }
  if (config.dynamicSharedBytes > config.maxDynamicSharedBytes ||
      config.dynamicSharedBytes > kMaxDynamicShared) {
    result.ok = false;
    result.error = "invalid launch: " + std::to_string(config.dynamicSharedBytes) +
                   " bytes of dynamic shared memory, over the kernel's limit of " +
                   std::to_string(std::min(config.maxDynamicSharedBytes, kMaxDynamicShared));
    return result;
  }
  Launch state;
  state.kernel = &kernel;
  state.config = config;
  state.checks = checks;
  state.blockCount = blocks;
  state.serial = ++launchSerial;
  state.runBlocks = config.sampleBlocks && config.sampleBlocks < blocks ? config.sampleBlocks
                                                                        : blocks;
  state.staticBase = (config.dynamicSharedBytes + 127) / 128 * 128;
  // Copy the parameters, as the driver does at launch.
  size_t total = 0;
  for (unsigned long size : kernel.parameterSizes)
    total += (size + 15) / 16 * 16;
  state.parameterBytes.resize(std::max<size_t>(total, 1));
  size_t at = 0;
  for (size_t i = 0; i < kernel.parameterSizes.size(); ++i) {
    std::memcpy(state.parameterBytes.data() + at, params[i], kernel.parameterSizes[i]);
    state.parameterPointers.push_back(state.parameterBytes.data() + at);
    at += (kernel.parameterSizes[i] + 15) / 16 * 16;
  }
  // Fresh sector maps for the unique-sector counter.
  {
    std::shared_lock<std::shared_mutex> lock(memoryMutex);
    for (auto &entry : allocations())
      for (size_t i = 0; i < entry.second->sectorWords; ++i)
        entry.second->sectors[i].store(0, std::memory_order_relaxed);
  }
  const unsigned workers =
      static_cast<unsigned>(std::min<uint64_t>(poolSize(), state.runBlocks));
  std::mutex totalMutex;
  if (workers <= 1) {
    workerLoop(state, result.counters, totalMutex);
  } else {
    std::vector<std::thread> pool;
    for (unsigned i = 0; i < workers; ++i)
      pool.emplace_back([&] { workerLoop(state, result.counters, totalMutex); });
    for (std::thread &thread : pool)
      thread.join();
  }
  {
    std::shared_lock<std::shared_mutex> lock(memoryMutex);
    for (auto &entry : allocations())
      for (size_t i = 0; i < entry.second->sectorWords; ++i)
        result.counters.globalSectorsUnique +=
            __builtin_popcountll(entry.second->sectors[i].load(std::memory_order_relaxed));
  }
  result.counters.gridBlocks = blocks;
  result.reports = std::move(state.reports);
  result.ok = result.reports.empty() && !state.aborted;
  if (state.aborted && result.reports.empty())
    result.error = "the launch was aborted";
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

} // namespace pagedc::emu
