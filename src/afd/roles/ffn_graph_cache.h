// The FFN roles' CUDA graphs (P2P: a whole step; async: one work item or gathered group), written
// once. Work is served by key: the key's first sighting runs eagerly in the graphs' memory
// (sizing it), the second is captured and replayed, every later one replays. The graphs of one
// pool (the work's row total: alike shapes, never running at once) share one workspace; if it
// ever has to grow, the graphs taken from it are dropped (they point into released memory) and
// captured again. A capture that outgrew the memory is thrown away and its work runs eagerly.
// The connector's capture bookkeeping (what one replay adds to its stats or sequence numbers:
// Connector::Captured from EndCapture) stays with each graph and is given back at every replay.
// Thread safety: one thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "afd/common/function_ref.h"
#include "afd/kernels/backend.h"
#include "afd/tensor/workspace.h"

namespace afd::roles {

template <typename Connector, typename Key>
class FfnGraphCache {
 public:
  using Captured = typename Connector::Captured;
  // sync_before_capture: wait for the device before each capture (nothing of the work before
  // in flight; the P2P role's NCCL transfers). Both must outlive the cache.
  FfnGraphCache(kernels::Backend& backend, Connector& connector, bool sync_before_capture)
      : backend_(backend), connector_(connector), sync_before_capture_(sync_before_capture) {}

  enum class Served { kReplayed, kEager };
  // Serves `key`'s work: `run(ws)` enqueues it, taking its scratch from ws.
  Served Serve(const Key& key, int64_t pool, FunctionRef<void(Workspace&)> run) {
    if (Replay(key)) return Served::kReplayed;
    std::unique_ptr<Memory>& memory = memory_[pool];
    if (!memory) memory = std::make_unique<Memory>(backend_);
    Workspace& ws = memory->ws;
    const auto eagerly = [&] {
      ws.Reset();
      run(ws);
      ws.Reset();
      DropIfGrown(*memory);
    };
    if (warmed_.insert(key).second) {  // the key's first work: eagerly, in the graphs' memory
      eagerly();
      return Served::kEager;
    }
    ws.Reset();
    DropIfGrown(*memory);
    if (sync_before_capture_) backend_.Synchronize();
    const int64_t chunks = ws.chunk_allocations();
    connector_.BeginCapture();
    backend_.BeginCapture();
    try {
      run(ws);
    } catch (...) {
      backend_.EndCapture();
      connector_.EndCapture();
      throw;
    }
    std::unique_ptr<kernels::OpGraph> graph = backend_.EndCapture();
    Captured captured = connector_.EndCapture();
    ++num_captures_;
    if (ws.chunk_allocations() != chunks) {
      // It outgrew the memory while capturing (nothing ran): this work eagerly; the next one
      // captures into the merged memory.
      eagerly();
      return Served::kEager;
    }
    if (memory->chunk_allocations < 0) memory->chunk_allocations = ws.chunk_allocations();
    memory->keys.push_back(key);
    graphs_[key] = Graph{std::move(graph), std::move(captured)};
    Replay(key);
    return Served::kReplayed;
  }

  // Replays key's graph if it has one (false: not captured yet).
  bool Replay(const Key& key) {
    const auto it = graphs_.find(key);
    if (it == graphs_.end()) return false;
    it->second.graph->Replay();
    connector_.Replayed(it->second.captured);
    return true;
  }

  bool Has(const Key& key) const { return graphs_.count(key) != 0; }
  int64_t num_captures() const { return num_captures_; }

 private:
  struct Graph {
    std::unique_ptr<kernels::OpGraph> graph;
    Captured captured;
  };
  struct Memory {
    explicit Memory(Allocator& allocator) : ws(allocator) {}
    Workspace ws;
    int64_t chunk_allocations = -1;  // when its first graph was captured
    std::vector<Key> keys;           // the graphs taken from it
  };
  void DropIfGrown(Memory& memory) {
    if (memory.chunk_allocations < 0 || memory.ws.chunk_allocations() == memory.chunk_allocations) {
      return;
    }
    for (const Key& k : memory.keys) graphs_.erase(k);
    memory.keys.clear();
    memory.chunk_allocations = -1;
  }

  kernels::Backend& backend_;
  Connector& connector_;
  bool sync_before_capture_;
  std::map<Key, Graph> graphs_;
  std::map<int64_t, std::unique_ptr<Memory>> memory_;  // by pool
  std::set<Key> warmed_;
  int64_t num_captures_ = 0;
};

}  // namespace afd::roles
