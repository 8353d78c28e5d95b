// A per-step arena of device memory: the scratch tensors of one forward step are taken from it
// and all released together at the step's end, so no op allocates memory inside a step and the
// addresses of a step's tensors stay put until Reset (what CUDA graph capture needs).
//
// Memory: chunks from the Allocator. A step that outgrows the current chunk gets another one
// (earlier tensors keep their addresses); at Reset the chunks are merged into one chunk of the
// high-water size, so from then on a step of the same shape allocates nothing. Mark/Rewind
// free a layer's scratch for the next layer within a step (addresses repeat step after step).
// Thread safety: none; one step at a time.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "afd/tensor/allocator.h"
#include "afd/tensor/tensor.h"

namespace afd {

class Workspace {
 public:
  // `allocator` must outlive the workspace.
  explicit Workspace(Allocator& allocator, size_t initial_bytes = 0);
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // A contiguous tensor of `shape`, 256-byte aligned, contents unspecified, valid until Reset.
  Tensor Take(DType dtype, const std::vector<int64_t>& shape);
  // Releases every tensor taken since the last Reset (their memory is reused).
  void Reset();
  // A position in the arena: Rewind(mark) releases what was taken after Mark() (stack order),
  // so a layer's scratch is reused by the next layer. Tensors taken before the mark stay.
  struct Mark {
    size_t chunk = 0;
    size_t offset = 0;
    size_t used = 0;
  };
  Mark mark() const;
  void Rewind(const Mark& mark);
  // Makes sure a step needing up to `bytes` takes no new chunk (call between steps).
  void Reserve(size_t bytes);

  size_t used() const { return used_; }              // bytes taken this step
  size_t high_water() const { return high_water_; }  // most bytes any step took
  size_t capacity() const;                           // bytes held in chunks
  int64_t chunk_allocations() const { return chunk_allocations_; }

 private:
  struct Chunk {
    std::shared_ptr<void> memory;
    size_t size = 0;
    size_t offset = 0;
  };
  void AddChunk(size_t bytes);

  Allocator& allocator_;
  std::vector<Chunk> chunks_;
  size_t current_ = 0;  // the chunk Take allocates from
  size_t used_ = 0;
  size_t high_water_ = 0;
  int64_t chunk_allocations_ = 0;
};

}  // namespace afd
