//===- Reports.cpp - Findings and the request counters --------------------===//
//
// How findings are recorded and worded (sites, symbolized return
// addresses, one entry per checker, site and kind), the warp-level request
// counters (shared wavefronts, global sectors) computed at each
// rendezvous, and the public Report and Counters methods. None of it is
// on a per-access path: a report is made only on a finding, the counters
// only at a warp's rendezvous.
//
//===----------------------------------------------------------------------===//

#include "EmulatorInternal.h"

#include <nlohmann/json.hpp>

#include <cstdio>

namespace pagedc::emu::detail {

//===----------------------------------------------------------------------===//
// Reports
//===----------------------------------------------------------------------===//

std::string siteString(const char *file, int line) {
  if (!file || !*file)
    return "?";
  const char *slash = std::strrchr(file, '/');
  return std::string(slash ? slash + 1 : file) + ":" + std::to_string(line);
}

namespace {

/// addr2line's "Prefill.cuh:123" for an offset in an image, or
/// "image+0x..." where it knows none.
std::string addr2line(const Module &module, uintptr_t offset) {
  char buffer[512];
  std::snprintf(buffer, sizeof(buffer), "addr2line -e '%s' 0x%lx 2>/dev/null", module.path.c_str(),
                static_cast<unsigned long>(offset));
  std::string text;
  if (FILE *pipe = popen(buffer, "r")) {
    while (fgets(buffer, sizeof(buffer), pipe))
      text += buffer;
    pclose(pipe);
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r'))
    text.pop_back();
  // addr2line prints "file:line (discriminator N)" or "??:0".
  if (auto space = text.find(' '); space != std::string::npos)
    text.resize(space);
  if (text.empty() || text.rfind("??", 0) == 0) {
    std::snprintf(buffer, sizeof(buffer), "image+0x%lx", static_cast<unsigned long>(offset));
    return buffer;
  }
  if (auto slash = text.rfind('/'); slash != std::string::npos)
    text = text.substr(slash + 1);
  return text;
}

/// "Prefill.cuh:123" for a return address in an image, through addr2line
/// once per address: a site is located before its finding is counted, and
/// a finding can repeat thousands of times in a launch (one addr2line run
/// per repeat took minutes).
std::string symbolize(const Module &module, const void *pc) {
  const auto offset = reinterpret_cast<uintptr_t>(pc) - module.loadBase - 1;
  std::lock_guard<std::mutex> lock(module.symbolsMutex);
  std::string &known = module.symbols[offset];
  if (known.empty())
    known = addr2line(module, offset);
  return known;
}

} // namespace

void report(const char *checker, std::string message, std::string location, uint64_t address,
            bool fatal) {
  Worker *worker = currentWorker;
  Thread *thread = reportedThread ? reportedThread : currentThread;
  Launch &launch = *worker->launch;
  {
    std::lock_guard<std::mutex> lock(launch.reportMutex);
    // One entry per checker, site and kind of finding (the message up to
    // its first colon); repeats only count.
    std::string key = std::string(checker) + "|" + location + "|" +
                      message.substr(0, message.find(':'));
    auto found = launch.reportIndex.find(key);
    if (found != launch.reportIndex.end()) {
      ++launch.reports[found->second].count;
    } else if (launch.reports.size() < 64) {
      Report entry;
      entry.checker = checker;
      entry.message = std::move(message);
      entry.kernel = launch.kernel->name;
      std::copy(worker->block, worker->block + 3, entry.block);
      if (thread)
        std::copy(thread->index.thread_idx, thread->index.thread_idx + 3, entry.thread);
      entry.location = std::move(location);
      entry.address = address;
      launch.reportIndex.emplace(std::move(key), launch.reports.size());
      launch.reports.push_back(std::move(entry));
    }
  }
  if (fatal) {
    worker->aborted = true;
    launch.aborted = true;
    reportedThread = nullptr;
    if (currentThread)
      switchContext(currentThread->context, worker->scheduler);
  }
}

std::string pcLocation(const void *pc) {
  return symbolize(*currentWorker->launch->kernel->module, pc);
}

std::string siteText(const Site &site) {
  if (site.file)
    return siteString(site.file, site.line);
  if (site.pc)
    return pcLocation(site.pc);
  return "?";
}

std::string hex(uint64_t value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "0x%llx", static_cast<unsigned long long>(value));
  return buffer;
}

const char *collectiveName(Collective kind) {
  switch (kind) {
  case Collective::None:
    return "none";
  case Collective::Shuffle:
    return "__shfl_xor_sync";
  case Collective::Ballot:
    return "__ballot_sync";
  case Collective::Ldmatrix:
    return "ldmatrix.x4";
  case Collective::LdmatrixTrans:
    return "ldmatrix.x4.trans";
  case Collective::Mma:
    return "mma.sync.m16n8k16";
  case Collective::Wgmma:
    return "wgmma.mma_async";
  case Collective::Setmaxnreg:
    return "setmaxnreg";
  }
  return "?";
}

std::string lanesString(unsigned mask) {
  std::string text;
  for (int lane = 0; lane < 32;) {
    if (!(mask >> lane & 1)) {
      ++lane;
      continue;
    }
    int end = lane;
    while (end + 1 < 32 && (mask >> (end + 1) & 1))
      ++end;
    if (!text.empty())
      text += ",";
    text += end == lane ? std::to_string(lane) : std::to_string(lane) + "-" + std::to_string(end);
    lane = end + 1;
  }
  return text.empty() ? "none" : text;
}

//===----------------------------------------------------------------------===//
// Counters of warp-level requests
//===----------------------------------------------------------------------===//

namespace {

/// Wavefronts of one warp-level shared request: per phase of 128 bytes'
/// worth of lanes, the most distinct 4-byte words any one bank serves.
uint64_t sharedWavefronts(const std::vector<const Access *> &lanes) {
  if (lanes.empty())
    return 0;
  const uint32_t size = std::max<uint32_t>(lanes.front()->size, 4);
  const size_t perPhase = std::max<size_t>(1, 128 / size);
  uint64_t total = 0;
  for (size_t begin = 0; begin < lanes.size(); begin += perPhase) {
    std::map<unsigned, std::vector<uintptr_t>> banks;
    for (size_t i = begin; i < std::min(lanes.size(), begin + perPhase); ++i)
      for (uint32_t byte = 0; byte < size; byte += 4) {
        uintptr_t word = (lanes[i]->address + byte) / 4;
        auto &words = banks[word % 32];
        if (std::find(words.begin(), words.end(), word) == words.end())
          words.push_back(word);
      }
    size_t most = 0;
    for (auto &entry : banks)
      most = std::max(most, entry.second.size());
    total += most;
  }
  return total;
}

} // namespace

void flushWarpAccesses(Worker &worker, unsigned warp) {
  const unsigned first = warp * 32, last = std::min(worker.threadCount, first + 32);
  // One request per instruction and execution of it: a lane's n-th access
  // from an instruction joins the other lanes' n-th from the same one, so
  // lanes that skipped an access under a branch (one lane in four storing
  // lse) stay in step with the others afterwards.
  std::map<std::pair<const void *, size_t>, std::vector<const Access *>> requests;
  for (unsigned t = first; t < last; ++t) {
    std::map<const void *, size_t> executions;
    for (const Access &access : worker.threads[t].accesses)
      requests[{access.pc, executions[access.pc]++}].push_back(&access);
  }
  for (auto &[instruction, group] : requests) {
    if (group.front()->shared) {
      ++worker.counters.sharedRequests;
      worker.counters.sharedWavefronts += sharedWavefronts(group);
      uint64_t bytes = 0;
      for (const Access *access : group)
        bytes += access->size;
      worker.counters.sharedIdealWavefronts += (bytes + 127) / 128;
    } else {
      ++worker.counters.globalRequests;
      std::vector<uintptr_t> sectors;
      for (const Access *access : group)
        for (uintptr_t s = access->address / 32; s <= (access->address + access->size - 1) / 32;
             ++s)
          sectors.push_back(s);
      std::sort(sectors.begin(), sectors.end());
      worker.counters.globalSectorsRequested +=
          std::unique(sectors.begin(), sectors.end()) - sectors.begin();
    }
  }
  for (unsigned t = first; t < last; ++t)
    worker.threads[t].accesses.clear();
}

} // namespace pagedc::emu::detail

namespace pagedc::emu {

using namespace detail;

std::string Report::format() const {
  std::string text = "pagedc-emu: " + checker + ": " + message + "\n    at " + location + " in " +
                     kernel + ", block (" + std::to_string(block[0]) + "," +
                     std::to_string(block[1]) + "," + std::to_string(block[2]) + "), thread (" +
                     std::to_string(thread[0]) + "," + std::to_string(thread[1]) + "," +
                     std::to_string(thread[2]) + ")";
  if (address)
    text += ", address " + hex(address);
  if (count > 1)
    text += " (" + std::to_string(count) + " times)";
  return text;
}

namespace {
/// Every counter with its JSON name: add() and json() walk this one list, so
/// a new counter is summed and written once it is listed here.
struct CounterField {
  const char *name;
  uint64_t Counters::*member;
};
constexpr CounterField kCounterFields[] = {
    {"grid_blocks", &Counters::gridBlocks},
    {"blocks", &Counters::blocks},
    {"threads", &Counters::threads},
    {"mma", &Counters::mma},
    {"ldmatrix", &Counters::ldmatrix},
    {"ldmatrix_wavefronts", &Counters::ldmatrixWavefronts},
    {"ldmatrix_ideal_wavefronts", &Counters::ldmatrixIdealWavefronts},
    {"shared_load_bytes", &Counters::sharedLoadBytes},
    {"shared_store_bytes", &Counters::sharedStoreBytes},
    {"shared_requests", &Counters::sharedRequests},
    {"shared_wavefronts", &Counters::sharedWavefronts},
    {"shared_ideal_wavefronts", &Counters::sharedIdealWavefronts},
    {"global_load_bytes", &Counters::globalLoadBytes},
    {"global_store_bytes", &Counters::globalStoreBytes},
    {"global_requests", &Counters::globalRequests},
    {"global_sectors_requested", &Counters::globalSectorsRequested},
    {"global_sectors_unique", &Counters::globalSectorsUnique},
    {"cp_async", &Counters::cpAsync},
    {"cp_async_bytes", &Counters::cpAsyncBytes},
    {"cp_async_zero_fill_bytes", &Counters::cpAsyncZeroFillBytes},
    {"wgmma", &Counters::wgmma},
    {"wgmma_flop", &Counters::wgmmaFlop},
    {"wgmma_shared_bytes", &Counters::wgmmaSharedBytes},
    {"bulk_copies", &Counters::bulkCopies},
    {"bulk_copy_bytes", &Counters::bulkCopyBytes},
    {"barriers", &Counters::barriers},
    {"shuffles", &Counters::shuffles},
    {"ballots", &Counters::ballots},
    {"atomics", &Counters::atomics},
    {"transcendentals", &Counters::transcendentals},
    {"tiles_kept", &Counters::tilesKept},
    {"tiles_masked", &Counters::tilesMasked},
    {"row_groups_rescaled", &Counters::rowGroupsRescaled},
};
} // namespace

void Counters::add(const Counters &o) {
  // The grid is the same launch's, not a sum of its sampled parts.
  const uint64_t grid = std::max(gridBlocks, o.gridBlocks);
  for (const CounterField &field : kCounterFields)
    this->*field.member += o.*field.member;
  gridBlocks = grid;
}

void Counters::forEach(const std::function<void(const char *, uint64_t)> &visit) const {
  for (const CounterField &field : kCounterFields)
    visit(field.name, this->*field.member);
}

std::string Counters::json() const {
  nlohmann::ordered_json object = nlohmann::ordered_json::object();
  forEach([&](const char *name, uint64_t value) { object[name] = value; });
  return object.dump();
}

} // namespace pagedc::emu
