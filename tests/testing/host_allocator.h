// Host memory for tests that need an Allocator without a backend, counting what it hands out.
#pragma once

#include <cstdlib>
#include <memory>

#include "afd/tensor/allocator.h"

namespace afd::testing_util {

class CountingAllocator : public Allocator {
 public:
  Device device() const override { return Device::Cpu(); }
  std::shared_ptr<void> Allocate(size_t bytes) override {
    ++calls;
    total += bytes;
    // 256-byte aligned, as the Allocator contract says.
    return std::shared_ptr<void>(std::aligned_alloc(256, (bytes + 255) / 256 * 256),
                                 [](void* p) { std::free(p); });
  }
  int calls = 0;
  size_t total = 0;
};

}  // namespace afd::testing_util
