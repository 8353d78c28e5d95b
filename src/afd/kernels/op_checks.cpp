#include "afd/kernels/op_checks.h"

#include <fmt/format.h>

#include <algorithm>

#include "afd/common/error.h"
#include "afd/kernels/afd_exchange.h"

namespace afd::kernels {

namespace {

void On(Device dev, const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) CheckOnDevice(op, *t, dev);
}

void CheckTokens(Device dev, const char* op, const AttentionTokens& t, int64_t n) {
  On(dev, op, {&t.positions, &t.seq_index, &t.slot_mapping, &t.block_tables});
  t.positions.Expect(op, DType::kI64, {n});
  t.seq_index.Expect(op, DType::kI32, {n});
  t.slot_mapping.Expect(op, DType::kI64, {n});
  t.block_tables.Expect(op, DType::kI32, {-1, -1});
  AFD_CHECK(t.block_size > 0, "{}: block size {}", op, t.block_size);
}

// The latent cache holds f32 or bf16 rows (kv::CacheShape::dtype): its own dtype when it is one
// of those, else f32 (the error names what was expected).
DType CacheDType(const Tensor& cache) {
  return cache.dtype() == DType::kBF16 ? DType::kBF16 : DType::kF32;
}

}  // namespace

void CheckOnDevice(const char* op, const Tensor& t, Device device) {
  AFD_CHECK(t.empty() || t.device() == device, "{}: tensor {} is not on {}", op, t.ToString(),
            device.ToString());
  AFD_CHECK(t.is_contiguous(), "{}: tensor {} is not contiguous", op, t.ToString());
}

RowsShape CheckEmbedding(Device dev, const Tensor& table, const Tensor& ids, const Tensor& out) {
  On(dev, "Embedding", {&table, &ids, &out});
  AFD_CHECK(table.ndim() == 2 && (table.dtype() == DType::kF32 || table.dtype() == DType::kBF16),
            "Embedding: table {} must be a float32 or bfloat16 matrix", table.ToString());
  const int64_t n = ids.numel(), h = table.dim(1);
  ids.Expect("Embedding ids", DType::kI32, {n});
  out.Expect("Embedding out", DType::kF32, {n, h});
  return {n, h};
}

LinearShape CheckLinear(Device dev, const Tensor& x, const Tensor& w, const Tensor& y) {
  On(dev, "Linear", {&x, &w, &y});
  AFD_CHECK(w.ndim() == 2 && (w.dtype() == DType::kF32 || w.dtype() == DType::kBF16),
            "Linear: weight {} must be a float32 or bfloat16 matrix", w.ToString());
  const int64_t n = x.dim(0), k = w.dim(1), m = w.dim(0);
  x.Expect("Linear x", DType::kF32, {n, k});
  y.Expect("Linear y", DType::kF32, {n, m});
  return {n, k, m};
}

RowsShape CheckRmsNorm(Device dev, const Tensor& x, const Tensor& w, const Tensor& out) {
  On(dev, "RmsNorm", {&x, &w, &out});
  const int64_t d = w.numel(), n = x.numel() / std::max<int64_t>(d, 1);
  w.Expect("RmsNorm weight", DType::kF32, {d});
  x.Expect("RmsNorm x", DType::kF32, {n, d});
  out.Expect("RmsNorm out", DType::kF32, {n, d});
  return {n, d};
}

void CheckAdd(Device dev, const Tensor& y, const Tensor& x) {
  On(dev, "Add", {&y, &x});
  AFD_CHECK(y.numel() == x.numel() && y.dtype() == DType::kF32 && x.dtype() == DType::kF32,
            "Add: {} += {}", y.ToString(), x.ToString());
}

RowsShape CheckSiluMul(Device dev, const Tensor& gate_up, const Tensor& out) {
  On(dev, "SiluMul", {&gate_up, &out});
  const int64_t n = gate_up.dim(0), inter = gate_up.dim(1) / 2;
  gate_up.Expect("SiluMul gate_up", DType::kF32, {n, 2 * inter});
  out.Expect("SiluMul out", DType::kF32, {n, inter});
  return {n, inter};
}

RopeShape CheckRope(Device dev, const Tensor& x, int64_t offset, const Tensor& positions,
                    const RopeSpec& rope) {
  On(dev, "Rope", {&x, &positions, &rope.inv_freq});
  const int64_t n = x.dim(0), heads = x.dim(1), width = x.dim(2);
  x.Expect("Rope x", DType::kF32, {n, heads, width});
  positions.Expect("Rope positions", DType::kI64, {n});
  const int64_t dr = 2 * rope.inv_freq.numel();
  AFD_CHECK(offset >= 0 && offset + dr <= width, "Rope: dims [{}, {}) outside width {}", offset,
            offset + dr, width);
  return {n, heads, width};
}

RowsShape CheckGatherRows(Device dev, const Tensor& x, const Tensor& index, const Tensor& out) {
  On(dev, "GatherRows", {&x, &index, &out});
  const int64_t m = index.numel(), h = x.dim(1);
  index.Expect("GatherRows index", DType::kI32, {m});
  x.Expect("GatherRows x", DType::kF32, {-1, h});
  out.Expect("GatherRows out", DType::kF32, {-1, h});
  AFD_CHECK(out.dim(0) >= m, "GatherRows: {} rows into {}", m, out.ToString());
  return {m, h};
}

CacheWriteShape CheckMlaCacheWrite(Device dev, const Tensor& ckv, const Tensor& norm_w,
                                   const AttentionTokens& tokens, const RopeSpec& rope,
                                   const Tensor& cache) {
  On(dev, "MlaCacheWrite", {&ckv, &norm_w, &cache, &rope.inv_freq});
  const int64_t n = ckv.dim(0), kvr = norm_w.numel(), width = kvr + 2 * rope.inv_freq.numel();
  ckv.Expect("MlaCacheWrite ckv", DType::kF32, {n, width});
  cache.Expect("MlaCacheWrite cache", CacheDType(cache), {-1, width});
  CheckTokens(dev, "MlaCacheWrite", tokens, n);
  return {n, kvr, width};
}

AttentionShape CheckMlaAttention(Device dev, const Tensor& q, const Tensor& kv_b,
                                 const AttentionTokens& tokens, const Tensor& cache,
                                 int64_t head_begin, int64_t head_end, int64_t dn, int64_t dv,
                                 const Tensor& out) {
  On(dev, "MlaAttention", {&q, &kv_b, &cache, &out});
  const int64_t n = q.dim(0), heads = q.dim(1), kvr = kv_b.dim(1), dr = cache.dim(1) - kvr;
  q.Expect("MlaAttention q", DType::kF32, {n, heads, dn + dr});
  kv_b.Expect("MlaAttention kv_b", DType::kF32, {heads * (dn + dv), kvr});
  cache.Expect("MlaAttention cache", CacheDType(cache), {-1, kvr + dr});
  AFD_CHECK(0 <= head_begin && head_begin < head_end && head_end <= heads,
            "MlaAttention: heads [{}, {}) of {}", head_begin, head_end, heads);
  out.Expect("MlaAttention out", DType::kF32, {n, (head_end - head_begin) * dv});
  CheckTokens(dev, "MlaAttention", tokens, n);
  return {n, heads, kvr, dr};
}

GqaShape CheckGqaCacheWrite(Device dev, const Tensor& qkv, const Tensor& q_norm,
                            const Tensor& k_norm, const AttentionTokens& tokens,
                            const RopeSpec& rope, const Tensor& q, const Tensor& cache) {
  On(dev, "GqaCacheWrite", {&qkv, &q_norm, &k_norm, &q, &cache, &rope.inv_freq});
  AFD_CHECK(q.ndim() == 3, "GqaCacheWrite: q must be [n, heads, d], got {}", q.ToString());
  const int64_t n = q.dim(0), heads = q.dim(1), d = q.dim(2);
  AFD_CHECK(d % 2 == 0 && rope.inv_freq.numel() * 2 == d,
            "GqaCacheWrite: the rope rotates {} dims, the heads have {}", 2 * rope.inv_freq.numel(),
            d);
  const int64_t width = cache.ndim() == 2 ? cache.dim(1) : 0;
  AFD_CHECK(width > 0 && width % (2 * d) == 0,
            "GqaCacheWrite: cache rows of {} values hold no whole k and v of {}-dim heads", width,
            d);
  const int64_t kvh = width / (2 * d);
  AFD_CHECK(heads % kvh == 0, "GqaCacheWrite: {} heads over {} KV heads", heads, kvh);
  qkv.Expect("GqaCacheWrite qkv", DType::kF32, {n, (heads + 2 * kvh) * d});
  q.Expect("GqaCacheWrite q", DType::kF32, {n, heads, d});
  q_norm.Expect("GqaCacheWrite q_norm", DType::kF32, {d});
  k_norm.Expect("GqaCacheWrite k_norm", DType::kF32, {d});
  cache.Expect("GqaCacheWrite cache", CacheDType(cache), {-1, width});
  CheckTokens(dev, "GqaCacheWrite", tokens, n);
  return {n, heads, kvh, d};
}

GqaShape CheckGqaAttention(Device dev, const Tensor& q, const AttentionTokens& tokens,
                           const Tensor& cache, int64_t num_kv_heads, int64_t head_begin,
                           int64_t head_end, const Tensor& out) {
  On(dev, "GqaAttention", {&q, &cache, &out});
  AFD_CHECK(q.ndim() == 3, "GqaAttention: q must be [n, heads, d], got {}", q.ToString());
  const int64_t n = q.dim(0), heads = q.dim(1), d = q.dim(2);
  AFD_CHECK(num_kv_heads >= 1 && heads % num_kv_heads == 0,
            "GqaAttention: {} heads over {} KV heads", heads, num_kv_heads);
  q.Expect("GqaAttention q", DType::kF32, {n, heads, d});
  cache.Expect("GqaAttention cache", CacheDType(cache), {-1, 2 * num_kv_heads * d});
  AFD_CHECK(0 <= head_begin && head_begin < head_end && head_end <= heads,
            "GqaAttention: heads [{}, {}) of {}", head_begin, head_end, heads);
  out.Expect("GqaAttention out", DType::kF32, {n, (head_end - head_begin) * d});
  CheckTokens(dev, "GqaAttention", tokens, n);
  return {n, heads, num_kv_heads, d};
}

RowsShape CheckRouterTopk(Device dev, const Tensor& logits, const Tensor& bias,
                          const RouterSpec& spec, const Tensor& ids, const Tensor& weights) {
  On(dev, "RouterTopk", {&logits, &bias, &ids, &weights});
  const int64_t n = logits.dim(0), e = logits.dim(1), k = spec.top_k;
  logits.Expect("RouterTopk logits", DType::kF32, {n, e});
  if (!bias.empty()) bias.Expect("RouterTopk bias", DType::kF32, {e});
  ids.Expect("RouterTopk ids", DType::kI32, {n, k});
  weights.Expect("RouterTopk weights", DType::kF32, {n, k});
  AFD_CHECK(k >= 1 && k <= e && spec.n_group >= 1 && e % spec.n_group == 0 &&
                spec.topk_group >= 1 && spec.topk_group <= spec.n_group,
            "RouterTopk: top_k {}, n_group {}, topk_group {} for {} experts", k, spec.n_group,
            spec.topk_group, e);
  return {n, e};
}

RowsShape CheckMoePermute(Device dev, const Tensor& ids, int64_t num_local, const Tensor& offsets,
                          const Tensor& src_row, const Tensor& row_of_slot) {
  On(dev, "MoePermute", {&ids, &offsets, &src_row, &row_of_slot});
  const int64_t n = ids.dim(0), k = ids.dim(1);
  ids.Expect("MoePermute ids", DType::kI32, {n, k});
  offsets.Expect("MoePermute offsets", DType::kI32, {num_local + 1});
  src_row.Expect("MoePermute src_row", DType::kI32, {n * k});
  row_of_slot.Expect("MoePermute row_of_slot", DType::kI32, {n, k});
  return {n, k};
}

RowsShape CheckGroupedExpertMlp(Device dev, const Tensor& x, const Tensor& offsets,
                                const ExpertWeights& experts, const Tensor& out) {
  On(dev, "GroupedExpertMlp", {&x, &offsets, &out});
  const int64_t h = x.dim(1), e = experts.num_experts();
  AFD_CHECK(experts.down.size() == experts.gate_up.size(),
            "GroupedExpertMlp: {} gate_up and {} down weights", experts.gate_up.size(),
            experts.down.size());
  // A layer's experts share one form (the builder's all-or-nothing): the first loaded one tells.
  int64_t first = 0;
  while (first < e && experts.gate_up[first].empty()) ++first;
  AFD_CHECK(experts.fp8() || first == e ||
                (experts.gate_up[first].dtype() != DType::kF8E4M3 &&
                 experts.down[first].dtype() != DType::kF8E4M3),
            "GroupedExpertMlp: expert {} holds FP8 codes without their block scales",
            experts.expert_begin + first);
  if (experts.fp8()) {
    AFD_CHECK(experts.gate_up_scale.size() == experts.gate_up.size() &&
                  experts.down_scale.size() == experts.gate_up.size(),
              "GroupedExpertMlp: {} FP8 experts with {} gate_up and {} down scales", e,
              experts.gate_up_scale.size(), experts.down_scale.size());
    const auto blocks = [](int64_t n) { return (n + kFp8WeightBlock - 1) / kFp8WeightBlock; };
    // Per call on the host: plain comparisons, the message formatted only for a failure.
    for (int64_t i = 0; i < e; ++i) {
      const Tensor &gu = experts.gate_up[i], &dn = experts.down[i];
      if (gu.empty()) continue;  // not loaded here
      const Tensor &gus = experts.gate_up_scale[i], &dns = experts.down_scale[i];
      const int64_t inter = dn.ndim() == 2 ? dn.dim(1) : -1;
      const auto is = [](const Tensor& t, DType dtype, int64_t rows, int64_t cols) {
        return t.dtype() == dtype && t.ndim() == 2 && t.dim(0) == rows && t.dim(1) == cols;
      };
      if (is(gu, DType::kF8E4M3, 2 * inter, h) && is(dn, DType::kF8E4M3, h, inter) &&
          is(gus, DType::kF32, 2 * blocks(inter), blocks(h)) &&
          is(dns, DType::kF32, blocks(h), blocks(inter))) {
        continue;
      }
      const std::string name = fmt::format("GroupedExpertMlp expert {}", experts.expert_begin + i);
      gu.Expect((name + " gate_up").c_str(), DType::kF8E4M3, {2 * inter, h});
      dn.Expect((name + " down").c_str(), DType::kF8E4M3, {h, inter});
      gus.Expect((name + " gate_up scales").c_str(), DType::kF32, {2 * blocks(inter), blocks(h)});
      dns.Expect((name + " down scales").c_str(), DType::kF32, {blocks(h), blocks(inter)});
    }
  }
  offsets.Expect("GroupedExpertMlp offsets", DType::kI32, {e + 1});
  x.Expect("GroupedExpertMlp x", DType::kF32, {-1, h});
  out.Expect("GroupedExpertMlp out", DType::kF32, {x.dim(0), h});
  return {x.dim(0), h};
}

CombineShape CheckMoeCombine(Device dev, const Tensor& y, const Tensor& row_of_slot,
                             const Tensor& weights, const Tensor& out) {
  On(dev, "MoeCombine", {&y, &row_of_slot, &weights, &out});
  const int64_t n = row_of_slot.dim(0), k = row_of_slot.dim(1), h = out.dim(1);
  row_of_slot.Expect("MoeCombine row_of_slot", DType::kI32, {n, k});
  weights.Expect("MoeCombine weights", DType::kF32, {n, k});
  y.Expect("MoeCombine y", DType::kF32, {-1, h});
  out.Expect("MoeCombine out", DType::kF32, {n, h});
  return {n, k, h};
}

RowsShape CheckLogSoftmaxAt(Device dev, const Tensor& logits, const Tensor& ids,
                            const Tensor& out) {
  On(dev, "LogSoftmaxAt", {&logits, &ids, &out});
  const int64_t n = logits.dim(0), v = logits.dim(1);
  logits.Expect("LogSoftmaxAt logits", DType::kF32, {n, v});
  ids.Expect("LogSoftmaxAt ids", DType::kI32, {n});
  out.Expect("LogSoftmaxAt out", DType::kF32, {n});
  return {n, v};
}

RowsShape CheckSample(Device dev, const Tensor& logits, const std::vector<SampleRow>& rows,
                      const Tensor& ids) {
  On(dev, "Sample", {&logits, &ids});
  const int64_t n = logits.dim(0), v = logits.dim(1);
  logits.Expect("Sample logits", DType::kF32, {n, v});
  ids.Expect("Sample ids", DType::kI32, {n});
  AFD_CHECK(static_cast<int64_t>(rows.size()) == n, "Sample: {} rows of parameters for {} logits",
            rows.size(), n);
  return {n, v};
}

int64_t CheckTakeIds(Device dev, const Tensor& from, const Tensor& source, const Tensor& ids) {
  On(dev, "TakeIds", {&from, &source, &ids});
  from.Expect("TakeIds from", DType::kI32, {from.numel()});
  const int64_t n = ids.numel();
  ids.Expect("TakeIds ids", DType::kI32, {n});
  source.Expect("TakeIds source", DType::kI32, {n});
  return n;
}

namespace {

int AfdRanks(const char* op, size_t ranks) {
  AFD_CHECK(ranks >= 1 && ranks <= static_cast<size_t>(Backend::kMaxAfdRanks),
            "{}: {} FFN ranks (1..{})", op, ranks, Backend::kMaxAfdRanks);
  return static_cast<int>(ranks);
}

}  // namespace

AfdShape CheckAfdDispatch(Device dev, const Tensor& hidden, const Tensor& ids,
                          const Tensor& weights, int64_t num_experts,
                          const std::vector<Tensor>& rows, const std::vector<Tensor>& scales,
                          const std::vector<Tensor>& tables, const Tensor& send_row) {
  AfdShape s;
  s.ranks = AfdRanks("AfdDispatch", rows.size());
  AFD_CHECK(tables.size() == rows.size(), "AfdDispatch: {} row tensors, {} tables", rows.size(),
            tables.size());
  AFD_CHECK(scales.empty() || scales.size() == rows.size(),
            "AfdDispatch: {} row tensors, {} scale tensors (none, or one per rank)", rows.size(),
            scales.size());
  On(dev, "AfdDispatch", {&hidden, &ids, &weights, &send_row});
  s.n = hidden.dim(0);
  s.h = hidden.dim(1);
  s.k = ids.dim(1);
  hidden.Expect("AfdDispatch hidden", DType::kF32, {s.n, s.h});
  ids.Expect("AfdDispatch ids", DType::kI32, {s.n, s.k});
  weights.Expect("AfdDispatch weights", DType::kF32, {s.n, s.k});
  send_row.Expect("AfdDispatch send_row", DType::kI32, {s.n, s.ranks});
  AFD_CHECK(num_experts >= s.ranks, "AfdDispatch: {} experts over {} FFN ranks", num_experts,
            s.ranks);
  for (int f = 0; f < s.ranks; ++f) {
    CheckOnDevice("AfdDispatch rows", rows[f], dev);
    CheckOnDevice("AfdDispatch table", tables[f], dev);
    const DType t = rows[f].dtype();
    AFD_CHECK(t == DType::kF32 || t == DType::kBF16 || t == DType::kF8E4M3,
              "AfdDispatch: rows of rank {} are {}, not f32, bf16 or f8e4m3", f,
              rows[f].ToString());
    rows[f].Expect("AfdDispatch rows", t, {s.n, s.h});
    const bool fp8 = t == DType::kF8E4M3;
    const bool has_scales = !scales.empty() && !scales[f].empty();
    AFD_CHECK(fp8 == has_scales, "AfdDispatch: rows of rank {} are {} {} scales", f,
              rows[f].ToString(), has_scales ? "with" : "without");
    if (fp8) {
      CheckOnDevice("AfdDispatch scales", scales[f], dev);
      scales[f].Expect("AfdDispatch scales", DType::kF32, {s.n, AfdFp8Groups(s.h)});
    }
    tables[f].Expect("AfdDispatch table", DType::kI32, {2 * s.n * s.k});
  }
  return s;
}

AfdShape CheckAfdSumPartials(Device dev, const std::vector<Tensor>& partials,
                             const Tensor& send_row, const Tensor& out) {
  AfdShape s;
  s.ranks = AfdRanks("AfdSumPartials", partials.size());
  On(dev, "AfdSumPartials", {&send_row, &out});
  s.n = out.dim(0);
  s.h = out.dim(1);
  out.Expect("AfdSumPartials out", DType::kF32, {s.n, s.h});
  send_row.Expect("AfdSumPartials send_row", DType::kI32, {s.n, s.ranks});
  for (const Tensor& p : partials) {
    CheckOnDevice("AfdSumPartials partials", p, dev);
    p.Expect("AfdSumPartials partials", DType::kF32, {p.dim(0), s.h});
  }
  return s;
}

AfdShape CheckAfdPairIndex(Device dev, const Tensor& ids, int64_t num_experts,
                           const Tensor& send_row, const std::vector<Tensor>& row_of_slot,
                           const std::vector<int64_t>& base,
                           const std::vector<int64_t>& shared_base, const Tensor& idx,
                           const Tensor& shared_idx) {
  AfdShape s;
  s.ranks = AfdRanks("AfdPairIndex", row_of_slot.size());
  On(dev, "AfdPairIndex", {&ids, &send_row, &idx, &shared_idx});
  s.n = ids.dim(0);
  s.k = ids.dim(1);
  ids.Expect("AfdPairIndex ids", DType::kI32, {s.n, s.k});
  idx.Expect("AfdPairIndex idx", DType::kI32, {s.n, s.k});
  send_row.Expect("AfdPairIndex send_row", DType::kI32, {s.n, s.ranks});
  AFD_CHECK(num_experts >= s.ranks, "AfdPairIndex: {} experts over {} FFN ranks", num_experts,
            s.ranks);
  AFD_CHECK(base.size() == row_of_slot.size() &&
                (shared_idx.empty() || shared_base.size() == row_of_slot.size()),
            "AfdPairIndex: {} bases, {} shared bases for {} ranks", base.size(), shared_base.size(),
            row_of_slot.size());
  if (!shared_idx.empty()) shared_idx.Expect("AfdPairIndex shared_idx", DType::kI32, {s.n});
  for (const Tensor& r : row_of_slot) {
    CheckOnDevice("AfdPairIndex row_of_slot", r, dev);
    r.Expect("AfdPairIndex row_of_slot", DType::kI32, {s.n, s.k});
  }
  return s;
}

RowsShape CheckDequantFp8Rows(Device dev, const Tensor& q, const Tensor& scales,
                              const Tensor& out) {
  On(dev, "DequantFp8Rows", {&q, &scales, &out});
  AFD_CHECK(q.ndim() == 2 && q.dtype() == DType::kF8E4M3,
            "DequantFp8Rows: q {} must be [m, H] f8e4m3", q.ToString());
  RowsShape r{q.dim(0), q.dim(1)};
  scales.Expect("DequantFp8Rows scales", DType::kF32, {r.n, AfdFp8Groups(r.d)});
  out.Expect("DequantFp8Rows out", DType::kF32, {r.n, r.d});
  return r;
}

int64_t CheckConvert(Device dev, const Tensor& dst, const Tensor& src) {
  On(dev, "Convert", {&dst, &src});
  AFD_CHECK(
      dst.shape() == src.shape() && ((dst.dtype() == DType::kF32 && src.dtype() == DType::kBF16) ||
                                     (dst.dtype() == DType::kBF16 && src.dtype() == DType::kF32) ||
                                     dst.dtype() == src.dtype()),
      "Convert: {} from {} (f32 <-> bf16, one shape)", dst.ToString(), src.ToString());
  return dst.numel();
}

}  // namespace afd::kernels
