// Wire layout of the asynchronous window connector (docs/wire_formats.md, "Async
// window connector"). Pure layout arithmetic and header checks: no I/O.
//
//   window = [ flag[num_regions x ring_depth] (u64) | slot(0,0) | slot(0,1) | ... ]
//   slot   = [ header | route table | routed rows | row scales | shared index | shared rows ]
//
// Every field starts 256-byte aligned. num_regions = max(A, F): both roles size their windows the
// same (symmetric). A sender writes only region = its own role rank, ring slot = the micro-batch
// stage; the flag of (region, ring) carries the sender's sequence number for that slot and is
// written after the payload. Dispatch (attention -> FFN) and combine (FFN -> attention) use the
// same slot layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace afd::connector {

inline constexpr uint32_t kSlotMagic = 0x47444641;  // "AFDG" little-endian
inline constexpr uint16_t kSlotVersion = 3;
inline constexpr size_t kSlotAlign = 256;

enum SlotFlags : uint16_t {
  kSlotCombine = 1u << 0,   // FFN -> attention (expert outputs); else attention -> FFN
  kSlotShutdown = 1u << 1,  // the sender sends nothing more; no payload
  kSlotPairs = 1u << 2,     // MoE: the reply carries per-(token, expert) outputs, not partial sums
  kSlotBf16Rows = 1u << 3,  // MoE dispatch: the token rows are bf16 (else f32)
  // MoE dispatch: sent by a CUDA graph replay of the sender's decode step (its shapes are a
  // graph bucket's), so the receiver may serve it from a graph of its own; never set by an
  // eager step (the P2P connector's explicit replay flag).
  kSlotGraph = 1u << 4,
  // MoE dispatch: the token rows are FP8 E4M3 with one f32 scale per group of 128 elements in
  // the row-scales field (connector_extra_config.dispatch_dtype "fp8"); never with kSlotBf16Rows.
  kSlotFp8Rows = 1u << 5,
};
inline constexpr uint16_t kKnownSlotFlags =
    kSlotCombine | kSlotShutdown | kSlotPairs | kSlotBf16Rows | kSlotGraph | kSlotFp8Rows;

// The fixed part of a slot header, followed by int32 expert_counts[num_experts].
struct SlotHeader {
  uint32_t magic;         // kSlotMagic
  uint16_t version;       // kSlotVersion
  uint16_t flags;         // SlotFlags
  int32_t sender;         // role rank of the sender (= the region it writes)
  int32_t layer;          // MoE layer
  int32_t stage;          // micro-batch stage (= the ring slot)
  int32_t num_tokens;     // tokens of the sender's micro-batch (dispatch; echoed in the combine)
  int32_t routed_rows;    // rows of the route table and of the routed rows
  int32_t shared_rows;    // rows of the shared index and of the shared rows
  int32_t num_experts;    // entries of expert_counts after the header
  int32_t table_entries;  // int32 entries of the index table (the route table)
  uint64_t seq;           // the sender's sequence number of this slot (equals the flag)
  uint64_t echo_seq;      // combine: seq of the dispatch it answers; dispatch: 0
};
static_assert(sizeof(SlotHeader) == 56, "SlotHeader is 56 bytes on the wire");
static_assert(offsetof(SlotHeader, seq) == 40 && offsetof(SlotHeader, echo_seq) == 48,
              "SlotHeader field offsets are part of the wire format");

// What one slot must hold.
struct SlotCapacity {
  int64_t token_cap = 0;          // tokens per micro-batch (max_num_batched_tokens)
  int64_t routed_cap = 0;         // routed rows per slot
  int64_t shared_cap = 0;         // shared rows per slot
  int64_t max_local_experts = 0;  // expert_counts entries
  size_t row_bytes = 0;           // bytes of one hidden row
  int64_t table_cap = 0;          // int32 entries of the index table (>= routed_cap)
  int64_t scale_cap = 0;          // f32 entries of the row scales (FP8 rows' group scales)
};

struct SlotLayout {
  SlotCapacity cap;
  int num_regions = 1;
  int ring_depth = 1;
  // Offsets within a slot.
  size_t header = 0, route = 0, routed = 0, row_scales = 0, shared_index = 0, shared = 0,
         slot_bytes = 0;
  size_t flags_bytes = 0;   // the flag array, padded to kSlotAlign
  size_t window_bytes = 0;  // flags + num_regions * ring_depth slots

  static SlotLayout Make(const SlotCapacity& cap, int num_regions, int ring_depth);
  size_t flag_offset(int region, int ring) const {
    return 8 * (static_cast<size_t>(region) * ring_depth + ring);
  }
  size_t slot_offset(int region, int ring) const {
    return flags_bytes + (static_cast<size_t>(region) * ring_depth + ring) * slot_bytes;
  }
};

// Checks a header read from region `region` whose flag said `seq`: magic, version, flags, sender,
// seq, counts within the capacities. `what` names the slot ("slot of attention rank 1 ...").
// Throws afd::Error naming the field and the slot.
// `what` (or the lazy form, called only to word an error) names the slot.
void ValidateSlotHeader(const SlotHeader& h, const SlotLayout& layout, int region, uint64_t seq,
                        const std::function<std::string()>& what);
void ValidateSlotHeader(const SlotHeader& h, const SlotLayout& layout, int region, uint64_t seq,
                        const std::string& what);

}  // namespace afd::connector
