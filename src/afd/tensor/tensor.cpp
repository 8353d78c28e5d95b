#include "afd/tensor/tensor.h"

#include <cstdlib>
#include <cstring>

#include "afd/common/error.h"

namespace afd {

std::string Device::ToString() const {
  return type == DeviceType::kCpu ? "cpu" : fmt::format("cuda:{}", index);
}

Tensor::Tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device,
               std::shared_ptr<void> owner)
    : Tensor(data, dtype, std::vector<int64_t>(shape), device, std::move(owner)) {}

Tensor::Tensor(void* data, DType dtype, const std::vector<int64_t>& shape, Device device,
               std::shared_ptr<void> owner)
    : data_(data), dtype_(dtype), device_(device), owner_(std::move(owner)) {
  AFD_CHECK(shape.size() <= kMaxDims, "tensor: {} dimensions, at most {}", shape.size(), kMaxDims);
  ndim_ = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int i = ndim_ - 1; i >= 0; --i) {
    AFD_CHECK(shape[i] >= 0, "tensor: negative size {} in dimension {}", shape[i], i);
    shape_[i] = shape[i];
    stride_[i] = stride;
    stride *= shape[i];
  }
}

Tensor Tensor::HostZeros(DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  const size_t bytes = (static_cast<size_t>(n) * DTypeSize(dtype) + 63) / 64 * 64 + 64;
  void* p = std::aligned_alloc(64, bytes);
  AFD_CHECK(p != nullptr, "cannot allocate {} bytes of host memory", bytes);
  std::memset(p, 0, bytes);
  std::shared_ptr<void> owner(p, [](void* q) { std::free(q); });
  return Tensor(p, dtype, shape, Device::Cpu(), std::move(owner));
}

int64_t Tensor::dim(int i) const {
  const int j = i < 0 ? i + ndim_ : i;
  AFD_CHECK(j >= 0 && j < ndim_, "tensor: no dimension {} in {}", i, ToString());
  return shape_[j];
}

int64_t Tensor::stride(int i) const {
  const int j = i < 0 ? i + ndim_ : i;
  AFD_CHECK(j >= 0 && j < ndim_, "tensor: no dimension {} in {}", i, ToString());
  return stride_[j];
}

std::vector<int64_t> Tensor::shape() const {
  return std::vector<int64_t>(shape_.begin(), shape_.begin() + ndim_);
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= shape_[i];
  return ndim_ == 0 && data_ == nullptr ? 0 : n;
}

bool Tensor::is_contiguous() const {
  int64_t stride = 1;
  for (int i = ndim_ - 1; i >= 0; --i) {
    if (shape_[i] != 1 && stride_[i] != stride) return false;
    stride *= shape_[i];
  }
  return true;
}

Tensor Tensor::Rows(int64_t begin, int64_t count) const {
  AFD_CHECK(ndim_ >= 1 && begin >= 0 && count >= 0 && begin + count <= shape_[0],
            "tensor: rows [{}, {}) outside {}", begin, begin + count, ToString());
  Tensor t = *this;
  t.shape_[0] = count;
  t.data_ = static_cast<char*>(data_) + begin * stride_[0] * DTypeSize(dtype_);
  return t;
}

Tensor Tensor::Reshape(const std::vector<int64_t>& shape) const {
  AFD_CHECK(is_contiguous(), "tensor: reshape of a non-contiguous {}", ToString());
  std::vector<int64_t> s = shape;
  int64_t known = 1, free_dim = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      AFD_CHECK(free_dim < 0, "tensor: two -1 in a reshape of {}", ToString());
      free_dim = static_cast<int64_t>(i);
    } else {
      known *= s[i];
    }
  }
  if (free_dim >= 0) s[free_dim] = known == 0 ? 0 : numel() / known;
  Tensor t(data_, dtype_, s, device_, owner_);
  AFD_CHECK(t.numel() == numel(), "tensor: cannot reshape {} to {} elements", ToString(),
            t.numel());
  return t;
}

void Tensor::Expect(const char* what, DType dtype, const std::vector<int64_t>& shape) const {
  bool ok = dtype_ == dtype && ndim_ == static_cast<int>(shape.size());
  for (int i = 0; ok && i < ndim_; ++i) ok = shape[i] < 0 || shape[i] == shape_[i];
  if (ok) return;
  std::string want;
  for (size_t i = 0; i < shape.size(); ++i) {
    want += (i ? ", " : "") + (shape[i] < 0 ? std::string("*") : std::to_string(shape[i]));
  }
  AFD_THROW("{}: expected {}[{}], got {}", what, DTypeName(dtype), want, ToString());
}

std::string Tensor::ToString() const {
  std::string dims;
  for (int i = 0; i < ndim_; ++i) dims += (i ? ", " : "") + std::to_string(shape_[i]);
  return fmt::format("{}[{}] on {}", DTypeName(dtype_), dims, device_.ToString());
}

}  // namespace afd
