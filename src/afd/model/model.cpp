#include "afd/model/model.h"

#include <algorithm>
#include <map>

#include "afd/common/error.h"
#include "afd/model/router.h"

namespace afd::model {

StepInputs StepInputs::Slice(int64_t begin, int64_t count) const {
  StepInputs s = *this;
  s.n = count;
  s.token_ids = token_ids.Rows(begin, count);
  s.attn.positions = attn.positions.Rows(begin, count);
  s.attn.seq_index = attn.seq_index.Rows(begin, count);
  s.attn.slot_mapping = attn.slot_mapping.Rows(begin, count);
  s.logits_rows = Tensor();
  return s;
}

MoeModel::MoeModel(ModelConfig config, ModelWeights weights, kernels::Backend& backend)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      backend_(backend),
      rope_(config_),
      router_spec_(RouterSpecOf(config_)) {
  AFD_CHECK(static_cast<int64_t>(weights_.layers.size()) == config_.num_hidden_layers,
            "weights have {} layers, the config {}", weights_.layers.size(),
            config_.num_hidden_layers);
  const int64_t half = static_cast<int64_t>(rope_.inv_freq().size());
  std::shared_ptr<void> mem = backend_.Allocate(half * sizeof(float));
  inv_freq_ = Tensor(mem.get(), DType::kF32, {half}, backend_.device(), mem);
  backend_.CopyToDevice(inv_freq_, rope_.inv_freq().data());
  rope_spec_ = {inv_freq_, rope_.attention_factor(), rope_.interleave()};
  // A bf16 model's attention products may use TF32 tensor cores (Backend::AllowTf32); an fp32
  // model stays exact.
  for (const LayerWeights& l : weights_.layers) {
    if (l.attn.o_proj.empty()) continue;
    bf16_attention_ = l.attn.o_proj.dtype() == DType::kBF16;
    backend_.AllowTf32(bf16_attention_);
    break;
  }
}

kv::CacheShape MoeModel::CacheShape(int64_t num_blocks, int64_t block_size) const {
  kv::CacheShape s;
  s.num_layers = config_.num_hidden_layers;
  s.row_width = config_.cache_row_width();
  s.block_size = block_size;
  s.num_blocks = num_blocks;
  s.dtype = kv_cache_dtype_;
  return s;
}

void MoeModel::set_kv_cache_dtype(DType dtype) {
  AFD_CHECK(dtype == DType::kF32 || dtype == DType::kBF16,
            "kv cache dtype {}: the cache holds fp32 or bf16 rows", DTypeName(dtype));
  kv_cache_dtype_ = dtype;
}

void MoeModel::CheckBatch(const ForwardBatch& b, const kv::PagedKvCache& cache) const {
  const int64_t n = b.size();
  AFD_CHECK(static_cast<int64_t>(b.positions.size()) == n &&
                static_cast<int64_t>(b.seq_index.size()) == n &&
                static_cast<int64_t>(b.slot_mapping.size()) == n &&
                b.seq_ids.size() == b.block_tables.size(),
            "forward batch: token_ids, positions, seq_index, slot_mapping differ in length");
  // Per block-table row: the expected next position and the sequence's blocks (one cache
  // lookup per row, not per token).
  std::vector<int64_t> next(b.seq_ids.size(), -1);
  std::vector<const std::vector<int32_t>*> blocks(b.seq_ids.size(), nullptr);
  for (int64_t i = 0; i < n; ++i) {
    AFD_CHECK(b.token_ids[i] >= 0 && b.token_ids[i] < config_.vocab_size,
              "token id {} is outside the vocabulary [0, {})", b.token_ids[i], config_.vocab_size);
    const int32_t row = b.seq_index[i];
    AFD_CHECK(row >= 0 && row < static_cast<int32_t>(b.seq_ids.size()),
              "forward batch: token {} has no sequence row {}", i, row);
    const int64_t seq = b.seq_ids[row];
    int64_t& expected = next[row];
    if (expected < 0) {
      expected = cache.length(seq);
      blocks[row] = &cache.block_table(seq);
    }
    AFD_CHECK(b.positions[i] == expected,
              "forward batch: token {} of sequence {} has position {}, expected {}", i, seq,
              b.positions[i], expected);
    const int64_t slot = cache.SlotIn(*blocks[row], b.positions[i]);
    AFD_CHECK(slot >= 0 && b.slot_mapping[i] == slot,
              "sequence {}: position {} has no reserved cache slot (capacity {})", seq,
              b.positions[i], cache.capacity(seq));
    ++expected;
  }
  if (!b.id_source.empty()) {
    AFD_CHECK(static_cast<int64_t>(b.id_source.size()) == n,
              "forward batch: {} id sources for {} tokens", b.id_source.size(), n);
    const int64_t k = b.ids_from.numel();
    AFD_CHECK(b.ids_from.dtype() == DType::kI32 && b.ids_from.device() == backend_.device(),
              "forward batch: ids_from must be i32 on {}, got {}", backend_.device().ToString(),
              b.ids_from.ToString());
    for (int64_t i = 0; i < n; ++i) {
      AFD_CHECK(b.id_source[i] < k, "forward batch: token {} takes id {} of {} sampled ids", i,
                b.id_source[i], k);
    }
  }
  for (size_t r = 1; r < b.logits_rows.size(); ++r) {
    AFD_CHECK(b.logits_rows[r - 1] < b.logits_rows[r], "forward batch: logits rows not ascending");
  }
  AFD_CHECK(b.logits_rows.empty() || (b.logits_rows.front() >= 0 && b.logits_rows.back() < n),
            "forward batch: logits rows outside the {} tokens", n);
}

void MoeModel::CommitBatch(const ForwardBatch& b, kv::PagedKvCache& cache) {
  // A row's tokens are consecutive positions: the last of each run sets the length.
  for (int64_t i = 0; i < b.size(); ++i) {
    if (i + 1 < b.size() && b.seq_index[i + 1] == b.seq_index[i]) continue;
    cache.Extend(b.seq_ids[b.seq_index[i]], b.positions[i] + 1);
  }
}

StepInputs MoeModel::Upload(const ForwardBatch& b, Workspace& ws) const {
  StepInputs in;
  in.n = b.size();
  auto put = [&](const auto& v, DType dtype, std::vector<int64_t> shape) {
    Tensor t = ws.Take(dtype, shape);
    backend_.CopyToDevice(t, v.data());
    return t;
  };
  in.token_ids = put(b.token_ids, DType::kI32, {in.n});
  if (!b.id_source.empty()) {
    backend_.TakeIds(b.ids_from, put(b.id_source, DType::kI32, {in.n}), in.token_ids);
  }
  in.attn.positions = put(b.positions, DType::kI64, {in.n});
  in.attn.seq_index = put(b.seq_index, DType::kI32, {in.n});
  in.attn.slot_mapping = put(b.slot_mapping, DType::kI64, {in.n});
  int64_t max_blocks = 1;
  for (const auto& t : b.block_tables) max_blocks = std::max<int64_t>(max_blocks, t.size());
  const int64_t rows = static_cast<int64_t>(b.block_tables.size());
  std::vector<int32_t> tables(std::max<int64_t>(rows, 1) * max_blocks, 0);  // [rows, max_blocks]
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(b.block_tables[r].begin(), b.block_tables[r].end(), tables.begin() + r * max_blocks);
  }
  in.attn.block_tables = put(tables, DType::kI32, {std::max<int64_t>(rows, 1), max_blocks});
  in.attn.block_size = kv::kDefaultBlockSize;
  for (int64_t pos : b.positions) in.attn.max_context = std::max(in.attn.max_context, pos + 1);
  in.logits_rows = put(b.logits_rows, DType::kI32, {static_cast<int64_t>(b.logits_rows.size())});
  return in;
}

void MoeModel::Embed(const StepInputs& in, const Tensor& x) const {
  backend_.Embedding(weights_.embed, in.token_ids, x);
}

void MoeModel::Mlp(const MlpWeights& w, const Tensor& x, const Tensor& out, Workspace& ws) const {
  const int64_t n = x.dim(0), inter = w.down.dim(1);
  const Tensor gate_up = ws.Take(DType::kF32, {n, 2 * inter});
  const Tensor act = ws.Take(DType::kF32, {n, inter});
  backend_.Linear(x, w.gate_up, gate_up);
  backend_.SiluMul(gate_up, act);
  backend_.Linear(act, w.down, out);
}

void MoeModel::DenseMlp(int64_t layer, const Tensor& mlp_in, const Tensor& out,
                        Workspace& ws) const {
  AFD_CHECK(!config_.IsMoeLayer(layer), "layer {} is a MoE layer", layer);
  Mlp(weights_.layers[layer].dense, mlp_in, out, ws);
}

Tensor MoeModel::Logits(const Tensor& x, const StepInputs& in, Workspace& ws) const {
  const int64_t m = in.logits_rows.numel(), h = config_.hidden_size;
  const Tensor rows = ws.Take(DType::kF32, {m, h});
  backend_.GatherRows(x, in.logits_rows, rows);
  backend_.RmsNorm(rows, weights_.final_norm, config_.rms_norm_eps, rows);
  const Tensor logits = ws.Take(DType::kF32, {m, config_.vocab_size});
  if (m > 0) backend_.Linear(rows, weights_.lm_head, logits);
  return logits;
}

Tensor MoeModel::Forward(const ForwardBatch& batch, kv::PagedKvCache& cache, MoeBackend& moe,
                         Workspace& ws) const {
  CheckBatch(batch, cache);
  const StepInputs in = Upload(batch, ws);
  const Tensor logits = ForwardInputs(in, cache, moe, ws);
  CommitBatch(batch, cache);
  return logits;
}

std::vector<std::pair<int, int>> MoeModel::MoeStartOrder(int stages) const {
  std::vector<std::pair<int, int>> order;
  for (int layer : config_.MoeLayers()) {
    for (int s = 0; s < stages; ++s) order.emplace_back(layer, s);
  }
  return order;
}

Tensor MoeModel::RunLayers(const StepInputs& in, kv::PagedKvCache* cache, MoeBackend& moe,
                           Workspace& ws, const LayerLoop& loop) const {
  const int64_t n = in.n, h = config_.hidden_size;
  const std::vector<int64_t> splits =
      loop.splits.empty() ? std::vector<int64_t>{0, n} : loop.splits;
  AFD_CHECK(splits.size() >= 2 && splits.front() == 0 && splits.back() == n &&
                std::is_sorted(splits.begin(), splits.end()),
            "layer loop: micro-batch offsets must ascend from 0 to the step's {} tokens", n);
  AFD_CHECK(n == 0 || cache != nullptr, "layer loop: a step with tokens needs a cache");
  backend_.SetStepRows(n);
  const Tensor x = ws.Take(DType::kF32, {n, h});
  const Tensor mlp_in = ws.Take(DType::kF32, {n, h});
  const Tensor mlp_out = ws.Take(DType::kF32, {n, h});
  if (n > 0) Embed(in, x);
  struct MicroBatch {
    StepInputs in;
    Tensor x, mlp_in, mlp_out;
    bool moe_started = false;  // a MoE Start awaits its Finish
    bool out_pending = false;  // mlp_out is not yet added to x
  };
  const int stages = static_cast<int>(splits.size()) - 1;
  std::vector<MicroBatch> mbs(stages);
  for (int s = 0; s < stages; ++s) {
    const int64_t begin = splits[s], m = splits[s + 1] - begin;
    MicroBatch& mb = mbs[s];
    mb.in = stages == 1 ? in : (n > 0 ? in.Slice(begin, m) : StepInputs{});
    mb.x = x.Rows(begin, m);
    mb.mlp_in = mlp_in.Rows(begin, m);
    mb.mlp_out = mlp_out.Rows(begin, m);
  }
  // Each layer's MLP output is added to x by the next layer's input norm (AddRmsNorm), the
  // last one's before the logits.
  const int64_t layers = n > 0 || moe.RunsEmptySteps() ? config_.num_hidden_layers : 0;
  for (int64_t l = 0; l < layers; ++l) {
    const Workspace::Mark layer_scratch = ws.mark();  // the next layer reuses this one's scratch
    const bool is_moe = config_.IsMoeLayer(l);
    for (int s = 0; s < stages; ++s) {
      MicroBatch& mb = mbs[s];
      if (mb.moe_started) {
        moe.Finish(s, ws);
        mb.moe_started = false;
        mb.out_pending = mb.in.n > 0;
      }
      if (mb.in.n > 0) {
        moe.Flush();
        Attention(l, mb.in, *cache, mb.x, mb.mlp_in, ws, loop.tp,
                  mb.out_pending ? &mb.mlp_out : nullptr);
        mb.out_pending = false;
      }
      if (is_moe) {
        moe.Start(l, s, mb.mlp_in, mb.mlp_out, ws);
        mb.moe_started = true;
      } else if (mb.in.n > 0) {
        DenseMlp(l, mb.mlp_in, mb.mlp_out, ws);
        mb.out_pending = true;
      }
    }
    ws.Rewind(layer_scratch);
  }
  for (int s = 0; s < stages; ++s) {
    MicroBatch& mb = mbs[s];
    if (mb.moe_started) {
      moe.Finish(s, ws);
      mb.out_pending = mb.in.n > 0;
    }
    if (mb.out_pending) backend_.Add(mb.x, mb.mlp_out);
  }
  if (n == 0) return Tensor();
  return Logits(x, in, ws);
}

}  // namespace afd::model
