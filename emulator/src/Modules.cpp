//===- Modules.cpp - Kernel images loaded for the emulator ----------------===//
//
// A kernel image (a shared object the host compiler built from the
// kernel's CUDA unit) written to a memfd, dlopen'ed and bound to the
// runtime table; its kernels' entries found by name; its loaded segments
// recorded so that reads of its constant tables pass the memory checks.
// It is separate because it is the one part that deals with the dynamic
// loader.
//
//===----------------------------------------------------------------------===//

#include "EmulatorInternal.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace pagedc::emu {

using namespace detail;

Module::~Module() {
  if (handle)
    dlclose(handle);
  if (memfd >= 0)
    close(memfd);
}

namespace {

/// dl_iterate_phdr callback: the PT_LOAD segments of the module's image.
int collectSegments(dl_phdr_info *info, size_t, void *data) {
  auto *module = static_cast<Module *>(data);
  if (info->dlpi_addr != module->loadBase)
    return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr) &header = info->dlpi_phdr[i];
    if (header.p_type != PT_LOAD)
      continue;
    module->segments.push_back(
        {info->dlpi_addr + header.p_vaddr, info->dlpi_addr + header.p_vaddr + header.p_memsz});
  }
  return 1;
}

} // namespace

std::shared_ptr<Module> loadModule(const void *image, std::string *error) {
  auto fail = [&](std::string why) -> std::shared_ptr<Module> {
    if (error)
      *error = std::move(why);
    return nullptr;
  };
  if (!image)
    return fail("no image");
  const auto *bytes = static_cast<const unsigned char *>(image);
  if (std::memcmp(bytes, PAGEDC_EMU_IMAGE_MAGIC, 16) != 0)
    return fail("not an emulator image (a cubin or PTX image cannot run on the emulator; "
                "build the kernel for the emulator)");
  uint64_t size = 0;
  for (int i = 0; i < 8; ++i)
    size |= static_cast<uint64_t>(bytes[16 + i]) << (8 * i);
  if (size == 0 || size > (uint64_t(1) << 31))
    return fail("emulator image with an implausible size");
  auto module = std::make_shared<Module>();
  module->memfd = memfd_create("pagedc-emu-kernel.so", MFD_CLOEXEC);
  if (module->memfd < 0)
    return fail(std::string("memfd_create failed: ") + std::strerror(errno));
  const unsigned char *data = bytes + PAGEDC_EMU_IMAGE_HEADER_BYTES;
  for (uint64_t written = 0; written < size;) {
    ssize_t n = write(module->memfd, data + written, size - written);
    if (n <= 0)
      return fail(std::string("writing the image failed: ") + std::strerror(errno));
    written += static_cast<uint64_t>(n);
  }
  module->path = "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(module->memfd);
  module->handle = dlopen(("/proc/self/fd/" + std::to_string(module->memfd)).c_str(),
                          RTLD_NOW | RTLD_LOCAL);
  if (!module->handle)
    return fail(std::string("loading the emulator image failed: ") + dlerror());
  auto bind = reinterpret_cast<PagedcEmuBindFunction>(dlsym(module->handle, "pagedc_emu_image_bind"));
  if (!bind)
    return fail("the emulator image has no pagedc_emu_image_bind");
  if (int version = bind(&kRuntime); version != 0)
    return fail("the emulator image has ABI version " + std::to_string(version) +
                ", this emulator " + std::to_string(PAGEDC_EMU_ABI_VERSION));
  Dl_info info{};
  if (dladdr(reinterpret_cast<void *>(bind), &info) && info.dli_fbase)
    module->loadBase = reinterpret_cast<uintptr_t>(info.dli_fbase);
  dl_iterate_phdr(&collectSegments, module.get());
  return module;
}

const Kernel *findKernel(const Module &module, const std::string &name) {
  std::lock_guard<std::mutex> lock(module.kernelsMutex);
  auto found = module.kernels.find(name);
  if (found != module.kernels.end())
    return found->second.get();
  auto entry =
      reinterpret_cast<PagedcEmuEntryFunction>(dlsym(module.handle, ("pagedc_emu_entry_" + name).c_str()));
  auto sizes = reinterpret_cast<PagedcEmuParamsFunction>(
      dlsym(module.handle, ("pagedc_emu_params_" + name).c_str()));
  if (!entry || !sizes)
    return nullptr;
  auto kernel = std::make_unique<Kernel>();
  kernel->name = name;
  kernel->entry = entry;
  kernel->module = &module;
  unsigned count = 0;
  const unsigned long *list = sizes(&count);
  kernel->parameterSizes.assign(list, list + count);
  if (const auto *ctas = static_cast<const int *>(
          dlsym(module.handle, ("pagedc_emu_ctas_per_sm_" + name).c_str()));
      ctas && *ctas >= 1)
    kernel->ctasPerSm = static_cast<unsigned>(*ctas);
  return module.kernels.emplace(name, std::move(kernel)).first->second.get();
}

} // namespace pagedc::emu
