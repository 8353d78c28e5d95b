// Device memory for tensors. A Backend is an Allocator for its device.
// Thread safety: implementations must allow concurrent Allocate calls.
#pragma once

#include <cstddef>
#include <memory>

#include "afd/tensor/device.h"

namespace afd {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // `bytes` of this device's memory, 256-byte aligned, freed when the last owner goes away.
  // Contents are unspecified. Throws afd::Error naming the device and size when out of memory.
  virtual std::shared_ptr<void> Allocate(size_t bytes) = 0;
};

}  // namespace afd
