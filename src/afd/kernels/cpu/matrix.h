// A weight matrix: [rows, cols] row-major, rows = output features (the PyTorch nn.Linear layout,
// y = x · Wᵀ). Elements are fp32 or bf16. The storage is shared and immutable once built: a
// Matrix either owns a buffer or views memory kept alive by `keep_alive` (e.g. a memory-mapped
// checkpoint), so copies are cheap and never copy the elements.
// Thread safety: const methods may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>

#include "afd/kernels/cpu/dtype.h"

namespace afd::kernels {

class Matrix {
 public:
  Matrix() = default;
  // A zero-filled matrix of `dtype` (kF32 or kBf16) owning its storage; fill via mutable_data().
  static Matrix Allocate(DType dtype, int64_t rows, int64_t cols);
  // Views `data` (kF32 or kBf16 elements, row-major) without copying; `keep_alive` owns it.
  static Matrix View(DType dtype, int64_t rows, int64_t cols, const void* data,
                     std::shared_ptr<const void> keep_alive);

  DType dtype() const { return dtype_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t size() const { return rows_ * cols_; }
  bool empty() const { return data_ == nullptr; }
  const void* data() const { return data_; }
  // Only for matrices made by Allocate, before they are shared.
  void* mutable_data() const { return const_cast<void*>(data_); }
  // fp32 elements; the matrix must be kF32.
  const float* f32() const;

  // dst[0, n) = elements of rows [r0, r0 + n_rows) converted to fp32 (n = n_rows * cols).
  void RowsToF32(int64_t r0, int64_t n_rows, float* dst) const;
  // The rows [r0, r0 + n_rows) as a Matrix sharing this storage.
  Matrix RowSlice(int64_t r0, int64_t n_rows) const;

 private:
  DType dtype_ = DType::kF32;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  const void* data_ = nullptr;
  std::shared_ptr<const void> keep_alive_;
};

}  // namespace afd::kernels
