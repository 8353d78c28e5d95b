// The symmetric window in POSIX shared memory (window.h), for CPU processes on one host.
//
// Each rank creates one segment named "/afd.<host>.<port>.w<world rank>" (the deployment's
// rendezvous address: two live deployments on one host cannot share it, so names never collide;
// a leftover segment of a crashed earlier deployment with the same address is replaced),
// publishes the name, its size and its pid in the rendezvous store ("async_window/<world rank>"),
// maps the segments of its peers, and -- once every rank has mapped what it needs (a store
// barrier) -- unlinks its name: the memory lives exactly as long as the mappings, and nothing is
// left in /dev/shm after a crash. A failure before that point unlinks too.
//
// Thread safety: one thread at a time.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "afd/comm/afd_world.h"
#include "afd/connector/window.h"

namespace afd::connector {

class ShmWindow : public Window {
 public:
  // Collective over every world rank of `world` (each calls it with the same `bytes`): maps the
  // copies of `peers` (world ranks; this rank's own copy is always mapped). Every wait is
  // bounded by afd_process_group_timeout_s. Throws afd::Error naming the segment and the cause.
  static std::unique_ptr<ShmWindow> Create(comm::AfdWorld& world, size_t bytes,
                                           const std::vector<int>& peers);
  ~ShmWindow() override;

  // The segment name of `world_rank` in the deployment at host:port.
  static std::string SegmentName(const std::string& host, int port, int world_rank);

  size_t bytes() const override { return bytes_; }
  char* local() const override { return maps_[self_]; }
  // `peer`'s copy as mapped in this process (null when not mapped): where a device writes the
  // peer's flags (StreamFlags).
  char* mapping(int peer) const { return maps_.at(peer); }
  void Write(int peer, size_t offset, const void* src, size_t bytes) override;
  void WriteFlag(int peer, size_t offset, uint64_t value) override;
  void ReadFlags(size_t offset, std::span<uint64_t> out) const override;
  bool PeerExited(int peer) const override;
  std::string Describe(int peer) const override;

 private:
  ShmWindow(size_t bytes, int world_size, int self);
  char* Peer(int peer, size_t offset, size_t bytes) const;

  size_t bytes_;
  int self_;
  std::vector<char*> maps_;         // [world size], null when not mapped
  std::vector<std::string> names_;  // [world size]
  std::vector<pid_t> pids_;         // [world size], 0 when unknown
  std::string own_name_;            // unlinked once every rank has mapped it
  bool unlinked_ = false;
};

}  // namespace afd::connector
