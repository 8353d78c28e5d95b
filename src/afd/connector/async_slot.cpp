#include "afd/connector/async_slot.h"

#include <algorithm>

#include "afd/common/error.h"

namespace afd::connector {

namespace {
size_t Align(size_t n) { return (n + kSlotAlign - 1) / kSlotAlign * kSlotAlign; }
}  // namespace

SlotLayout SlotLayout::Make(const SlotCapacity& cap, int num_regions, int ring_depth) {
  AFD_CHECK(cap.token_cap >= 1 && cap.routed_cap >= 0 && cap.shared_cap >= 0 &&
                cap.max_local_experts >= 0 && cap.row_bytes >= 1 &&
                cap.table_cap >= cap.routed_cap && cap.scale_cap >= 0,
            "slot layout: bad capacities (tokens {}, routed {}, shared {}, experts {}, row {} B)",
            cap.token_cap, cap.routed_cap, cap.shared_cap, cap.max_local_experts, cap.row_bytes);
  AFD_CHECK(num_regions >= 1 && ring_depth >= 1 && ring_depth <= 64,
            "slot layout: {} regions x ring depth {}", num_regions, ring_depth);
  SlotLayout l;
  l.cap = cap;
  l.num_regions = num_regions;
  l.ring_depth = ring_depth;
  size_t at = 0;
  l.header = at;
  at += Align(sizeof(SlotHeader) + 4 * static_cast<size_t>(cap.max_local_experts));
  l.route = at;
  at += Align(4 * static_cast<size_t>(cap.table_cap));
  l.routed = at;
  at += Align(cap.row_bytes * static_cast<size_t>(cap.routed_cap));
  l.row_scales = at;
  at += Align(4 * static_cast<size_t>(cap.scale_cap));
  l.shared_index = at;
  at += Align(4 * static_cast<size_t>(cap.shared_cap));
  l.shared = at;
  at += Align(cap.row_bytes * static_cast<size_t>(cap.shared_cap));
  l.slot_bytes = at;
  const size_t slots = static_cast<size_t>(num_regions) * ring_depth;
  l.flags_bytes = Align(8 * slots);
  l.window_bytes = l.flags_bytes + slots * l.slot_bytes;
  return l;
}

void ValidateSlotHeader(const SlotHeader& h, const SlotLayout& l, int region, uint64_t seq,
                        const std::function<std::string()>& what) {
  AFD_CHECK(h.magic == kSlotMagic, "{}: bad magic {:#x} (expected {:#x} \"AFDG\")", what(), h.magic,
            kSlotMagic);
  AFD_CHECK(h.version == kSlotVersion, "{}: version {}, this build speaks version {}", what(),
            h.version, kSlotVersion);
  AFD_CHECK((h.flags & ~kKnownSlotFlags) == 0, "{}: unknown flag bits {:#x}", what(), h.flags);
  if (h.flags & kSlotFp8Rows) {
    AFD_CHECK(!(h.flags & (kSlotBf16Rows | kSlotCombine)),
              "{}: flags {:#x} mark FP8 rows together with bf16 rows or a reply (FP8 rows are a "
              "dispatch's only)",
              what(), h.flags);
    AFD_CHECK(h.routed_rows <= l.cap.token_cap,
              "{}: {} FP8 rows exceed the row scales' capacity of {} rows", what(), h.routed_rows,
              l.cap.token_cap);
  }
  AFD_CHECK(h.table_entries >= 0 && h.table_entries <= l.cap.table_cap,
            "{}: {} index table entries exceed the capacity {}", what(), h.table_entries,
            l.cap.table_cap);
  AFD_CHECK(h.sender == region, "{}: the header names sender {} but region {} belongs to rank {}",
            what(), h.sender, region, region);
  AFD_CHECK(h.seq == seq,
            "{}: header seq {} does not match its flag {} (the payload is not the one signalled)",
            what(), h.seq, seq);
  AFD_CHECK(h.stage >= 0 && h.stage < l.ring_depth, "{}: stage {} outside the ring depth {}",
            what(), h.stage, l.ring_depth);
  AFD_CHECK(h.num_tokens >= 0 && h.num_tokens <= l.cap.token_cap,
            "{}: {} tokens exceed the token capacity {}", what(), h.num_tokens, l.cap.token_cap);
  AFD_CHECK(h.routed_rows >= 0 && h.routed_rows <= l.cap.routed_cap,
            "{}: {} routed rows exceed the routed capacity {}", what(), h.routed_rows,
            l.cap.routed_cap);
  AFD_CHECK(h.shared_rows >= 0 && h.shared_rows <= l.cap.shared_cap,
            "{}: {} shared rows exceed the shared capacity {}", what(), h.shared_rows,
            l.cap.shared_cap);
  AFD_CHECK(h.num_experts >= 0 && h.num_experts <= l.cap.max_local_experts,
            "{}: {} expert counts exceed {}", what(), h.num_experts, l.cap.max_local_experts);
  AFD_CHECK(h.layer >= 0, "{}: layer {}", what(), h.layer);
}

void ValidateSlotHeader(const SlotHeader& h, const SlotLayout& l, int region, uint64_t seq,
                        const std::string& what) {
  ValidateSlotHeader(h, l, region, seq, [&what] { return what; });
}

}  // namespace afd::connector
