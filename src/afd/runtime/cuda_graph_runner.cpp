#include "afd/runtime/cuda_graph_runner.h"

#include <algorithm>
#include <cstring>

#include "afd/common/error.h"

namespace afd::runtime {

namespace {

// The smallest block-table width (in blocks) a graph is captured with.
constexpr int64_t kMinWidth = 4;

}  // namespace

struct CudaGraphRunner::Graph {
  explicit Graph(Allocator& allocator) : ws(allocator) {}
  Workspace ws;          // the graph's tensors; never Reset after capture
  model::StepInputs in;  // [bucket] inputs the graph reads; block tables [bucket, width]
  Tensor packed;         // the memory of in's per-step inputs (PackedStepInputs)
  Tensor logits;         // [bucket, vocab] the graph writes
  std::unique_ptr<kernels::OpGraph> graph;
  int token = 0;  // GraphedStep::EndCapture's
};

std::vector<int64_t> DefaultCudaGraphSizes() {
  std::vector<int64_t> s = {1, 2, 4};
  for (int64_t b = 8; b <= 64; b += 8) s.push_back(b);
  for (int64_t b = 80; b <= 128; b += 16) s.push_back(b);
  for (int64_t b = 160; b <= 256; b += 32) s.push_back(b);
  return s;
}

void PackStepInputs(const model::ForwardBatch& batch, const PackedStepInputs& layout,
                    std::vector<char>& out) {
  const int64_t n = batch.size(), bucket = layout.bucket, width = layout.width;
  AFD_CHECK(n <= bucket && static_cast<int64_t>(batch.block_tables.size()) <= bucket,
            "graph inputs: {} tokens ({} block-table rows) in a bucket of {}", n,
            batch.block_tables.size(), bucket);
  out.assign(layout.bytes(), 0);
  char* base = out.data();
  const auto put = [](char* dst, const auto& v) {
    if (!v.empty()) std::memcpy(dst, v.data(), v.size() * sizeof(v[0]));
  };
  put(base + layout.positions(), batch.positions);
  put(base + layout.slots(), batch.slot_mapping);
  put(base + layout.slots() + 8 * n, std::vector<int64_t>(bucket - n, -1));
  put(base + layout.ids(), batch.token_ids);
  put(base + layout.seq_index(), batch.seq_index);
  if (batch.id_source.empty()) {
    std::memset(base + layout.id_source(), 0xff, 4 * bucket);  // -1: every id is in ids
  } else {
    put(base + layout.id_source(), batch.id_source);
    put(base + layout.id_source() + 4 * n, std::vector<int32_t>(bucket - n, -1));
  }
  for (size_t r = 0; r < batch.block_tables.size(); ++r) {
    AFD_CHECK(static_cast<int64_t>(batch.block_tables[r].size()) <= width,
              "graph inputs: block-table row {} has {} blocks, the graph {}", r,
              batch.block_tables[r].size(), width);
    put(base + layout.tables() + 4 * width * static_cast<int64_t>(r), batch.block_tables[r]);
  }
}

CudaGraphRunner::CudaGraphRunner(const model::MoeModel& model, CudaGraphOptions options)
    : model_(model),
      local_(std::make_unique<LocalStep>(model)),
      step_(*local_),
      sizes_(options.sizes.empty() ? DefaultCudaGraphSizes() : options.sizes),
      enforce_eager_(options.enforce_eager || !model.backend().SupportsGraphs()) {
  for (int64_t s : sizes_) AFD_CHECK(s >= 1, "--cuda-graph-sizes: size {} must be >= 1", s);
  std::sort(sizes_.begin(), sizes_.end());
  sizes_.erase(std::unique(sizes_.begin(), sizes_.end()), sizes_.end());
}

CudaGraphRunner::CudaGraphRunner(const model::MoeModel& model, GraphedStep& step,
                                 CudaGraphOptions options)
    : model_(model),
      step_(step),
      sizes_(options.sizes.empty() ? DefaultCudaGraphSizes() : options.sizes),
      enforce_eager_(options.enforce_eager || !model.backend().SupportsGraphs()) {
  for (int64_t s : sizes_) AFD_CHECK(s >= 1, "--cuda-graph-sizes: size {} must be >= 1", s);
  std::sort(sizes_.begin(), sizes_.end());
  sizes_.erase(std::unique(sizes_.begin(), sizes_.end()), sizes_.end());
}

CudaGraphRunner::~CudaGraphRunner() = default;

CudaGraphRunner::Graph& CudaGraphRunner::GraphFor(int64_t bucket, int64_t width,
                                                  kv::PagedKvCache& cache) {
  std::unique_ptr<Graph>& slot = graphs_[Key{bucket, width}];
  if (slot) return *slot;
  kernels::Backend& backend = model_.backend();
  auto g = std::make_unique<Graph>(backend);
  // Inputs that are valid for any cache: token 0 at position 0 of row 0 (block 0), no write.
  const PackedStepInputs layout{bucket, width};
  std::vector<char> init;
  PackStepInputs(model::ForwardBatch{}, layout, init);
  std::vector<int32_t> rows(bucket);
  for (int64_t i = 0; i < bucket; ++i) rows[i] = static_cast<int32_t>(i);
  auto take_inputs = [&] {
    model::StepInputs& in = g->in;
    in.n = bucket;
    g->packed = g->ws.Take(DType::kI32, {layout.bytes() / 4});
    char* base = static_cast<char*>(g->packed.data());
    const Device dev = g->packed.device();
    const std::shared_ptr<void>& owner = g->packed.owner();
    in.attn.positions = Tensor(base + layout.positions(), DType::kI64, {bucket}, dev, owner);
    in.attn.slot_mapping = Tensor(base + layout.slots(), DType::kI64, {bucket}, dev, owner);
    in.token_ids = Tensor(base + layout.ids(), DType::kI32, {bucket}, dev, owner);
    in.attn.seq_index = Tensor(base + layout.seq_index(), DType::kI32, {bucket}, dev, owner);
    in.attn.block_tables = Tensor(base + layout.tables(), DType::kI32, {bucket, width}, dev, owner);
    in.attn.block_size = cache.block_size();
    in.attn.max_context = width * cache.block_size();
    in.logits_rows = g->ws.Take(DType::kI32, {bucket});
    backend.CopyToDevice(g->packed, init.data());
    backend.CopyToDevice(in.logits_rows, rows.data());
  };
  // Warm-up: sizes the workspace and the backend's scratch for these shapes, builds the
  // expert pointer tables; then the workspace is merged into one chunk and taken again.
  take_inputs();
  step_.Body(g->in, cache, g->ws);
  backend.Synchronize();
  g->ws.Reset();
  take_inputs();
  backend.Synchronize();
  step_.BeginCapture();
  backend.BeginCapture();
  try {
    g->logits = step_.Body(g->in, cache, g->ws);
  } catch (...) {
    backend.EndCapture();
    step_.EndCapture();
    throw;
  }
  g->graph = backend.EndCapture();
  g->token = step_.EndCapture();
  ++num_captures_;
  slot = std::move(g);
  return *slot;
}

Tensor CudaGraphRunner::Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                                Workspace& ws) {
  const int64_t n = batch.size();
  bool graphable = !enforce_eager_ && n > 0 && n <= sizes_.back() &&
                   static_cast<int64_t>(batch.logits_rows.size()) == n;
  for (int64_t i = 0; graphable && i < n; ++i) graphable = batch.logits_rows[i] == i;
  const int64_t fits = graphable ? *std::lower_bound(sizes_.begin(), sizes_.end(), n) : 0;
  const int64_t bucket = step_.Plan(batch, fits);
  if (bucket == 0) {
    ++eager_steps_;
    return step_.Eager(batch, cache, ws);
  }
  AFD_CHECK(graphable && bucket >= fits && std::binary_search(sizes_.begin(), sizes_.end(), bucket),
            "graph runner: the step planned a graph of {} rows for a batch of {} tokens ({})",
            bucket, n, graphable ? "not a capture size at least the batch's" : "not graphable");
  model_.CheckBatch(batch, cache);
  // The first and last layers' addresses identify the cache's memory and its layer stride.
  const std::pair<const void*, const void*> memory = {
      cache.Layer(0).data(), cache.Layer(model_.config().num_hidden_layers - 1).data()};
  if (memory != cache_memory_) {  // graphs hold the old cache's addresses
    model_.backend().Synchronize();
    graphs_.clear();
    cache_memory_ = memory;
  }
  int64_t needed = 1;
  for (const auto& t : batch.block_tables) needed = std::max<int64_t>(needed, t.size());
  int64_t width = kMinWidth;
  while (width < needed) width *= 2;
  Graph& g = GraphFor(bucket, width, cache);

  // The step's inputs, padded to the bucket (padding rows: token 0 at position 0, no cache
  // write), in one host buffer and one upload.
  PackStepInputs(batch, PackedStepInputs{bucket, width}, packed_);
  kernels::Backend& backend = model_.backend();
  backend.CopyToDevice(g.packed, packed_.data());
  if (!batch.id_source.empty()) {  // ids the previous step sampled, still on the device only
    const Tensor source(
        static_cast<char*>(g.packed.data()) + PackedStepInputs{bucket, width}.id_source(),
        DType::kI32, {n}, g.packed.device(), g.packed.owner());
    backend.TakeIds(batch.ids_from, source, g.in.token_ids.Rows(0, n));
  }
  g.graph->Replay();
  step_.Replayed(g.token);
  model::MoeModel::CommitBatch(batch, cache);
  ++graph_steps_;  // ws is not used: the graph's tensors live in its own workspace
  return g.logits.Rows(0, n);
}

}  // namespace afd::runtime
