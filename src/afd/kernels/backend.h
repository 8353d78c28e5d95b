// The op interface every backend implements (cpu/ is the exact reference; cuda/ the fast path).
// The model and the runtime are written once against it: they hold Tensors in the backend's
// memory (weights, the paged latent cache, a per-step Workspace) and call these ops.
//
// Conventions of every op:
//  * Tensors live on the backend's device; float activations are fp32, weight matrices fp32 or
//    bf16, shapes are noted per op ("x: [n, K]"); an op checks shapes and dtypes and throws
//    afd::Error naming the op and the tensor.
//  * Ops are enqueued on the backend's stream in call order; the CPU backend runs them inline.
//    CopyToHost and Synchronize wait for the device, FinishCopyToHost for one copy's place in
//    the stream; CopyToDevice returns once `src` may be reused (the CUDA backend stages it in
//    pinned memory first, as it does Sample's row parameters). Every other op returns without
//    waiting.
//  * A token whose slot_mapping is negative writes no cache row (MlaCacheWrite): the padding
//    rows of a captured graph (runtime/cuda_graph_runner.h) use it.
//  * Rows are independent: a token's result never depends on the other rows of the batch
//    (batch invariance), on every backend.
// Thread safety: a Backend is used by one thread at a time (one per rank).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "afd/common/function_ref.h"
#include "afd/tensor/allocator.h"
#include "afd/tensor/tensor.h"

namespace afd::kernels {

// Rotary embedding of dr = 2·inv_freq.numel() dims (model/rope.h has the semantics).
struct RopeSpec {
  Tensor inv_freq;  // [dr/2] f32 on the device
  float attention_factor = 1.0f;
  bool interleave = true;  // pairs (x[2i], x[2i+1]); else (x[i], x[i + dr/2])
};

// Per-token metadata of a step for attention over the paged latent cache.
struct AttentionTokens {
  Tensor positions;     // [n] i64 position of each token in its sequence
  Tensor seq_index;     // [n] i32 row of block_tables of the token's sequence
  Tensor slot_mapping;  // [n] i64 cache slot (block·block_size + offset) of the token's row
  Tensor block_tables;  // [num_seqs, max_blocks] i32 physical blocks of each sequence
  int64_t block_size = 0;
  // Host-side upper bound of positions[t] + 1 over the tokens (0: unknown, then the block tables'
  // width bounds it): lets a GPU split long contexts over more blocks without reading positions.
  int64_t max_context = 0;
};

// Router top-k semantics (model/router.h documents each method).
enum class RouterScoring { kSoftmax, kSigmoid };
struct RouterSpec {
  RouterScoring scoring = RouterScoring::kSoftmax;
  bool group_limited = false;  // softmax: group_limited_greedy (max score per group)
  int64_t top_k = 1;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  // The top-k weights divided by (their sum + norm_eps): V3 (sigmoid, 1e-20) and Qwen3 (softmax,
  // 0); V2 never.
  bool norm_topk_prob = false;
  float norm_eps = 1e-20f;
  float routed_scaling_factor = 1.0f;
};

// Block size of FP8 weights held as FP8 (DeepSeek-V3's weight_block_size, vLLM's online fp8).
inline constexpr int64_t kFp8WeightBlock = 128;

// The SwiGLU experts a rank holds: gate_up[e] [2I, H], down[e] [H, I] for local expert e
// (global id expert_begin + e); an empty tensor is an expert not loaded here.
// FP8 experts (fp8()): gate_up / down are E4M3 codes (kF8E4M3) and w = code * scale in fp32
// with one float32 scale per kFp8WeightBlock x kFp8WeightBlock block (edge blocks partial):
// gate_up_scale[e] [2 * ceil(I / 128), ceil(H / 128)] -- gate_proj's blocks, then up_proj's (so
// up row j is in block row ceil(I / 128) + j / 128 whatever I is) -- and down_scale[e]
// [ceil(H / 128), ceil(I / 128)]. Otherwise both scale lists are empty.
struct ExpertWeights {
  std::vector<Tensor> gate_up;
  std::vector<Tensor> down;
  std::vector<Tensor> gate_up_scale;
  std::vector<Tensor> down_scale;
  int64_t expert_begin = 0;
  int64_t num_experts() const { return static_cast<int64_t>(gate_up.size()); }
  bool fp8() const { return !gate_up_scale.empty(); }
};

// One row's sampling: greedy when temperature <= 0; else temperature, top-k (0: none), top-p,
// and u in [0, 1), the row's uniform draw (the host's per-sequence random stream).
struct SampleRow {
  float temperature = 0.0f;
  int64_t top_k = 0;
  float top_p = 1.0f;
  double u = 0.0;
};

// A recorded sequence of ops (a CUDA graph) that replays on the backend's stream, with the very
// tensors (addresses) and shapes it was captured with.
class OpGraph {
 public:
  virtual ~OpGraph() = default;
  virtual void Replay() = 0;  // enqueues; does not wait
};

// Device time of one op name over a profiled span (Backend::SetProfiling).
struct OpTime {
  std::string op;  // the op and its shape, e.g. "Linear 16x2048->2816"
  int64_t calls = 0;
  double ms = 0.0;
};

// One kernel's run on the device, from a kernel trace (Backend::SetKernelTrace).
struct KernelSpan {
  std::string name;  // demangled, without namespaces and parameter lists
  uint32_t stream = 0;
  uint32_t graph = 0;   // the CUDA graph it ran in (0: launched on its own)
  uint32_t launch = 0;  // its launch's correlation id: the same for every kernel of a replay
  uint64_t start_ns = 0, end_ns = 0;
};

class Backend : public Allocator {
 public:
  ~Backend() override = default;
  virtual std::string name() const = 0;  // "cpu", "cuda:0 (NVIDIA H200)"
  virtual Stream stream() const = 0;
  // Makes the backend's device current on the calling thread: a thread other than the one that
  // created the backend calls it once before running ops (the serving engine's thread).
  virtual void BindThread() {}
  // Free and total bytes of the device's memory; -1 when the backend cannot tell (the CPU).
  struct MemoryInfo {
    int64_t free_bytes = -1;
    int64_t total_bytes = -1;
  };
  virtual MemoryInfo DeviceMemory() const { return {}; }

  // ---- Memory --------------------------------------------------------------------------
  // dst (contiguous, on the device) = dst.nbytes() bytes from host memory src.
  virtual void CopyToDevice(const Tensor& dst, const void* src) = 0;
  // dst (host) = src.nbytes() bytes of src; waits for the work that writes src.
  virtual void CopyToHost(void* dst, const Tensor& src) = 0;
  // dst = src, same shape and dtype, both on the device.
  virtual void Copy(const Tensor& dst, const Tensor& src) = 0;
  virtual void Fill(const Tensor& dst, float value) = 0;  // f32 tensors
  virtual void Synchronize() = 0;
  // CUDA IPC (a KV transfer between the processes of one host, docs/pd.md): IpcHandle is the
  // handle (opaque bytes) of the allocation that `t` starts -- t must be a whole allocation of
  // this backend (Allocate); CopyFromIpc enqueues dst = the dst.nbytes() bytes at `offset` of
  // the allocation another process's IpcHandle named (opened once per handle, kept open while
  // the backend lives; Synchronize waits for the copy). CopyFromIpc throws, naming the cause,
  // when the allocation cannot be opened or is smaller than offset + dst.nbytes(). Backends
  // without IPC (the CPU) say so (SupportsIpc) and throw.
  virtual bool SupportsIpc() const { return false; }
  virtual std::string IpcHandle(const Tensor& t);
  virtual void CopyFromIpc(const Tensor& dst, const std::string& handle, int64_t offset);
  // A copy to the host that does not wait for work enqueued after it: StartCopyToHost enqueues
  // a copy of src into host memory the backend holds and returns a ticket; FinishCopyToHost
  // waits for that copy (and the work before it) only, then writes its bytes to dst
  // (src.nbytes() of them). Each ticket is finished once, in any order; at most
  // kMaxCopiesToHost are unfinished at a time (several engines may share a backend). The base
  // class copies at once (CopyToHost); the CUDA backend copies into pinned memory and waits on
  // an event.
  static constexpr int kMaxCopiesToHost = 16;
  virtual int64_t StartCopyToHost(const Tensor& src);
  virtual void FinishCopyToHost(int64_t ticket, void* dst);
  // Bounds every wait for the device (Synchronize, CopyToHost) of a rank whose stream also
  // carries transfers with other processes (a peer that died mid-transfer would leave it blocked
  // for ever): such a wait fails after `timeout_s`, and calls `check` (which may throw, e.g. on
  // the deployment's abort) about every 100 ms. No-op on backends without an asynchronous device.
  virtual void WatchWaits(double timeout_s, std::function<void()> check) {
    (void)timeout_s;
    (void)check;
  }

  // ---- Dense ops -----------------------------------------------------------------------
  // out: [n, H] f32 = rows ids: [n] i32 of table: [V, H] (f32/bf16). Ids are checked by callers.
  virtual void Embedding(const Tensor& table, const Tensor& ids, const Tensor& out) = 0;
  // y: [n, N] = x: [n, K] · wᵀ, w: [N, K] f32/bf16: a weight, which no op of the step writes
  // (the CUDA backend's GEMVs may load it before the previous kernel has finished).
  virtual void Linear(const Tensor& x, const Tensor& w, const Tensor& y) = 0;
  // out: [n, D] = w ⊙ x / sqrt(mean(x²) + eps) per row, w: [D] f32; out may alias x.
  virtual void RmsNorm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) = 0;
  // y += x, same shape.
  virtual void Add(const Tensor& y, const Tensor& x) = 0;
  // The residual add and the norm after it: y += x, then out = RmsNorm(y, w, eps) (out must not
  // alias y or x). The same values as Add then RmsNorm (the default); a backend may fuse them.
  virtual void AddRmsNorm(const Tensor& y, const Tensor& x, const Tensor& w, float eps,
                          const Tensor& out) {
    Add(y, x);
    RmsNorm(y, w, eps, out);
  }
  // out: [n, I] = silu(gate_up[:, :I]) · gate_up[:, I:], gate_up: [n, 2I].
  virtual void SiluMul(const Tensor& gate_up, const Tensor& out) = 0;
  // Rotates dims [offset, offset + dr) of every head of x: [n, heads, width] in place, token t
  // at positions[t] (i64 [n]).
  virtual void Rope(const Tensor& x, int64_t offset, const Tensor& positions,
                    const RopeSpec& rope) = 0;
  // Gathers rows: out[i] = x[index[i]] for index: [m] i32, x: [n, H], out: [m, H].
  virtual void GatherRows(const Tensor& x, const Tensor& index, const Tensor& out) = 0;

  // ---- MLA over the paged latent cache --------------------------------------------------
  // ckv: [n, kv_lora + dr] (x · W_kv_aᵀ). Writes cache[slot_mapping[t]] =
  // [rmsnorm(ckv[t, :kv_lora], norm_w, eps) | rope(ckv[t, kv_lora:], positions[t])].
  // cache: [num_slots, kv_lora + dr] f32 (one layer).
  virtual void MlaCacheWrite(const Tensor& ckv, const Tensor& norm_w, float eps,
                             const AttentionTokens& tokens, const RopeSpec& rope,
                             const Tensor& cache) = 0;
  // Absorbed MLA of heads [head_begin, head_end) (model/attention.h has the math), causal over
  // each token's sequence positions [0, positions[t]]. q: [n, heads, dn + dr] for all heads
  // (rope applied; only the range is read), kv_b: [heads·(dn + dv), kv_lora] f32,
  // out: [n, nh·dv] with nh = head_end - head_begin.
  virtual void MlaAttention(const Tensor& q, const Tensor& kv_b, const AttentionTokens& tokens,
                            const Tensor& cache, int64_t head_begin, int64_t head_end, int64_t dn,
                            int64_t dv, float scale, const Tensor& out) = 0;

  // ---- GQA over the paged key/value cache (Qwen3) --------------------------------------
  // qkv: [n, (nh + 2·kvh)·d] = x · W_qkvᵀ (per row: q of every head, then k, then v of every KV
  // head). Writes q: [n, nh, d] = rope(rmsnorm(q_h, q_norm, eps)) of each head, and for each
  // token with slot_mapping >= 0 its cache row [rope(rmsnorm(k_g, k_norm, eps)) for each KV head
  // g | v_g for each g]. The rope rotates all d dims (inv_freq: [d/2]). q_norm, k_norm: [d] f32;
  // cache: [num_slots, 2·kvh·d] f32, or bf16 (rounded once, after the norm and the rope).
  virtual void GqaCacheWrite(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                             float eps, const AttentionTokens& tokens, const RopeSpec& rope,
                             const Tensor& q, const Tensor& cache) = 0;
  // Attention of heads [head_begin, head_end) of q: [n, nh, d], head h reading KV head
  // h / (nh / num_kv_heads) of the cache; causal over each token's sequence positions
  // [0, positions[t]]: out[t, h - head_begin] = Σ_j softmax_j(q·k_j · scale) v_j.
  // out: [n, (head_end - head_begin)·d].
  virtual void GqaAttention(const Tensor& q, const AttentionTokens& tokens, const Tensor& cache,
                            int64_t num_kv_heads, int64_t head_begin, int64_t head_end, float scale,
                            const Tensor& out) = 0;

  // ---- MoE ----------------------------------------------------------------------------
  // logits: [n, E] (h · W_gateᵀ), bias: [E] (sigmoid: e_score_correction_bias) or empty.
  // ids: [n, k] i32 ascending per token, weights: [n, k] f32.
  virtual void RouterTopk(const Tensor& logits, const Tensor& bias, const RouterSpec& spec,
                          const Tensor& ids, const Tensor& weights) = 0;
  // A MoE layer's router in one op: logits = hidden: [n, H] · gateᵀ (gate: [E, H]), then
  // RouterTopk(logits, ...). logits: [n, E] receives the gate's output. The composition by
  // default; a backend may fuse the two (the CUDA backend for a few tokens).
  virtual void RouterGateTopk(const Tensor& hidden, const Tensor& gate, const Tensor& bias,
                              const RouterSpec& spec, const Tensor& logits, const Tensor& ids,
                              const Tensor& weights) {
    Linear(hidden, gate, logits);
    RouterTopk(logits, bias, spec, ids, weights);
  }
  // Groups the (token, slot) pairs whose expert is in [begin, begin + num_local) by expert,
  // tokens ascending within an expert. ids: [n, k] i32. Outputs: offsets: [num_local + 1] i32
  // (expert e's rows are [offsets[e], offsets[e+1])), src_row: [n·k] i32 (token of each grouped
  // row; 0 past offsets[num_local]), row_of_slot: [n, k] i32 (grouped row of each
  // slot, -1 for experts outside the range). Device side only: no host sync.
  virtual void MoePermute(const Tensor& ids, int64_t begin, int64_t num_local,
                          const Tensor& offsets, const Tensor& src_row,
                          const Tensor& row_of_slot) = 0;
  // RouterGateTopk, then MoePermute of its ids (the in-process MoE layer routes and groups its
  // own tokens). The composition by default; the CUDA backend does both in one launch for a few
  // tokens (the router's last block groups the slots).
  virtual void RouteAndPermute(const Tensor& hidden, const Tensor& gate, const Tensor& bias,
                               const RouterSpec& spec, const Tensor& logits, const Tensor& ids,
                               const Tensor& weights, int64_t begin, int64_t num_local,
                               const Tensor& offsets, const Tensor& src_row,
                               const Tensor& row_of_slot) {
    RouterGateTopk(hidden, gate, bias, spec, logits, ids, weights);
    MoePermute(ids, begin, num_local, offsets, src_row, row_of_slot);
  }
  // out[r] = expert_e(x[r]) (SwiGLU, unweighted) for the rows [offsets[e], offsets[e+1]) of each
  // local expert e. x, out: [m, H] with m >= offsets[num_local] (rows past it untouched).
  virtual void GroupedExpertMlp(const Tensor& x, const Tensor& offsets,
                                const ExpertWeights& experts, const Tensor& out) = 0;
  // GroupedExpertMlp of the gathered rows x[src_row[r]] (src_row: [m] i32, as MoePermute makes
  // it): the composition gathers into `grouped` ([m, H] scratch); a backend that reads x through
  // src_row itself may leave grouped unwritten.
  virtual void GatheredExpertMlp(const Tensor& x, const Tensor& src_row, const Tensor& grouped,
                                 const Tensor& offsets, const ExpertWeights& experts,
                                 const Tensor& out) {
    GatherRows(x, src_row, grouped);
    GroupedExpertMlp(grouped, offsets, experts, out);
  }
  // out[t] = Σ_j weights[t, j] · y[row_of_slot[t, j]] over j ascending with row >= 0, starting
  // from 0 (accumulate: from out[t]). y: [m, H], out: [n, H].
  virtual void MoeCombine(const Tensor& y, const Tensor& row_of_slot, const Tensor& weights,
                          bool accumulate, const Tensor& out) = 0;
  // MoeCombine from 0, then out += addend ([n, H]; the in-process MoE layer's shared experts):
  // the composition by default; the CUDA backend adds addend in the combine's pass (the same
  // bits: one fp32 add after each row's weighted sum).
  virtual void MoeCombineAdd(const Tensor& y, const Tensor& row_of_slot, const Tensor& weights,
                             const Tensor& addend, const Tensor& out) {
    MoeCombine(y, row_of_slot, weights, /*accumulate=*/false, out);
    Add(out, addend);
  }

  // ---- AFD exchange (the attention role's dispatch and combine, the FFN's rows) ---------
  // FFN rank f of F (F = rows.size(), at most kMaxAfdRanks) owns experts ExpertRangeOf(E, F, f)
  // (topology/expert_range.h). The dispatch of n tokens sends each token once to every rank it
  // needs: with `shared` (the model has shared experts), rank f gets first the tokens t with
  // t % F == f (at row t / F: their shared experts run there); then the other tokens with an
  // expert there, ascending. ids: [n, k] i32 in [0, E),
  // weights: [n, k] f32, hidden: [n, H] f32. For each f: rows[f]: [n, H] f32, bf16 (rounded) or
  // f8e4m3 (the FP8 dispatch: kernels/afd_exchange.h, with scales[f]: [n, AfdFp8Groups(H)] f32
  // the row's group scales; scales empty, or an empty tensor for a rank whose rows are not FP8),
  // row r = hidden[its token] (rows past the rank's tokens untouched); tables[f]: [2·n·k] i32 =
  // ids [n, k] (the token's ids; -1 for rows past the rank's tokens) then weights [n, k] (f32
  // bits). send_row: [n, F] i32 = the row of token t at rank f, -1 where it is not sent.
  static constexpr int kMaxAfdRanks = 64;
  virtual void AfdDispatch(const Tensor& hidden, const Tensor& ids, const Tensor& weights,
                           int64_t num_experts, const std::vector<Tensor>& rows,
                           const std::vector<Tensor>& scales, const std::vector<Tensor>& tables,
                           const Tensor& send_row, bool shared) = 0;
  // out[r, c] = fp8_value(q[r, c]) · scales[r, c / 128] (the FP8 dispatch's rows, read by the
  // FFN: one f32 product, exact on every backend). q: [m, H] f8e4m3, scales: [m,
  // AfdFp8Groups(H)] f32, out: [m, H] f32.
  virtual void DequantFp8Rows(const Tensor& q, const Tensor& scales, const Tensor& out) = 0;
  // out[t] = the sum over f ascending with send_row[t, f] >= 0 of partials[f][send_row[t, f]]
  // (the first term copied, the next ones added in fp32). partials[f]: [m_f, H] f32; out: [n, H].
  virtual void AfdSumPartials(const std::vector<Tensor>& partials, const Tensor& send_row,
                              const Tensor& out) = 0;
  // The combine index of per-pair replies: idx[t, j] = base[f] + row_of_slot[f][send_row[t, f],
  // j] with f the owner of ids[t, j] (row_of_slot[f]: [n, k] i32, the rank's MoePermute of its
  // rows); shared_idx[t] = shared_base[t % F] + t / F (empty: not written). idx: [n, k] i32,
  // shared_idx: [n] i32.
  virtual void AfdPairIndex(const Tensor& ids, int64_t num_experts, const Tensor& send_row,
                            const std::vector<Tensor>& row_of_slot,
                            const std::vector<int64_t>& base,
                            const std::vector<int64_t>& shared_base, const Tensor& idx,
                            const Tensor& shared_idx) = 0;
  // dst = src, f32 <-> bf16 (round to nearest even; bf16 -> f32 is exact), same shape.
  virtual void Convert(const Tensor& dst, const Tensor& src) = 0;

  // ---- Outputs ------------------------------------------------------------------------
  // out[t] = log_softmax(logits[t])[ids[t]], logits: [n, V], ids: [n] i32, out: [n] f32.
  virtual void LogSoftmaxAt(const Tensor& logits, const Tensor& ids, const Tensor& out) = 0;
  // ids: [n] i32 sampled from logits: [n, V] with rows[t]. NaN logits are never chosen (a row
  // of only NaN gives id 0).
  virtual void Sample(const Tensor& logits, const std::vector<SampleRow>& rows,
                      const Tensor& ids) = 0;
  // ids[t] = from[source[t]] for each t with source[t] >= 0 (else ids[t] is left as it is):
  // a step's input ids taken from the previous step's sampled ids, which only the device has
  // yet (the engine's asynchronous scheduling). ids, source: [n] i32, from: [k] i32; callers
  // check source[t] < k.
  virtual void TakeIds(const Tensor& from, const Tensor& source, const Tensor& ids) = 0;

  // A bf16 model's attention may take its fp32 products (MLA's absorbed W_k / W_v projections,
  // scores and P·V) on TF32 tensor cores: inputs rounded to a 10-bit mantissa, finer than the
  // model's bf16 weights, accumulated in fp32. Off (the default, and every fp32 model): exact
  // fp32. The CPU backend, the reference, is always exact. Set once, before any capture.
  // Concurrency inside a step: the ops `fn` issues may run beside those issued after Beside
  // returns, until JoinBeside(); ops issued after JoinBeside see everything fn's ops wrote. fn's
  // ops read only what was written before Beside and write memory that nothing else touches
  // before JoinBeside. One Beside at a time, joined before the step's end. A backend with one
  // queue runs fn in place (the CPU: the same ops in the same order, so the same values). rows:
  // the rows fn's ops work on (tokens); where they are many, the ops fill the device alone and
  // a backend may run fn in place (the CUDA backend above kBesideMaxRows).
  virtual void Beside(FunctionRef<void()> fn, int64_t /*rows*/) { fn(); }
  virtual void JoinBeside() {}
  // The rows (tokens) of the forward step about to be issued (the layer loop; an FFN role: its
  // step or expert pass), for launch choices that depend on the step's size (the CUDA backend:
  // programmatic dependent launch up to 64 rows). Per calling thread on the CUDA backend.
  // Captured graphs keep the choice made when they were captured.
  virtual void SetStepRows(int64_t /*rows*/) {}
  virtual void AllowTf32(bool /*on*/) {}
  // Forms forced for measurements (`afd bench decode --mla-splits / --mla-bufs`,
  // `backend_ops_test`), 0 each: the backend's own choice. The CUDA backend's MLA decode takes
  // them (splits 1..64, tile buffers 1..2, where they apply); others have no such forms.
  struct FormOverrides {
    int64_t mla_splits = 0;
    int64_t mla_bufs = 0;
  };
  virtual void SetFormOverrides(const FormOverrides& /*forms*/) {}

  // ---- Graphs and profiling (the CUDA backend; the CPU backend has neither) ---------------
  virtual bool SupportsGraphs() const { return false; }
  // Whether routed experts held as FP8 (ExpertWeights::fp8) of these sizes run here (the CPU
  // dequantizes them; the CUDA backend's FP8 form needs hidden and intermediate sizes that are
  // multiples of 32).
  virtual bool SupportsFp8Experts(int64_t /*hidden*/, int64_t /*inter*/) const { return false; }
  // Whether ops run after they are enqueued (a CUDA stream), so that the host may work while
  // they do; the CPU backend runs each op as it is called.
  virtual bool RunsAsynchronously() const { return false; }
  // The ops enqueued between BeginCapture and EndCapture are recorded into the returned graph,
  // not run. Nothing in between may wait for the device or read host memory at replay time:
  // no CopyToDevice, CopyToHost, Synchronize or sampled Sample. Throws afd::Error when
  // unsupported or when the capture failed.
  virtual void BeginCapture();
  virtual std::unique_ptr<OpGraph> EndCapture();
  // While on, each op's device time is recorded (CUDA events around it; off by default, and
  // not while capturing). TakeProfile waits for the device and returns the per-op totals since
  // the last TakeProfile, longest first, and clears them. `profiler_range`: the span is also the
  // range an external profiler sees (CUDA: cudaProfilerStart/Stop).
  virtual void SetProfiling(bool /*on*/, bool /*profiler_range*/ = true) {}
  virtual std::vector<OpTime> TakeProfile() { return {}; }
  // Kernel trace: while on, every kernel the device runs is recorded with its start and end
  // (CUDA: CUPTI's activity records, so kernels replayed from a CUDA graph too, with their
  // overlap under programmatic launches). SetKernelTrace(false) or TakeKernelTrace stops it;
  // TakeKernelTrace waits for the device and returns the spans since it was turned on, by start.
  // Throws afd::Error naming the cause where a backend cannot trace (the CPU: no kernels).
  virtual void SetKernelTrace(bool on);
  virtual std::vector<KernelSpan> TakeKernelTrace();
  // Device time of spans of enqueued work (not while capturing): BeginTimedSpan marks the
  // stream, EndTimedSpan marks it again; TakeTimedSeconds waits for the device and returns the
  // device time of every span since the last call, summed. A backend that runs each op as it is
  // called (the CPU) reads the host clock, which is then the same thing.
  virtual void BeginTimedSpan();
  virtual void EndTimedSpan();
  virtual double TakeTimedSeconds();

 protected:
  // StartCopyToHost's bookkeeping: a free slot (in [0, kMaxCopiesToHost)) for a new ticket,
  // returned in `slot` (throws afd::Error when every slot is taken)...
  int64_t OpenCopyTicket(int& slot);
  // ... the slot of an unfinished ticket (throws for an unknown or finished one), and the
  // slot's release once its copy is read.
  int CopySlot(int64_t ticket) const;
  void CloseCopySlot(int slot) { copy_tickets_[slot] = -1; }

 private:
  std::chrono::steady_clock::time_point span_begin_;
  double span_seconds_ = 0.0;
  int64_t next_copy_ticket_ = 0;
  std::vector<int64_t> copy_tickets_;              // by slot: its ticket, -1 when free
  std::vector<std::vector<char>> copies_to_host_;  // the base class's copies, by slot
};

// The backend of `device`: CpuBackend, or the CUDA backend in CUDA builds. Throws afd::Error
// when the device is not available in this build or on this machine.
std::unique_ptr<Backend> MakeBackend(Device device);

// log(sum(exp(logits))) of one row in host memory, as the CPU reference computes it (a host-side
// log-softmax then matches the CPU backend's LogSoftmaxAt bit for bit).
double HostLogSumExp(const float* logits, int64_t vocab);

}  // namespace afd::kernels
