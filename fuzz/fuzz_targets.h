// The entry points of the fuzz targets (one *_fuzz.cpp per parser wraps one of these) and of the
// regression test that replays the corpus seeds and every input a fuzzer ever crashed on
// (tests/fuzz_regressions/). Each function must return normally for any input: a rejected
// input throws afd::Error, caught here; anything else -- a crash, a sanitizer report, another
// exception type escaping -- is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "afd/comm/store_protocol.h"
#include "afd/comm/wire.h"
#include "afd/common/error.h"
#include "afd/config/afd_config.h"
#include "afd/connector/control_plane.h"
#include "afd/deploy/engine_wire.h"
#include "afd/model/checkpoint.h"
#include "afd/model/model_config.h"
#include "afd/model/safetensors.h"

namespace afd::fuzz {

inline std::string_view Text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The `afd` object of --additional-config; a config that parses must print and parse again.
inline void AfdConfigInput(const uint8_t* data, size_t size) {
  try {
    const AfdConfig c = ParseAfdConfig(Text(data, size));
    const AfdConfig again = ParseAfdConfig(AfdConfigToJson(c));
    if (AfdConfigToJson(again) != AfdConfigToJson(c)) __builtin_trap();
  } catch (const Error&) {
  }
}

// A model's config.json.
inline void ModelConfigInput(const uint8_t* data, size_t size) {
  try {
    model::ParseModelConfig(std::string(Text(data, size)), "fuzz/config.json");
  } catch (const Error&) {
  }
}

// A whole safetensors file image; every tensor it accepts is read end to end.
inline void SafetensorsInput(const uint8_t* data, size_t size) {
  try {
    const model::SafetensorsFile f =
        model::SafetensorsFile::Parse(data, size, "fuzz.safetensors", nullptr);
    uint8_t sum = 0;
    for (const auto& [name, t] : f.tensors()) {
      const uint8_t* p = static_cast<const uint8_t*>(t.data);
      if (t.num_bytes > 0) sum ^= p[0] ^ p[t.num_bytes - 1];
      if (t.numel() < 0 || (t.numel() == 0) != (t.num_bytes == 0)) __builtin_trap();
    }
    volatile uint8_t sink = sum;
    (void)sink;
  } catch (const Error&) {
  }
}

// model.safetensors.index.json: any shard name it accepts is a plain file name.
inline void SafetensorsIndexInput(const uint8_t* data, size_t size) {
  try {
    for (const auto& [tensor, shard] :
         model::ParseSafetensorsIndex(Text(data, size), "fuzz/model.safetensors.index.json")) {
      if (shard.find('/') != std::string::npos || shard == ".." || shard.empty()) __builtin_trap();
    }
  } catch (const Error&) {
  }
}

// The headers a peer sends: ControlHeader (24 bytes), MessageHeader (32), HelloHeader (16),
// then int64 token counts.
inline void WireHeadersInput(const uint8_t* data, size_t size) {
  auto take = [&](void* out, size_t n) {
    if (n == 0) return;  // memcpy/memset must not see a null pointer, even for 0 bytes
    std::memset(out, 0, n);
    std::memcpy(out, data, std::min(n, size));
    const size_t used = std::min(n, size);
    data += used;
    size -= used;
  };
  connector::ControlHeader control;
  comm::MessageHeader message;
  comm::HelloHeader hello;
  take(&control, sizeof(control));
  take(&message, sizeof(message));
  take(&hello, sizeof(hello));
  std::vector<int64_t> counts(size / 8);
  take(counts.data(), counts.size() * 8);
  try {
    connector::ValidateControlHeader(control, 1 + control.step % 300, 0);
  } catch (const Error&) {
  }
  try {
    comm::ValidateMessageHeader(message, {message.seq, 7, 1, 64}, "fuzz peer");
  } catch (const Error&) {
  }
  try {
    comm::ValidateHello(hello, comm::HashName("afd_subgroup_0"), 1, 8);
  } catch (const Error&) {
  }
  try {
    connector::ValidateTokenCounts(counts, 0);
  } catch (const Error&) {
  }
}

// Bytes a client sends to the store (first byte: whether the store has a secret and how the
// rest is chunked), and the client's side of the handshake on the same bytes.
inline void StoreProtocolInput(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const uint8_t mode = data[0];
  ++data;
  --size;
  const std::string nonce(comm::store_wire::kNonceBytes, 'n');
  std::optional<std::string> secret;
  if (mode & 1) secret = "fuzz-join-secret-0123456789";
  comm::store_wire::StoreData store;
  comm::store_wire::StoreSession session(store, secret, nonce);
  const size_t chunk = 1 + (mode >> 1);
  std::string in, out;
  try {
    for (size_t pos = 0; pos < size; pos += chunk) {
      in.append(reinterpret_cast<const char*>(data + pos), std::min(chunk, size - pos));
      session.Consume(in, out, 1u << 20);
      if (out.size() > (1u << 20)) out.clear();
    }
  } catch (const Error&) {
  }
  try {
    std::string server_nonce;
    comm::store_wire::AnswerChallenge(Text(data, size), secret, nonce, &server_nonce, "fuzz");
  } catch (const Error&) {
  }
  try {
    comm::store_wire::CheckAuthReply(Text(data, size), secret, nonce, nonce, "fuzz");
  } catch (const Error&) {
  }
  try {
    comm::store_wire::FrameLength(Text(data, size), comm::store_wire::kMaxBody);
  } catch (const Error&) {
  }
}

// A frame body of the engine channel (deploy/engine_wire.h), as a peer that has not yet
// authenticated may send one: a message that decodes must encode and decode to the same text.
inline void EngineMessageInput(const uint8_t* data, size_t size) {
  try {
    const deploy::EngineMessage m =
        deploy::DecodeEngineMessage(std::string(Text(data, size)), "fuzz");
    const std::string once = deploy::EncodeEngineMessage(m);
    const std::string twice =
        deploy::EncodeEngineMessage(deploy::DecodeEngineMessage(once, "fuzz (again)"));
    if (once != twice) __builtin_trap();
  } catch (const Error&) {
  }
}

}  // namespace afd::fuzz
