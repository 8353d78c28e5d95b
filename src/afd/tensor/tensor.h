// Tensor: a view of elements in one device's memory -- data pointer, dtype, shape, strides (in
// elements), device -- plus an optional shared owner of that memory. Copies are cheap and share
// the elements; nothing here reads or writes them (that is a Backend's job), so the same type
// describes host and GPU memory.
// Invariants: ndim <= kMaxDims; a default-constructed Tensor is empty (null data, ndim 0).
// Thread safety: const methods may be called from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "afd/common/dtype.h"
#include "afd/tensor/device.h"

namespace afd {

class Tensor {
 public:
  static constexpr int kMaxDims = 4;

  Tensor() = default;
  // A contiguous (row-major) view; `owner` keeps the memory alive (may be null for a view).
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = {},
         std::shared_ptr<void> owner = {});
  Tensor(void* data, DType dtype, const std::vector<int64_t>& shape, Device device = {},
         std::shared_ptr<void> owner = {});

  // Owning host tensor, zero-filled, 64-byte aligned.
  static Tensor HostZeros(DType dtype, const std::vector<int64_t>& shape);

  bool empty() const { return data_ == nullptr; }
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  // Size of dimension i; negative i counts from the end.
  int64_t dim(int i) const;
  int64_t stride(int i) const;
  std::vector<int64_t> shape() const;
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  bool is_contiguous() const;
  const std::shared_ptr<void>& owner() const { return owner_; }

  // Rows [begin, begin + count) of dimension 0, sharing the memory and the owner.
  Tensor Rows(int64_t begin, int64_t count) const;
  // The same elements with another shape (contiguous only; same numel; one -1 allowed).
  Tensor Reshape(const std::vector<int64_t>& shape) const;
  // Checks dtype and shape (-1 matches any size); throws afd::Error naming `what`.
  void Expect(const char* what, DType dtype, const std::vector<int64_t>& shape) const;
  // "bfloat16[4, 2048] on cpu".
  std::string ToString() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_;
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> stride_{};
  std::shared_ptr<void> owner_;
};

}  // namespace afd
