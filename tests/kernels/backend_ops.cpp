// backend_ops_test: every op of the Backend interface on every backend this build and machine
// have (cpu; cuda:N when the CUDA backend is built and a GPU is present), against a readable
// reference written here in double precision (not the CPU backend's code), with a per-op
// tolerance. ggml's test-backend-ops is the model.
//
//   backend_ops_test                      check every op (exit 1 on any failure)
//   backend_ops_test --perf [--iters N]   time each op at DeepSeek-V2-Lite-like shapes:
//                                         ms, GB/s (bytes an op must touch) and TFLOP/s
//   backend_ops_test --op NAME            only ops whose name contains NAME
//   backend_ops_test --backend cpu|cuda   only that backend
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "afd/common/dtype_convert.h"
#include "afd/common/error.h"
#include "afd/common/fp8_rows.h"
#include "afd/kernels/backend.h"

namespace afd::kernels {
namespace {

// ---- Host <-> backend helpers ------------------------------------------------------------

struct Ctx {
  Backend& b;
  std::mt19937 rng{1234};
  bool perf = false;
  int iters = 20;

  std::vector<float> Randn(int64_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
  }
  Tensor Alloc(DType dtype, const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    auto mem = b.Allocate(std::max<size_t>(1, n * DTypeSize(dtype)));
    return Tensor(mem.get(), dtype, shape, b.device(), mem);
  }
  template <typename T>
  Tensor Up(const std::vector<T>& v, DType dtype, const std::vector<int64_t>& shape) {
    Tensor t = Alloc(dtype, shape);
    b.CopyToDevice(t, v.data());
    return t;
  }
  // fp32 values stored as bf16 (the host copy is rounded to what the device holds).
  Tensor UpBf16(std::vector<float>& v, const std::vector<int64_t>& shape) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      h[i] = F32ToBf16(v[i]);
      v[i] = Bf16ToF32(h[i]);
    }
    return Up(h, DType::kBF16, shape);
  }
  template <typename T>
  std::vector<T> Down(const Tensor& t) {
    std::vector<T> v(t.numel());
    b.CopyToHost(v.data(), t);
    return v;
  }
  // Seconds per call of fn (median of iters after a warm-up), device work included.
  double Time(const std::function<void()>& fn) {
    fn();
    b.Synchronize();
    std::vector<double> s;
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      b.Synchronize();
      s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
};

// max |got - want| / max(max |want|, 1e-30): a relative error that ignores tiny entries' noise.
double RelErr(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(got[i]) - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  return got.size() == want.size() ? num / den : INFINITY;
}

struct Result {
  double err = 0, tol = 0;      // check mode
  double seconds = 0;           // perf mode
  double bytes = 0, flops = 0;  // per call
  std::string note;

  Result() = default;
  Result(double e, double t) : err(e), tol(t) {}
  static Result Fail(std::string why) {
    Result r(INFINITY, 0.0);
    r.note = std::move(why);
    return r;
  }
};

struct Case {
  std::string op, shape;
  std::function<Result(Ctx&)> run;
};

// ---- References (double) -----------------------------------------------------------------

std::vector<double> RefLinear(const std::vector<float>& x, const std::vector<float>& w, int64_t n,
                              int64_t k, int64_t m) {
  std::vector<double> y(n * m);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t o = 0; o < m; ++o) {
      double acc = 0;
      for (int64_t j = 0; j < k; ++j) acc += double(x[i * k + j]) * w[o * k + j];
      y[i * m + o] = acc;
    }
  }
  return y;
}

std::vector<double> RefRmsNorm(const std::vector<double>& x, const std::vector<float>& w, int64_t n,
                               int64_t d, double eps) {
  std::vector<double> y(n * d);
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += x[i * d + j] * x[i * d + j];
    const double inv = 1.0 / std::sqrt(ss / d + eps);
    for (int64_t j = 0; j < d; ++j) y[i * d + j] = w[j] * x[i * d + j] * inv;
  }
  return y;
}

double Silu(double g) { return g / (1 + std::exp(-g)); }

// Rotates v[0, dr) for position pos.
void RefRope(double* v, int64_t dr, int64_t pos, const std::vector<float>& inv_freq, double factor,
             bool interleave) {
  const int64_t half = dr / 2;
  std::vector<double> out(v, v + dr);
  for (int64_t i = 0; i < half; ++i) {
    const double a = double(float(pos) * inv_freq[i]);
    const double c = std::cos(a) * factor, s = std::sin(a) * factor;
    const int64_t p = interleave ? 2 * i : i, q = interleave ? 2 * i + 1 : i + half;
    out[p] = v[p] * c - v[q] * s;
    out[q] = v[q] * c + v[p] * s;
  }
  std::copy(out.begin(), out.end(), v);
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// ---- Cases -------------------------------------------------------------------------------

// warm: one product of other rows into the same output first (a kernel whose state outlives a
// launch, such as split-K arrival counters, must leave it as it found it).
Result Linear(Ctx& c, int64_t n, int64_t k, int64_t m, DType wt, bool warm = false) {
  std::vector<float> x = c.Randn(n * k), w = c.Randn(m * k, 1.0f / std::sqrt(float(k)));
  // The GPU's bf16 GEMMs take bf16 activations (as a bf16 model does): the reference rounds x
  // the same way, so the tolerance still only covers the summation order.
  std::vector<float> x_ref = x;
  if (wt == DType::kBF16 && !c.b.device().is_cpu()) {
    for (float& v : x_ref) v = Bf16ToF32(F32ToBf16(v));
  }
  const Tensor tx = c.Up(x, DType::kF32, {n, k});
  const Tensor tw = wt == DType::kBF16 ? c.UpBf16(w, {m, k}) : c.Up(w, DType::kF32, {m, k});
  const Tensor ty = c.Alloc(DType::kF32, {n, m});
  Result r;
  r.bytes = tw.nbytes() + tx.nbytes() + ty.nbytes();
  r.flops = 2.0 * n * k * m;
  if (c.perf) {
    r.seconds = c.Time([&] { c.b.Linear(tx, tw, ty); });
    return r;
  }
  if (warm) c.b.Linear(c.Up(c.Randn(n * k), DType::kF32, {n, k}), tw, ty);
  c.b.Linear(tx, tw, ty);
  r.err = RelErr(c.Down<float>(ty), RefLinear(x_ref, w, n, k, m));
  r.tol = 1e-5;
  return r;
}

Result Embedding(Ctx& c, int64_t n, int64_t v, int64_t h) {
  std::vector<float> table = c.Randn(v * h);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = c.rng() % v;
  const Tensor tt = c.UpBf16(table, {v, h}), ti = c.Up(ids, DType::kI32, {n});
  const Tensor out = c.Alloc(DType::kF32, {n, h});
  c.b.Embedding(tt, ti, out);
  std::vector<double> want(n * h);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < h; ++j) want[i * h + j] = table[ids[i] * h + j];
  }
  return Result(RelErr(c.Down<float>(out), want), 0.0);
}

Result RmsNorm(Ctx& c, int64_t n, int64_t d) {
  std::vector<float> x = c.Randn(n * d, 3.0f), w = c.Randn(d);
  const Tensor tx = c.Up(x, DType::kF32, {n, d}), tw = c.Up(w, DType::kF32, {d});
  Result r;
  r.bytes = 2.0 * tx.nbytes();
  if (c.perf) {
    const Tensor out = c.Alloc(DType::kF32, {n, d});
    r.seconds = c.Time([&] { c.b.RmsNorm(tx, tw, 1e-6f, out); });
    return r;
  }
  c.b.RmsNorm(tx, tw, 1e-6f, tx);  // in place (out may alias x)
  r.err = RelErr(c.Down<float>(tx), RefRmsNorm(ToDouble(x), w, n, d, 1e-6));
  r.tol = 1e-5;
  return r;
}

// y += x, out = RmsNorm(y): y exactly the fp32 sums, out against the double reference of them,
// and both bit for bit what Add then RmsNorm give on the same backend.
Result AddRmsNorm(Ctx& c, int64_t n, int64_t d) {
  std::vector<float> y = c.Randn(n * d, 2.0f), x = c.Randn(n * d), w = c.Randn(d);
  const Tensor ty = c.Up(y, DType::kF32, {n, d}), tx = c.Up(x, DType::kF32, {n, d});
  const Tensor ty2 = c.Up(y, DType::kF32, {n, d}), tw = c.Up(w, DType::kF32, {d});
  const Tensor out = c.Alloc(DType::kF32, {n, d}), out2 = c.Alloc(DType::kF32, {n, d});
  c.b.AddRmsNorm(ty, tx, tw, 1e-6f, out);
  c.b.Add(ty2, tx);
  c.b.RmsNorm(ty2, tw, 1e-6f, out2);
  std::vector<float> sum(n * d);
  for (int64_t i = 0; i < n * d; ++i) sum[i] = y[i] + x[i];
  const std::vector<float> got_y = c.Down<float>(ty), got = c.Down<float>(out);
  if (got_y != sum) return Result::Fail("y is not y + x");
  if (got_y != c.Down<float>(ty2) || got != c.Down<float>(out2)) {
    return Result::Fail("differs from Add then RmsNorm");
  }
  return Result(RelErr(got, RefRmsNorm(ToDouble(sum), w, n, d, 1e-6)), 1e-5);
}

Result AddSilu(Ctx& c, int64_t n, int64_t inter) {
  std::vector<float> gu = c.Randn(n * 2 * inter, 2.0f), y = c.Randn(n * inter);
  const Tensor tg = c.Up(gu, DType::kF32, {n, 2 * inter}), ty = c.Up(y, DType::kF32, {n, inter});
  const Tensor act = c.Alloc(DType::kF32, {n, inter});
  c.b.SiluMul(tg, act);
  c.b.Add(ty, act);
  std::vector<double> want(n * inter);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < inter; ++j) {
      want[i * inter + j] =
          y[i * inter + j] + Silu(gu[i * 2 * inter + j]) * double(gu[i * 2 * inter + inter + j]);
    }
  }
  return Result(RelErr(c.Down<float>(ty), want), 1e-6);
}

Result Rope(Ctx& c, bool interleave) {
  const int64_t n = 5, heads = 3, dn = 8, dr = 16, width = dn + dr;
  std::vector<float> x = c.Randn(n * heads * width), inv(dr / 2);
  for (int64_t i = 0; i < dr / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / dr);
  std::vector<int64_t> pos = {0, 1, 7, 300, 4095};
  const Tensor tx = c.Up(x, DType::kF32, {n, heads, width});
  const RopeSpec spec{c.Up(inv, DType::kF32, {dr / 2}), 1.3f, interleave};
  c.b.Rope(tx, dn, c.Up(pos, DType::kI64, {n}), spec);
  std::vector<double> want = ToDouble(x);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      RefRope(&want[(i * heads + h) * width + dn], dr, pos[i], inv, 1.3, interleave);
    }
  }
  return Result(RelErr(c.Down<float>(tx), want), 1e-6);
}

Result Gather(Ctx& c) {
  const int64_t n = 7, h = 33;
  std::vector<float> x = c.Randn(n * h);
  std::vector<int32_t> idx = {6, 0, 0, 3, 5};
  const Tensor out = c.Alloc(DType::kF32, {5, h});
  c.b.GatherRows(c.Up(x, DType::kF32, {n, h}), c.Up(idx, DType::kI32, {5}), out);
  std::vector<double> want;
  for (int32_t r : idx) want.insert(want.end(), x.begin() + r * h, x.begin() + (r + 1) * h);
  return Result(RelErr(c.Down<float>(out), want), 0.0);
}

// A paged MLA setup: `seqs` sequences of length `len` (blocks scattered over the pool), latent
// rows written by MlaCacheWrite, one query token per sequence at its last position.
struct MlaSetup {
  int64_t heads = 4, dn = 16, dr = 8, dv = 12, kvr = 32, block = 4;
  DType cache_dtype = DType::kF32;  // kBF16: rows rounded when written (cache_ref likewise)
  std::vector<float> inv, norm_w, kv_b;
  std::vector<double> cache_ref;  // [seqs, len, kvr + dr] expected rows
  Tensor cache, kv_b_t;
  AttentionTokens last;  // one token per sequence: position len - 1
  AttentionTokens all;   // every position of every sequence (a prefill's queries)
  RopeSpec rope;
};

// DeepSeek's MLA shape (latent 512 + rope 64) with small heads (dn 16, dv 8) and a bf16 cache.
MlaSetup WideBf16Mla(int64_t heads, int64_t block) {
  MlaSetup s;
  s.heads = heads, s.dn = 16, s.dv = 8, s.kvr = 512, s.dr = 64, s.block = block;
  s.cache_dtype = DType::kBF16;
  return s;
}

// DeepSeek's full head dims (nope 128, rope 64, value 128), latent 512, bf16 cache.
MlaSetup DeepseekHeadsMla(int64_t heads, int64_t block) {
  MlaSetup s = WideBf16Mla(heads, block);
  s.dn = 128, s.dv = 128;
  return s;
}

// `s` gives the shapes (its defaults are small ones).
MlaSetup MakeMla(Ctx& c, int64_t seqs, int64_t len, Result* write_check, MlaSetup s = {}) {
  const int64_t width = s.kvr + s.dr, blocks_per_seq = (len + s.block - 1) / s.block;
  const int64_t num_blocks = seqs * blocks_per_seq + 3;
  s.inv.resize(s.dr / 2);
  for (int64_t i = 0; i < s.dr / 2; ++i) s.inv[i] = std::pow(10000.0f, -2.0f * i / s.dr);
  s.norm_w = c.Randn(s.kvr, 0.5f);
  for (float& w : s.norm_w) w += 1.0f;
  s.kv_b = c.Randn(s.heads * (s.dn + s.dv) * s.kvr, 1.0f / std::sqrt(float(s.kvr)));
  s.kv_b_t = c.Up(s.kv_b, DType::kF32, {s.heads * (s.dn + s.dv), s.kvr});
  s.rope = {c.Up(s.inv, DType::kF32, {s.dr / 2}), 1.0f, true};
  s.cache = c.Alloc(s.cache_dtype, {num_blocks * s.block, width});
  // Block tables: a permutation of the pool, so no sequence has contiguous blocks.
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), c.rng);
  std::vector<int32_t> tables(seqs * blocks_per_seq);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = perm[i];
  const Tensor tables_t = c.Up(tables, DType::kI32, {seqs, blocks_per_seq});
  // Write every position of every sequence in one call.
  const int64_t n = seqs * len;
  std::vector<float> ckv = c.Randn(n * width);
  std::vector<int64_t> pos(n), slots(n);
  std::vector<int32_t> seq_index(n);
  for (int64_t q = 0; q < seqs; ++q) {
    for (int64_t p = 0; p < len; ++p) {
      const int64_t i = q * len + p;
      pos[i] = p;
      seq_index[i] = static_cast<int32_t>(q);
      slots[i] = tables[q * blocks_per_seq + p / s.block] * s.block + p % s.block;
    }
  }
  AttentionTokens all{c.Up(pos, DType::kI64, {n}), c.Up(seq_index, DType::kI32, {n}),
                      c.Up(slots, DType::kI64, {n}), tables_t, s.block};
  c.b.MlaCacheWrite(c.Up(ckv, DType::kF32, {n, width}), c.Up(s.norm_w, DType::kF32, {s.kvr}), 1e-6f,
                    all, s.rope, s.cache);
  s.all = all;
  s.cache_ref.resize(n * width);
  std::vector<double> latent(n * s.kvr);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < s.kvr; ++j) latent[i * s.kvr + j] = ckv[i * width + j];
  }
  latent = RefRmsNorm(latent, s.norm_w, n, s.kvr, 1e-6);
  for (int64_t i = 0; i < n; ++i) {
    std::copy(latent.begin() + i * s.kvr, latent.begin() + (i + 1) * s.kvr,
              s.cache_ref.begin() + i * width);
    for (int64_t j = 0; j < s.dr; ++j)
      s.cache_ref[i * width + s.kvr + j] = ckv[i * width + s.kvr + j];
    RefRope(&s.cache_ref[i * width + s.kvr], s.dr, pos[i], s.inv, 1.0, true);
  }
  const bool bf16 = s.cache_dtype == DType::kBF16;
  if (bf16) {
    for (double& v : s.cache_ref) v = Bf16ToF32(F32ToBf16(static_cast<float>(v)));
  }
  if (write_check) {
    std::vector<float> got_cache;
    if (bf16) {
      for (uint16_t v : c.Down<uint16_t>(s.cache)) got_cache.push_back(Bf16ToF32(v));
    } else {
      got_cache = c.Down<float>(s.cache);
    }
    std::vector<float> got(n * width);
    for (int64_t i = 0; i < n; ++i) {
      std::copy(got_cache.begin() + slots[i] * width, got_cache.begin() + (slots[i] + 1) * width,
                got.begin() + i * width);
    }
    // bf16: the fp32 row and the double reference may round to neighbouring bf16 values.
    *write_check = Result(RelErr(got, s.cache_ref), bf16 ? 8e-3 : 1e-5);
  }
  std::vector<int64_t> lpos(seqs, len - 1), lslots(seqs);
  std::vector<int32_t> lseq(seqs);
  for (int64_t q = 0; q < seqs; ++q) {
    lseq[q] = static_cast<int32_t>(q);
    lslots[q] = slots[q * len + len - 1];
  }
  s.last = {c.Up(lpos, DType::kI64, {seqs}), c.Up(lseq, DType::kI32, {seqs}),
            c.Up(lslots, DType::kI64, {seqs}), tables_t, s.block};
  return s;
}

Result MlaCacheWrite(Ctx& c, DType cache_dtype = DType::kF32) {
  Result r;
  MlaSetup shapes;
  shapes.cache_dtype = cache_dtype;
  MakeMla(c, 3, 9, &r, std::move(shapes));
  return r;
}

// MlaAttention's tolerance against the double reference: a bf16 cache makes the reference
// attend the same rounded rows (a rare tie may round the other way on the device); TF32 allowed
// with a bf16 cache (a bf16 model): the GPU may take q and the softmax weights as bf16 too (8
// mantissa bits, as the model's own tensors), so 1e-2.
double MlaTolerance(const MlaSetup& s, bool tf32) {
  const bool bf16_cache = s.cache_dtype == DType::kBF16;
  return tf32 ? (bf16_cache ? 1e-2 : 5e-3) : bf16_cache ? 1e-3 : 1e-4;
}

// Attention of heads [h0, h1) for the last token of each sequence, against the expanded
// (non-absorbed) form: k_j = W_k·c_j, v_j = W_v·c_j.
// tf32: with Backend::AllowTf32 (a bf16 model's setting; the GPU may then use TF32 tensor
// cores: inputs rounded to 10 mantissa bits, so the tolerance is that of those roundings).
Result MlaAttention(Ctx& c, int64_t h0, int64_t h1, int64_t seqs = 3, int64_t len = 11,
                    MlaSetup shapes = {}, bool tf32 = false) {
  MlaSetup s = MakeMla(c, seqs, len, nullptr, std::move(shapes));
  const int64_t width = s.kvr + s.dr, qk = s.dn + s.dr, nh = h1 - h0;
  std::vector<float> q = c.Randn(seqs * s.heads * qk);
  const Tensor out = c.Alloc(DType::kF32, {seqs, nh * s.dv});
  const float scale = 1.0f / std::sqrt(float(qk));
  c.b.AllowTf32(tf32);
  try {
    c.b.MlaAttention(c.Up(q, DType::kF32, {seqs, s.heads, qk}), s.kv_b_t, s.last, s.cache, h0, h1,
                     s.dn, s.dv, scale, out);
  } catch (...) {
    c.b.AllowTf32(false);
    throw;
  }
  c.b.AllowTf32(false);
  std::vector<double> want(seqs * nh * s.dv);
  for (int64_t t = 0; t < seqs; ++t) {
    for (int64_t h = h0; h < h1; ++h) {
      const float* qh = &q[(t * s.heads + h) * qk];
      const float* wk = &s.kv_b[h * (s.dn + s.dv) * s.kvr];
      const float* wv = wk + s.dn * s.kvr;
      std::vector<double> score(len);
      for (int64_t j = 0; j < len; ++j) {
        const double* row = &s.cache_ref[(t * len + j) * width];
        double acc = 0;
        for (int64_t d = 0; d < s.dn; ++d) {
          double k = 0;
          for (int64_t l = 0; l < s.kvr; ++l) k += double(wk[d * s.kvr + l]) * row[l];
          acc += qh[d] * k;
        }
        for (int64_t d = 0; d < s.dr; ++d) acc += qh[s.dn + d] * row[s.kvr + d];
        score[j] = acc * scale;
      }
      const double mx = *std::max_element(score.begin(), score.end());
      double sum = 0;
      for (double& v : score) sum += (v = std::exp(v - mx));
      for (int64_t e = 0; e < s.dv; ++e) {
        double o = 0;
        for (int64_t j = 0; j < len; ++j) {
          const double* row = &s.cache_ref[(t * len + j) * width];
          double v = 0;
          for (int64_t l = 0; l < s.kvr; ++l) v += double(wv[e * s.kvr + l]) * row[l];
          o += score[j] / sum * v;
        }
        want[(t * nh + (h - h0)) * s.dv + e] = o;
      }
    }
  }
  return Result(RelErr(c.Down<float>(out), want), MlaTolerance(s, tf32));
}

// Prefill attention: positions [first, len) of `seqs` sequences of `len` queried at once
// (causal: the token at position p attends 0 .. p; positions before `first` are a cached
// prefix, as in a chunked prefill), heads [0, heads), against the expanded form as above (each
// head's k_j, v_j computed once per cached row).
Result MlaPrefill(Ctx& c, int64_t seqs, int64_t len, MlaSetup shapes, bool tf32,
                  int64_t first = 0) {
  MlaSetup s = MakeMla(c, seqs, len, nullptr, std::move(shapes));
  const int64_t width = s.kvr + s.dr, qk = s.dn + s.dr, nh = s.heads, fresh = len - first;
  const int64_t n = seqs * fresh;
  AttentionTokens tokens = s.all;
  if (first > 0) {
    const std::vector<int64_t> pos = c.Down<int64_t>(s.all.positions);
    const std::vector<int64_t> slots = c.Down<int64_t>(s.all.slot_mapping);
    const std::vector<int32_t> seq = c.Down<int32_t>(s.all.seq_index);
    std::vector<int64_t> qpos, qslots;
    std::vector<int32_t> qseq;
    for (size_t i = 0; i < pos.size(); ++i) {
      if (pos[i] < first) continue;
      qpos.push_back(pos[i]), qslots.push_back(slots[i]), qseq.push_back(seq[i]);
    }
    tokens = {c.Up(qpos, DType::kI64, {n}), c.Up(qseq, DType::kI32, {n}),
              c.Up(qslots, DType::kI64, {n}), s.all.block_tables, s.block};
  }
  std::vector<float> q = c.Randn(n * nh * qk);
  const Tensor out = c.Alloc(DType::kF32, {n, nh * s.dv});
  const float scale = 1.0f / std::sqrt(float(qk));
  c.b.AllowTf32(tf32);
  try {
    c.b.MlaAttention(c.Up(q, DType::kF32, {n, nh, qk}), s.kv_b_t, tokens, s.cache, 0, nh, s.dn,
                     s.dv, scale, out);
  } catch (...) {
    c.b.AllowTf32(false);
    throw;
  }
  c.b.AllowTf32(false);
  std::vector<double> want(n * nh * s.dv);
  std::vector<double> k(len * s.dn), v(len * s.dv), score(len);
  for (int64_t sq = 0; sq < seqs; ++sq) {
    for (int64_t h = 0; h < nh; ++h) {
      const float* wk = &s.kv_b[h * (s.dn + s.dv) * s.kvr];
      const float* wv = wk + s.dn * s.kvr;
      for (int64_t j = 0; j < len; ++j) {
        const double* row = &s.cache_ref[(sq * len + j) * width];
        for (int64_t d = 0; d < s.dn; ++d) {
          double acc = 0;
          for (int64_t l = 0; l < s.kvr; ++l) acc += double(wk[d * s.kvr + l]) * row[l];
          k[j * s.dn + d] = acc;
        }
        for (int64_t e = 0; e < s.dv; ++e) {
          double acc = 0;
          for (int64_t l = 0; l < s.kvr; ++l) acc += double(wv[e * s.kvr + l]) * row[l];
          v[j * s.dv + e] = acc;
        }
      }
      for (int64_t p = first; p < len; ++p) {
        const int64_t t = sq * fresh + p - first;
        const float* qh = &q[(t * nh + h) * qk];
        double mx = -1e300;
        for (int64_t j = 0; j <= p; ++j) {
          const double* row = &s.cache_ref[(sq * len + j) * width];
          double acc = 0;
          for (int64_t d = 0; d < s.dn; ++d) acc += qh[d] * k[j * s.dn + d];
          for (int64_t d = 0; d < s.dr; ++d) acc += qh[s.dn + d] * row[s.kvr + d];
          score[j] = acc * scale;
          mx = std::max(mx, score[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= p; ++j) sum += (score[j] = std::exp(score[j] - mx));
        for (int64_t e = 0; e < s.dv; ++e) {
          double o = 0;
          for (int64_t j = 0; j <= p; ++j) o += score[j] / sum * v[j * s.dv + e];
          want[(t * nh + h) * s.dv + e] = o;
        }
      }
    }
  }
  return Result(RelErr(c.Down<float>(out), want), MlaTolerance(s, tf32));
}

// An MLA perf case's operands: random q [n, heads, dn + dr] and kv_b [heads (dn + dv), kvr]
// (fp32), and the output [n, heads dv].
struct MlaPerfOperands {
  Tensor q, kv_b, out;
};
MlaPerfOperands MlaPerfTensors(Ctx& c, int64_t n, int64_t heads, int64_t dn, int64_t dr, int64_t dv,
                               int64_t kvr) {
  return {c.Up(c.Randn(n * heads * (dn + dr)), DType::kF32, {n, heads, dn + dr}),
          c.Up(c.Randn(heads * (dn + dv) * kvr), DType::kF32, {heads * (dn + dv), kvr}),
          c.Alloc(DType::kF32, {n, heads * dv})};
}

// Decode attention perf: `seqs` tokens over `ctx` cached positions each, 16 heads, 512 + 64.
Result MlaDecodePerf(Ctx& c, int64_t seqs, int64_t ctx, bool tf32 = false,
                     DType cache_dtype = DType::kF32) {
  const int64_t heads = 16, dn = 128, dr = 64, dv = 128, kvr = 512, block = 64, width = kvr + dr;
  const int64_t blocks = (ctx + block - 1) / block;
  const Tensor cache = c.Alloc(cache_dtype, {seqs * blocks * block, width});
  if (cache_dtype == DType::kF32) {
    c.b.Fill(cache, 0.01f);
  } else {
    c.b.CopyToDevice(cache, std::vector<uint16_t>(cache.numel(), F32ToBf16(0.01f)).data());
  }
  std::vector<int32_t> tables(seqs * blocks);
  std::iota(tables.begin(), tables.end(), 0);
  std::vector<int64_t> pos(seqs, ctx - 1), slots(seqs);
  std::vector<int32_t> seq(seqs);
  std::iota(seq.begin(), seq.end(), 0);
  AttentionTokens t{c.Up(pos, DType::kI64, {seqs}), c.Up(seq, DType::kI32, {seqs}),
                    c.Up(slots, DType::kI64, {seqs}), c.Up(tables, DType::kI32, {seqs, blocks}),
                    block};
  const auto [tq, tkv, out] = MlaPerfTensors(c, seqs, heads, dn, dr, dv, kvr);
  Result r;
  r.bytes = double(seqs) * ctx * width * DTypeSize(cache_dtype) + tkv.nbytes();
  r.flops = 2.0 * seqs * heads * (ctx * (kvr + dr) + ctx * kvr + (dn + dv) * kvr);
  c.b.AllowTf32(tf32);
  r.seconds = c.Time([&] { c.b.MlaAttention(tq, tkv, t, cache, 0, heads, dn, dv, 0.1f, out); });
  c.b.AllowTf32(false);
  return r;
}

// Prefill attention perf: every position of `seqs` sequences of `len` tokens, 16 heads, 512 +
// 64 latent, 128 + 64 / 128 head dims, bf16 cache (random rows), TF32 allowed (a bf16 model).
// FLOPs of the expanded form: k_nope, v per context row and head, then the causal products.
// A paged GQA setup (Qwen3): `seqs` sequences of `len` positions, blocks scattered over the
// pool, every position written by one GqaCacheWrite (prefill), checked against the double
// reference of the normed, roped q and cache rows.
struct GqaSetup {
  int64_t heads = 8, kvh = 2, d = 16, block = 4;
  DType cache_dtype = DType::kF32;
  std::vector<float> inv, q_norm, k_norm;
  std::vector<double> q_ref, cache_ref;  // [n, heads, d], [n, 2·kvh·d] for token n = seq·len + p
  Tensor cache, q;                       // q: every token's, as GqaCacheWrite wrote it
  AttentionTokens last, all;
  RopeSpec rope;
};

GqaSetup MakeGqa(Ctx& c, int64_t seqs, int64_t len, Result* write_check, GqaSetup s) {
  const int64_t width = 2 * s.kvh * s.d, in_width = (s.heads + 2 * s.kvh) * s.d;
  const int64_t blocks_per_seq = (len + s.block - 1) / s.block;
  const int64_t num_blocks = seqs * blocks_per_seq + 3;
  s.inv.resize(s.d / 2);
  for (int64_t i = 0; i < s.d / 2; ++i) s.inv[i] = std::pow(1e6f, -2.0f * i / s.d);
  s.q_norm = c.Randn(s.d, 0.2f);
  s.k_norm = c.Randn(s.d, 0.2f);
  for (float& w : s.q_norm) w += 1.0f;
  for (float& w : s.k_norm) w += 1.0f;
  s.rope = {c.Up(s.inv, DType::kF32, {s.d / 2}), 1.0f, false};
  s.cache = c.Alloc(s.cache_dtype, {num_blocks * s.block, width});
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), c.rng);
  std::vector<int32_t> tables(perm.begin(), perm.begin() + seqs * blocks_per_seq);
  const Tensor tables_t = c.Up(tables, DType::kI32, {seqs, blocks_per_seq});
  const int64_t n = seqs * len;
  std::vector<float> qkv = c.Randn(n * in_width);
  std::vector<int64_t> pos(n), slots(n);
  std::vector<int32_t> seq_index(n);
  for (int64_t q = 0; q < seqs; ++q) {
    for (int64_t p = 0; p < len; ++p) {
      const int64_t i = q * len + p;
      pos[i] = p;
      seq_index[i] = static_cast<int32_t>(q);
      slots[i] = tables[q * blocks_per_seq + p / s.block] * s.block + p % s.block;
    }
  }
  s.all = {c.Up(pos, DType::kI64, {n}), c.Up(seq_index, DType::kI32, {n}),
           c.Up(slots, DType::kI64, {n}), tables_t, s.block};
  s.q = c.Alloc(DType::kF32, {n, s.heads, s.d});
  c.b.GqaCacheWrite(c.Up(qkv, DType::kF32, {n, in_width}), c.Up(s.q_norm, DType::kF32, {s.d}),
                    c.Up(s.k_norm, DType::kF32, {s.d}), 1e-6f, s.all, s.rope, s.q, s.cache);
  s.q_ref.resize(n * s.heads * s.d);
  s.cache_ref.resize(n * width);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < s.heads + s.kvh; ++h) {
      std::vector<double> v(qkv.begin() + i * in_width + h * s.d,
                            qkv.begin() + i * in_width + (h + 1) * s.d);
      v = RefRmsNorm(v, h < s.heads ? s.q_norm : s.k_norm, 1, s.d, 1e-6);
      RefRope(v.data(), s.d, pos[i], s.inv, 1.0, false);
      double* dst = h < s.heads ? &s.q_ref[(i * s.heads + h) * s.d]
                                : &s.cache_ref[i * width + (h - s.heads) * s.d];
      std::copy(v.begin(), v.end(), dst);
    }
    for (int64_t j = 0; j < s.kvh * s.d; ++j) {
      s.cache_ref[i * width + s.kvh * s.d + j] = qkv[i * in_width + (s.heads + s.kvh) * s.d + j];
    }
  }
  const bool bf16 = s.cache_dtype == DType::kBF16;
  if (bf16) {
    for (double& v : s.cache_ref) v = Bf16ToF32(F32ToBf16(static_cast<float>(v)));
  }
  if (write_check) {
    std::vector<float> got_cache;
    if (bf16) {
      for (uint16_t v : c.Down<uint16_t>(s.cache)) got_cache.push_back(Bf16ToF32(v));
    } else {
      got_cache = c.Down<float>(s.cache);
    }
    std::vector<float> got(n * width);
    for (int64_t i = 0; i < n; ++i) {
      std::copy(got_cache.begin() + slots[i] * width, got_cache.begin() + (slots[i] + 1) * width,
                got.begin() + i * width);
    }
    const double q_err = RelErr(c.Down<float>(s.q), s.q_ref);
    *write_check = Result(std::max(q_err, RelErr(got, s.cache_ref)), bf16 ? 8e-3 : 1e-5);
  }
  std::vector<int64_t> lpos(seqs, len - 1), lslots(seqs);
  std::vector<int32_t> lseq(seqs);
  for (int64_t q = 0; q < seqs; ++q) {
    lseq[q] = static_cast<int32_t>(q);
    lslots[q] = slots[q * len + len - 1];
  }
  s.last = {c.Up(lpos, DType::kI64, {seqs}), c.Up(lseq, DType::kI32, {seqs}),
            c.Up(lslots, DType::kI64, {seqs}), tables_t, s.block};
  return s;
}

Result GqaCacheWrite(Ctx& c, GqaSetup shapes) {
  Result r;
  MakeGqa(c, 3, 9, &r, std::move(shapes));
  return r;
}

// Heads [h0, h1) of `seqs` sequences of `len`: the last token of each (decode), or every token
// (prefill: each position over its causal prefix), against the double reference over the
// expected cache rows and q.
// tf32: with Backend::AllowTf32 (a bf16 model): with a bf16 cache and head_dim 64 / 128 / 256
// the GPU runs the bf16 tensor-core form (q and P rounded to bf16), hence 1e-2.
Result GqaAttention(Ctx& c, int64_t h0, int64_t h1, int64_t seqs, int64_t len, GqaSetup shapes,
                    bool prefill = false, bool tf32 = false) {
  GqaSetup s = MakeGqa(c, seqs, len, nullptr, std::move(shapes));
  const int64_t width = 2 * s.kvh * s.d, nh = h1 - h0, group = s.heads / s.kvh;
  const int64_t n = prefill ? seqs * len : seqs;
  const float scale = 1.0f / std::sqrt(float(s.d));
  // The queries: the written q of each token (prefill), or of each sequence's last token.
  std::vector<float> q_all = c.Down<float>(s.q), q(n * s.heads * s.d);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t src = prefill ? t : t * len + len - 1;
    std::copy(q_all.begin() + src * s.heads * s.d, q_all.begin() + (src + 1) * s.heads * s.d,
              q.begin() + t * s.heads * s.d);
  }
  const Tensor out = c.Alloc(DType::kF32, {n, nh * s.d});
  c.b.AllowTf32(tf32);
  try {
    c.b.GqaAttention(c.Up(q, DType::kF32, {n, s.heads, s.d}), prefill ? s.all : s.last, s.cache,
                     s.kvh, h0, h1, scale, out);
  } catch (...) {
    c.b.AllowTf32(false);
    throw;
  }
  c.b.AllowTf32(false);
  std::vector<double> want(n * nh * s.d);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t seq = prefill ? t / len : t, p_last = prefill ? t % len : len - 1;
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t g = h / group;
      const float* qh = &q[(t * s.heads + h) * s.d];
      std::vector<double> score(p_last + 1);
      for (int64_t j = 0; j <= p_last; ++j) {
        const double* row = &s.cache_ref[(seq * len + j) * width + g * s.d];
        double acc = 0;
        for (int64_t e = 0; e < s.d; ++e) acc += double(qh[e]) * row[e];
        score[j] = acc * scale;
      }
      const double mx = *std::max_element(score.begin(), score.end());
      double sum = 0;
      for (double& v : score) sum += (v = std::exp(v - mx));
      for (int64_t e = 0; e < s.d; ++e) {
        double o = 0;
        for (int64_t j = 0; j <= p_last; ++j) {
          o += score[j] / sum * s.cache_ref[(seq * len + j) * width + (s.kvh + g) * s.d + e];
        }
        want[(t * nh + (h - h0)) * s.d + e] = o;
      }
    }
  }
  return Result(RelErr(c.Down<float>(out), want),
                tf32 ? 1e-2 : (s.cache_dtype == DType::kBF16 ? 1e-3 : 1e-4));
}

GqaSetup Gqa(int64_t heads, int64_t kvh, int64_t d, int64_t block, DType cache = DType::kF32) {
  GqaSetup s;
  s.heads = heads, s.kvh = kvh, s.d = d, s.block = block, s.cache_dtype = cache;
  return s;
}

Result MlaPrefillPerf(Ctx& c, int64_t seqs, int64_t len) {
  const int64_t heads = 16, dn = 128, dr = 64, dv = 128, kvr = 512, block = 64, width = kvr + dr;
  const int64_t blocks = (len + block - 1) / block, n = seqs * len;
  const Tensor cache = c.Alloc(DType::kBF16, {seqs * blocks * block, width});
  std::vector<uint16_t> rows(cache.numel());
  const std::vector<float> r = c.Randn(cache.numel());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = F32ToBf16(r[i]);
  c.b.CopyToDevice(cache, rows.data());
  std::vector<int32_t> tables(seqs * blocks);
  std::iota(tables.begin(), tables.end(), 0);
  std::vector<int64_t> pos(n), slots(n);
  std::vector<int32_t> seq(n);
  for (int64_t i = 0; i < n; ++i) {
    pos[i] = i % len, seq[i] = static_cast<int32_t>(i / len);
    slots[i] = (i / len) * blocks * block + i % len;
  }
  AttentionTokens t{c.Up(pos, DType::kI64, {n}),
                    c.Up(seq, DType::kI32, {n}),
                    c.Up(slots, DType::kI64, {n}),
                    c.Up(tables, DType::kI32, {seqs, blocks}),
                    block,
                    len};
  const auto [tq, tkv, out] = MlaPerfTensors(c, n, heads, dn, dr, dv, kvr);
  Result res;
  res.bytes = double(cache.nbytes()) + tq.nbytes() + out.nbytes();
  res.flops = 2.0 * seqs * heads *
              (double(len) * (len + 1) / 2 * (dn + dr + dv) + double(len) * kvr * (dn + dv));
  c.b.AllowTf32(true);
  res.seconds = c.Time([&] { c.b.MlaAttention(tq, tkv, t, cache, 0, heads, dn, dv, 0.1f, out); });
  c.b.AllowTf32(false);
  return res;
}

// A router spec by field: renormalised top-k weights as V3 (sigmoid, + 1e-20) or Qwen3 (softmax,
// no epsilon) do.
RouterSpec Spec(RouterScoring scoring, bool group_limited, int64_t k, int64_t n_group,
                int64_t topk_group, bool norm, float scaling) {
  RouterSpec spec;
  spec.scoring = scoring;
  spec.group_limited = group_limited;
  spec.top_k = k;
  spec.n_group = n_group;
  spec.topk_group = topk_group;
  spec.norm_topk_prob = norm;
  spec.norm_eps = scoring == RouterScoring::kSigmoid ? 1e-20f : 0.0f;
  spec.routed_scaling_factor = scaling;
  return spec;
}

Result Router(Ctx& c, RouterScoring scoring, bool group_limited, bool norm) {
  const int64_t n = 6, e = 16, k = 4;
  const RouterSpec spec = Spec(scoring, group_limited, k, 4, 2, norm, 2.5f);
  std::vector<float> logits = c.Randn(n * e, 2.0f), bias = c.Randn(e, 0.1f);
  const bool use_bias = scoring == RouterScoring::kSigmoid;
  const Tensor ids = c.Alloc(DType::kI32, {n, k}), w = c.Alloc(DType::kF32, {n, k});
  c.b.RouterTopk(c.Up(logits, DType::kF32, {n, e}),
                 use_bias ? c.Up(bias, DType::kF32, {e}) : Tensor(), spec, ids, w);
  const std::vector<int32_t> got_ids = c.Down<int32_t>(ids);
  std::vector<double> want(n * k);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> score(e), choice(e);
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < e; ++i) mx = std::max(mx, double(logits[t * e + i]));
    for (int64_t i = 0; i < e; ++i) sum += std::exp(logits[t * e + i] - mx);
    for (int64_t i = 0; i < e; ++i) {
      score[i] = use_bias ? 1 / (1 + std::exp(-double(logits[t * e + i])))
                          : std::exp(logits[t * e + i] - mx) / sum;
      choice[i] = score[i] + (use_bias ? bias[i] : 0.0);
    }
    if (use_bias || group_limited) {  // keep the 2 best of 4 groups
      std::vector<std::pair<double, int>> g;
      for (int q = 0; q < 4; ++q) {
        std::vector<double> m(choice.begin() + q * 4, choice.begin() + q * 4 + 4);
        std::sort(m.rbegin(), m.rend());
        g.push_back({use_bias ? m[0] + m[1] : m[0], -q});
      }
      std::sort(g.rbegin(), g.rend());
      for (int q = 2; q < 4; ++q) {
        for (int i = 0; i < 4; ++i) choice[-g[q].second * 4 + i] = use_bias ? -INFINITY : 0.0;
      }
    }
    std::vector<int> idx(e);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return choice[a] > choice[b]; });
    std::vector<int> top(idx.begin(), idx.begin() + k);
    std::sort(top.begin(), top.end());
    double norm = 0;
    for (int i : top) norm += score[i];
    for (int64_t j = 0; j < k; ++j) {
      if (got_ids[t * k + j] != top[j]) return Result::Fail("ids differ");
      want[t * k + j] = score[top[j]] / (spec.norm_topk_prob ? norm : 1.0) * 2.5;
    }
  }
  return Result(RelErr(c.Down<float>(w), want), 1e-5);
}

// The router in one op (RouterGateTopk: the CUDA backend fuses the fp32 gate GEMV and the top-k
// for up to 8 tokens) against Linear then RouterTopk on the same backend: the same ids, weights
// within 1e-6 (the same gate arithmetic; only the fusion differs).
Result RouterGate(Ctx& c, int64_t n, int64_t e, RouterScoring scoring, bool group_limited,
                  bool renormalised = false) {
  const int64_t h = 2048, k = 6;
  const bool sigmoid = scoring == RouterScoring::kSigmoid, grouped = sigmoid || group_limited;
  const RouterSpec spec = Spec(scoring, group_limited, k, grouped ? 8 : 1, grouped ? 3 : 1,
                               sigmoid || renormalised, 2.5f);
  const Tensor x = c.Up(c.Randn(n * h), DType::kF32, {n, h});
  const Tensor gate = c.Up(c.Randn(e * h, 0.05f), DType::kF32, {e, h});
  const Tensor bias =
      scoring == RouterScoring::kSigmoid ? c.Up(c.Randn(e, 0.1f), DType::kF32, {e}) : Tensor();
  const Tensor logits = c.Alloc(DType::kF32, {n, e}), logits2 = c.Alloc(DType::kF32, {n, e});
  const Tensor ids = c.Alloc(DType::kI32, {n, k}), w = c.Alloc(DType::kF32, {n, k});
  const Tensor ids2 = c.Alloc(DType::kI32, {n, k}), w2 = c.Alloc(DType::kF32, {n, k});
  for (int rep = 0; rep < 3; ++rep) {  // the fused kernel's arrival counter re-arms itself
    c.b.RouterGateTopk(x, gate, bias, spec, logits, ids, w);
  }
  c.b.Linear(x, gate, logits2);
  c.b.RouterTopk(logits2, bias, spec, ids2, w2);
  if (c.Down<int32_t>(ids) != c.Down<int32_t>(ids2)) return Result::Fail("ids differ");
  const double err = std::max(RelErr(c.Down<float>(w), ToDouble(c.Down<float>(w2))),
                              RelErr(c.Down<float>(logits), ToDouble(c.Down<float>(logits2))));
  return Result(err, 1e-6);
}

// The router and the grouping in one op (RouteAndPermute: the CUDA backend's router groups the
// slots in its last block for up to 8 tokens) against RouterGateTopk then MoePermute on the
// same backend: every output identical, over local experts [begin, begin + local).
Result RouteAndPermute(Ctx& c, int64_t n, int64_t e, int64_t k, RouterScoring scoring,
                       bool group_limited, int64_t begin, int64_t local) {
  const int64_t h = 2048;
  const RouterSpec spec =
      Spec(scoring, group_limited, k, 8, 3, scoring == RouterScoring::kSigmoid, 2.5f);
  const Tensor x = c.Up(c.Randn(n * h), DType::kF32, {n, h});
  const Tensor gate = c.Up(c.Randn(e * h, 0.05f), DType::kF32, {e, h});
  const Tensor bias =
      scoring == RouterScoring::kSigmoid ? c.Up(c.Randn(e, 0.1f), DType::kF32, {e}) : Tensor();
  struct Out {
    Tensor logits, ids, w, offsets, src, ros;
  };
  const auto alloc = [&] {
    return Out{c.Alloc(DType::kF32, {n, e}),  c.Alloc(DType::kI32, {n, k}),
               c.Alloc(DType::kF32, {n, k}),  c.Alloc(DType::kI32, {local + 1}),
               c.Alloc(DType::kI32, {n * k}), c.Alloc(DType::kI32, {n, k})};
  };
  const Out a = alloc(), b = alloc();
  for (const Out* o : {&a, &b}) {  // both must zero src_row past the grouped rows
    c.b.CopyToDevice(o->src, std::vector<int32_t>(n * k, 7).data());
  }
  for (int rep = 0; rep < 3; ++rep) {  // the fused kernel's arrival counter re-arms itself
    c.b.RouteAndPermute(x, gate, bias, spec, a.logits, a.ids, a.w, begin, local, a.offsets, a.src,
                        a.ros);
  }
  c.b.RouterGateTopk(x, gate, bias, spec, b.logits, b.ids, b.w);
  c.b.MoePermute(b.ids, begin, local, b.offsets, b.src, b.ros);
  if (c.Down<int32_t>(a.ids) != c.Down<int32_t>(b.ids)) return Result::Fail("ids differ");
  if (c.Down<int32_t>(a.offsets) != c.Down<int32_t>(b.offsets)) return Result::Fail("offsets");
  if (c.Down<int32_t>(a.src) != c.Down<int32_t>(b.src)) return Result::Fail("src_row differs");
  if (c.Down<int32_t>(a.ros) != c.Down<int32_t>(b.ros)) return Result::Fail("row_of_slot");
  const auto off = c.Down<int32_t>(a.offsets);
  if (off[0] != 0 || off[local] > n * k) return Result::Fail("offsets out of range");
  const double err = std::max(RelErr(c.Down<float>(a.w), ToDouble(c.Down<float>(b.w))),
                              RelErr(c.Down<float>(a.logits), ToDouble(c.Down<float>(b.logits))));
  return Result(err, 0.0);
}

// MoeCombineAdd (the CUDA backend adds the shared experts' rows in the combine's pass) against
// MoeCombine then Add on the same backend: the same bits; slots of foreign experts (-1) skipped.
Result CombineAdd(Ctx& c, int64_t n, int64_t k, int64_t h) {
  const int64_t m = n * k;
  std::vector<int32_t> ros(n * k);
  for (int64_t s = 0; s < n * k; ++s) ros[s] = s % 5 == 3 ? -1 : static_cast<int32_t>((s * 7) % m);
  const Tensor y = c.Up(c.Randn(m * h), DType::kF32, {m, h});
  const Tensor tros = c.Up(ros, DType::kI32, {n, k});
  const Tensor w = c.Up(c.Randn(n * k), DType::kF32, {n, k});
  const Tensor shared = c.Up(c.Randn(n * h), DType::kF32, {n, h});
  const Tensor a = c.Alloc(DType::kF32, {n, h}), b = c.Alloc(DType::kF32, {n, h});
  c.b.MoeCombineAdd(y, tros, w, shared, a);
  c.b.MoeCombine(y, tros, w, /*accumulate=*/false, b);
  c.b.Add(b, shared);
  return Result(RelErr(c.Down<float>(a), ToDouble(c.Down<float>(b))), 0.0);
}

// n tokens' top-k of num_experts distinct experts, ascending per token (hot >= 0: every token's
// first pick is `hot`).
std::vector<int32_t> RandomRouting(Ctx& c, int64_t n, int64_t num_experts, int64_t k, int64_t hot) {
  std::vector<int32_t> ids(n * k);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> all(num_experts);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), c.rng);
    if (hot >= 0) std::swap(*std::find(all.begin(), all.end(), hot), all[0]);
    std::sort(all.begin(), all.begin() + k);
    std::copy(all.begin(), all.begin() + k, ids.begin() + t * k);
  }
  return ids;
}

// Permute -> grouped experts -> combine, against per-token SwiGLU experts in double. hot >= 0:
// every token routes to expert `hot` (one expert with n rows, the others sharing the rest).
// gathered: Backend::GatheredExpertMlp (the rows read through MoePermute's src_row), else
// GatherRows then GroupedExpertMlp.
Result Moe(Ctx& c, int64_t n, int64_t num_experts, int64_t k, int64_t h, int64_t inter,
           int64_t begin, int64_t local, int64_t hot = -1, bool gathered = true) {
  std::vector<float> x = c.Randn(n * h), wts = c.Randn(n * k);
  const std::vector<int32_t> ids = RandomRouting(c, n, num_experts, k, hot);
  ExpertWeights ew;
  ew.expert_begin = begin;
  std::vector<std::vector<float>> gu(local), dn(local);
  for (int64_t e = 0; e < local; ++e) {
    // Perf: every expert holds expert 0's values in its own memory (the time does not depend
    // on them, and 64 experts of 2048x1408 would take long to draw).
    const int64_t from = c.perf ? 0 : e;
    if (from == e) {
      gu[e] = c.Randn(2 * inter * h, 1.0f / std::sqrt(float(h)));
      dn[e] = c.Randn(h * inter, 1.0f / std::sqrt(float(inter)));
    }
    ew.gate_up.push_back(c.UpBf16(gu[from], {2 * inter, h}));
    ew.down.push_back(c.UpBf16(dn[from], {h, inter}));
  }
  const Tensor tx = c.Up(x, DType::kF32, {n, h}), tids = c.Up(ids, DType::kI32, {n, k});
  const Tensor tw = c.Up(wts, DType::kF32, {n, k});
  const Tensor offsets = c.Alloc(DType::kI32, {local + 1}), src = c.Alloc(DType::kI32, {n * k});
  const Tensor row_of_slot = c.Alloc(DType::kI32, {n, k});
  const Tensor grouped = c.Alloc(DType::kF32, {n * k, h}), y = c.Alloc(DType::kF32, {n * k, h});
  const Tensor out = c.Alloc(DType::kF32, {n, h});
  auto run = [&] {
    c.b.MoePermute(tids, begin, local, offsets, src, row_of_slot);
    if (gathered) {
      c.b.GatheredExpertMlp(tx, src, grouped, offsets, ew, y);
    } else {
      c.b.GatherRows(tx, src, grouped);
      c.b.GroupedExpertMlp(grouped, offsets, ew, y);
    }
    c.b.MoeCombine(y, row_of_slot, tw, false, out);
  };
  Result r;
  if (c.perf) {
    int64_t used = 0;
    std::vector<char> hit(local, 0);
    for (int32_t id : ids) {
      if (id >= begin && id < begin + local && !hit[id - begin]) ++used, hit[id - begin] = 1;
    }
    r.bytes = used * 3.0 * inter * h * 2 + 2.0 * n * h * 4;
    int64_t rows = 0;
    for (int32_t id : ids) rows += id >= begin && id < begin + local;
    r.flops = rows * 6.0 * inter * h;
    r.seconds = c.Time(run);
    return r;
  }
  run();
  // Permutation invariants.
  const auto off = c.Down<int32_t>(offsets), srcv = c.Down<int32_t>(src);
  const auto ros = c.Down<int32_t>(row_of_slot);
  for (int64_t s = 0; s < n * k; ++s) {
    const bool mine = ids[s] >= begin && ids[s] < begin + local;
    if (!mine && ros[s] != -1) return Result::Fail("foreign slot mapped");
    if (mine && (ros[s] < off[ids[s] - begin] || ros[s] >= off[ids[s] - begin + 1] ||
                 srcv[ros[s]] != s / k)) {
      return Result::Fail("bad permutation");
    }
  }
  // Tokens ascending within each expert; rows past the last expert's are 0.
  for (int64_t e = 0; e < local; ++e) {
    for (int32_t r = off[e] + 1; r < off[e + 1]; ++r) {
      if (srcv[r] <= srcv[r - 1]) return Result::Fail("tokens not ascending within an expert");
    }
  }
  for (int64_t r = off[local]; r < n * k; ++r) {
    if (srcv[r] != 0) return Result::Fail("src_row past the grouped rows not 0");
  }
  // The GPU's bf16 paths round their GEMM inputs to bf16: the mma.sync paths (up to 256 rows
  // per expert on average, K a multiple of 32, N of 8; above, the tiled one), the WMMA path (16+
  // rows per expert, K and N multiples of 16) and the bf16 GEMV (up to 32 rows per expert, K a
  // multiple of 8). The reference does the same there.
  const bool gpu = !c.b.device().is_cpu();
  // Over 256 rows per expert on average with K and N multiples of 8 in both projections: the
  // tiled path (both GEMMs, bf16 intermediate).
  const bool tiled = n * k > 256 * local && h % 8 == 0 && inter % 8 == 0;
  auto rounds = [&](int64_t kk, int64_t nn) {
    const bool mma = tiled || (n * k <= 256 * local && kk % 32 == 0 && nn % 8 == 0);
    const bool tensor_cores = n * k >= 16 * local && kk % 16 == 0 && nn % 16 == 0;
    const bool gemv = n * k <= 32 * local && kk % 8 == 0;
    return gpu && (mma || tensor_cores || gemv);
  };
  const bool round_x = rounds(h, inter), round_act = rounds(inter, h);
  auto rnd = [](double v, bool on) { return on ? double(Bf16ToF32(F32ToBf16(float(v)))) : v; };
  // The activation is rounded to bf16 from the device's fp32 sums, which differ from these
  // double sums in the last bits: near a rounding boundary (rare: ~1e-7 / 2^-8 per value) the
  // two round to neighbouring bf16 values. slack allows one such flip per (token, expert): one
  // bf16 ulp (<= 2^-7 relative) of its largest activation term, times |weight|.
  std::vector<double> want(n * h, 0.0), slack(n * h, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[t * k + j] - begin;
      if (e < 0 || e >= local) continue;
      std::vector<double> act(inter);
      for (int64_t i = 0; i < inter; ++i) {
        double g = 0, u = 0;
        for (int64_t d = 0; d < h; ++d) {
          g += double(gu[e][i * h + d]) * rnd(x[t * h + d], round_x);
          u += double(gu[e][(inter + i) * h + d]) * rnd(x[t * h + d], round_x);
        }
        act[i] = rnd(float(Silu(g) * u), round_act);
      }
      for (int64_t d = 0; d < h; ++d) {
        double o = 0, flip = 0;
        for (int64_t i = 0; i < inter; ++i) {
          o += double(dn[e][d * inter + i]) * act[i];
          flip = std::max(flip, std::fabs(double(dn[e][d * inter + i]) * act[i]));
        }
        want[t * h + d] += wts[t * k + j] * o;
        if (round_act) slack[t * h + d] += std::fabs(wts[t * k + j]) * flip / 128.0;
      }
    }
  }
  const std::vector<float> got = c.Down<float>(out);
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::fabs(double(got[i]) - want[i]) - slack[i]);
    den = std::max(den, std::fabs(want[i]));
  }
  return Result(num / den, 1e-4);
}

// v [n, w] through the FP8 row format (common/fp8_rows.h: E4M3 with a scale per row and group of
// 128) and back: the values an FP8 row holds.
std::vector<double> Fp8RowsRoundTrip(const std::vector<double>& v, int64_t n, int64_t w) {
  std::vector<double> out(v.size());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g0 = 0; g0 < w; g0 += kAfdFp8Group) {
      const int64_t g1 = std::min(w, g0 + kAfdFp8Group);
      float amax = 0;
      for (int64_t i = g0; i < g1; ++i) amax = std::max(amax, std::fabs(float(v[r * w + i])));
      const float a = AfdFp8Clamp(amax), mul = AfdFp8Mul(a), scale = AfdFp8Scale(a);
      for (int64_t i = g0; i < g1; ++i) {
        out[r * w + i] = double(Fp8E4M3ToF32(F32ToFp8E4M3(float(v[r * w + i]) * mul))) * scale;
      }
    }
  }
  return out;
}

// FP8 experts (E4M3 codes, a float32 scale per 128 x 128 block; ExpertWeights::fp8).
// CPU, and the GPU above 256 rows per expert: against the same experts dequantized (code *
// scale in fp32) and held as the backend holds weights (GPU: bf16 -- the FP8 experts are
// dequantized into bf16 for the tiled form the bf16 ones take; CPU: fp32): the same bits (tol 0).
// GPU decode sizes (w8a8, sm_89+): x and the SwiGLU product go to the tensor cores as FP8 rows
// too (RowsToFp8), so the reference is that computation in double: x's codes are the same bytes;
// the product's codes come from the device's sums (the e4m3 mma's, promoted to fp32 every 64
// products), which differ from double sums in the last bits, so near a rounding boundary a code
// is one E4M3 step (2^-3 relative) off -- slack allows one such flip per (token, expert) of its
// largest term, the tolerance a few more. Sizes off the 128 grid give
// partial blocks and up_proj's block rows after gate_proj's; K % 64 == 32 the trailing chunk.
Result MoeFp8(Ctx& c, int64_t n, int64_t num_experts, int64_t k, int64_t h, int64_t inter,
              int64_t local, int64_t hot = -1) {
  std::vector<float> x = c.Randn(n * h), wts = c.Randn(n * k);
  const std::vector<int32_t> ids = RandomRouting(c, n, num_experts, k, hot);
  const bool gpu = !c.b.device().is_cpu();
  constexpr int64_t B = kFp8WeightBlock;
  const auto blocks = [](int64_t v) { return (v + B - 1) / B; };
  // w [rows, cols] quantized per block (rows from `split` on start new block rows): codes,
  // scales and the dequantized values.
  const auto quantize = [&](const std::vector<float>& w, int64_t rows, int64_t cols, int64_t split,
                            std::vector<uint8_t>& codes, std::vector<float>& scales,
                            std::vector<float>& deq) {
    const int64_t sr = blocks(split) + blocks(rows - split), sc = blocks(cols);
    const auto block_row = [&](int64_t i) {
      return i < split ? i / B : blocks(split) + (i - split) / B;
    };
    scales.assign(sr * sc, 0.0f);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        float& s = scales[block_row(i) * sc + j / B];
        s = std::max(s, std::fabs(w[i * cols + j]));
      }
    }
    for (float& s : scales) s = s > 0 ? s / 448.0f : 1.0f;
    codes.resize(rows * cols);
    deq.resize(rows * cols);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const float s = scales[block_row(i) * sc + j / B];
        codes[i * cols + j] = F32ToFp8E4M3(w[i * cols + j] / s);
        deq[i * cols + j] = Fp8E4M3ToF32(codes[i * cols + j]) * s;
      }
    }
    return std::vector<int64_t>{sr, sc};
  };
  ExpertWeights fp8, held;
  std::vector<std::vector<double>> deq_gu, deq_dn;  // the dequantized experts, for w8a8
  for (int64_t e = 0; e < local; ++e) {
    const std::vector<float> gu = c.Randn(2 * inter * h, 1.0f / std::sqrt(float(h)));
    const std::vector<float> dn = c.Randn(h * inter, 1.0f / std::sqrt(float(inter)));
    std::vector<uint8_t> q;
    std::vector<float> s, deq;
    std::vector<int64_t> ss = quantize(gu, 2 * inter, h, inter, q, s, deq);
    fp8.gate_up.push_back(c.Up(q, DType::kF8E4M3, {2 * inter, h}));
    fp8.gate_up_scale.push_back(c.Up(s, DType::kF32, ss));
    held.gate_up.push_back(gpu ? c.UpBf16(deq, {2 * inter, h})
                               : c.Up(deq, DType::kF32, {2 * inter, h}));
    deq_gu.emplace_back(deq.begin(), deq.end());
    ss = quantize(dn, h, inter, h, q, s, deq);
    deq_dn.emplace_back(deq.begin(), deq.end());
    fp8.down.push_back(c.Up(q, DType::kF8E4M3, {h, inter}));
    fp8.down_scale.push_back(c.Up(s, DType::kF32, ss));
    held.down.push_back(gpu ? c.UpBf16(deq, {h, inter}) : c.Up(deq, DType::kF32, {h, inter}));
  }
  const Tensor tx = c.Up(x, DType::kF32, {n, h}), tids = c.Up(ids, DType::kI32, {n, k});
  const Tensor tw = c.Up(wts, DType::kF32, {n, k});
  const Tensor offsets = c.Alloc(DType::kI32, {local + 1}), src = c.Alloc(DType::kI32, {n * k});
  const Tensor row_of_slot = c.Alloc(DType::kI32, {n, k});
  const Tensor grouped = c.Alloc(DType::kF32, {n * k, h}), y = c.Alloc(DType::kF32, {n * k, h});
  const auto run = [&](const ExpertWeights& ew, const Tensor& out) {
    c.b.MoePermute(tids, 0, local, offsets, src, row_of_slot);
    c.b.GatheredExpertMlp(tx, src, grouped, offsets, ew, y);
    c.b.MoeCombine(y, row_of_slot, tw, false, out);
  };
  const Tensor a = c.Alloc(DType::kF32, {n, h}), b = c.Alloc(DType::kF32, {n, h});
  if (c.perf) {
    Result r;
    std::vector<char> hit(local, 0);
    int64_t used = 0;
    for (int32_t id : ids) {
      if (id < local && !hit[id]) ++used, hit[id] = 1;
    }
    r.bytes = used * 3.0 * inter * h + 2.0 * n * h * 4;
    r.flops = static_cast<double>(n) * k * 6.0 * inter * h;
    r.seconds = c.Time([&] { run(fp8, a); });
    return r;
  }
  run(fp8, a);
  run(held, b);
  int64_t m = 0;  // rows of the local experts
  for (int32_t id : ids) m += id < local;
  const bool w8a8 = gpu && c.b.SupportsFp8Experts(h, inter) && m <= 256 * local;
  if (!w8a8) return Result(RelErr(c.Down<float>(a), ToDouble(c.Down<float>(b))), 0.0);
  const std::vector<double> xq = Fp8RowsRoundTrip(ToDouble(x), n, h);
  std::vector<double> want(n * h, 0.0), slack(n * h, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[t * k + j];
      if (e >= local) continue;
      std::vector<double> act(inter);
      for (int64_t i = 0; i < inter; ++i) {
        double g = 0, u = 0;
        for (int64_t d = 0; d < h; ++d) {
          g += deq_gu[e][i * h + d] * xq[t * h + d];
          u += deq_gu[e][(inter + i) * h + d] * xq[t * h + d];
        }
        act[i] = float(Silu(g) * u);
      }
      act = Fp8RowsRoundTrip(act, 1, inter);
      for (int64_t d = 0; d < h; ++d) {
        double o = 0, flip = 0;
        for (int64_t i = 0; i < inter; ++i) {
          o += deq_dn[e][d * inter + i] * act[i];
          flip = std::max(flip, std::fabs(deq_dn[e][d * inter + i] * act[i]));
        }
        want[t * h + d] += wts[t * k + j] * o;
        slack[t * h + d] += std::fabs(wts[t * k + j]) * flip / 8.0;
      }
    }
  }
  const std::vector<float> got = c.Down<float>(a);
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::fabs(double(got[i]) - want[i]) - slack[i]);
    den = std::max(den, std::fabs(want[i]));
  }
  // The tolerance is a tenth of what quantizing the activations changes (the dequantized
  // experts' distance from the reference): a few flips beyond the slack (the e4m3 mma's sums
  // carry fewer bits than fp32's) stay far below it; a fragment, layout or scale error reaches it.
  const double moved = RelErr(c.Down<float>(b), want);
  Result r(num / den, 0.1 * moved);
  r.note = fmt::format("w8a8; without slack {:.3g}; w8a16 vs the reference {:.3g}",
                       RelErr(got, want), moved);
  return r;
}

// Rows of v logits (the GPU reduces them in chunks of 4096); above 8192, row 1 starts with a
// whole chunk of -inf.
Result LogSoftmaxAt(Ctx& c, int64_t v) {
  const int64_t n = 4;
  std::vector<float> logits = c.Randn(n * v, 4.0f);
  if (v > 8192) {
    for (int64_t j = 0; j < 5000; ++j) logits[v + j] = -INFINITY;
  }
  std::vector<int32_t> ids = {0, static_cast<int32_t>(v - 1), 17, static_cast<int32_t>(v / 2)};
  const Tensor out = c.Alloc(DType::kF32, {n});
  c.b.LogSoftmaxAt(c.Up(logits, DType::kF32, {n, v}), c.Up(ids, DType::kI32, {n}), out);
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) {
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, double(logits[i * v + j]));
    for (int64_t j = 0; j < v; ++j) sum += std::exp(logits[i * v + j] - mx);
    want[i] = logits[i * v + ids[i]] - mx - std::log(sum);
  }
  return Result(RelErr(c.Down<float>(out), want), 1e-6);
}

// A NaN logit makes its row's log-softmax NaN, also when its chunk holds only NaN and -inf (the
// GPU's chunk max then ignores it); the other row is unaffected.
Result LogSoftmaxNaN(Ctx& c) {
  const int64_t n = 2, v = 9000;
  std::vector<float> logits = c.Randn(n * v, 4.0f);
  for (int64_t j = 8192; j < v; ++j) logits[j] = -INFINITY;
  logits[8500] = std::nanf("");
  std::vector<int32_t> ids = {3, 4};
  const Tensor out = c.Alloc(DType::kF32, {n});
  c.b.LogSoftmaxAt(c.Up(logits, DType::kF32, {n, v}), c.Up(ids, DType::kI32, {n}), out);
  const std::vector<float> got = c.Down<float>(out);
  if (!std::isnan(got[0])) return Result::Fail(fmt::format("row 0: {} instead of NaN", got[0]));
  double mx = -INFINITY, sum = 0;
  for (int64_t j = 0; j < v; ++j) mx = std::max(mx, double(logits[v + j]));
  for (int64_t j = 0; j < v; ++j) sum += std::exp(logits[v + j] - mx);
  return Result(RelErr({got[1]}, {logits[v + 4] - mx - std::log(sum)}), 1e-6);
}

// Greedy over rows of 20000 logits (several of the GPU's chunks): the first maximum wins across
// chunks, NaN never wins, a row of -inf gives 0.
Result GreedyLongRows(Ctx& c) {
  const int64_t v = 20000;
  const float nan = std::nanf("");
  std::vector<float> logits = c.Randn(5 * v, 1.0f);
  std::vector<int32_t> want = {19999, 3, 8192, 0, 4097};
  logits[0 * v + 19999] = 50.0f;  // max in the last chunk
  logits[1 * v + 3] = 50.0f;      // a tie across chunks: the first wins
  logits[1 * v + 12000] = 50.0f;
  for (int64_t j = 0; j < v; ++j) logits[2 * v + j] = nan;  // NaN everywhere but one value
  logits[2 * v + 8192] = -1.0f;
  for (int64_t j = 0; j < v; ++j) logits[3 * v + j] = -INFINITY;
  logits[4 * v + 4097] = 50.0f;  // a tie inside a chunk and with a later one
  logits[4 * v + 4098] = 50.0f;
  logits[4 * v + 9000] = 50.0f;
  const Tensor ids = c.Alloc(DType::kI32, {5});
  c.b.Sample(c.Up(logits, DType::kF32, {5, v}), std::vector<SampleRow>(5, SampleRow{}), ids);
  const auto got = c.Down<int32_t>(ids);
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) {
      return Result::Fail(fmt::format("row {}: {} instead of {}", i, got[i], want[i]));
    }
  }
  return Result(0.0, 0.0);
}

// Greedy, top-k 1, NaN rows, and inverse-CDF sampling at chosen u on a known distribution.
Result Sample(Ctx& c) {
  const float nan = std::nanf("");
  const int64_t v = 4;
  // logits ln(p) for p = {0.1, 0.2, 0.3, 0.4}: sorted descending 3, 2, 1, 0.
  std::vector<float> base = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};
  struct Row {
    std::vector<float> logits;
    SampleRow p;
    int32_t want;
  };
  const std::vector<Row> rows = {
      {{1, 5, 5, 2}, {0.0f, 0, 1.0f, 0.0}, 1},          // greedy: first maximum
      {{nan, 1, 3, nan}, {0.0f, 0, 1.0f, 0.0}, 2},      // NaN never chosen
      {{nan, nan, nan, nan}, {0.0f, 0, 1.0f, 0.0}, 0},  // nothing to choose
      {base, {1.0f, 1, 1.0f, 0.99}, 3},                 // top-k 1 is greedy
      {base, {1.0f, 0, 1.0f, 0.39}, 3},                 // cdf 0.4 | 0.7 | 0.9 | 1
      {base, {1.0f, 0, 1.0f, 0.41}, 2},
      {base, {1.0f, 0, 1.0f, 0.95}, 0},
      {base, {1.0f, 0, 0.65f, 0.99}, 2},                 // top-p keeps {3, 2}
      {base, {1.0f, 2, 1.0f, 0.5}, 3},                   // top-k 2: 0.4/0.7 = 0.57 > 0.5
      {{nan, 0, 0.5f, nan}, {1.0f, 0, 1.0f, 0.99}, 1}};  // NaN has no probability
  std::vector<float> logits;
  std::vector<SampleRow> params;
  for (const Row& r : rows) {
    logits.insert(logits.end(), r.logits.begin(), r.logits.end());
    params.push_back(r.p);
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  const Tensor ids = c.Alloc(DType::kI32, {n});
  c.b.Sample(c.Up(logits, DType::kF32, {n, v}), params, ids);
  const auto got = c.Down<int32_t>(ids);
  for (int64_t i = 0; i < n; ++i) {
    if (got[i] != rows[i].want) {
      return Result::Fail(fmt::format("row {}: {} instead of {}", i, got[i], rows[i].want));
    }
  }
  return Result(0.0, 0.0);
}

Result SampleOneRow(Ctx& c) {
  std::vector<float> logits = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};
  const Tensor ids = c.Alloc(DType::kI32, {1});
  c.b.Sample(c.Up(logits, DType::kF32, {1, 4}), {SampleRow{1.0f, 0, 1.0f, 0.41}}, ids);
  const int32_t got = c.Down<int32_t>(ids)[0];
  return got == 2 ? Result(0.0, 0.0) : Result::Fail(fmt::format("{} instead of 2", got));
}

// TakeIds: ids from a device array where the source says (-1: kept); a copy to the host that
// later work does not disturb (StartCopyToHost takes the values of its place in the stream).
Result TakeIdsAndCopiesToHost(Ctx& c) {
  const int64_t k = 7, n = 300;
  std::vector<int32_t> from(k), source(n), ids(n), want(n);
  for (int64_t i = 0; i < k; ++i) from[i] = 1000 + 37 * static_cast<int32_t>(i);
  for (int64_t t = 0; t < n; ++t) {
    ids[t] = static_cast<int32_t>(t);
    source[t] = t % 3 == 0 ? -1 : static_cast<int32_t>((t * 5) % k);
    want[t] = source[t] < 0 ? ids[t] : from[source[t]];
  }
  const Tensor from_t = c.Up(from, DType::kI32, {k}), ids_t = c.Up(ids, DType::kI32, {n});
  const int64_t before = c.b.StartCopyToHost(ids_t);  // the ids as uploaded
  c.b.TakeIds(from_t, c.Up(source, DType::kI32, {n}), ids_t);
  const int64_t after = c.b.StartCopyToHost(ids_t);
  c.b.TakeIds(from_t, c.Up(std::vector<int32_t>(n, 0), DType::kI32, {n}), ids_t);  // all from[0]
  std::vector<int32_t> got_before(n), got_after(n);
  c.b.FinishCopyToHost(before, got_before.data());
  c.b.FinishCopyToHost(after, got_after.data());
  for (int64_t t = 0; t < n; ++t) {
    if (got_before[t] != ids[t] || got_after[t] != want[t]) {
      return Result::Fail(fmt::format("token {}: {} then {}, expected {} then {}", t, got_before[t],
                                      got_after[t], ids[t], want[t]));
    }
  }
  const auto last = c.Down<int32_t>(ids_t);
  if (last != std::vector<int32_t>(n, from[0])) return Result::Fail("the last TakeIds");
  return Result(0.0, 0.0);
}

// Many uploads in a row, more bytes than the staging ring holds, with copies to the host
// finished between them: every tensor gets its own bytes.
Result StagedUploadsWrap(Ctx& c) {
  const int64_t n = 300000;  // 1.2 MB each, 40 of them
  std::vector<Tensor> up;
  std::vector<int64_t> tickets;
  for (int i = 0; i < 40; ++i) {
    std::vector<int32_t> v(n, i);
    v[i] = -i;
    up.push_back(c.Up(v, DType::kI32, {n}));
    if (i % 7 == 3) tickets.push_back(c.b.StartCopyToHost(up.back().Rows(0, 8)));
    if (tickets.size() == 2) {
      std::vector<int32_t> h(8);
      for (int64_t t : tickets) c.b.FinishCopyToHost(t, h.data());
      tickets.clear();
    }
  }
  std::vector<int32_t> h(8);
  for (int64_t t : tickets) c.b.FinishCopyToHost(t, h.data());
  for (int i = 0; i < 40; ++i) {
    const auto v = c.Down<int32_t>(up[i]);
    for (int64_t j = 0; j < n; ++j) {
      if (v[j] != (j == i ? -i : i)) {
        return Result::Fail(fmt::format("upload {}: element {} is {}", i, j, v[j]));
      }
    }
  }
  return Result(0.0, 0.0);
}

Result CopyFill(Ctx& c) {
  std::vector<float> x = c.Randn(100);
  const Tensor a = c.Up(x, DType::kF32, {10, 10}), b = c.Alloc(DType::kF32, {10, 10});
  c.b.Copy(b, a);
  c.b.Fill(a.Rows(0, 3), 2.5f);
  std::vector<double> want = ToDouble(x);
  const double err_copy = RelErr(c.Down<float>(b), want);
  for (int i = 0; i < 30; ++i) want[i] = 2.5;
  return Result(std::max(err_copy, RelErr(c.Down<float>(a), want)), 0.0);
}

// The FP8 dispatch (common/fp8_rows.h) must write the same bytes on every backend: each row
// sent to an FP8 rank is E4M3 of x * (448 / a) with a = max(amax of its group of 128, 1e-4) and
// the scale a / 448 (an exact spec: one f32 operation each); a bf16 rank beside them gets the
// rounded row. Then DequantFp8Rows reads them back as fp8_value * scale, exactly.
Result AfdDispatchFp8(Ctx& c) {
  const int64_t n = 37, k = 2, h = 2120, E = 12, groups = AfdFp8Groups(h);  // 16 + a partial
  const int F = 3;
  std::vector<float> x = c.Randn(n * h, 2.0f);
  for (int64_t i = 0; i < h; ++i) x[3 * h + i] = 0.0f;      // a zero row
  for (int64_t i = 0; i < 128; ++i) x[5 * h + i] *= 1e-7f;  // subnormal E4M3 values
  for (int64_t i = 0; i < h; i += 97) x[7 * h + i] = 3e4f * (i % 2 ? 1 : -1);  // large
  std::vector<int32_t> ids(n * k);
  std::vector<float> w(n * k, 0.5f);
  for (int64_t t = 0; t < n; ++t) {
    ids[t * k] = static_cast<int32_t>(t % E);
    ids[t * k + 1] = static_cast<int32_t>((t * 5 + 3) % E == t % E ? (t + 1) % E : (t * 5 + 3) % E);
    if (ids[t * k] > ids[t * k + 1]) std::swap(ids[t * k], ids[t * k + 1]);
  }
  const DType kinds[F] = {DType::kF8E4M3, DType::kBF16, DType::kF8E4M3};
  std::vector<Tensor> rows, scales, tables;
  for (int f = 0; f < F; ++f) {
    rows.push_back(c.Alloc(kinds[f], {n, h}));
    scales.push_back(kinds[f] == DType::kF8E4M3 ? c.Alloc(DType::kF32, {n, groups}) : Tensor());
    tables.push_back(c.Alloc(DType::kI32, {2 * n * k}));
  }
  const Tensor send_row = c.Alloc(DType::kI32, {n, F});
  c.b.AfdDispatch(c.Up(x, DType::kF32, {n, h}), c.Up(ids, DType::kI32, {n, k}),
                  c.Up(w, DType::kF32, {n, k}), E, rows, scales, tables, send_row, true);
  const auto sr = c.Down<int32_t>(send_row);
  int64_t checked = 0;
  for (int f = 0; f < F; ++f) {
    std::vector<uint8_t> q;
    std::vector<uint16_t> bf;
    std::vector<float> sc;
    if (kinds[f] == DType::kF8E4M3) {
      q = c.Down<uint8_t>(rows[f]);
      sc = c.Down<float>(scales[f]);
    } else {
      bf = c.Down<uint16_t>(rows[f]);
    }
    for (int64_t t = 0; t < n; ++t) {
      const int32_t r = sr[t * F + f];
      if (r < 0) continue;
      ++checked;
      const float* xt = x.data() + t * h;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t b = g * 128, e = std::min(h, b + 128);
        float amax = 0.0f;
        for (int64_t i = b; i < e; ++i) amax = std::max(amax, std::fabs(xt[i]));
        const float a = std::max(amax, 1e-4f);
        if (kinds[f] == DType::kF8E4M3 && sc[r * groups + g] != a / 448.0f) {
          return Result::Fail(fmt::format("rank {} token {} group {}: scale {} != {}", f, t, g,
                                          sc[r * groups + g], a / 448.0f));
        }
        for (int64_t i = b; i < e; ++i) {
          if (kinds[f] == DType::kF8E4M3) {
            const uint8_t want = F32ToFp8E4M3(xt[i] * (448.0f / a));
            if (q[r * h + i] != want) {
              return Result::Fail(fmt::format("rank {} token {} element {}: {:#x} != {:#x}", f, t,
                                              i, q[r * h + i], want));
            }
          } else if (bf[r * h + i] != F32ToBf16(xt[i])) {
            return Result::Fail(fmt::format("rank {} token {} element {}: bf16", f, t, i));
          }
        }
      }
    }
  }
  if (checked < n) return Result::Fail("too few rows dispatched");
  // Read back rank 0's rows.
  const Tensor back = c.Alloc(DType::kF32, {n, h});
  c.b.DequantFp8Rows(rows[0], scales[0], back);
  const auto got = c.Down<float>(back);
  const auto q = c.Down<uint8_t>(rows[0]);
  const auto sc = c.Down<float>(scales[0]);
  for (int64_t i = 0; i < n * h; ++i) {
    const float want = Fp8E4M3ToF32(q[i]) * sc[(i / h) * groups + (i % h) / 128];
    if (!(got[i] == want || (std::isnan(got[i]) && std::isnan(want)))) {
      return Result::Fail(fmt::format("DequantFp8Rows element {}: {} != {}", i, got[i], want));
    }
  }
  return Result(0.0, 0.0);
}

std::vector<Case> CheckCases() {
  using D = DType;
  return {
      {"Linear", "f32 1x7->5", [](Ctx& c) { return Linear(c, 1, 7, 5, D::kF32); }},
      {"Linear", "bf16 37x600->300", [](Ctx& c) { return Linear(c, 37, 600, 300, D::kBF16); }},
      {"Linear", "f32 16x64->513", [](Ctx& c) { return Linear(c, 16, 64, 513, D::kF32); }},
      // A few rows, K % 4 == 0: the GPU's fp32 GEMV (the router gate's path).
      {"Linear", "f32 3x64->65", [](Ctx& c) { return Linear(c, 3, 64, 65, D::kF32); }},
      {"Linear", "f32 1x2048->64", [](Ctx& c) { return Linear(c, 1, 2048, 64, D::kF32); }},
      // The router gate at decode batch 9-16: the GPU's GEMV in 8-row chunks (one launch).
      {"Linear", "f32 16x2048->64", [](Ctx& c) { return Linear(c, 16, 2048, 64, D::kF32); }},
      {"Linear", "f32 13x512->160", [](Ctx& c) { return Linear(c, 13, 512, 160, D::kF32); }},
      {"Linear", "f32 11x4096->72", [](Ctx& c) { return Linear(c, 11, 4096, 72, D::kF32); }},
      // The GPU's GEMVs (<= 8 rows): x staged in shared memory up to 48 KB, else read per row;
      // K past one batch of loads (2048 bf16 / 1024 f32 per warp) and not a whole batch.
      {"Linear", "bf16 1x2048->300", [](Ctx& c) { return Linear(c, 1, 2048, 300, D::kBF16); }},
      {"Linear", "bf16 5x2600->77", [](Ctx& c) { return Linear(c, 5, 2600, 77, D::kBF16); }},
      {"Linear", "bf16 8x4096->40", [](Ctx& c) { return Linear(c, 8, 4096, 40, D::kBF16); }},
      // 9-32 rows (decode batches past the GEMV's 8 rows), N = 72 and 200 (not multiples of
      // 16), K = 96; twice into one output (state a kernel keeps between launches, such as
      // split-K workspace, must not leak into the next product).
      {"Linear", "bf16 12x1024->72", [](Ctx& c) { return Linear(c, 12, 1024, 72, D::kBF16); }},
      {"Linear", "bf16 16x2048->3072", [](Ctx& c) { return Linear(c, 16, 2048, 3072, D::kBF16); }},
      {"Linear", "bf16 9x2048->21", [](Ctx& c) { return Linear(c, 9, 2048, 21, D::kBF16); }},
      {"Linear", "bf16 32x2048->200", [](Ctx& c) { return Linear(c, 32, 2048, 200, D::kBF16); }},
      {"Linear", "bf16 20x96->48", [](Ctx& c) { return Linear(c, 20, 96, 48, D::kBF16); }},
      // x rounded to bf16 before cuBLAS, n x k not a multiple of 4.
      {"Linear", "bf16 33x75->40", [](Ctx& c) { return Linear(c, 33, 75, 40, D::kBF16); }},
      {"Linear", "bf16 16x2816->2048, twice",
       [](Ctx& c) { return Linear(c, 16, 2816, 2048, D::kBF16, true); }},
      // 512+ rows of bf16 (prefill): the GPU's tiled kernel (128 x 128 tiles, K in steps of 64),
      // here with a partial m tile, a partial K step and a partial column block.
      {"Linear", "bf16 700x200->576", [](Ctx& c) { return Linear(c, 700, 200, 576, D::kBF16); }},
      {"Linear", "bf16 512x2048->66", [](Ctx& c) { return Linear(c, 512, 2048, 66, D::kBF16); }},
      {"Linear", "f32 8x2048->33", [](Ctx& c) { return Linear(c, 8, 2048, 33, D::kF32); }},
      // 512+ rows, <= 256 columns of fp32 (the router gate at prefill): the GPU's 64 x 64 tiles,
      // partial row and column tiles, K not a multiple of the 16-wide step.
      {"Linear", "f32 600x1500->70", [](Ctx& c) { return Linear(c, 600, 1500, 70, D::kF32); }},
      // The skinny kernel's K steps of 32: a last step holding one float4.
      {"Linear", "f32 520x36->64", [](Ctx& c) { return Linear(c, 520, 36, 64, D::kF32); }},
      {"Linear", "f32 2x1500->19", [](Ctx& c) { return Linear(c, 2, 1500, 19, D::kF32); }},
      {"Embedding", "bf16 9 of 50x24", [](Ctx& c) { return Embedding(c, 9, 50, 24); }},
      {"RmsNorm", "5x96 in place", [](Ctx& c) { return RmsNorm(c, 5, 96); }},
      // Widths not a multiple of 4 (the GPU's scalar form) and past what a thread holds.
      {"RmsNorm", "3x50 in place", [](Ctx& c) { return RmsNorm(c, 3, 50); }},
      {"RmsNorm", "2x4100 in place", [](Ctx& c) { return RmsNorm(c, 2, 4100); }},
      {"AddRmsNorm", "5x96", [](Ctx& c) { return AddRmsNorm(c, 5, 96); }},
      {"AddRmsNorm", "3x50", [](Ctx& c) { return AddRmsNorm(c, 3, 50); }},
      {"AddRmsNorm", "2x4100", [](Ctx& c) { return AddRmsNorm(c, 2, 4100); }},
      // An even and an odd intermediate width.
      {"SiluMul+Add", "3x40", [](Ctx& c) { return AddSilu(c, 3, 40); }},
      {"SiluMul+Add", "5x37", [](Ctx& c) { return AddSilu(c, 5, 37); }},
      {"Rope", "interleaved", [](Ctx& c) { return Rope(c, true); }},
      {"Rope", "half split", [](Ctx& c) { return Rope(c, false); }},
      {"GatherRows", "5 of 7x33", Gather},
      {"MlaCacheWrite", "3 seqs x 9, block 4", [](Ctx& c) { return MlaCacheWrite(c); }},
      {"MlaCacheWrite", "bf16 cache", [](Ctx& c) { return MlaCacheWrite(c, DType::kBF16); }},
      {"GqaCacheWrite", "8 heads / 2 KV, d 16, block 4",
       [](Ctx& c) { return GqaCacheWrite(c, Gqa(8, 2, 16, 4)); }},
      {"GqaCacheWrite", "bf16 cache, 32 / 4, d 128",
       [](Ctx& c) { return GqaCacheWrite(c, Gqa(32, 4, 128, 16, DType::kBF16)); }},
      {"GqaAttention", "8 / 2, d 16, all heads",
       [](Ctx& c) { return GqaAttention(c, 0, 8, 3, 11, Gqa(8, 2, 16, 4)); }},
      // A head range that splits a KV group (attention TP 3 of 8 heads), MHA and MQA.
      {"GqaAttention", "8 / 2, heads [3, 6)",
       [](Ctx& c) { return GqaAttention(c, 3, 6, 3, 11, Gqa(8, 2, 16, 4)); }},
      {"GqaAttention", "4 / 4 (MHA), d 32",
       [](Ctx& c) { return GqaAttention(c, 0, 4, 2, 9, Gqa(4, 4, 32, 4)); }},
      {"GqaAttention", "4 / 1 (MQA), d 48",
       [](Ctx& c) { return GqaAttention(c, 0, 4, 2, 9, Gqa(4, 1, 48, 4)); }},
      // Qwen3-30B-A3B's heads (32 / 4, d 128: two blocks of 8 heads per KV head), a long context
      // (the GPU splits it and merges), 40 sequences, a bf16 cache.
      {"GqaAttention", "32 / 4, d 128, 2 seqs x 700",
       [](Ctx& c) { return GqaAttention(c, 0, 32, 2, 700, Gqa(32, 4, 128, 64)); }},
      {"GqaAttention", "32 / 4, d 128, 40 seqs x 37",
       [](Ctx& c) { return GqaAttention(c, 0, 32, 40, 37, Gqa(32, 4, 128, 16)); }},
      {"GqaAttention", "bf16 cache, 16 / 4, d 256, 2 x 300",
       [](Ctx& c) { return GqaAttention(c, 0, 16, 2, 300, Gqa(16, 4, 256, 64, DType::kBF16)); }},
      {"GqaAttention", "prefill: 2 seqs x 40, 8 / 2, d 64",
       [](Ctx& c) { return GqaAttention(c, 0, 8, 2, 40, Gqa(8, 2, 64, 16), true); }},
      // A bf16 model's form (tensor cores on the GPU): 8 of a tile's 16 rows (32 / 4), all 16
      // (64 / 4), a head range inside a group, a split context, a prefill, head dims 64 / 256.
      {"GqaAttention", "tf32, bf16 cache: 32 / 4, d 128, 2 x 700",
       [](Ctx& c) {
         return GqaAttention(c, 0, 32, 2, 700, Gqa(32, 4, 128, 64, DType::kBF16), false, true);
       }},
      {"GqaAttention", "tf32, bf16 cache: 64 / 4, d 128, 40 x 37",
       [](Ctx& c) {
         return GqaAttention(c, 0, 64, 40, 37, Gqa(64, 4, 128, 16, DType::kBF16), false, true);
       }},
      {"GqaAttention", "tf32, bf16 cache: 32 / 4 heads [5, 29), d 128, 3 x 150",
       [](Ctx& c) {
         return GqaAttention(c, 5, 29, 3, 150, Gqa(32, 4, 128, 64, DType::kBF16), false, true);
       }},
      {"GqaAttention", "tf32, bf16 cache: prefill 2 x 70, 8 / 2, d 64",
       [](Ctx& c) {
         return GqaAttention(c, 0, 8, 2, 70, Gqa(8, 2, 64, 16, DType::kBF16), true, true);
       }},
      // Prefill with an odd length: token pairs that straddle two sequences, a last lone token.
      {"GqaAttention", "tf32, bf16 cache: prefill 3 x 33, 32 / 4, d 128",
       [](Ctx& c) {
         return GqaAttention(c, 0, 32, 3, 33, Gqa(32, 4, 128, 16, DType::kBF16), true, true);
       }},
      {"GqaAttention", "tf32, bf16 cache: prefill 2 x 301 heads [4, 12), 16 / 2, d 128",
       [](Ctx& c) {
         return GqaAttention(c, 4, 12, 2, 301, Gqa(16, 2, 128, 64, DType::kBF16), true, true);
       }},
      {"GqaAttention", "tf32, bf16 cache: 16 / 4, d 256, 2 x 300",
       [](Ctx& c) {
         return GqaAttention(c, 0, 16, 2, 300, Gqa(16, 4, 256, 64, DType::kBF16), false, true);
       }},
      {"MlaAttention", "all heads", [](Ctx& c) { return MlaAttention(c, 0, 4); }},
      {"MlaAttention", "heads [1, 3)", [](Ctx& c) { return MlaAttention(c, 1, 3); }},
      // Long contexts: the GPU splits them over several blocks and merges the partials.
      {"MlaAttention", "2 seqs x 700 positions",
       [](Ctx& c) { return MlaAttention(c, 0, 4, 2, 700); }},
      // Up to 32 tokens the GPU's W_k / W_v products are its own kernels (chunks of 8 tokens:
      // 11 is one full chunk and a partial one); above, batched cuBLAS GEMMs.
      {"MlaAttention", "11 seqs, heads [1, 4)",
       [](Ctx& c) { return MlaAttention(c, 1, 4, 11, 6); }},
      {"MlaAttention", "40 seqs", [](Ctx& c) { return MlaAttention(c, 0, 4, 40, 5); }},
      // DeepSeek's latent width (512 + 64) and a second, partial group of heads (16 + 4), over
      // several chunks of positions with a partial last one, at decode and small-batch sizes.
      {"MlaAttention", "20 heads, 512 + 64, 2 seqs x 150",
       [](Ctx& c) {
         MlaSetup wide;
         wide.heads = 20, wide.dn = 16, wide.dv = 8, wide.kvr = 512, wide.dr = 64, wide.block = 64;
         return MlaAttention(c, 0, 20, 2, 150, std::move(wide));
       }},
      {"MlaAttention", "16 heads, 512 + 64, 1 seq x 37",
       [](Ctx& c) {
         MlaSetup wide;
         wide.heads = 16, wide.dn = 16, wide.dv = 8, wide.kvr = 512, wide.dr = 64, wide.block = 16;
         return MlaAttention(c, 0, 16, 1, 37, std::move(wide));
       }},
      // The same with TF32 allowed (bf16 models): tensor-core scores and P·V on the GPU,
      // cuBLAS TF32 projections above 32 tokens.
      {"MlaAttention", "tf32: all heads",
       [](Ctx& c) { return MlaAttention(c, 0, 4, 3, 11, {}, true); }},
      {"MlaAttention", "tf32: heads [1, 3), 2 seqs x 700",
       [](Ctx& c) { return MlaAttention(c, 1, 3, 2, 700, {}, true); }},
      {"MlaAttention", "tf32: 40 seqs",
       [](Ctx& c) { return MlaAttention(c, 0, 4, 40, 5, {}, true); }},
      {"MlaAttention", "tf32: 20 heads, 512 + 64, 3 x 150",
       [](Ctx& c) {
         MlaSetup wide;
         wide.heads = 20, wide.dn = 16, wide.dv = 8, wide.kvr = 512, wide.dr = 64, wide.block = 64;
         return MlaAttention(c, 0, 20, 3, 150, std::move(wide), true);
       }},
      {"MlaAttention", "tf32: 16 heads, 512 + 64, 40 x 37",
       [](Ctx& c) {
         MlaSetup wide;
         wide.heads = 16, wide.dn = 16, wide.dv = 8, wide.kvr = 512, wide.dr = 64, wide.block = 16;
         return MlaAttention(c, 0, 16, 40, 37, std::move(wide), true);
       }},
      // A bf16 latent cache (--kv-cache-dtype bf16), fp32 and TF32 products.
      {"MlaAttention", "bf16 cache: heads [1, 3), 2 seqs x 300",
       [](Ctx& c) {
         MlaSetup s;
         s.cache_dtype = DType::kBF16;
         return MlaAttention(c, 1, 3, 2, 300, std::move(s));
       }},
      {"MlaAttention", "bf16 cache, tf32: 16 heads, 512 + 64, 40 x 37",
       [](Ctx& c) { return MlaAttention(c, 0, 16, 40, 37, WideBf16Mla(16, 16), true); }},
      // DeepSeek's shape, bf16 cache, TF32 allowed: the GPU's tiled bf16 kernel (64-row tiles):
      // more tokens than SMs (one split, several tiles, the last partial); a head range past
      // one group of 16 (the second partial) over a 16-row block size and split contexts.
      {"MlaAttention", "bf16 cache, tf32: 16 heads, 512 + 64, 136 x 130",
       [](Ctx& c) { return MlaAttention(c, 0, 16, 136, 130, WideBf16Mla(16, 64), true); }},
      {"MlaAttention", "bf16 cache, tf32: heads [2, 20) of 20, 512 + 64, 3 x 333, block 16",
       [](Ctx& c) { return MlaAttention(c, 2, 20, 3, 333, WideBf16Mla(20, 16), true); }},
      // Two tile buffers, the second's first tile partial (rows past the end never loaded into
      // it before: zeros, where a buffer that held a whole tile keeps finite cache rows).
      {"MlaAttention", "bf16 cache, tf32: 16 heads, 512 + 64, 5 x 100",
       [](Ctx& c) { return MlaAttention(c, 0, 16, 5, 100, WideBf16Mla(16, 64), true); }},
      // More blocks than SMs (an H200 has 132): one tile buffer, two blocks per SM.
      {"MlaAttention", "bf16 cache, tf32: 16 heads, 512 + 64, 300 x 130, block 16",
       [](Ctx& c) { return MlaAttention(c, 0, 16, 300, 130, WideBf16Mla(16, 16), true); }},
      // 128-row blocks: the context bound (2 blocks) is past the positions, so some splits
      // are empty and the last block to finish merges them.
      {"MlaAttention", "bf16 cache, tf32: 16 heads, 512 + 64, 2 x 130, block 128",
       [](Ctx& c) { return MlaAttention(c, 0, 16, 2, 130, WideBf16Mla(16, 128), true); }},
      // A prefill's queries (every position, causal), DeepSeek's shape, bf16 cache, TF32: past
      // 1024 tokens the GPU's tiled kernel takes two query tokens per block, here with a pair
      // across two sequences (345 positions each: tokens 344 | 345) and an odd last token; and
      // the same queries over fewer tokens (one per block), heads past a group of 16.
      {"MlaAttention", "prefill, bf16 cache, tf32: 16 heads, 512 + 64, 3 x 345",
       [](Ctx& c) { return MlaPrefill(c, 3, 345, WideBf16Mla(16, 64), true); }},
      {"MlaAttention", "prefill, bf16 cache, tf32: 20 heads, 512 + 64, 2 x 90, block 16",
       [](Ctx& c) { return MlaPrefill(c, 2, 90, WideBf16Mla(20, 16), true); }},
      // The expanded form (GPU: 256+ tokens, most of them new): DeepSeek's head dims (128 + 64
      // / 128), sequences not a multiple of the 64-token windows (a window spans two or three
      // sequences), a cached prefix before the queried positions, block sizes 16 and 64.
      {"MlaAttention", "prefill, expanded: 2 heads, 128 + 64 / 128, 3 x 150, block 16",
       [](Ctx& c) { return MlaPrefill(c, 3, 150, DeepseekHeadsMla(2, 16), true); }},
      {"MlaAttention", "prefill, expanded: 3 heads, 4 x 333 with 100 cached, block 64",
       [](Ctx& c) { return MlaPrefill(c, 4, 333, DeepseekHeadsMla(3, 64), true, 100); }},
      {"MlaAttention", "bf16 cache: 20 heads, 512 + 64, 2 x 150",
       [](Ctx& c) { return MlaAttention(c, 0, 20, 2, 150, WideBf16Mla(20, 64)); }},
      {"RouterTopk", "softmax greedy",
       [](Ctx& c) { return Router(c, RouterScoring::kSoftmax, false, false); }},
      {"RouterTopk", "softmax greedy, renormalised (Qwen3)",
       [](Ctx& c) { return Router(c, RouterScoring::kSoftmax, false, true); }},
      {"RouterTopk", "softmax group-limited",
       [](Ctx& c) { return Router(c, RouterScoring::kSoftmax, true, false); }},
      {"RouterTopk", "sigmoid noaux_tc",
       [](Ctx& c) { return Router(c, RouterScoring::kSigmoid, false, true); }},
      {"RouterGateTopk", "4 tokens, 128 experts, softmax renormalised (Qwen3)",
       [](Ctx& c) { return RouterGate(c, 4, 128, RouterScoring::kSoftmax, false, true); }},
      {"RouterGateTopk", "100 tokens (row blocks), 128 experts, softmax renormalised",
       [](Ctx& c) { return RouterGate(c, 100, 128, RouterScoring::kSoftmax, false, true); }},
      {"RouterGateTopk", "1 token, 64 experts, softmax",
       [](Ctx& c) { return RouterGate(c, 1, 64, RouterScoring::kSoftmax, false); }},
      {"RouterGateTopk", "5 tokens, 160 experts, softmax group-limited",
       [](Ctx& c) { return RouterGate(c, 5, 160, RouterScoring::kSoftmax, true); }},
      {"RouterGateTopk", "8 tokens, 256 experts, sigmoid noaux_tc",
       [](Ctx& c) { return RouterGate(c, 8, 256, RouterScoring::kSigmoid, false); }},
      {"MoeCombineAdd", "3 tokens, top-6, 2048 wide",
       [](Ctx& c) { return CombineAdd(c, 3, 6, 2048); }},
      {"MoeCombineAdd", "5 tokens, top-2, 50 wide (not 4-aligned rows)",
       [](Ctx& c) { return CombineAdd(c, 5, 2, 50); }},
      {"RouteAndPermute", "1 token, top-6 of 64",
       [](Ctx& c) { return RouteAndPermute(c, 1, 64, 6, RouterScoring::kSoftmax, false, 0, 64); }},
      {"RouteAndPermute", "5 tokens, 160 experts group-limited, local [40, 120)",
       [](Ctx& c) { return RouteAndPermute(c, 5, 160, 6, RouterScoring::kSoftmax, true, 40, 80); }},
      {"RouteAndPermute", "8 tokens, top-8 of 256 (64 slots), sigmoid",
       [](Ctx& c) {
         return RouteAndPermute(c, 8, 256, 8, RouterScoring::kSigmoid, false, 0, 256);
       }},
      {"RouteAndPermute", "8 tokens, top-9 of 64 (72 slots: unfused)",
       [](Ctx& c) { return RouteAndPermute(c, 8, 64, 9, RouterScoring::kSoftmax, false, 0, 64); }},
      {"RouterGateTopk", "12 tokens (GEMV chunks, then the router), 64 experts",
       [](Ctx& c) { return RouterGate(c, 12, 64, RouterScoring::kSoftmax, false); }},
      {"RouterGateTopk", "64 tokens (GEMM, then the router), 64 experts",
       [](Ctx& c) { return RouterGate(c, 64, 64, RouterScoring::kSoftmax, false); }},
      {"RouterGateTopk", "257 tokens (row blocks, a partial one), 160 experts group-limited",
       [](Ctx& c) { return RouterGate(c, 257, 160, RouterScoring::kSoftmax, true); }},
      {"RouterGateTopk", "65 tokens (row blocks, a partial one), 60 experts (a partial chunk of 8)",
       [](Ctx& c) { return RouterGate(c, 65, 60, RouterScoring::kSoftmax, false); }},
      {"RouterGateTopk", "511 tokens (row blocks), 256 experts, sigmoid noaux_tc",
       [](Ctx& c) { return RouterGate(c, 511, 256, RouterScoring::kSigmoid, false); }},
      {"RouterGateTopk", "600 tokens (GEMM, then the router), 64 experts",
       [](Ctx& c) { return RouterGate(c, 600, 64, RouterScoring::kSoftmax, false); }},
      {"RouteAndPermute", "100 tokens (row-blocked router, then the grouping), top-6 of 64",
       [](Ctx& c) {
         return RouteAndPermute(c, 100, 64, 6, RouterScoring::kSoftmax, false, 0, 64);
       }},
      {"MoePermute+GroupedExpertMlp+MoeCombine", "all 8 experts",
       [](Ctx& c) { return Moe(c, 7, 8, 3, 32, 24, 0, 8); }},
      {"MoePermute+GroupedExpertMlp+MoeCombine", "experts [3, 6)",
       [](Ctx& c) { return Moe(c, 7, 8, 3, 32, 24, 3, 3); }},
      // Over 32 grouped rows per expert: the GPU's down projection (K = 24) takes its tiled
      // path instead of its per-column one.
      {"MoePermute+GroupedExpertMlp+MoeCombine", "100 tokens, top-3 of 8",
       [](Ctx& c) { return Moe(c, 100, 8, 3, 32, 24, 0, 8); }},
      // 16+ rows each and K, N multiples of 16 (the down projection's K = 48 is not one of 32):
      // the GPU's WMMA path there.
      {"MoePermute+GroupedExpertMlp+MoeCombine", "60 tokens, top-4 of 8, 64x48",
       [](Ctx& c) { return Moe(c, 60, 8, 4, 64, 48, 0, 8); }},
      // K multiples of 32: the GPU's mma.sync path at 1, 6, 17, 40 and 70 rows per expert on
      // average, with empty experts, an expert over one 64-row pass, local ranges not from 0.
      {"MoePermute+GroupedExpertMlp+MoeCombine", "~1 row/expert, [4, 20) of 32",
       [](Ctx& c) { return Moe(c, 8, 32, 2, 64, 96, 4, 16); }},
      {"MoePermute+GroupedExpertMlp+MoeCombine", "~6 rows/expert, [3, 19) of 20",
       [](Ctx& c) { return Moe(c, 24, 20, 4, 64, 96, 3, 16); }},
      {"MoePermute+GroupedExpertMlp+MoeCombine", "~17 rows/expert, one of 34",
       [](Ctx& c) { return Moe(c, 34, 10, 4, 96, 64, 1, 8, 1); }},
      {"MoePermute+GroupedExpertMlp+MoeCombine", "~40 rows/expert, one of 80",
       [](Ctx& c) { return Moe(c, 80, 8, 4, 64, 96, 0, 8, 5); }},
      {"MoePermute+GroupedExpertMlp+MoeCombine", "~70 rows/expert, one of 140",
       [](Ctx& c) { return Moe(c, 140, 12, 4, 64, 96, 2, 8, 6); }},
      // The mma.sync path's x staged in K pieces: ~20 rows per expert (2 m tiles per pass, 16
      // warps) with K = 2560 in two pieces of 1280; ~1.5 rows
      // per expert (1 tile) with K = 2304 in three of 768.
      {"MoePermute+GroupedExpertMlp+MoeCombine", "~20 rows/expert, K 2560 in 2 pieces",
       [](Ctx& c) { return Moe(c, 40, 8, 4, 2560, 96, 0, 8); }},
      {"MoePermute+GroupedExpertMlp+MoeCombine", "~1.5 rows/expert, K 2304 in 3 pieces",
       [](Ctx& c) { return Moe(c, 6, 8, 2, 2304, 64, 0, 8); }},
      // Fewer rows than local experts (decode at batch 1-10): the GPU launches blocks for
      // min(experts, rows) experts, block z taking the z-th expert with rows; a local range not
      // from 0 with foreign slots; over 256 local experts every expert gets its blocks.
      {"MoePermute+GroupedExpertMlp+MoeCombine", "1 token, top-6 of 64",
       [](Ctx& c) { return Moe(c, 1, 64, 6, 256, 128, 0, 64); }},
      {"MoePermute+GroupedExpertMlp+MoeCombine", "3 tokens, top-4 of 64, [10, 50)",
       [](Ctx& c) { return Moe(c, 3, 64, 4, 64, 96, 10, 40); }},
      {"MoePermute+GroupedExpertMlp+MoeCombine", "2 tokens, top-4 of 300",
       [](Ctx& c) { return Moe(c, 2, 300, 4, 64, 64, 0, 300); }},
      // One m tile over K in pieces: the GPU splits K between two halves of warps (pieces
      // alternate), here with both projections in 2 pieces and a hot expert of 3 passes.
      {"MoePermute+GroupedExpertMlp+MoeCombine", "~10 rows/expert, one of 40, 1280x1280",
       [](Ctx& c) { return Moe(c, 40, 8, 2, 1280, 1280, 0, 8, 2); }},
      // The same with 32 experts' blocks side by side (18 column blocks each).
      {"MoePermute+GroupedExpertMlp+MoeCombine", "~3 rows/expert, 32 experts, 1152x576",
       [](Ctx& c) { return Moe(c, 24, 32, 4, 1152, 576, 0, 32); }},
      // The same two and a tiled one with the rows gathered first (GatherRows), not on the way.
      {"MoePermute+GroupedExpertMlp+MoeCombine", "~10 rows/expert, 1280x1280, gathered first",
       [](Ctx& c) { return Moe(c, 40, 8, 2, 1280, 1280, 0, 8, 2, false); }},
      {"MoePermute+GroupedExpertMlp+MoeCombine", "~6 rows/expert, gathered first",
       [](Ctx& c) { return Moe(c, 24, 20, 4, 64, 96, 3, 16, -1, false); }},
      {"MoePermute+GroupedExpertMlp+MoeCombine", "~40 rows/expert, gathered first",
       [](Ctx& c) { return Moe(c, 80, 8, 4, 64, 96, 0, 8, 5, false); }},
      // FP8 experts (held as E4M3 codes with 128 x 128 block scales): decode sizes (1 and 2 m
      // tiles, K in pieces), partial blocks (96 / 160 / 224 off the grid), a hot expert over
      // many passes, and a prefill size (dequantized for the tiled form).
      {"GroupedExpertMlp FP8", "1 token, top-6 of 64, 256x128",
       [](Ctx& c) { return MoeFp8(c, 1, 64, 6, 256, 128, 64); }},
      {"GroupedExpertMlp FP8", "~6 rows/expert, 160x96 (partial blocks)",
       [](Ctx& c) { return MoeFp8(c, 24, 16, 4, 160, 96, 16); }},
      {"GroupedExpertMlp FP8", "~24 rows/expert (2 m tiles), 2048x1408 as V2-Lite",
       [](Ctx& c) { return MoeFp8(c, 24, 4, 4, 2048, 1408, 4); }},
      {"GroupedExpertMlp FP8", "~10 rows/expert, one of 40, 1280x1280 (K in pieces)",
       [](Ctx& c) { return MoeFp8(c, 40, 8, 2, 1280, 1280, 8, 2); }},
      {"GroupedExpertMlp FP8", "~300 rows/expert (prefill), 256x224",
       [](Ctx& c) { return MoeFp8(c, 600, 8, 4, 256, 224, 8); }},
      // Down projection N = 72 (a warp's second 8-column tile past N) on the mma.sync path.
      {"MoePermute+GroupedExpertMlp+MoeCombine", "30 tokens, top-4 of 8, 72x64",
       [](Ctx& c) { return Moe(c, 30, 8, 4, 72, 64, 0, 8); }},
      // Over 256 rows per expert on average: the GPU's tiled path (128 x 128 block tiles, K in
      // steps of 64): partial column blocks (gate/up N 96, down N 64) and a partial K step
      // (96); K = 200 in 3 steps + 8, N = 72, a hot expert over 8 m tiles beside experts of a
      // partial one, a local range not from 0; 40 experts (the block's expert lookup over more
      // than one warp's 32); the rows gathered first.
      {"MoePermute+GroupedExpertMlp+MoeCombine", "600 tokens, top-4 of 8, 64x96",
       [](Ctx& c) { return Moe(c, 600, 8, 4, 64, 96, 0, 8); }},
      {"MoePermute+GroupedExpertMlp+MoeCombine", "~300 rows/expert, one of 900, 200x72",
       [](Ctx& c) { return Moe(c, 900, 12, 4, 200, 72, 2, 8, 6); }},
      // 8+ tiles of 1024 slots: the GPU groups them over blocks (two launches), the same
      // grouping: a local range with foreign slots, and all 64 experts.
      {"MoePermute+GroupedExpertMlp+MoeCombine", "12600 slots, [10, 50) of 64, 64x64",
       [](Ctx& c) { return Moe(c, 2100, 64, 6, 64, 64, 10, 40); }},
      {"MoePermute+GroupedExpertMlp+MoeCombine", "~280 rows/expert, 40 experts",
       [](Ctx& c) { return Moe(c, 1400, 40, 8, 64, 64, 0, 40); }},
      {"MoePermute+GroupedExpertMlp+MoeCombine", "~300 rows/expert, gathered first",
       [](Ctx& c) { return Moe(c, 600, 8, 4, 64, 96, 0, 8, -1, false); }},
      {"LogSoftmaxAt", "4x1000", [](Ctx& c) { return LogSoftmaxAt(c, 1000); }},
      {"LogSoftmaxAt", "4x20000", [](Ctx& c) { return LogSoftmaxAt(c, 20000); }},
      {"LogSoftmaxAt", "NaN in a chunk of -inf", LogSoftmaxNaN},
      {"Sample", "greedy over 20000 logits", GreedyLongRows},
      {"Sample", "greedy, NaN, top-k, top-p, cdf", Sample},
      // One sampled row: parameter arrays of odd sizes must stay aligned on the device.
      {"Sample", "one sampled row", SampleOneRow},
      {"Copy+Fill", "10x10", CopyFill},
      {"TakeIds+StartCopyToHost", "300 ids from 7", TakeIdsAndCopiesToHost},
      {"CopyToDevice", "40 x 1.2 MB staged, past the ring", StagedUploadsWrap},
      {"AfdDispatch+DequantFp8Rows", "37 x 2120 to fp8, bf16, fp8 ranks", AfdDispatchFp8},
  };
}

std::vector<Case> PerfCases() {
  using D = DType;
  std::vector<Case> v;
  for (int64_t n : {1, 16, 32, 64, 256}) {
    v.push_back({"Linear", fmt::format("bf16 {}x2048->2816", n),
                 [n](Ctx& c) { return Linear(c, n, 2048, 2816, D::kBF16); }});
  }
  // DeepSeek-V2-Lite's dense projections at decode batch 16: q, o, kv_a, shared experts' down.
  for (const auto& [k, m] : std::vector<std::pair<int64_t, int64_t>>{
           {2048, 3072}, {2048, 2048}, {2048, 576}, {2816, 2048}}) {
    v.push_back({"Linear", fmt::format("bf16 16x{}->{}", k, m),
                 [k, m](Ctx& c) { return Linear(c, 16, k, m, D::kBF16); }});
  }
  v.push_back(
      {"Linear", "f32 256x2048->2048", [](Ctx& c) { return Linear(c, 256, 2048, 2048, D::kF32); }});
  // The same projections at prefill (8192 tokens), and the router gate (fp32, 64 experts).
  for (const auto& [k, m] : std::vector<std::pair<int64_t, int64_t>>{
           {2048, 3072}, {2048, 2048}, {2048, 576}, {2048, 5632}, {2816, 2048}}) {
    v.push_back({"Linear", fmt::format("bf16 8192x{}->{}", k, m),
                 [k, m](Ctx& c) { return Linear(c, 8192, k, m, D::kBF16); }});
  }
  v.push_back(
      {"Linear", "f32 8192x2048->64", [](Ctx& c) { return Linear(c, 8192, 2048, 64, D::kF32); }});
  // The router gate at decode batch 1-64 (fp32, 64 experts).
  for (int64_t n : {1, 8, 16, 64}) {
    v.push_back({"Linear", fmt::format("f32 {}x2048->64", n),
                 [n](Ctx& c) { return Linear(c, n, 2048, 64, D::kF32); }});
  }
  v.push_back({"RmsNorm", "256x2048", [](Ctx& c) { return RmsNorm(c, 256, 2048); }});
  for (int64_t seqs : {1, 16, 64}) {
    v.push_back({"MlaAttention", fmt::format("decode {} x ctx 1024, 16 heads", seqs),
                 [seqs](Ctx& c) { return MlaDecodePerf(c, seqs, 1024); }});
    v.push_back({"MlaAttention",
                 fmt::format("decode {} x ctx 1024, 16 heads, tf32, bf16 cache", seqs),
                 [seqs](Ctx& c) { return MlaDecodePerf(c, seqs, 1024, true, DType::kBF16); }});
  }
  // The tiled kernel (bf16 cache) at small batch and short contexts, where the split count
  // trades a merge for parallel tiles (--mla-splits forces one).
  for (int64_t seqs : {1, 4, 16}) {
    for (int64_t ctx : {129, 256, 512}) {
      v.push_back(
          {"MlaAttention", fmt::format("decode {} x ctx {}, 16 heads, tf32, bf16 cache", seqs, ctx),
           [seqs, ctx](Ctx& c) { return MlaDecodePerf(c, seqs, ctx, true, DType::kBF16); }});
    }
  }
  // A prefill's attention (issue 11's 8 x 1024; the decode bench's 256 x 128).
  for (const auto& [seqs, len] : std::vector<std::pair<int64_t, int64_t>>{{8, 1024}, {256, 128}}) {
    v.push_back({"MlaAttention",
                 fmt::format("prefill {} x {}, 16 heads, tf32, bf16 cache", seqs, len),
                 [seqs, len](Ctx& c) { return MlaPrefillPerf(c, seqs, len); }});
  }
  // fp32 vs TF32 tensor cores (bf16 models) at large batch: ctx 128 and 1024.
  for (int64_t ctx : {128, 1024}) {
    v.push_back({"MlaAttention",
                 fmt::format("decode 256 x ctx {}, 16 heads, tf32, bf16 cache", ctx),
                 [ctx](Ctx& c) { return MlaDecodePerf(c, 256, ctx, true, DType::kBF16); }});
    for (bool tf32 : {false, true}) {
      v.push_back({"MlaAttention",
                   fmt::format("decode 256 x ctx {}, 16 heads{}", ctx, tf32 ? ", tf32" : ""),
                   [ctx, tf32](Ctx& c) { return MlaDecodePerf(c, 256, ctx, tf32); }});
    }
  }
  for (int64_t n : {1, 16, 64}) {
    v.push_back({"MoE (permute+experts+combine)", fmt::format("{} tok, top-6 of 16, 2048x1408", n),
                 [n](Ctx& c) { return Moe(c, n, 16, 6, 2048, 1408, 0, 16); }});
  }
  // DeepSeek-V2-Lite's routed experts: 64 of 2048x1408, top-6 (GB/s of the weights touched).
  for (int64_t n : {1, 16, 64, 256, 4096, 8192}) {
    v.push_back({"MoE (permute+experts+combine)", fmt::format("{} tok, top-6 of 64, 2048x1408", n),
                 [n](Ctx& c) { return Moe(c, n, 64, 6, 2048, 1408, 0, 64); }});
  }
  // The same experts held as FP8 (w8a8 up to 256 rows an expert; GB/s of the FP8 bytes).
  for (int64_t n : {1, 16, 64, 256}) {
    v.push_back({"MoE FP8 (permute+experts+combine)",
                 fmt::format("{} tok, top-6 of 64, 2048x1408", n),
                 [n](Ctx& c) { return MoeFp8(c, n, 64, 6, 2048, 1408, 64); }});
  }
  return v;
}

int Main(int argc, char** argv) {
  bool perf = false;
  int iters = 20;
  std::string only_op, only_case, only_backend;
  Backend::FormOverrides forms;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--perf") {
      perf = true;
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--op" && i + 1 < argc) {
      only_op = argv[++i];
    } else if (a == "--case" && i + 1 < argc) {
      only_case = argv[++i];
    } else if (a == "--backend" && i + 1 < argc) {
      only_backend = argv[++i];
    } else if (a == "--mla-splits" && i + 1 < argc) {
      forms.mla_splits = std::atoi(argv[++i]);
    } else if (a == "--mla-bufs" && i + 1 < argc) {
      forms.mla_bufs = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: backend_ops_test [--perf [--iters N]] [--op NAME] [--case TEXT] "
                   "[--backend cpu|cuda] [--mla-splits N] [--mla-bufs N]\n(--op, --case: the "
                   "cases whose op / shape contain it; --mla-*: forms forced, "
                   "Backend::FormOverrides)\n");
      return 2;
    }
  }
  std::vector<std::unique_ptr<Backend>> backends;
  if (only_backend.empty() || only_backend == "cpu") backends.push_back(MakeBackend(Device::Cpu()));
  if (only_backend.empty() || only_backend == "cuda") {
    try {
      backends.push_back(MakeBackend(Device::Cuda(0)));
    } catch (const Error& e) {
      std::printf("skipping cuda: %s\n", e.what());
    }
  }
  int passed = 0, failed = 0;
  for (auto& backend : backends) {
    // Checks: the launch mode of a small decode step (a GPU's programmatic dependent launch,
    // where a kernel reading before its predecessor finished would show); perf: the plain one.
    if (!perf) backend->SetStepRows(1);
    backend->SetFormOverrides(forms);
    Ctx ctx{*backend};
    ctx.perf = perf;
    ctx.iters = iters;
    for (const Case& c : perf ? PerfCases() : CheckCases()) {
      if (!only_op.empty() && c.op.find(only_op) == std::string::npos) continue;
      if (!only_case.empty() && c.shape.find(only_case) == std::string::npos) continue;
      Result r;
      try {
        r = c.run(ctx);
      } catch (const Error& e) {
        r = Result::Fail(e.what());
      }
      if (perf) {
        std::printf("%-6s %-38s %-36s %9.3f ms %9.1f GB/s %8.3f TFLOP/s\n", backend->name().c_str(),
                    c.op.c_str(), c.shape.c_str(), r.seconds * 1e3, r.bytes / r.seconds / 1e9,
                    r.flops / r.seconds / 1e12);
        ++passed;
        continue;
      }
      const bool ok = r.err <= r.tol;
      (ok ? passed : failed)++;
      std::printf("%-6s %-40s %-30s err %.2e (tol %.0e) %s %s\n", backend->name().c_str(),
                  c.op.c_str(), c.shape.c_str(), r.err, r.tol, ok ? "OK" : "FAIL", r.note.c_str());
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace afd::kernels

int main(int argc, char** argv) { return afd::kernels::Main(argc, argv); }
