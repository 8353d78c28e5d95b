#include "afd/kernels/cpu/matrix.h"

#include <cstdlib>

#include "afd/common/error.h"

namespace afd::kernels {

Matrix Matrix::Allocate(DType dtype, int64_t rows, int64_t cols) {
  AFD_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "Matrix: dtype {} is not stored",
            DTypeName(dtype));
  AFD_CHECK(rows >= 0 && cols >= 0, "Matrix: bad shape [{}, {}]", rows, cols);
  const size_t bytes = static_cast<size_t>(rows) * cols * DTypeSize(dtype);
  // 64-byte aligned, zero-filled; freed when the last copy goes away.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  AFD_CHECK(p != nullptr, "Matrix: cannot allocate {} bytes for [{}, {}]", bytes, rows, cols);
  std::memset(p, 0, bytes);
  Matrix m;
  m.dtype_ = dtype;
  m.rows_ = rows;
  m.cols_ = cols;
  m.data_ = p;
  m.keep_alive_ =
      std::shared_ptr<const void>(p, [](const void* q) { std::free(const_cast<void*>(q)); });
  return m;
}

Matrix Matrix::View(DType dtype, int64_t rows, int64_t cols, const void* data,
                    std::shared_ptr<const void> keep_alive) {
  AFD_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "Matrix: cannot view {} elements",
            DTypeName(dtype));
  Matrix m;
  m.dtype_ = dtype;
  m.rows_ = rows;
  m.cols_ = cols;
  m.data_ = data;
  m.keep_alive_ = std::move(keep_alive);
  return m;
}

const float* Matrix::f32() const {
  AFD_CHECK(dtype_ == DType::kF32, "Matrix: fp32 access to a {} matrix", DTypeName(dtype_));
  return static_cast<const float*>(data_);
}

void Matrix::RowsToF32(int64_t r0, int64_t n_rows, float* dst) const {
  AFD_CHECK(r0 >= 0 && n_rows >= 0 && r0 + n_rows <= rows_, "Matrix: rows [{}, {}) out of {}", r0,
            r0 + n_rows, rows_);
  const char* src = static_cast<const char*>(data_) + r0 * cols_ * DTypeSize(dtype_);
  ConvertToF32(dtype_, src, n_rows * cols_, dst);
}

Matrix Matrix::RowSlice(int64_t r0, int64_t n_rows) const {
  AFD_CHECK(r0 >= 0 && n_rows >= 0 && r0 + n_rows <= rows_, "Matrix: rows [{}, {}) out of {}", r0,
            r0 + n_rows, rows_);
  Matrix m = *this;
  m.rows_ = n_rows;
  m.data_ = static_cast<const char*>(data_) + r0 * cols_ * DTypeSize(dtype_);
  return m;
}

}  // namespace afd::kernels
