#include "afd/tensor/workspace.h"

#include <algorithm>

#include "afd/common/error.h"

namespace afd {

namespace {
constexpr size_t kAlign = 256;
size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

Workspace::Workspace(Allocator& allocator, size_t initial_bytes) : allocator_(allocator) {
  if (initial_bytes > 0) AddChunk(initial_bytes);
}

void Workspace::AddChunk(size_t bytes) {
  Chunk c;
  c.size = AlignUp(std::max<size_t>(bytes, kAlign));
  c.memory = allocator_.Allocate(c.size);
  chunks_.push_back(std::move(c));
  ++chunk_allocations_;
}

Tensor Workspace::Take(DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    AFD_CHECK(s >= 0, "workspace: negative size {}", s);
    n *= s;
  }
  const size_t bytes = AlignUp(static_cast<size_t>(n) * DTypeSize(dtype));
  // The next chunk with room (chunks after a Rewind are empty again), or a new one.
  while (current_ < chunks_.size() && chunks_[current_].offset + bytes > chunks_[current_].size) {
    ++current_;
    if (current_ < chunks_.size()) chunks_[current_].offset = 0;
  }
  if (current_ >= chunks_.size()) {
    // Grow geometrically so that a growing step takes few chunks.
    AddChunk(std::max(bytes, capacity()));
    current_ = chunks_.size() - 1;
  }
  Chunk& c = chunks_[current_];
  void* p = static_cast<char*>(c.memory.get()) + c.offset;
  c.offset += bytes;
  used_ += bytes;
  high_water_ = std::max(high_water_, used_);
  return Tensor(p, dtype, shape, allocator_.device());
}

void Workspace::Reset() {
  if (chunks_.size() > 1) {
    chunks_.clear();
    AddChunk(high_water_);
  }
  for (Chunk& c : chunks_) c.offset = 0;
  current_ = 0;
  used_ = 0;
}

Workspace::Mark Workspace::mark() const {
  if (chunks_.empty()) return {0, 0, used_};
  const size_t chunk = std::min(current_, chunks_.size() - 1);
  return {chunk, chunks_[chunk].offset, used_};
}

void Workspace::Rewind(const Mark& m) {
  AFD_CHECK(m.used <= used_, "workspace: rewind to a mark ahead of the arena ({} > {} bytes)",
            m.used, used_);
  if (chunks_.empty()) return;
  current_ = m.chunk;
  chunks_[current_].offset = m.offset;
  for (size_t i = current_ + 1; i < chunks_.size(); ++i) chunks_[i].offset = 0;
  used_ = m.used;
}

void Workspace::Reserve(size_t bytes) {
  AFD_CHECK(used_ == 0, "workspace: Reserve inside a step ({} bytes taken)", used_);
  if (capacity() >= bytes && chunks_.size() <= 1) return;
  chunks_.clear();
  AddChunk(std::max(bytes, high_water_));
  current_ = 0;
}

size_t Workspace::capacity() const {
  size_t total = 0;
  for (const Chunk& c : chunks_) total += c.size;
  return total;
}

}  // namespace afd
