// A StepRunner that replays a captured CUDA graph of the whole forward step for decode-sized
// batches (Backend::BeginCapture/EndCapture), and runs everything else eagerly.
//
// Graphs: one per (batch bucket, block-table width, cache). A step of n tokens whose logits
// rows are all n rows in order (decode steps, and small prefills that want every row) runs in
// the smallest bucket >= n of `sizes` (like vLLM's capture sizes): its inputs are padded to the
// bucket and uploaded into the graph's own input tensors (stable addresses, taken once from the
// graph's own Workspace), then the graph replays. Padding rows: token 0 at position 0 of the
// first sequence with cache slot -1 (writes nothing); their logits are computed and dropped.
// The block-table width is the step's longest table rounded up to a power of two (>= 4 blocks),
// so a graph serves every context up to it. A graph is captured the first time its key is seen,
// after one eager warm-up run of the same padded shapes (which sizes the backend's scratch).
// Graphs point into the cache they were captured with: a step on another cache drops them.
//
// Padding changes the batch a kernel sees, not a row's arithmetic on the paths that are
// batch-invariant; eager (enforce_eager, or a backend without graphs) and graph replay give
// identical results for a batch that fills its bucket.
// Thread safety: one Forward at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "afd/runtime/generator.h"

namespace afd::runtime {

struct CudaGraphOptions {
  std::vector<int64_t> sizes;  // capture sizes (batch buckets); empty: DefaultCudaGraphSizes()
  bool enforce_eager = false;  // never capture: every step runs eagerly
};

// 1, 2, 4, 8, then every multiple of 8 up to 64, every multiple of 16 up to 128 and of 32 up to
// 256 (vLLM's idea: small steps between small sizes, where padding costs most).
std::vector<int64_t> DefaultCudaGraphSizes();

// A graph's per-step inputs live in one device buffer, uploaded with one copy per step (byte
// offsets; the i64 parts first, so every part is 8-aligned): positions [B] i64 | slot_mapping
// [B] i64 | token_ids [B] i32 | seq_index [B] i32 | block_tables [B, width] i32.
struct PackedStepInputs {
  int64_t bucket = 0, width = 0;
  int64_t bytes() const { return bucket * (8 + 8 + 4 + 4 + 4) + bucket * width * 4; }
  int64_t positions() const { return 0; }
  int64_t slots() const { return 8 * bucket; }
  int64_t ids() const { return 16 * bucket; }
  int64_t seq_index() const { return 20 * bucket; }
  int64_t tables() const { return 24 * bucket; }
  int64_t id_source() const { return 24 * bucket + 4 * bucket * width; }  // TakeIds reads it
};
// `batch` (n <= bucket tokens, block-table rows at most `width` blocks) padded to the bucket in
// that layout into `out` (resized): padding rows are token 0 at position 0 of row 0 with slot
// -1 (no cache write) and id source -1, padding table entries block 0.
void PackStepInputs(const model::ForwardBatch& batch, const PackedStepInputs& layout,
                    std::vector<char>& out);

// What a graph captures: the forward step on inputs already on the device. The default is the
// in-process model (every expert here); the AFD attention role plugs in its step, whose MoE
// exchange runs on the device (roles/async_attention.h).
class GraphedStep {
 public:
  virtual ~GraphedStep() = default;
  // A step no graph serves (a prefill, a batch above the largest size), eagerly.
  virtual Tensor Eager(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                       Workspace& ws) = 0;
  // The captured body: logits [in.n, vocab] of every row (in.n is the bucket); waits for nothing.
  virtual Tensor Body(const model::StepInputs& in, kv::PagedKvCache& cache, Workspace& ws) = 0;
  // Called once per step before anything runs: `bucket` is the graph size the batch fits (0: it
  // runs eagerly). Returns the size to replay (0: eagerly; else one of the capture sizes >= the
  // batch's): a step whose ranks must agree (P2P data parallelism) decides it with them here.
  virtual int64_t Plan(const model::ForwardBatch& /*batch*/, int64_t bucket) { return bucket; }
  // Around the capture of one graph (its warm-up run before, which runs, is not inside); the
  // returned token is passed to Replayed after every replay of that graph.
  virtual void BeginCapture() {}
  virtual int EndCapture() { return 0; }
  virtual void Replayed(int /*token*/) {}
};

class CudaGraphRunner : public StepRunner {
 public:
  // `model` must outlive the runner and hold every expert. Throws afd::Error for a size < 1.
  CudaGraphRunner(const model::MoeModel& model, CudaGraphOptions options);
  // The graphs capture `step` (which must outlive the runner) instead of the in-process model.
  CudaGraphRunner(const model::MoeModel& model, GraphedStep& step, CudaGraphOptions options);
  ~CudaGraphRunner() override;

  Tensor Forward(const model::ForwardBatch& batch, kv::PagedKvCache& cache, Workspace& ws) override;
  bool TakesDeviceIds() const override { return true; }

  int64_t graph_steps() const { return graph_steps_; }  // steps replayed from a graph
  int64_t eager_steps() const { return eager_steps_; }
  int64_t num_captures() const { return num_captures_; }

 private:
  struct Graph;
  // (bucket, block-table width in blocks)
  using Key = std::tuple<int64_t, int64_t>;
  Graph& GraphFor(int64_t bucket, int64_t width, kv::PagedKvCache& cache);

  // The in-process step (the default GraphedStep).
  class LocalStep : public GraphedStep {
   public:
    explicit LocalStep(const model::MoeModel& model) : model_(model), moe_(model) {}
    Tensor Eager(const model::ForwardBatch& batch, kv::PagedKvCache& cache,
                 Workspace& ws) override {
      return model_.Forward(batch, cache, moe_, ws);
    }
    Tensor Body(const model::StepInputs& in, kv::PagedKvCache& cache, Workspace& ws) override {
      return model_.ForwardInputs(in, cache, moe_, ws);
    }

   private:
    const model::MoeModel& model_;
    model::LocalMoeBackend moe_;
  };

  const model::MoeModel& model_;
  std::unique_ptr<LocalStep> local_;  // null when a step was given
  GraphedStep& step_;
  std::vector<int64_t> sizes_;  // ascending, unique
  bool enforce_eager_;
  // The cache the graphs were captured with: its first and last layers' addresses.
  std::pair<const void*, const void*> cache_memory_ = {nullptr, nullptr};
  std::map<Key, std::unique_ptr<Graph>> graphs_;
  // Host staging of a step's padded inputs, laid out as the graph's packed inputs (reused).
  std::vector<char> packed_;
  int64_t graph_steps_ = 0, eager_steps_ = 0, num_captures_ = 0;
};

}  // namespace afd::runtime
