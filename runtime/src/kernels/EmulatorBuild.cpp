//===- EmulatorBuild.cpp - Kernels built for the SIMT emulator ------------===//

#include "pagedc/EmulatorBuild.h"
#include "Environment.h"

#include "SealedFile.h"

#include "pagedc/Error.h"
#include "pagedc/KernelCache.h"

#include <fmt/format.h>

#include <elf.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace pagedc {

namespace fs = std::filesystem;

namespace {

std::string compilerPath() {
  if (const char *chosen = env::get(env::Setting::EmuCxx))
    return chosen;
#ifdef PAGEDC_EMU_CXX_HINT
  if (::access(PAGEDC_EMU_CXX_HINT, X_OK) == 0)
    return PAGEDC_EMU_CXX_HINT;
#endif
  return "c++";
}

bool isClang(const std::string &compiler) {
  return compiler.find("clang") != std::string::npos;
}

std::string quote(const std::string &text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

/// Flags of the compile step. TSan's hooks are implemented by the emulator
/// (Emulator.cuh), never by libtsan, so the link step leaves the flag out.
/// -O0: a unit is compiled for one or a few launches, and the emulator's
/// own code, not the kernel's, takes most of a launch's time (3% of it in
/// kernel code at -O1 on the corpus matrix). With GCC 12 a decode unit
/// compiles in 0.20 s against 0.37 s at -O1, and the corpus matrix's
/// launches take 15-20% longer.
std::string compileFlags(const std::string &compiler) {
  std::string flags = "-std=c++17 -O0 -g1 -fPIC -fvisibility=hidden -fno-exceptions "
                      "-fsanitize=thread -w";
  flags += isClang(compiler) ? " -mllvm -tsan-instrument-func-entry-exit=0"
                             : " --param=tsan-instrument-func-entry-exit=0";
  return flags;
}

std::string fileIdentity(const std::string &path) {
  std::string resolved = path;
  if (path.find('/') == std::string::npos) {
    // A bare name: the first match on PATH.
    const char *search = env::get(env::Setting::Path);
    std::stringstream stream(search ? search : "/usr/bin");
    std::string dir;
    while (std::getline(stream, dir, ':'))
      if (::access((dir + "/" + path).c_str(), X_OK) == 0) {
        resolved = dir + "/" + path;
        break;
      }
  }
  std::error_code error;
  fs::path real = fs::canonical(resolved, error);
  struct stat info;
  if (error || ::stat(real.c_str(), &info) != 0)
    return path;
  return fmt::format("{}|{}|{}", real.string(), info.st_size, info.st_mtime);
}

uint64_t textHash(std::string_view text, uint64_t hash) {
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

/// Runs `command` through the shell; returns its exit status and output.
int run(const std::string &command, std::string &output) {
  FILE *pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe)
    throw Error(fmt::format("could not start the host compiler: {}", std::strerror(errno)));
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0)
    output.append(buffer, n);
  int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/// A temporary directory removed with its contents at scope exit.
struct TempDirectory {
  std::string path;
  TempDirectory() {
    const char *base = env::get(env::Setting::TmpDir);
    std::string pattern = std::string(base ? base : "/tmp") + "/pagedc-emu-XXXXXX";
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (!mkdtemp(buffer.data()))
      throw Error(fmt::format("could not create a temporary directory for the emulator build "
                              "({}): {}",
                              pattern, std::strerror(errno)));
    path = buffer.data();
  }
  ~TempDirectory() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

constexpr std::string_view kImageMagic = "PAGEDC-EMU-IMG1\n";
constexpr uint64_t kImageHeaderBytes = 16 + 8;

#if defined(__x86_64__)
constexpr uint16_t kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr uint16_t kHostMachine = EM_AARCH64;
#else
#error "the SIMT emulator builds kernels for x86-64 and AArch64 hosts only"
#endif

/// Whether the table [offset, offset + count * entrySize) lies in a file of
/// `size` bytes, without overflow.
bool tableFits(uint64_t offset, uint64_t count, uint64_t entrySize, uint64_t size) {
  if (offset > size)
    return false;
  return entrySize == 0 || count <= (size - offset) / entrySize;
}

} // namespace

std::string checkEmulatorLibrary(std::string_view library) {
  const uint64_t size = library.size();
  if (size > KernelCache::kMaxEntryBytes)
    return fmt::format("{} bytes, more than an image may hold", size);
  Elf64_Ehdr header;
  if (size < sizeof(header))
    return fmt::format("{} bytes, shorter than an ELF header", size);
  std::memcpy(&header, library.data(), sizeof(header));
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0)
    return "no ELF magic";
  if (header.e_ident[EI_CLASS] != ELFCLASS64)
    return "not a 64-bit ELF object";
  if (header.e_ident[EI_DATA] != ELFDATA2LSB)
    return "not a little-endian ELF object";
  if (header.e_type != ET_DYN)
    return "not a shared object";
  if (header.e_machine != kHostMachine)
    return fmt::format("ELF machine {}, this host is {}", header.e_machine, kHostMachine);
  if (header.e_phentsize != sizeof(Elf64_Phdr) || header.e_phnum == 0 ||
      !tableFits(header.e_phoff, header.e_phnum, sizeof(Elf64_Phdr), size))
    return "program headers outside the file (truncated?)";
  if (header.e_shnum != 0 && (header.e_shentsize != sizeof(Elf64_Shdr) ||
                              !tableFits(header.e_shoff, header.e_shnum, sizeof(Elf64_Shdr), size)))
    return fmt::format("section headers end past the file's {} bytes (truncated?)", size);
  for (unsigned i = 0; i < header.e_phnum; ++i) {
    Elf64_Phdr segment;
    std::memcpy(&segment, library.data() + header.e_phoff + i * sizeof(Elf64_Phdr),
                sizeof(segment));
    if (segment.p_type == PT_LOAD && !tableFits(segment.p_offset, 1, segment.p_filesz, size))
      return fmt::format("segment {} ends past the file's {} bytes (truncated?)", i, size);
  }
  return "";
}

std::string checkEmulatorImage(std::string_view image) {
  if (image.size() < kImageHeaderBytes || image.substr(0, kImageMagic.size()) != kImageMagic)
    return "no emulator image header";
  uint64_t recorded = 0;
  for (int i = 0; i < 8; ++i)
    recorded |= uint64_t(static_cast<unsigned char>(image[kImageMagic.size() + i])) << (8 * i);
  if (recorded != image.size() - kImageHeaderBytes)
    return fmt::format("the image header records {} bytes, {} follow", recorded,
                       image.size() - kImageHeaderBytes);
  return checkEmulatorLibrary(image.substr(kImageHeaderBytes));
}

std::string emulatorSource(const KernelSource &source) {
  std::string code;
  code.reserve(source.code.size() + 32 * 1024);
  code += "// pagedc kernel, built for the SIMT emulator\n";
  code += emulatorPrologue();
  // Each part of the unit starts with a "// ---- NAME ----" line; from there
  // on, lines are numbered as in NAME.
  std::string_view rest = source.code;
  while (!rest.empty()) {
    size_t end = rest.find('\n');
    std::string_view line = rest.substr(0, end == std::string_view::npos ? rest.size() : end + 1);
    rest.remove_prefix(line.size());
    code += line;
    if (line.rfind("// ---- ", 0) == 0) {
      std::string_view name = line.substr(8);
      size_t close = name.find(" ----");
      if (close != std::string_view::npos) {
        name = name.substr(0, close);
        if (code.back() != '\n')
          code += '\n';
        code += fmt::format("#line 1 \"{}\"\n", name == "generated mod code" ? "mods" : name);
      }
    }
  }
  if (!code.empty() && code.back() != '\n')
    code += '\n';
  code += "#line 1 \"emulator entries\"\n";
  for (const std::string &kernel : source.kernelNames)
    code += fmt::format("PAGEDC_EMU_ENTRY({})\n", kernel);
  return code;
}

const std::string &emulatorBuildIdentity() {
  static const std::string identity = [] {
    const std::string compiler = compilerPath();
    uint64_t hash = textHash(embeddedTemplate("EmuKernelAbi.h"), 0xcbf29ce484222325ull);
    hash = textHash(embeddedTemplate("Emulator.cuh"), hash);
    return fmt::format("emulator cxx {} flags {} headers {:016x}", fileIdentity(compiler),
                       compileFlags(compiler), hash);
  }();
  return identity;
}

CompileResult compileForEmulator(const KernelSource &source) {
  return compileEmulatorUnit(emulatorSource(source),
                             fmt::format("the {} kernel", kernelKindName(source.config.kind)));
}

std::string emulatorPrologue() {
  std::string code = "#define PAGEDC_EMULATOR 1\n#line 1 \"EmuKernelAbi.h\"\n";
  code += embeddedTemplate("EmuKernelAbi.h");
  code += "\n#line 1 \"Emulator.cuh\"\n";
  code += embeddedTemplate("Emulator.cuh");
  code += "\n";
  return code;
}

CompileResult compileEmulatorUnit(const std::string &code, const std::string &what) {
  const auto start = std::chrono::steady_clock::now();
  const std::string compiler = compilerPath();
  TempDirectory directory;
  const std::string unit = directory.path + "/kernel.cpp";
  const std::string object = directory.path + "/kernel.o";
  const std::string library = directory.path + "/kernel.so";
  {
    std::ofstream file(unit, std::ios::binary);
    file << code;
    if (!file.flush())
      throw Error(fmt::format("could not write the emulator build's source to {}", unit));
  }
  CompileResult result;
  std::string output;
  int status = run(fmt::format("{} {} -c {} -o {}", quote(compiler), compileFlags(compiler),
                               quote(unit), quote(object)),
                   output);
  if (status == 0)
    status = run(fmt::format("{} -shared -o {} {}", quote(compiler), quote(library),
                             quote(object)),
                 output);
  if (status != 0)
    throw Error(fmt::format("the host compiler ({}) could not build {} for the SIMT "
                            "emulator (exit {}):\n{}",
                            compiler, what, status, output));
  // Read from fstat's size, bounded, and checked before it is sealed: a
  // compiler killed or out of disk space mid-write leaves a truncated
  // object that would be cached and fault every later dlopen.
  std::string bytes;
  const sealed::ReadStatus read =
      sealed::readEntryFile(library, bytes, KernelCache::kMaxEntryBytes - kImageHeaderBytes);
  if (read != sealed::ReadStatus::Read)
    throw Error(fmt::format("the host compiler ({}) wrote no readable emulator image for {}{}",
                            compiler, what,
                            read == sealed::ReadStatus::TooLarge ? " (too large)" : ""));
  if (std::string problem = checkEmulatorLibrary(bytes); !problem.empty())
    throw Error(fmt::format("the host compiler ({}) wrote a damaged emulator image for {}: {}",
                            compiler, what, problem));
  // KernelAbi.h's image header: magic, size (8 bytes, little-endian).
  result.image = kImageMagic;
  uint64_t size = bytes.size();
  for (int i = 0; i < 8; ++i)
    result.image += static_cast<char>((size >> (8 * i)) & 0xff);
  result.image += bytes;
  result.log = std::move(output);
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

} // namespace pagedc
