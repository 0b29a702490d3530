//===- SealedFile.cpp - Checksummed files of the on-disk kernel cache -----===//

#include "SealedFile.h"

#include "pagedc/KernelCache.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

namespace pagedc::sealed {

std::string hex64(unsigned long long value) { return fmt::format("{:016x}", value); }

std::string seal(std::string_view magic, std::string header, std::string_view payload) {
  header += fmt::format("size={}\nchecksum={}\n", payload.size(), hex64(contentHash64(payload)));
  header += fmt::format("header_checksum={}\n\n", hex64(contentHash64(header)));
  std::string file;
  file.reserve(magic.size() + header.size() + payload.size());
  file.append(magic).append(header).append(payload);
  return file;
}

bool open(std::string_view bytes, std::string_view magic,
          std::map<std::string, std::string> &fields, std::string_view &payload) {
  if (bytes.substr(0, magic.size()) != magic)
    return false;
  size_t headerBegin = magic.size();
  size_t headerEnd = bytes.find("\n\n", headerBegin);
  if (headerEnd == std::string_view::npos)
    return false;
  std::string_view header = bytes.substr(headerBegin, headerEnd + 1 - headerBegin);
  constexpr std::string_view kHeaderChecksum = "header_checksum=";
  size_t checksumAt = header.rfind(kHeaderChecksum);
  if (checksumAt == std::string_view::npos ||
      header.substr(checksumAt + kHeaderChecksum.size(), 16) !=
          hex64(contentHash64(header.substr(0, checksumAt))))
    return false;
  fields.clear();
  std::istringstream lines{std::string(header)};
  for (std::string line; std::getline(lines, line);) {
    size_t equals = line.find('=');
    if (equals != std::string::npos)
      fields[line.substr(0, equals)] = line.substr(equals + 1);
  }
  const std::string &size = fields["size"];
  char *end = nullptr;
  unsigned long long expected = std::strtoull(size.c_str(), &end, 10);
  if (size.empty() || *end != '\0')
    return false;
  payload = bytes.substr(headerEnd + 2);
  if (payload.size() != expected)
    return false; // truncated or padded
  return hex64(contentHash64(payload)) == fields["checksum"];
}

bool writeAtomically(const std::string &path, std::string_view bytes) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(fs::path(path).parent_path(), error);
  static std::atomic<uint64_t> counter{0};
  std::string temporary =
      fmt::format("{}.tmp-{}-{}-{}", path, getpid(),
                  std::hash<std::thread::id>()(std::this_thread::get_id()), counter++);
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    file.flush();
    if (!file) {
      fs::remove(temporary, error);
      return false;
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    fs::remove(temporary, error);
    return false;
  }
  return true;
}

ReadStatus readEntryFile(const std::string &path, std::string &bytes, uint64_t maxBytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT ? ReadStatus::Missing
           : errno == ELOOP || errno == EISDIR || errno == ENXIO ? ReadStatus::NotRegular
                                                                 : ReadStatus::Unreadable;
  struct stat info;
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return ReadStatus::NotRegular;
  }
  if (info.st_size < 0 || static_cast<uint64_t>(info.st_size) > maxBytes) {
    ::close(fd);
    return ReadStatus::TooLarge;
  }
  bytes.resize(static_cast<size_t>(info.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t got = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      break; // shrank or failed: the checksums reject what was read
    done += static_cast<size_t>(got);
  }
  bytes.resize(done);
  ::close(fd);
  return ReadStatus::Read;
}

void removeEntry(const std::string &path) {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored); // a symlink is removed, not followed
}

} // namespace pagedc::sealed
