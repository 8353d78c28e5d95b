#include "afd/connector/async_connector.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "afd/common/deadline.h"
#include "afd/common/error.h"
#include "afd/common/fp8_rows.h"
#include "afd/common/thread_annotations.h"
#include "afd/connector/shm_window.h"
#include "afd/topology/expert_range.h"
#ifdef AFD_WITH_CUDA
#include <cuda_runtime.h>

#include "afd/connector/cuda/cuda_ipc_window.h"
#ifdef AFD_WITH_NCCL
#include "afd/connector/cuda/nccl_window.h"
#endif
#endif

namespace afd::connector {

namespace {

// The largest of the values the ranks `from` (store key, rank's name) published under
// `prefix`: each must parse and lie in lo..`hi` (`hi_text` in errors), else the rank is named.
int64_t LargestPublished(comm::PrefixStore& store, double timeout, const std::string& what,
                         const std::vector<std::pair<std::string, std::string>>& from, int64_t lo,
                         int64_t hi, const std::string& hi_text) {
  int64_t largest = lo;
  for (const auto& [key, name] : from) {
    const std::string v = store.Get(key, timeout);
    int64_t n = 0;
    try {
      n = std::stoll(v);
    } catch (const std::exception&) {
      AFD_THROW("async connector: {} published the {} \"{}\"", name, what, v);
    }
    AFD_CHECK(n >= lo && n <= hi, "async connector: {} published the {} {}, outside {}..{}", name,
              what, n, lo, hi_text);
    largest = std::max(largest, n);
  }
  return largest;
}

// The largest token capacity of the attention ranks: each publishes its own.
int64_t AgreeTokenCap(comm::AfdWorld& world, int64_t mine) {
  comm::PrefixStore store(world.store(), "async_window/token_cap");
  if (world.self().role == Role::kAttention) {
    AFD_CHECK(mine >= 1,
              "async connector: attention rank {} has no token capacity (set "
              "--max-num-batched-tokens)",
              world.self().rank);
    store.Set(std::to_string(world.self().rank), std::to_string(mine));
  }
  std::vector<std::pair<std::string, std::string>> from;
  for (int a = 0; a < world.topology().num_attention(); ++a) {
    from.emplace_back(std::to_string(a), fmt::format("attention rank {}", a));
  }
  return LargestPublished(store, world.config().afd_process_group_timeout_s, "token capacity", from,
                          1, int64_t{1} << 24, "2^24");
}

// The ring depth of every window: the deepest any rank asks for (an attention rank's stages in
// flight: 2 with --enable-dbo, or async_moe_num_ubatches), so ranks started with different
// flags (an FFN command without --enable-dbo) still lay their windows out alike.
int AgreeRingDepth(comm::AfdWorld& world, int mine) {
  comm::PrefixStore store(world.store(), "async_window/ring_depth");
  store.Set(std::to_string(world.world_rank()), std::to_string(mine));
  std::vector<std::pair<std::string, std::string>> from;
  for (int w = 0; w < world.topology().world_size(); ++w) {
    from.emplace_back(std::to_string(w), world.Describe(w));
  }
  return static_cast<int>(LargestPublished(store, world.config().afd_process_group_timeout_s,
                                           "ring depth", from, 1, 64, "64"));
}

}  // namespace

AsyncConnector::AsyncConnector(comm::AfdWorld& world, const AsyncConnectorOptions& o)
    : world_(world), options_(o) {
  const AfdConfig& c = world.config();
  AFD_CHECK(c.is_async(), "AsyncConnector with connector {}", c.connector);
  const Topology& t = world.topology();
  const int A = t.num_attention(), F = t.num_ffn();
  AFD_CHECK(o.topk >= 1 && o.num_experts >= o.topk && o.row.elems_per_row >= 1,
            "async connector: bad model shape (topk {}, experts {}, row of {})", o.topk,
            o.num_experts, o.row.elems_per_row);
  SlotCapacity cap;
  cap.token_cap = AgreeTokenCap(world, o.token_cap);
  cap.max_local_experts = (o.num_experts + F - 1) / F;
  // Every (token, expert) pair a rank can own (the per-pair replies of the MoE exchange); the
  // index table holds a dispatch's ids and weights (2 * tokens * topk).
  cap.routed_cap = cap.token_cap * std::min<int64_t>(o.topk, cap.max_local_experts);
  cap.table_cap = std::max(cap.routed_cap, 2 * cap.token_cap * o.topk);
  cap.shared_cap = (cap.token_cap + F - 1) / F;
  cap.row_bytes = o.row.row_bytes();
  // Room for an FP8 dispatch's group scales whatever the sender's dispatch_dtype (the layout,
  // and so the window size, does not depend on it; the flags say what a slot holds).
  cap.scale_cap = cap.token_cap * AfdFp8Groups(o.row.elems_per_row);
  layout_ =
      SlotLayout::Make(cap, std::max(A, F), AgreeRingDepth(world, c.async_options.ring_depth));

  std::vector<int> peers;
  for (int p = 0; p < num_peers(); ++p) peers.push_back(OppositeWorldRank(p));
  std::unique_ptr<ShmWindow> shm = ShmWindow::Create(world, layout_.window_bytes, peers);
  shm_ = shm.get();
  window_ = std::move(shm);
  const bool device_rows = c.connector == kGpuAsyncConnector || o.cuda_device >= 0;
  if (device_rows) {
#ifdef AFD_WITH_CUDA
    AFD_CHECK(o.cuda_device >= 0,
              "afd.connector {}: this rank runs on the CPU; GPU windows need --device cuda",
              c.connector);
    std::unique_ptr<DeviceRowWindow> rows;
    if (c.async_options.window == "nccl") {
#ifdef AFD_WITH_NCCL
      rows = NcclWindow::Create(world, layout_.window_bytes, peers, o.cuda_device);
#else
      AFD_THROW(
          "afd.connector_extra_config.window \"nccl\": this build has no NCCL (its header or "
          "library was not found when it was built); use window \"cuda_ipc\"");
#endif
    } else {
      rows = CudaIpcWindow::Create(world, layout_.window_bytes, peers, o.cuda_device);
    }
    if (o.cuda_stream != nullptr) {
      std::string why;
      // Stream flags: the kernel form's own bound comes after the watchdog's (WatchDeviceWaits),
      // which names the peer. Device sequencing: the kernels' own bound comes first (0.75 of the
      // timeout), so that a host waiting for the stream (Backend::WatchWaits, whose check calls
      // CheckDevice) names the peer before its own deadline.
      const double timeout = world.config().afd_process_group_timeout_s;
      stream_flags_ = StreamFlags::Create(o.cuda_device, &why,
                                          o.device_sequenced ? 0.75 * timeout : 2 * timeout);
      if (stream_flags_) {
        rows->UseStream(o.cuda_stream);
        if (o.device_sequenced) {
          RegisterSlotPages(peers);
          device_seqs_ = stream_flags_->DeviceCounters(2 * static_cast<size_t>(num_peers()) *
                                                       layout_.ring_depth);
        } else {
          // The flag pages of this rank's copy (awaited) and of every peer's (stored into).
          const size_t page = 4096;
          const size_t flag_bytes =
              std::min(layout_.window_bytes, (layout_.flags_bytes + page - 1) / page * page);
          std::vector<int> mapped = peers;
          mapped.push_back(world.world_rank());
          for (int w : mapped) {
            stream_flags_->Register(shm_->mapping(w), flag_bytes, shm_->Describe(w));
          }
        }
      } else {
        fmt::print(stderr, "{}: flags stay on the host ({})\n", world.Describe(world.world_rank()),
                   why);
      }
    }
    data_window_ = std::move(rows);
#else
    AFD_THROW(
        "afd.connector {}: its CUDA IPC windows are not part of this build (no CUDA); CPU "
        "processes use AsyncAFDConnector (POSIX shared memory windows)",
        c.connector);
#endif
  }
  send_seq_.assign(static_cast<size_t>(num_peers()) * layout_.ring_depth, 0);
  seen_.assign(static_cast<size_t>(layout_.num_regions) * layout_.ring_depth, 0);
  device_wait_.assign(seen_.size(), 0);
  claimed_.assign(seen_.size(), 0);
  if (stream_flags_) {
    watched_seq_ = std::make_unique<std::atomic<uint64_t>[]>(seen_.size());
    watched_since_ = std::make_unique<std::atomic<int64_t>[]>(seen_.size());
    for (size_t i = 0; i < seen_.size(); ++i) watched_seq_[i] = 0;
    for (int p = 0; p < num_peers(); ++p) peer_names_.push_back(PeerName(p));
    watchdog_ = std::thread([this] { WatchDeviceWaits(); });
  }
  finished_ = std::make_unique<std::atomic<bool>[]>(num_peers());
  for (int p = 0; p < num_peers(); ++p) finished_[p] = false;
}

void AsyncConnector::PeerFinished(int peer) {
  AFD_CHECK(peer >= 0 && peer < num_peers(), "async connector: peer {} outside [0, {})", peer,
            num_peers());
  finished_[peer] = true;
}

#ifdef AFD_WITH_CUDA
// The pages the device kernels touch: in this rank's copy the flags and every peer's slot
// headers (awaited and checked), in each peer's copy the flags and this rank's slot headers
// (published), each as page-aligned runs.
void AsyncConnector::RegisterSlotPages(const std::vector<int>& peers) {
  const size_t page = 4096, header_bytes = sizeof(SlotHeader);
  const auto register_runs = [&](int w, const std::vector<int>& regions) {
    std::vector<size_t> pages;
    for (size_t p = 0; p * page < layout_.flags_bytes; ++p) pages.push_back(p);
    for (int r : regions) {
      for (int ring = 0; ring < layout_.ring_depth; ++ring) {
        const size_t at = layout_.slot_offset(r, ring) + layout_.header;
        for (size_t p = at / page; p * page < at + header_bytes; ++p) pages.push_back(p);
      }
    }
    std::sort(pages.begin(), pages.end());
    pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
    for (size_t i = 0; i < pages.size();) {
      size_t j = i + 1;
      while (j < pages.size() && pages[j] == pages[j - 1] + 1) ++j;
      const size_t begin = pages[i] * page;
      const size_t end = std::min(layout_.window_bytes, pages[j - 1] * page + page);
      stream_flags_->Register(shm_->mapping(w) + begin, end - begin, shm_->Describe(w));
      i = j;
    }
  };
  std::vector<int> all;
  for (int p = 0; p < num_peers(); ++p) all.push_back(p);
  register_runs(world_.world_rank(), all);
  for (int w : peers) register_runs(w, {world_.self().rank});
}

char* AsyncConnector::DeviceMirror(int world_rank) const {
  char* base = static_cast<DeviceRowWindow*>(data_window_.get())->mapping(world_rank);
  AFD_CHECK(base != nullptr, "async connector: the device window of {} is not mapped",
            world_.Describe(world_rank));
  return base;
}

void AsyncConnector::PublishOnDevice(int peer, int w, size_t slot, const std::vector<char>& header,
                                     bool echo_received, int ring) {
  const size_t i = static_cast<size_t>(peer) * layout_.ring_depth + ring;
  // The echo from the mirror of the slot being answered (device memory: no bus round trip).
  const auto* echo =
      echo_received ? reinterpret_cast<const uint64_t*>(DeviceMirror(world_.world_rank()) +
                                                        layout_.slot_offset(peer, ring) +
                                                        layout_.header + offsetof(SlotHeader, seq))
                    : nullptr;
  const size_t flag = layout_.flag_offset(world_.self().rank, ring);
  char* mirror = DeviceMirror(w);
  stream_flags_->Publish(options_.cuda_stream, shm_->mapping(w) + slot + layout_.header,
                         reinterpret_cast<uint64_t*>(shm_->mapping(w) + flag),
                         mirror + slot + layout_.header, reinterpret_cast<uint64_t*>(mirror + flag),
                         header.data(), device_seqs_ + i, echo);
}

void AsyncConnector::CheckDevice() const {
  if (!stream_flags_ || !device_seqs_) return;
  const DeviceSlotStatus& st = stream_flags_->status();
  const uint32_t code = __atomic_load_n(&st.code, __ATOMIC_ACQUIRE);
  if (code == DeviceSlotStatus::kOk) return;
  const std::string me = world_.Describe(world_.world_rank());
  const double timeout = world_.config().afd_process_group_timeout_s;
  const std::string peer = st.region >= 0 && st.region < num_peers()
                               ? PeerName(st.region)
                               : fmt::format("region {}", st.region);
  switch (code) {
    case DeviceSlotStatus::kTimeout:
      AFD_THROW(
          "{} timed out after {}s: its CUDA stream waited for the reply of {} to layer {} (ring "
          "{}: "
          "flag still {}, awaited {})",
          me, timeout, peer, st.layer, st.ring, st.flag, st.awaited);
    case DeviceSlotStatus::kJump:
      AFD_THROW(
          "{}: the reply of {} to layer {} (ring {}): flag jumped to {}, awaited {}: the slot was "
          "overwritten before it was read",
          me, peer, st.layer, st.ring, st.flag, st.awaited);
    case DeviceSlotStatus::kHeader:
      AFD_THROW("{}: {} answered layer {} (ring {}, seq {}) with {} {}, {} expected", me, peer,
                st.layer, st.ring, st.awaited, DeviceSlotFieldName(st.field), st.got, st.want);
    case DeviceSlotStatus::kAborted:
      AFD_THROW("{} exited while {} waited for its replies on the device", peer, me);
    default:
      AFD_THROW("{}: a device wait failed with code {}", me, code);
  }
}
#else
void AsyncConnector::RegisterSlotPages(const std::vector<int>&) {}
void AsyncConnector::PublishOnDevice(int, int, size_t, const std::vector<char>&, bool, int) {
  AFD_THROW("async connector: device sequencing needs a CUDA build");
}
void AsyncConnector::CheckDevice() const {}
#endif

std::string AsyncConnector::DescribeState() const {
  const int R = layout_.ring_depth, P = num_peers(), me = world_.world_rank();
  const size_t n = static_cast<size_t>(P) * R;
  std::vector<uint64_t> device(2 * n, 0), mirror_here(n, 0), mirror_there(n, 0);
  std::string device_note = "no device counters";
#ifdef AFD_WITH_CUDA
  if (device_seqs_ != nullptr) {
    // A stream of its own that waits for no other: this rank's stream may be stuck in a wait.
    cudaStream_t s = nullptr;
    device_note = "device reads failed";
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess) {
      bool ok = cudaMemcpyAsync(device.data(), device_seqs_, 16 * n, cudaMemcpyDeviceToHost, s) ==
                cudaSuccess;
      for (int p = 0; p < P && ok; ++p) {
        for (int r = 0; r < R && ok; ++r) {
          const size_t i = static_cast<size_t>(p) * R + r;
          ok = cudaMemcpyAsync(&mirror_here[i], DeviceMirror(me) + layout_.flag_offset(p, r), 8,
                               cudaMemcpyDeviceToHost, s) == cudaSuccess &&
               cudaMemcpyAsync(
                   &mirror_there[i],
                   DeviceMirror(OppositeWorldRank(p)) + layout_.flag_offset(world_.self().rank, r),
                   8, cudaMemcpyDeviceToHost, s) == cudaSuccess;
        }
      }
      const Deadline deadline = Deadline::In(1.0);
      cudaError_t q = cudaErrorNotReady;
      while (ok && (q = cudaStreamQuery(s)) == cudaErrorNotReady && !deadline.expired()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (ok && q == cudaSuccess) device_note = "device counters read";
      if (q != cudaErrorNotReady) cudaStreamDestroy(s);  // else left: it may still write
    }
    const cudaError_t idle = cudaStreamQuery(static_cast<cudaStream_t>(options_.cuda_stream));
    device_note += idle == cudaSuccess         ? ", stream idle"
                   : idle == cudaErrorNotReady ? ", stream busy"
                                               : ", stream error";
  }
#endif
  const bool have_device = device_note.rfind("device counters read", 0) == 0;
  std::string out = fmt::format("{} async connector state ({}):", world_.Describe(me), device_note);
  for (int p = 0; p < P; ++p) {
    for (int r = 0; r < R; ++r) {
      const size_t i = static_cast<size_t>(p) * R + r;
      uint64_t here = 0;
      window_->ReadFlags(layout_.flag_offset(p, r), std::span<uint64_t>(&here, 1));
      uint64_t there = 0;
      if (shm_ != nullptr) {
        std::memcpy(
            &there,
            shm_->mapping(OppositeWorldRank(p)) + layout_.flag_offset(world_.self().rank, r), 8);
      }
      out += fmt::format(
          "\n  {} ring {}: sent {}, consumed {}, awaited {}, claimed {}; flag here {}, there {}",
          PeerName(p), r, send_seq_[i], seen_[i], device_wait_[i], claimed_[i], here, there);
      if (have_device) {
        out += fmt::format("; device sent {}, seen {}, mirror here {}, there {}", device[i],
                           device[n + i], mirror_here[i], mirror_there[i]);
      }
    }
  }
  return out;
}

void AsyncConnector::BeginCapture() {
  AFD_CHECK(device_sequenced() && !capturing_,
            "async connector: a graph capture needs device sequencing{}",
            capturing_ ? " (and is already capturing)" : "");
  capture_base_.sends = send_seq_;
  capture_base_.waits = seen_;
  captured_stats_.clear();
  capturing_ = true;
}

AsyncConnector::Captured AsyncConnector::EndCapture() {
  AFD_CHECK(capturing_, "async connector: EndCapture without BeginCapture");
  capturing_ = false;
  Captured c;
  c.sends.resize(send_seq_.size());
  c.waits.resize(seen_.size());
  for (size_t i = 0; i < send_seq_.size(); ++i) c.sends[i] = send_seq_[i] - capture_base_.sends[i];
  for (size_t i = 0; i < seen_.size(); ++i) c.waits[i] = seen_[i] - capture_base_.waits[i];
  send_seq_ = capture_base_.sends;
  seen_ = capture_base_.waits;
  c.stats = std::move(captured_stats_);
  captured_stats_.clear();
  return c;
}

void AsyncConnector::Replayed(const Captured& c) {
  AFD_CHECK(c.sends.size() == send_seq_.size() && c.waits.size() == seen_.size(),
            "async connector: a replay of another connector's capture");
  for (size_t i = 0; i < send_seq_.size(); ++i) send_seq_[i] += c.sends[i];
  for (size_t i = 0; i < seen_.size(); ++i) {
    seen_[i] += c.waits[i];
    waits_enqueued_ += c.waits[i];
  }
  for (const Captured::Stat& st : c.stats) {
    LayerTransferStats& s = stats_[st.layer];
    s.messages += 1;
    s.bytes += st.bytes;
    s.tokens += st.tokens;
  }
}

AsyncConnector::~AsyncConnector() {
  if (watchdog_.joinable()) {
    {
      MutexLock lock(watchdog_mu_);
      watchdog_stop_ = true;
    }
    watchdog_cv_.notify_all();
    watchdog_.join();
  }
#ifdef AFD_WITH_CUDA
  if (stream_flags_) {
    // Device sequencing: fail any wait still pending (a failing deployment) so that the
    // stream drains.
    if (device_seqs_) stream_flags_->Abort(-1);
    ReleaseDeviceWaits();
  }
#endif
}

namespace {
int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void AsyncConnector::WatchDeviceWaits() {
  const double timeout = world_.config().afd_process_group_timeout_s;
  const auto timeout_ns = static_cast<int64_t>(timeout * 1e9);
  MutexLock lock(watchdog_mu_);
  bool aborted = false;  // device sequencing: the waits were failed
  while (!watchdog_stop_) {
    watchdog_cv_.wait_for(lock, std::chrono::milliseconds(50));
    if (watchdog_stop_ || device_wait_expired_ || aborted) continue;
    if (device_seqs_) {
#ifdef AFD_WITH_CUDA
      // Device sequencing: the kernels bound their own waits; a peer that exited while a wait
      // may still be pending fails them at once (CheckDevice names it). None pending (an FFN
      // rank, or every reply in): a peer's exit is not this rank's failure.
      const uint64_t done = __atomic_load_n(&stream_flags_->status().waits_done, __ATOMIC_ACQUIRE);
      if (waits_enqueued_.load() <= done) continue;
      for (int p = 0; p < num_peers(); ++p) {
        if (finished_[p] || !window_->PeerExited(OppositeWorldRank(p))) continue;
        stream_flags_->Abort(p);
        aborted = true;
        break;
      }
#endif
      continue;
    }
    const int64_t now = SteadyNanos();
    for (size_t i = 0; i < device_wait_.size(); ++i) {
      const uint64_t seq = watched_seq_[i].load();
      if (seq == 0 || now - watched_since_[i].load() < timeout_ns) continue;
      const int peer = static_cast<int>(i / static_cast<size_t>(layout_.ring_depth));
      const int ring = static_cast<int>(i % static_cast<size_t>(layout_.ring_depth));
      auto* flag =
          reinterpret_cast<volatile uint64_t*>(window_->local() + layout_.flag_offset(peer, ring));
      if (*flag >= seq) continue;  // it came; the host has not received it yet
      device_wait_failure_ = fmt::format(
          "{} timed out after {}s: its CUDA stream waited for the reply of {} (flag of region {} "
          "ring {} still {}, awaited {}); the stream's waits were released so that it drains",
          world_.Describe(world_.world_rank()), timeout, peer_names_[peer], peer, ring, *flag, seq);
      fmt::print(stderr, "async connector: {}\n", device_wait_failure_);
      // Release every pending wait: the stream (and a host sync behind it) must not hang.
      for (size_t j = 0; j < device_wait_.size(); ++j) {
        const uint64_t v = watched_seq_[j].load();
        if (v == 0) continue;
        const int pj = static_cast<int>(j / static_cast<size_t>(layout_.ring_depth));
        const int rj = static_cast<int>(j % static_cast<size_t>(layout_.ring_depth));
        auto* f =
            reinterpret_cast<volatile uint64_t*>(window_->local() + layout_.flag_offset(pj, rj));
        if (*f < v) *f = v;
      }
      device_wait_expired_ = true;
      break;
    }
  }
}

void AsyncConnector::ThrowIfDeviceWaitExpired() const {
  if (!device_wait_expired_.load()) return;
  MutexLock lock(watchdog_mu_);
  AFD_THROW("{}", device_wait_failure_);
}

void AsyncConnector::AwaitSlotOnDevice(int peer, int stage, uint64_t* seen, uint64_t seq,
                                       const uint64_t* echo_counter, const ExpectedSlot& expect) {
#ifdef AFD_WITH_CUDA
  DeviceSlotExpect e;
  e.flags = expect.flags;
  e.sender = peer;
  e.layer = expect.layer;
  e.stage = stage;
  e.num_tokens = expect.num_tokens;
  e.routed_rows = static_cast<int32_t>(expect.routed_rows);
  e.shared_rows = static_cast<int32_t>(expect.shared_rows);
  e.table_entries = static_cast<int32_t>(expect.table_entries);
  char* local = DeviceMirror(world_.world_rank());
  stream_flags_->AwaitSlot(
      options_.cuda_stream,
      reinterpret_cast<const uint64_t*>(local + layout_.flag_offset(peer, stage)),
      local + layout_.slot_offset(peer, stage) + layout_.header, seen, seq, echo_counter, e, peer,
      stage);
#else
  (void)peer, (void)stage, (void)seen, (void)seq, (void)echo_counter, (void)expect;
  AFD_THROW("async connector: device sequencing needs a CUDA build");
#endif
}

void AsyncConnector::EnqueueWait(int peer, int stage, const ExpectedSlot& expect) {
  AFD_CHECK(device_flags(), "async connector: EnqueueWait without device flags");
  AFD_CHECK(peer >= 0 && peer < num_peers() && stage >= 0 && stage < layout_.ring_depth,
            "async connector: wait for peer {} stage {} out of range", peer, stage);
  const size_t i = static_cast<size_t>(peer) * layout_.ring_depth + stage;
  if (device_seqs_) {
    AFD_CHECK(expect.flags & kSlotCombine,
              "async connector: a device-sequenced wait for {} ring {} needs the reply it expects "
              "(ExpectedSlot)",
              PeerName(peer), stage);
    const size_t sends = static_cast<size_t>(num_peers()) * layout_.ring_depth;
    AwaitSlotOnDevice(peer, stage, device_seqs_ + sends + i, 0, device_seqs_ + i, expect);
    ++seen_[i];  // the host's mirror
    if (!capturing_) ++waits_enqueued_;
    return;
  }
  AFD_CHECK(device_wait_[i] == 0,
            "async connector: a second wait on ring {} of {} before it was received", stage,
            PeerName(peer));
  device_wait_[i] = seen_[i] + 1;
  if (stream_flags_) {
    ThrowIfDeviceWaitExpired();
    watched_since_[i] = SteadyNanos();
    watched_seq_[i] = device_wait_[i];
    DeviceAwaitFlag(layout_.flag_offset(peer, stage), device_wait_[i]);
    return;
  }
  // Inline (CPU): the "stream" is this thread; the flag is consumed by Receive later.
  AwaitFlagOnHost(peer, stage, [] { return std::string("the reply"); });
}

void AsyncConnector::Claim(int peer, int stage, uint64_t seq, const ExpectedSlot& expect) {
  AFD_CHECK((device_sequenced() || options_.inline_flags) && !capturing_,
            "async connector: Claim needs device sequencing or inline flags, outside a capture");
  AFD_CHECK(peer >= 0 && peer < num_peers() && stage >= 0 && stage < layout_.ring_depth,
            "async connector: claim of peer {} stage {} out of range", peer, stage);
  const size_t i = static_cast<size_t>(peer) * layout_.ring_depth + stage;
  AFD_CHECK(claimed_[i] == 0 && seq == seen_[i] + 1,
            "async connector: a claim of seq {} of {} ring {} (last seen {}, claimed {}): only "
            "the next slot may be claimed, once",
            seq, PeerName(peer), stage, seen_[i], claimed_[i]);
  ThrowIfDeviceWaitExpired();
  if (!device_sequenced()) {
    // Inline flags (CPU): the "stream" is this thread: wait here, check as the device would.
    const auto what = [&] { return fmt::format("the claimed message {}", seq); };
    AwaitFlagOnHost(peer, stage, what);
    uint64_t flag = 0;
    window_->ReadFlags(layout_.flag_offset(peer, stage), std::span<uint64_t>(&flag, 1));
    const auto slot_name = [&] {
      return fmt::format("{} from {}: slot (region {}, ring {}) of {}", what(), PeerName(peer),
                         peer, stage, world_.Describe(world_.world_rank()));
    };
    AFD_CHECK(flag == seq, "{}: flag jumped from {} to {}", slot_name(), seq - 1, flag);
    SlotHeader h;
    std::memcpy(&h, window_->local() + layout_.slot_offset(peer, stage) + layout_.header,
                sizeof(h));
    ValidateSlotHeader(h, layout_, peer, seq, slot_name);
    const auto check = [&](const char* field, int64_t got, int64_t want) {
      AFD_CHECK(got == want, "{}: header {} is {}, the claim expects {}", slot_name(), field, got,
                want);
    };
    check("flags", h.flags, expect.flags);
    check("layer", h.layer, expect.layer);
    check("stage", h.stage, stage);
    check("num_tokens", h.num_tokens, expect.num_tokens);
    check("routed_rows", h.routed_rows, expect.routed_rows);
    check("shared_rows", h.shared_rows, expect.shared_rows);
    check("table_entries", h.table_entries, expect.table_entries);
    claimed_[i] = seq;
    return;
  }
  AwaitSlotOnDevice(peer, stage, nullptr, seq, nullptr, expect);
  claimed_[i] = seq;
  ++waits_enqueued_;
}

uint64_t AsyncConnector::SeenSeq(int peer, int stage) const {
  AFD_CHECK(peer >= 0 && peer < num_peers() && stage >= 0 && stage < layout_.ring_depth,
            "async connector: peer {} stage {} out of range", peer, stage);
  return seen_[static_cast<size_t>(peer) * layout_.ring_depth + stage];
}

void AsyncConnector::AwaitFlagOnHost(int peer, int stage, const Describe& what) {
  const double timeout = world_.config().afd_process_group_timeout_s;
  const size_t i = static_cast<size_t>(peer) * layout_.ring_depth + stage;
  const int hit = WaitForFlags(
      *window_, layout_.flag_offset(peer, stage), std::span<const uint64_t>(&seen_[i], 1), 0,
      Deadline::In(timeout),
      [&] { CheckPeers(fmt::format("waited for {} from {}", what(), PeerName(peer))); });
  AFD_CHECK(hit == 0,
            "{} timed out after {}s waiting for {} from {} (flag of region {} ring {} "
            "still {})",
            world_.Describe(world_.world_rank()), timeout, what(), PeerName(peer), peer, stage,
            seen_[i]);
}

#ifdef AFD_WITH_CUDA
// The store follows the row copies on the stream (fenced), into the receiver's host-window flag:
// its host polls it, its stream awaits it. (A copy of the flag in the receiver's device window
// for its stream to await was measured no faster on an H200: 29.6 vs 28.1 us per round trip.)
void AsyncConnector::DeviceStoreFlag(int w, size_t offset, uint64_t seq) {
  stream_flags_->Write(options_.cuda_stream, reinterpret_cast<uint64_t*>(shm_->mapping(w) + offset),
                       seq);
}

void AsyncConnector::DeviceAwaitFlag(size_t offset, uint64_t seq) {
  stream_flags_->Wait(options_.cuda_stream,
                      reinterpret_cast<const uint64_t*>(window_->local() + offset), seq);
}

// A stream may still wait for a flag that will never come (a failing deployment): store the
// awaited seqs into this rank's own flags so that it drains, then let the copies and flag stores
// enqueued so far finish before the registered pages go away.
void AsyncConnector::ReleaseDeviceWaits() {
  for (size_t i = 0; i < device_wait_.size(); ++i) {
    if (device_wait_[i] == 0) continue;
    auto* flag = reinterpret_cast<volatile uint64_t*>(window_->local() + 8 * i);
    if (*flag < device_wait_[i]) *flag = device_wait_[i];
  }
  try {
    data_window_->Flush();
  } catch (const std::exception& e) {
    fmt::print(stderr, "async connector: draining the stream at shutdown: {}\n", e.what());
  }
  stream_flags_.reset();
}
#else
void AsyncConnector::DeviceStoreFlag(int, size_t, uint64_t) {
  AFD_THROW("async connector: device flags need a CUDA build");
}
void AsyncConnector::DeviceAwaitFlag(size_t, uint64_t) {
  AFD_THROW("async connector: device flags need a CUDA build");
}
void AsyncConnector::ReleaseDeviceWaits() {}
#endif

AsyncConnector::RowViews AsyncConnector::RowsOf(int region, int ring) const {
  char* rows =
      (data_window_ ? data_window_->local() : window_->local()) + layout_.slot_offset(region, ring);
  return {rows + layout_.routed, rows + layout_.shared,
          reinterpret_cast<int32_t*>(rows + layout_.route),
          reinterpret_cast<float*>(rows + layout_.row_scales)};
}

AsyncConnector::RowViews AsyncConnector::PeerSlot(int peer, int ring) const {
  AFD_CHECK(peer >= 0 && peer < num_peers() && ring >= 0 && ring < layout_.ring_depth,
            "async connector: slot of peer {} ring {} (peers {}, ring depth {})", peer, ring,
            num_peers(), layout_.ring_depth);
  const int w = OppositeWorldRank(peer);
  char* base = nullptr;
#ifdef AFD_WITH_CUDA
  if (data_window_) base = static_cast<DeviceRowWindow*>(data_window_.get())->mapping(w);
#endif
  if (!data_window_) base = shm_->mapping(w);
  AFD_CHECK(base != nullptr, "async connector: the window of {} is not mapped", PeerName(peer));
  char* slot = base + layout_.slot_offset(world_.self().rank, ring);
  return {slot + layout_.routed, slot + layout_.shared,
          reinterpret_cast<int32_t*>(slot + layout_.route),
          reinterpret_cast<float*>(slot + layout_.row_scales)};
}

int AsyncConnector::num_peers() const {
  const Topology& t = world_.topology();
  return world_.self().role == Role::kAttention ? t.num_ffn() : t.num_attention();
}

int AsyncConnector::OppositeWorldRank(int peer) const {
  const Role other = world_.self().role == Role::kAttention ? Role::kFfn : Role::kAttention;
  return world_.topology().WorldRank({other, peer});
}

std::string AsyncConnector::PeerName(int peer) const {
  return world_.Describe(OppositeWorldRank(peer));
}

int64_t AsyncConnector::expert_begin(int f) const {
  return ExpertRangeOf(options_.num_experts, world_.topology().num_ffn(), f).begin;
}

int64_t AsyncConnector::num_local_experts(int f) const {
  return ExpertRangeOf(options_.num_experts, world_.topology().num_ffn(), f).size();
}

uint64_t AsyncConnector::Send(int peer, const SlotPayload& p) {
  ThrowIfDeviceWaitExpired();
  AFD_CHECK(peer >= 0 && peer < num_peers(), "async connector: peer {} outside [0, {})", peer,
            num_peers());
  AFD_CHECK(p.stage >= 0 && p.stage < layout_.ring_depth,
            "async connector: stage {} needs ring_depth > {} (it is {})", p.stage, p.stage,
            layout_.ring_depth);
  const SlotCapacity& cap = layout_.cap;
  // Worded only for an error: a send formats nothing.
  const auto me = [&] { return world_.Describe(world_.world_rank()); };
  const auto fits = [&](int64_t n, int64_t limit, const char* what) {
    AFD_CHECK(n <= limit,
              "async connector: {} {} for layer {} from {} to {} exceed the slot's capacity of "
              "{} (raise max_num_batched_tokens)",
              n, what, p.layer, me(), PeerName(peer), limit);
  };
  const int64_t routed_count = p.in_place ? p.routed_count : static_cast<int64_t>(p.route.size());
  const int64_t shared_count =
      p.in_place ? p.shared_count : static_cast<int64_t>(p.shared_index.size());
  const int64_t table_entries = p.in_place ? p.table_entries : static_cast<int64_t>(p.route.size());
  fits(routed_count, cap.routed_cap, "routed rows");
  fits(shared_count, cap.shared_cap, "shared rows");
  fits(table_entries, cap.table_cap, "index table entries");
  fits(p.num_tokens, cap.token_cap, "tokens");
  fits(static_cast<int64_t>(p.expert_counts.size()), cap.max_local_experts, "expert counts");

  const int region = world_.self().rank, ring = p.stage;
  AFD_CHECK(device_wait_[static_cast<size_t>(peer) * layout_.ring_depth + ring] == 0,
            "async connector: {} sends on ring {} to {} before it received the reply awaited "
            "there",
            me(), ring, PeerName(peer));
  uint64_t& seq = send_seq_[static_cast<size_t>(peer) * layout_.ring_depth + ring];
  ++seq;
  const int w = OppositeWorldRank(peer);
  const size_t slot = layout_.slot_offset(region, ring);
  std::vector<char>& header = header_;  // reused: no allocation per send
  header.resize(sizeof(SlotHeader) + 4 * p.expert_counts.size());
  SlotHeader h{};
  h.magic = kSlotMagic;
  h.version = kSlotVersion;
  h.flags = p.flags;
  h.sender = region;
  h.layer = p.layer;
  h.stage = p.stage;
  h.num_tokens = p.num_tokens;
  h.routed_rows = static_cast<int32_t>(routed_count);
  h.shared_rows = static_cast<int32_t>(shared_count);
  h.num_experts = static_cast<int32_t>(p.expert_counts.size());
  h.table_entries = static_cast<int32_t>(table_entries);
  h.seq = seq;
  h.echo_seq = p.echo_seq;
  std::memcpy(header.data(), &h, sizeof(h));
  if (!p.expert_counts.empty()) {
    std::memcpy(header.data() + sizeof(h), p.expert_counts.data(), 4 * p.expert_counts.size());
  }
  const size_t row = cap.row_bytes;
  Window& rows = data_window_ ? *data_window_ : *window_;
  if (device_seqs_ && !(p.flags & kSlotShutdown)) {
    AFD_CHECK(p.in_place && p.expert_counts.empty(),
              "async connector: with device sequencing a send is in place (the sender's ops "
              "wrote the slot)");
    PublishOnDevice(peer, w, slot, header, p.echo_received, ring);
    const uint64_t bytes = header.size() + p.payload_bytes;
    if (capturing_) {
      captured_stats_.push_back({p.layer, bytes, static_cast<uint64_t>(p.num_tokens)});
    } else {
      LayerTransferStats& s = stats_[p.layer];
      s.messages += 1;
      s.tokens += static_cast<uint64_t>(p.num_tokens);
      s.bytes += bytes;
    }
    return seq;
  }
  AFD_CHECK(!capturing_, "async connector: a shutdown send while capturing");
  if (!p.in_place) {
    rows.Write(w, slot + layout_.routed, p.routed_rows, row * p.route.size());
    rows.Write(w, slot + layout_.shared, p.shared_rows, row * p.shared_index.size());
    window_->Write(w, slot + layout_.route, p.route.data(), 4 * p.route.size());
    window_->Write(w, slot + layout_.shared_index, p.shared_index.data(),
                   4 * p.shared_index.size());
  }
  window_->Write(w, slot + layout_.header, header.data(), header.size());
  if (stream_flags_ && !(p.flags & kSlotShutdown)) {
    DeviceStoreFlag(w, layout_.flag_offset(region, ring), seq);  // after the copies, no wait
  } else {
    // Host flags (and a shutdown: every earlier device store of this stream lands first, so a
    // receiver never sees a ring's seqs out of order).
    rows.Flush();  // the rows have landed before the flag says so
    window_->WriteFlag(w, layout_.flag_offset(region, ring), seq);
  }
  if (p.flags & kSlotShutdown) return seq;
  LayerTransferStats& s = stats_[p.layer];
  s.messages += 1;
  s.tokens += static_cast<uint64_t>(p.num_tokens);
  if (p.in_place) {  // the rows as the sender wrote them (MoeExchangeBytes)
    s.bytes += header.size() + p.payload_bytes;
  } else {
    s.bytes += header.size() + (4 + row) * (p.route.size() + p.shared_index.size());
  }
  return seq;
}

ReceivedSlot AsyncConnector::Read(int region, int ring, uint64_t seq, const Describe& what) {
  // Worded only for an error: a receive formats nothing.
  const auto slot_name = [&] {
    return fmt::format("{}: slot (region {}, ring {}) of {} in {}", what(), region, ring,
                       world_.Describe(world_.world_rank()),
                       window_->Describe(world_.world_rank()));
  };
  uint64_t& seen = seen_[static_cast<size_t>(region) * layout_.ring_depth + ring];
  AFD_CHECK(seq == seen + 1,
            "{}: flag jumped from {} to {}: the sender overwrote a slot before it was read (its "
            "messages in flight exceed ring_depth {})",
            slot_name(), seen, seq, layout_.ring_depth);
  seen = seq;
  char* base = window_->local() + layout_.slot_offset(region, ring);
  ReceivedSlot r;
  std::memcpy(&r.header, base + layout_.header, sizeof(SlotHeader));
  ValidateSlotHeader(r.header, layout_, region, seq, slot_name);
  AFD_CHECK(r.header.stage == ring, "{}: header stage {} in ring slot {}", slot_name(),
            r.header.stage, ring);
  r.expert_counts = reinterpret_cast<const int32_t*>(base + layout_.header + sizeof(SlotHeader));
  r.route = reinterpret_cast<const int32_t*>(base + layout_.route);
  const RowViews rows = RowsOf(region, ring);
  r.routed_rows = rows.routed;
  r.shared_index = reinterpret_cast<const int32_t*>(base + layout_.shared_index);
  r.shared_rows = rows.shared;
  if (r.shutdown()) PeerFinished(region);
  return r;
}

void AsyncConnector::CheckPeers(const std::string& what) {
  // An abort first: a peer that failed published its cause before it exited.
  world_.CheckAbort();
  for (int p = 0; p < num_peers(); ++p) {
    if (finished_[p]) continue;
    AFD_CHECK(!window_->PeerExited(OppositeWorldRank(p)), "{} exited while {} {}", PeerName(p),
              world_.Describe(world_.world_rank()), what);
  }
}

ReceivedSlot AsyncConnector::Receive(int peer, int stage, const Describe& what) {
  AFD_CHECK(peer >= 0 && peer < num_peers() && stage >= 0 && stage < layout_.ring_depth,
            "async connector: receive from peer {} stage {} out of range", peer, stage);
  const auto start = std::chrono::steady_clock::now();
  const size_t i = static_cast<size_t>(peer) * layout_.ring_depth + stage;
  ThrowIfDeviceWaitExpired();  // a released wait's flag is not the peer's
  AwaitFlagOnHost(peer, stage, what);
  ThrowIfDeviceWaitExpired();
  uint64_t seq = 0;
  window_->ReadFlags(layout_.flag_offset(peer, stage), std::span<uint64_t>(&seq, 1));
  ReceivedSlot r = Read(peer, stage, seq, what);
  device_wait_[i] = 0;
  if (watched_seq_) watched_seq_[i] = 0;
  if (!r.shutdown()) {
    stats_[r.header.layer].seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return r;
}

std::optional<ReceivedSlot> AsyncConnector::Poll(int timeout_ms) {
  ThrowIfDeviceWaitExpired();
  const int n = static_cast<int>(seen_.size());
  const int hit = WaitForFlags(*window_, 0, seen_, poll_start_, Deadline::In(timeout_ms / 1e3),
                               [&] { CheckPeers("polled for work"); });
  if (hit < 0) {
    CheckPeers("polled for work");
    return std::nullopt;
  }
  poll_start_ = (hit + 1) % n;  // rotate: no sender is favoured
  const int region = hit / layout_.ring_depth, ring = hit % layout_.ring_depth;
  AFD_CHECK(region < num_peers(),
            "async connector: a flag changed in region {}, but only {} "
            "peers may write this window",
            region, num_peers());
  uint64_t seq = 0;
  window_->ReadFlags(layout_.flag_offset(region, ring), std::span<uint64_t>(&seq, 1));
  const size_t i = static_cast<size_t>(region) * layout_.ring_depth + ring;
  if (claimed_[i] != 0) {
    // Claimed by a device wait (Claim): its header was checked there, and the slot may
    // already hold the sender's next message (when the device served the claimed one before
    // this poll), so it is not read here; a next message is returned by the next poll.
    AFD_CHECK(seq >= claimed_[i],
              "async connector: slot (region {}, ring {}) moved to seq {}, below the claimed {}",
              region, ring, seq, claimed_[i]);
    ReceivedSlot r;
    r.claimed = true;
    r.header.sender = region;
    r.header.stage = ring;
    r.header.seq = claimed_[i];
    seen_[i] = claimed_[i];
    claimed_[i] = 0;
    return r;
  }
  return Read(region, ring, seq, [&] { return fmt::format("work from {}", PeerName(region)); });
}

std::optional<ReceivedSlot> AsyncConnector::TryReceive(int peer, int stage) {
  AFD_CHECK(peer >= 0 && peer < num_peers() && stage >= 0 && stage < layout_.ring_depth,
            "async connector: try-receive from peer {} stage {} out of range", peer, stage);
  ThrowIfDeviceWaitExpired();
  const size_t i = static_cast<size_t>(peer) * layout_.ring_depth + stage;
  AFD_CHECK(claimed_[i] == 0,
            "async connector: try-receive of slot (region {}, ring {}), which a device wait "
            "claimed (seq {})",
            peer, stage, claimed_[i]);
  uint64_t seq = 0;
  window_->ReadFlags(layout_.flag_offset(peer, stage), std::span<uint64_t>(&seq, 1));
  if (seq == seen_[i]) return std::nullopt;
  return Read(peer, stage, seq, [&] { return fmt::format("work from {}", PeerName(peer)); });
}

void AsyncConnector::AnnounceShutdown() {
  for (int p = 0; p < num_peers(); ++p) {
    SlotPayload s;
    s.flags = kSlotShutdown | (world_.self().role == Role::kFfn ? kSlotCombine : 0);
    Send(p, s);
  }
}

}  // namespace afd::connector
