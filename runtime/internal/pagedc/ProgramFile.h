//===- ProgramFile.h - Bounded reading of .attn programs --------*- C++ -*-===//
//
// The one reader of program files, shared by `pagedc` (compile mode, `run`,
// `demo`), `pagedc-jit`, the JIT's compileModsFromFile() and the Python
// package (which applies the same limit, kMaxProgramBytes, to the files it
// reads). Header-only and free of LLVM so that runtime-only tools can use
// it, like ConstOverride.h.
//
// A program is at most kMaxProgramBytes (16 MiB): far beyond any real set of
// mods, and small enough that `pagedc /dev/zero` or `pagedc - < /dev/zero`
// stop with an error instead of reading until memory runs out. A regular
// file is measured with fstat() before anything is read; anything else
// (standard input, a pipe, a FIFO, a device) is counted while it is read and
// refused as soon as it passes the limit.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_PROGRAMFILE_H
#define PAGEDC_PROGRAMFILE_H

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace pagedc {

/// The largest program, in bytes, any pagedc reader accepts.
inline constexpr int64_t kMaxProgramBytes = int64_t(16) << 20;

/// How errors and --help state the limit.
inline constexpr const char *kMaxProgramText = "16 MiB (16777216 bytes)";

/// The error for a program of `path` (as the user spelt it; "-" is standard
/// input) over the limit.
inline std::string programTooLarge(const std::string &path) {
  return (path == "-" ? std::string("the program on standard input")
                      : "program '" + path + "'") +
         " is larger than " + kMaxProgramText + ", the most a program may be";
}

/// Reads the program `path` ("-": standard input) into `text`. Returns an
/// empty string on success, else the error naming the file: cannot open,
/// a directory, over kMaxProgramBytes, or a read error.
inline std::string readProgramFile(const std::string &path, std::string &text) {
  text.clear();
  const bool fromStdin = path == "-";
  int fd = fromStdin ? STDIN_FILENO : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return "cannot read '" + path + "': " + std::strerror(errno);
  // Standard input stays open: it is the caller's.
  auto fail = [&](const std::string &message) {
    if (!fromStdin)
      ::close(fd);
    text.clear();
    return message;
  };
  struct stat info;
  if (::fstat(fd, &info) != 0)
    return fail("cannot read '" + path + "': " + std::strerror(errno));
  if (S_ISDIR(info.st_mode))
    return fail("cannot read '" + path + "': it is a directory, not a program file");
  if (S_ISREG(info.st_mode)) {
    // A regular file says its size: refuse before reading a byte. Standard
    // input redirected from a file is measured from where it now stands.
    off_t start = fromStdin ? ::lseek(fd, 0, SEEK_CUR) : 0;
    if (start < 0)
      start = 0;
    if (info.st_size - start > kMaxProgramBytes)
      return fail(programTooLarge(path));
  }
  // Everything else is counted while reading, one chunk past the limit at
  // most; a regular file that grows while it is read is caught here too.
  char chunk[65536];
  for (;;) {
    ssize_t got = ::read(fd, chunk, sizeof(chunk));
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      return fail("cannot read '" + path + "': " + std::strerror(errno));
    if (got == 0)
      break;
    if (static_cast<int64_t>(text.size()) + got > kMaxProgramBytes)
      return fail(programTooLarge(path));
    text.append(chunk, static_cast<size_t>(got));
  }
  if (!fromStdin)
    ::close(fd);
  return "";
}

} // namespace pagedc

#endif // PAGEDC_PROGRAMFILE_H
