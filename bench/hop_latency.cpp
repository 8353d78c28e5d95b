// Latency of the primitives of one async-connector hop on one GPU, in one process (CUDA builds):
// the pieces of issue 12's round trip, each timed alone (median / p10 / p90 us over --iters):
//   kernel+sync      a one-thread kernel, then cudaStreamSynchronize
//   memcpy+sync      a device-to-device cudaMemcpyAsync of N bytes, then cudaStreamSynchronize
//                    (the host-flags send)
//   memcpy+value     the copy, then cuStreamWriteValue64 into a host-mapped flag; until the
//                    host sees the flag (the device-flags send)
//   wait+hop         the stream waits for a host-mapped flag (StreamFlags::Wait), then the copy
//                    and the flag store; from the host storing the awaited flag (the stream
//                    waiting already) until it sees the stored one (a receiver's reaction plus
//                    a hop)
// Usage: hop_latency_bench [--iters n] [--bytes 4096,65536,524288,2097152]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "afd/connector/cuda/flag_kernels.h"
#include "afd/connector/cuda/stream_flags.h"

namespace {

using Clock = std::chrono::steady_clock;

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "hop_latency_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Spins until *flag >= value (bounded: 1 s).
void SpinUntil(const volatile uint64_t* flag, uint64_t value) {
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  while (*flag < value) {
    if (Clock::now() > deadline) {
      std::fprintf(stderr, "hop_latency_bench: a flag never arrived (%llu < %llu)\n",
                   static_cast<unsigned long long>(*flag), static_cast<unsigned long long>(value));
      std::exit(1);
    }
  }
}

void Report(const char* name, size_t bytes, std::vector<double> us) {
  std::sort(us.begin(), us.end());
  std::printf("%-14s %9zu B   median %7.2f us   p10 %7.2f   p90 %7.2f\n", name, bytes,
              us[us.size() / 2], us[us.size() / 10], us[us.size() * 9 / 10]);
}

// Times `one(i)` (i = 1, 2, ...) `iters` times after 20 warm-ups; `one` returns its own
// start time when it is not the call itself.
void Time(const char* name, size_t bytes, int iters,
          const std::function<Clock::time_point(uint64_t)>& one) {
  std::vector<double> us;
  for (int i = 0; i < iters + 20; ++i) {
    const Clock::time_point start = one(static_cast<uint64_t>(i) + 1);
    const double t = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (i >= 20) us.push_back(t);
  }
  Report(name, bytes, std::move(us));
}

std::vector<size_t> ParseSizes(const char* s) {
  std::vector<size_t> out;
  std::string v(s);
  size_t pos = 0;
  while (pos <= v.size()) {
    const size_t comma = v.find(',', pos);
    out.push_back(std::stoull(v.substr(pos, comma - pos)));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace afd::connector;
  int iters = 300;
  std::vector<size_t> sizes = {4096, 65536, 524288, 2097152};
  for (int i = 1; i < argc; i += 2) {
    const bool known = std::strcmp(argv[i], "--iters") == 0 || std::strcmp(argv[i], "--bytes") == 0;
    if (!known || i + 1 >= argc) {
      std::fprintf(stderr, "hop_latency_bench: %s: expected --iters N or --bytes A,B,...\n",
                   argv[i]);
      return 2;
    }
    try {
      if (std::strcmp(argv[i], "--iters") == 0) iters = std::stoi(argv[i + 1]);
      if (std::strcmp(argv[i], "--bytes") == 0) sizes = ParseSizes(argv[i + 1]);
    } catch (const std::exception&) {
      std::fprintf(stderr, "hop_latency_bench: %s %s: not a number\n", argv[i], argv[i + 1]);
      return 2;
    }
  }
  if (iters < 10 || sizes.empty()) {
    std::fprintf(stderr, "hop_latency_bench: --iters must be at least 10 (is %d)\n", iters);
    return 2;
  }
  Check(cudaSetDevice(0), "cudaSetDevice");
  std::string why;
  std::unique_ptr<StreamFlags> flags = StreamFlags::Create(0, &why);
  if (!flags) {
    std::fprintf(stderr, "hop_latency_bench: no stream flags: %s\n", why.c_str());
    return 1;
  }
  // Host flags: [0] stored by the device, [8] stored by the host (awaited by the stream).
  auto* page = static_cast<uint64_t*>(std::aligned_alloc(4096, 4096));
  std::memset(page, 0, 4096);
  flags->Register(reinterpret_cast<char*>(page), 4096, "the bench's flag page");
  volatile uint64_t* device_set = page;
  volatile uint64_t* host_set = page + 8;
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  const size_t most = *std::max_element(sizes.begin(), sizes.end());
  char *src = nullptr, *dst = nullptr;
  uint64_t* device_flag = nullptr;
  Check(cudaMalloc(&src, most), "cudaMalloc");
  Check(cudaMalloc(&dst, most), "cudaMalloc");
  Check(cudaMalloc(&device_flag, 8), "cudaMalloc");
  Check(cudaMemset(src, 1, most), "cudaMemset");
  uint64_t seq = 0;  // of device_set, across every measurement
  uint64_t host_seq = 0;
  std::printf("hop latency on cuda:0, %d iterations each\n", iters);
  Time("kernel+sync", 0, iters, [&](uint64_t i) {
    const auto start = Clock::now();
    if (!LaunchStoreFlag(stream, device_flag, i)) {
      std::fprintf(stderr, "hop_latency_bench: the flag kernel failed to launch\n");
      std::exit(1);
    }
    Check(cudaStreamSynchronize(stream), "sync");
    return start;
  });
  for (size_t bytes : sizes) {
    Time("memcpy+sync", bytes, iters, [&](uint64_t) {
      const auto start = Clock::now();
      Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "memcpy");
      Check(cudaStreamSynchronize(stream), "sync");
      return start;
    });
    Time("memcpy+value", bytes, iters, [&](uint64_t) {
      const auto start = Clock::now();
      Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "memcpy");
      flags->Write(stream, const_cast<uint64_t*>(device_set), ++seq);
      SpinUntil(device_set, seq);
      return start;
    });
    // The stream is already waiting when the host stores its flag: 30 us later.
    Time("wait+hop", bytes, iters, [&](uint64_t) {
      flags->Wait(stream, const_cast<uint64_t*>(host_set), ++host_seq);
      Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "memcpy");
      flags->Write(stream, const_cast<uint64_t*>(device_set), ++seq);
      std::this_thread::sleep_for(std::chrono::microseconds(30));
      const auto start = Clock::now();
      *host_set = host_seq;
      SpinUntil(device_set, seq);
      return start;
    });
  }
  Check(cudaStreamSynchronize(stream), "sync");
  std::vector<char> check(most);
  Check(cudaMemcpy(check.data(), dst, most, cudaMemcpyDeviceToHost), "check copy");
  for (char c : check) {
    if (c != 1) {
      std::fprintf(stderr, "hop_latency_bench: the copied bytes differ\n");
      return 1;
    }
  }
  std::printf("copies checked\n");
  return 0;
}
