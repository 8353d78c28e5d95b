#include "afd/connector/shm_window.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "afd/common/error.h"

namespace afd::connector {

namespace {

std::string Errno() { return std::strerror(errno); }

// Creates and sizes this rank's segment; replaces a leftover of the same name (see the header).
int CreateSegment(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) {
    shm_unlink(name.c_str());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  AFD_CHECK(fd >= 0, "shared memory window {}: shm_open failed: {}", name, Errno());
  // Reserve the pages now: a full /dev/shm is then an error here, not a SIGBUS mid-step.
  const int rc = ftruncate(fd, static_cast<off_t>(bytes)) == 0
                     ? posix_fallocate(fd, 0, static_cast<off_t>(bytes))
                     : errno;
  if (rc != 0) {
    close(fd);
    shm_unlink(name.c_str());
    AFD_THROW(
        "shared memory window {}: cannot reserve {} bytes: {} (/dev/shm too small? lower "
        "max_num_batched_tokens, or enlarge /dev/shm)",
        name, bytes, std::strerror(rc));
  }
  return fd;
}

char* MapSegment(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  AFD_CHECK(p != MAP_FAILED, "shared memory window {}: mmap of {} bytes failed: {}", name, bytes,
            Errno());
  return static_cast<char*>(p);
}

}  // namespace

std::string ShmWindow::SegmentName(const std::string& host, int port, int world_rank) {
  std::string h;
  for (char c : host) h += (c == '/' ? '_' : c);
  return fmt::format("/afd.{}.{}.w{}", h, port, world_rank);
}

ShmWindow::ShmWindow(size_t bytes, int world_size, int self)
    : bytes_(bytes),
      self_(self),
      maps_(world_size, nullptr),
      names_(world_size),
      pids_(world_size, 0) {}

ShmWindow::~ShmWindow() {
  for (char* p : maps_) {
    if (p) munmap(p, bytes_);
  }
  if (!unlinked_ && !own_name_.empty()) shm_unlink(own_name_.c_str());
}

std::unique_ptr<ShmWindow> ShmWindow::Create(comm::AfdWorld& world, size_t bytes,
                                             const std::vector<int>& peers) {
  AFD_CHECK(bytes > 0 && bytes % 256 == 0,
            "shared memory window: size {} is not a positive "
            "multiple of 256",
            bytes);
  const int me = world.world_rank(), n = world.topology().world_size();
  const double timeout = world.config().afd_process_group_timeout_s;
  std::unique_ptr<ShmWindow> w(new ShmWindow(bytes, n, me));
  w->own_name_ = SegmentName(world.config().host, world.config().port, me);
  w->names_[me] = w->own_name_;
  w->pids_[me] = getpid();
  const int fd = CreateSegment(w->own_name_, bytes);
  try {
    w->maps_[me] = MapSegment(fd, bytes, w->own_name_);
  } catch (...) {
    close(fd);
    throw;
  }
  close(fd);
  comm::PrefixStore store(world.store(), "async_window");
  store.Set(std::to_string(me), fmt::format("{} {} {}", w->own_name_, bytes, getpid()));
  for (int peer : peers) {
    AFD_CHECK(peer >= 0 && peer < n, "shared memory window: peer world rank {} outside [0, {})",
              peer, n);
    if (peer == me) continue;
    std::istringstream in(store.Get(std::to_string(peer), timeout));
    std::string name;
    size_t their_bytes = 0;
    pid_t pid = 0;
    in >> name >> their_bytes >> pid;
    AFD_CHECK(!in.fail() && name == SegmentName(world.config().host, world.config().port, peer),
              "shared memory window: {} published a malformed window entry", world.Describe(peer));
    AFD_CHECK(their_bytes == bytes,
              "shared memory window: {} has a {}-byte window, this rank ({}) {} bytes; every rank "
              "must size it the same (same model, max_num_batched_tokens and connector options)",
              world.Describe(peer), their_bytes, world.Describe(me), bytes);
    const int pfd = shm_open(name.c_str(), O_RDWR, 0);
    AFD_CHECK(pfd >= 0, "shared memory window {} of {}: shm_open failed: {} (is it on this host?)",
              name, world.Describe(peer), Errno());
    struct stat st {};
    const bool sized = fstat(pfd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes;
    if (!sized) close(pfd);
    AFD_CHECK(sized, "shared memory window {} of {} is not {} bytes", name, world.Describe(peer),
              bytes);
    try {
      w->maps_[peer] = MapSegment(pfd, bytes, name);
    } catch (...) {
      close(pfd);
      throw;
    }
    close(pfd);
    w->names_[peer] = name;
    w->pids_[peer] = pid;
  }
  // Every rank has mapped what it needs: the names can go (the mappings keep the memory).
  world.Barrier("async_window_mapped");
  shm_unlink(w->own_name_.c_str());
  w->unlinked_ = true;
  return w;
}

char* ShmWindow::Peer(int peer, size_t offset, size_t bytes) const {
  AFD_CHECK(peer >= 0 && peer < static_cast<int>(maps_.size()) && maps_[peer],
            "shared memory window: world rank {} is not mapped by world rank {}", peer, self_);
  AFD_CHECK(offset <= bytes_ && bytes <= bytes_ - offset,
            "shared memory window {}: write of {} bytes at offset {} exceeds its {} bytes",
            names_[peer], bytes, offset, bytes_);
  return maps_[peer] + offset;
}

void ShmWindow::Write(int peer, size_t offset, const void* src, size_t bytes) {
  if (bytes == 0) return;
  std::memcpy(Peer(peer, offset, bytes), src, bytes);
}

void ShmWindow::WriteFlag(int peer, size_t offset, uint64_t value) {
  AFD_CHECK(offset % 8 == 0, "shared memory window: flag offset {} is not 8-aligned", offset);
  auto* flag = reinterpret_cast<uint64_t*>(Peer(peer, offset, 8));
  // Release: the payload stores above are visible to whoever reads this value (acquire).
  __atomic_store_n(flag, value, __ATOMIC_RELEASE);
}

void ShmWindow::ReadFlags(size_t offset, std::span<uint64_t> out) const {
  AFD_CHECK(offset % 8 == 0 && offset <= bytes_ && out.size() * 8 <= bytes_ - offset,
            "shared memory window: {} flags at offset {} exceed its {} bytes", out.size(), offset,
            bytes_);
  const auto* flags = reinterpret_cast<const uint64_t*>(maps_[self_] + offset);
  for (size_t i = 0; i < out.size(); ++i) out[i] = __atomic_load_n(&flags[i], __ATOMIC_ACQUIRE);
}

bool ShmWindow::PeerExited(int peer) const {
  if (peer < 0 || peer >= static_cast<int>(pids_.size()) || pids_[peer] <= 0) return false;
  std::ifstream in("/proc/" + std::to_string(pids_[peer]) + "/stat");
  if (!in) return true;
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  const char state = line[close + 2];
  return state == 'Z' || state == 'X';  // a zombie has exited, only its parent has not reaped it
}

std::string ShmWindow::Describe(int peer) const {
  const std::string& name =
      peer >= 0 && peer < static_cast<int>(names_.size()) ? names_[peer] : own_name_;
  return fmt::format("POSIX shared memory {}", name.empty() ? "(unmapped)" : name);
}

}  // namespace afd::connector
