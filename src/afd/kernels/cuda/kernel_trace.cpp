#include "afd/kernels/cuda/kernel_trace.h"

#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

#include "afd/common/error.h"

namespace afd::kernels::cuda {
namespace {

// The few CUPTI entry points the trace uses, from libcupti loaded at run time (no link-time
// dependency: a build without the library still runs everything else).
struct Cupti {
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc,
                                    CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*dropped)(CUcontext, uint32_t, size_t*) = nullptr;
  CUptiResult (*result_string)(CUptiResult, const char**) = nullptr;
};

constexpr size_t kBufferBytes = size_t{16} << 20;

std::mutex g_mu;
std::vector<KernelSpan> g_spans;  // records completed so far (under g_mu)
std::string g_error;              // a record CUPTI could not hand back (under g_mu)
bool g_on = false;

const Cupti& Library() {
  static const Cupti cupti = [] {
    void* lib = nullptr;
    std::string tried;
    for (const char* name : {"libcupti.so.13", "libcupti.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
      tried += fmt::format(" {}: {};", name, dlerror());
    }
    AFD_CHECK(lib != nullptr,
              "kernel trace: cannot load CUDA's CUPTI library ({} put the folder of "
              "libcupti.so.13, e.g. the CUDA toolkit's lib or extras/CUPTI/lib64, on "
              "LD_LIBRARY_PATH)",
              tried);
    Cupti c;
    auto sym = [lib](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      AFD_CHECK(fn != nullptr, "kernel trace: libcupti has no {}", name);
    };
    sym(c.register_callbacks, "cuptiActivityRegisterCallbacks");
    sym(c.enable, "cuptiActivityEnable");
    sym(c.disable, "cuptiActivityDisable");
    sym(c.flush_all, "cuptiActivityFlushAll");
    sym(c.next_record, "cuptiActivityGetNextRecord");
    sym(c.dropped, "cuptiActivityGetNumDroppedRecords");
    sym(c.result_string, "cuptiGetResultString");
    return c;
  }();
  return cupti;
}

void Check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* text = "unknown error";
  Library().result_string(r, &text);
  AFD_THROW("kernel trace: {}: {}", what, text);
}

// "void afd::kernels::cuda::(anonymous namespace)::GemvBf16<4, true, false>(float const*, ...)"
// -> "GemvBf16<4, true, false>": the parameter list, the return type and the scopes dropped.
std::string ShortName(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && demangled != nullptr ? demangled : mangled;
  std::free(demangled);
  if (!s.empty() && s.back() == ')') {  // the parameter list: back to its opening parenthesis
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      depth += s[i] == ')' ? 1 : s[i] == '(' ? -1 : 0;
      if (depth == 0) {
        s.resize(i);
        break;
      }
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  size_t begin = 0;
  int depth = 0;
  for (size_t i = 0; i + 1 < s.size(); ++i) {  // the last scope outside template arguments
    depth += s[i] == '<' ? 1 : s[i] == '>' ? -1 : 0;
    if (depth == 0 && s[i] == ':' && s[i + 1] == ':') begin = i + 2;
  }
  s.erase(0, begin);
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<KernelSpan> spans;
  CUpti_Activity* record = nullptr;
  CUptiResult r = CUPTI_SUCCESS;
  while ((r = Library().next_record(buffer, valid, &record)) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
      continue;
    }
    // The fields read here sit at the same offsets in every CUpti_ActivityKernel version.
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    KernelSpan span;
    span.name = ShortName(k->name != nullptr ? k->name : "?");
    span.stream = k->streamId;
    span.graph = k->graphId;
    span.launch = k->correlationId;
    span.start_ns = k->start;
    span.end_ns = k->end;
    spans.push_back(std::move(span));
  }
  std::free(buffer);
  const std::lock_guard<std::mutex> lock(g_mu);
  if (r != CUPTI_ERROR_MAX_LIMIT_REACHED && g_error.empty()) {
    const char* text = "unknown error";
    Library().result_string(r, &text);
    g_error = fmt::format("reading an activity record: {}", text);
  }
  g_spans.insert(g_spans.end(), std::make_move_iterator(spans.begin()),
                 std::make_move_iterator(spans.end()));
}

}  // namespace

void StartKernelTrace() {
  const Cupti& c = Library();
  static const bool registered = [&c] {
    Check(c.register_callbacks(BufferRequested, BufferCompleted), "cuptiActivityRegisterCallbacks");
    return true;
  }();
  (void)registered;
  AFD_CHECK(!g_on, "kernel trace: already on");
  {
    const std::lock_guard<std::mutex> lock(g_mu);
    g_spans.clear();
    g_error.clear();
  }
  Check(c.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  g_on = true;
}

std::vector<KernelSpan> StopKernelTrace() {
  AFD_CHECK(g_on, "kernel trace: not on");
  const Cupti& c = Library();
  g_on = false;
  Check(c.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  Check(c.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityDisable");
  size_t dropped = 0;
  Check(c.dropped(nullptr, 0, &dropped), "cuptiActivityGetNumDroppedRecords");
  std::vector<KernelSpan> spans;
  std::string error;
  {
    const std::lock_guard<std::mutex> lock(g_mu);
    spans.swap(g_spans);
    error.swap(g_error);
  }
  AFD_CHECK(error.empty(), "kernel trace: {}", error);
  AFD_CHECK(dropped == 0, "kernel trace: CUPTI dropped {} kernel records", dropped);
  std::stable_sort(spans.begin(), spans.end(), [](const KernelSpan& a, const KernelSpan& b) {
    return a.start_ns < b.start_ns;
  });
  return spans;
}

bool KernelTraceOn() { return g_on; }

}  // namespace afd::kernels::cuda
