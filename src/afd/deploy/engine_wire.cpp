#include "afd/deploy/engine_wire.h"

#include <poll.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <type_traits>

#include "afd/common/error.h"
#include "afd/common/sha256.h"

namespace afd::deploy {

using nlohmann::json;

FrameConnection::FrameConnection(comm::Socket socket, std::string peer)
    : socket_(std::move(socket)), peer_(std::move(peer)) {}

void FrameConnection::Send(const std::string& body, double timeout_s) {
  AFD_CHECK(body.size() <= kMaxEngineFrameBytes, "engine frame of {} bytes to {} exceeds {}",
            body.size(), peer_, kMaxEngineFrameBytes);
  const uint32_t n = static_cast<uint32_t>(body.size());
  unsigned char header[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                             static_cast<unsigned char>(n >> 16),
                             static_cast<unsigned char>(n >> 24)};
  std::lock_guard<std::mutex> lock(send_mu_);
  const Deadline deadline = Deadline::In(timeout_s);
  socket_.SendAll(header, 4, deadline, peer_);
  socket_.SendAll(body.data(), body.size(), deadline, peer_);
}

std::optional<std::string> FrameConnection::TakeFrame() {
  if (buffer_.size() < 4) return std::nullopt;
  const auto* b = reinterpret_cast<const unsigned char*>(buffer_.data());
  const uint32_t n = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  AFD_CHECK(n <= max_frame_bytes_, "{} sent an engine frame of {} bytes (at most {})", peer_, n,
            max_frame_bytes_);
  if (buffer_.size() < 4 + static_cast<size_t>(n)) return std::nullopt;
  std::string body = buffer_.substr(4, n);
  buffer_.erase(0, 4 + static_cast<size_t>(n));
  return body;
}

std::optional<std::string> FrameConnection::Poll(double timeout_s) {
  if (std::optional<std::string> f = TakeFrame()) return f;
  const Deadline deadline = Deadline::In(timeout_s);
  char chunk[65536];
  while (true) {
    const size_t got = socket_.RecvSome(chunk, sizeof(chunk), peer_);  // throws on EOF
    if (got > 0) {
      buffer_.append(chunk, got);
      if (std::optional<std::string> f = TakeFrame()) return f;
      continue;
    }
    if (deadline.expired()) return std::nullopt;
    pollfd p{socket_.fd(), POLLIN, 0};
    const int n = poll(&p, 1, deadline.remaining_ms());
    AFD_CHECK(n >= 0 || errno == EINTR, "poll on the connection to {}: {}", peer_,
              std::strerror(errno));
    if (n == 0) return std::nullopt;
  }
}

const std::vector<double>& RoundTripBounds() {
  static const std::vector<double> bounds = {1e-5, 2.5e-5, 5e-5,   1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
                                             5e-3, 1e-2,   2.5e-2, 5e-2, 0.1,    0.25, 0.5,  1.0};
  return bounds;
}

namespace {

// Checked reads of untrusted JSON (a frame may come from a peer that has not authenticated):
// nlohmann's get<int>() of 1e127 or of 2^40 would convert out of range, which is undefined.
template <typename T>
T Int(const json& v) {
  static_assert(std::is_integral_v<T>);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    AFD_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<T>::max()),
              "{} is out of range for its field", u);
    return static_cast<T>(u);
  }
  AFD_CHECK(v.is_number_integer(), "expected an integer, got {}", v.dump());
  const int64_t i = v.get<int64_t>();
  AFD_CHECK(i >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                (i < 0 ||
                 static_cast<uint64_t>(i) <= static_cast<uint64_t>(std::numeric_limits<T>::max())),
            "{} is out of range for its field", i);
  return static_cast<T>(i);
}
template <typename T>
std::vector<T> Ints(const json& v) {
  AFD_CHECK(v.is_array(), "expected a list of integers, got {}", v.dump());
  std::vector<T> out;
  out.reserve(v.size());
  for (const json& e : v) out.push_back(Int<T>(e));
  return out;
}
double Real(const json& v) {
  AFD_CHECK(v.is_number(), "expected a number, got {}", v.dump());
  return v.get<double>();
}
float Float(const json& v) {
  const double d = Real(v);
  AFD_CHECK(std::isfinite(d) && std::fabs(d) <= std::numeric_limits<float>::max(),
            "{} is out of range for a float field", d);
  return static_cast<float>(d);
}

json LogprobsJson(const std::vector<runtime::TokenLogprobs>& v) {
  json a = json::array();
  for (const auto& t : v) {
    json top = json::array();
    for (const auto& c : t.top) top.push_back({c.id, c.logprob});
    // NaN (the first prompt position) is not JSON: null.
    a.push_back({{"lp", std::isnan(t.logprob) ? json(nullptr) : json(t.logprob)}, {"top", top}});
  }
  return a;
}

std::vector<runtime::TokenLogprobs> LogprobsFrom(const json& a) {
  std::vector<runtime::TokenLogprobs> v;
  for (const auto& e : a) {
    runtime::TokenLogprobs t;
    t.logprob = e.at("lp").is_null() ? std::nanf("") : Float(e.at("lp"));
    for (const auto& c : e.at("top")) t.top.push_back({Int<int32_t>(c.at(0)), Float(c.at(1))});
    v.push_back(std::move(t));
  }
  return v;
}

// KV rows: their layout in the JSON, their bytes in the frame's attachment.
// Device rows (KvRows::device) are described in "device" and attach nothing.
json KvRowsJson(const runtime::KvRows& kv) {
  json j = {{"layers", kv.num_layers},
            {"width", kv.row_width},
            {"positions", kv.positions},
            {"dtype", static_cast<int>(kv.dtype)}};
  if (const std::optional<runtime::KvDeviceRows>& d = kv.device) {
    j["device"] = {{"handle", ToHex(d->ipc_handle)},
                   {"slots", d->num_slots},
                   {"block_size", d->block_size},
                   {"blocks", d->blocks}};
  }
  return j;
}

DType DTypeFrom(const json& v) {
  const int d = Int<int>(v);
  AFD_CHECK(d >= static_cast<int>(DType::kF32) && d <= static_cast<int>(DType::kU8),
            "dtype {} is not one of the wire's element types", d);
  return static_cast<DType>(d);
}

// The attachment's bytes as rows of the layout in `j`; they must be exactly that many.
std::shared_ptr<runtime::KvRows> KvRowsFrom(const json& j, std::string_view attachment) {
  auto kv = std::make_shared<runtime::KvRows>();
  kv->num_layers = Int<int64_t>(j.at("layers"));
  kv->row_width = Int<int64_t>(j.at("width"));
  kv->positions = Int<int64_t>(j.at("positions"));
  kv->dtype = DTypeFrom(j.at("dtype"));
  // Each factor below 2^31: their product (times the element size) fits 128 bits.
  constexpr int64_t kMaxDimension = int64_t{1} << 31;
  AFD_CHECK(kv->num_layers >= 0 && kv->num_layers < kMaxDimension && kv->row_width >= 0 &&
                kv->row_width < kMaxDimension && kv->positions >= 0 &&
                kv->positions < kMaxDimension,
            "KV rows of {} layers x {} positions x {} are out of range", kv->num_layers,
            kv->positions, kv->row_width);
  const unsigned __int128 want = static_cast<unsigned __int128>(kv->num_layers) *
                                 static_cast<unsigned __int128>(kv->positions) *
                                 static_cast<unsigned __int128>(kv->row_width) *
                                 DTypeSize(kv->dtype);
  if (j.contains("device")) {
    const json& d = j.at("device");
    runtime::KvDeviceRows& rows = kv->device.emplace();
    const std::optional<std::string> handle = FromHex(d.at("handle").get<std::string>());
    AFD_CHECK(handle && !handle->empty(), "device KV rows with a malformed handle");
    rows.ipc_handle = *handle;
    rows.num_slots = Int<int64_t>(d.at("slots"));
    rows.block_size = Int<int64_t>(d.at("block_size"));
    rows.blocks = Ints<int32_t>(d.at("blocks"));
    AFD_CHECK(attachment.empty(), "device KV rows with {} bytes attached", attachment.size());
    return kv;
  }
  AFD_CHECK(want == attachment.size(),
            "KV rows of {} layers x {} positions x {} {} need {} bytes, the frame carries {}",
            kv->num_layers, kv->positions, kv->row_width, DTypeName(kv->dtype),
            static_cast<uint64_t>(want), attachment.size());
  kv->bytes.assign(attachment.begin(), attachment.end());
  return kv;
}

}  // namespace

const char* EngineMessageKindName(EngineMessage::Kind k) {
  switch (k) {
    case EngineMessage::Kind::kSubmit:
      return "submit";
    case EngineMessage::Kind::kAbort:
      return "abort";
    case EngineMessage::Kind::kShutdown:
      return "shutdown";
    case EngineMessage::Kind::kHello:
      return "hello";
    case EngineMessage::Kind::kStep:
      return "step";
    case EngineMessage::Kind::kChallenge:
      return "challenge";
    case EngineMessage::Kind::kRefused:
      return "refused";
    case EngineMessage::Kind::kExportKv:
      return "export_kv";
    case EngineMessage::Kind::kReleaseKv:
      return "release_kv";
    case EngineMessage::Kind::kKvRows:
      return "kv_rows";
  }
  return "?";
}

std::string EngineHelloProof(const std::optional<std::string>& secret, const std::string& nonce,
                             int dp_rank) {
  if (!secret) return "";
  const Digest mac =
      HmacSha256(*secret, "afd engine hello|" + nonce + "|" + std::to_string(dp_rank));
  return ToHex(AsBytes(mac));
}

std::string EncodeEngineMessage(const EngineMessage& m) {
  json j = {{"kind", EngineMessageKindName(m.kind)}};
  const runtime::KvRows* attach = nullptr;
  switch (m.kind) {
    case EngineMessage::Kind::kSubmit: {
      const runtime::RequestParams& p = m.params;
      j["id"] = m.id;
      j["prompt"] = p.prompt;
      j["max_tokens"] = p.max_tokens;
      j["temperature"] = p.sampling.temperature;
      j["top_k"] = p.sampling.top_k;
      j["top_p"] = p.sampling.top_p;
      j["seed"] = p.sampling.seed;
      j["stream"] = p.sampler_stream;
      j["stop_token_ids"] = p.stop_token_ids;
      j["ignore_eos"] = p.ignore_eos;
      j["logprobs"] = p.logprobs;
      j["prompt_logprobs"] = p.prompt_logprobs;
      if (p.hold_kv_s > 0) j["hold_kv_s"] = p.hold_kv_s;
      if (p.hold_kv_on_device) j["hold_kv_on_device"] = true;
      if (p.imported_kv) {
        j["kv"] = KvRowsJson(*p.imported_kv);
        if (!p.imported_kv->device) attach = p.imported_kv.get();
      }
      break;
    }
    case EngineMessage::Kind::kExportKv:
      j["id"] = m.id;
      if (m.device_ok) j["device_ok"] = true;
      break;
    case EngineMessage::Kind::kAbort:
    case EngineMessage::Kind::kReleaseKv:
      j["id"] = m.id;
      break;
    case EngineMessage::Kind::kKvRows:
      j["id"] = m.id;
      if (m.kv) {
        j["kv"] = KvRowsJson(*m.kv);
        if (!m.kv->device) attach = m.kv.get();
      } else {
        j["why"] = m.why;
      }
      break;
    case EngineMessage::Kind::kShutdown:
      break;
    case EngineMessage::Kind::kChallenge:
      j["nonce"] = m.challenge.nonce;
      j["secret"] = m.challenge.secret;
      break;
    case EngineMessage::Kind::kRefused:
      j["why"] = m.why;
      break;
    case EngineMessage::Kind::kHello:
      j["dp_rank"] = m.hello.dp_rank;
      j["proof"] = m.hello.proof;
      j["vocab_size"] = m.hello.vocab_size;
      j["max_model_len"] = m.hello.max_model_len;
      j["eos_token_ids"] = m.hello.eos_token_ids;
      j["kv_blocks"] = m.hello.kv_blocks;
      j["kv_layout"] = {{"model", m.hello.kv_layout.model},
                        {"layers", m.hello.kv_layout.num_layers},
                        {"width", m.hello.kv_layout.row_width},
                        {"dtype", static_cast<int>(m.hello.kv_layout.dtype)}};
      break;
    case EngineMessage::Kind::kStep: {
      json outs = json::array();
      for (const runtime::RequestOutput& o : m.outputs) {
        json e = {{"id", o.request_id},
                  {"ids", o.token_ids},
                  {"n_prompt", o.num_prompt_tokens},
                  {"finished", o.finished},
                  {"reason", static_cast<int>(o.finish_reason)},
                  {"stop_id", o.stop_token_id}};
        if (!o.logprobs.empty()) e["lps"] = LogprobsJson(o.logprobs);
        if (!o.prompt_logprobs.empty()) e["prompt_lps"] = LogprobsJson(o.prompt_logprobs);
        if (!o.error.empty()) e["error"] = o.error;
        if (o.rejected) e["rejected"] = true;
        if (o.kv_held) e["kv_held"] = {{"positions", o.kv_positions}, {"blocks", o.kv_block_ids}};
        if (o.kv_imported) e["kv_imported"] = true;
        outs.push_back(std::move(e));
      }
      j["outputs"] = std::move(outs);
      const runtime::EngineStats& s = m.stats;
      j["stats"] = {s.num_running,     s.num_waiting,     s.kv_blocks_used,
                    s.kv_blocks_total, s.num_preemptions, s.steps};
      j["rt"] = {{"counts", m.round_trips.bucket_counts},
                 {"sum", m.round_trips.sum_s},
                 {"n", m.round_trips.count}};
      break;
    }
  }
  std::string body = j.dump();  // JSON text holds no NUL: the attachment follows one
  if (attach != nullptr) {
    AFD_CHECK(static_cast<int64_t>(attach->bytes.size()) == attach->expected_bytes(),
              "KV rows of {} bytes for {} positions x {} layers (expected {})",
              attach->bytes.size(), attach->positions, attach->num_layers,
              attach->expected_bytes());
    body.reserve(body.size() + 1 + attach->bytes.size());
    body.push_back('\0');
    body.append(attach->bytes.data(), attach->bytes.size());
  }
  return body;
}

EngineMessage DecodeEngineMessage(const std::string& body, const std::string& from) {
  EngineMessage m;
  try {
    const size_t nul = body.find('\0');
    const std::string_view text =
        nul == std::string::npos ? std::string_view(body) : std::string_view(body).substr(0, nul);
    const std::string_view attachment =
        nul == std::string::npos ? std::string_view() : std::string_view(body).substr(nul + 1);
    const json j = json::parse(text);
    bool attached = false;  // the attachment was read as KV rows
    const std::string kind = j.at("kind").get<std::string>();
    if (kind == "submit") {
      m.kind = EngineMessage::Kind::kSubmit;
      m.id = Int<uint64_t>(j.at("id"));
      runtime::RequestParams& p = m.params;
      p.prompt = Ints<int32_t>(j.at("prompt"));
      p.max_tokens = Int<int64_t>(j.at("max_tokens"));
      p.sampling.temperature = Float(j.at("temperature"));
      p.sampling.top_k = Int<int64_t>(j.at("top_k"));
      p.sampling.top_p = Float(j.at("top_p"));
      p.sampling.seed = Int<uint64_t>(j.at("seed"));
      p.sampler_stream = Int<int64_t>(j.at("stream"));
      p.stop_token_ids = Ints<int32_t>(j.at("stop_token_ids"));
      p.ignore_eos = j.at("ignore_eos").get<bool>();
      p.logprobs = Int<int32_t>(j.at("logprobs"));
      p.prompt_logprobs = Int<int32_t>(j.at("prompt_logprobs"));
      if (j.contains("hold_kv_s")) p.hold_kv_s = Real(j.at("hold_kv_s"));
      if (j.contains("hold_kv_on_device"))
        p.hold_kv_on_device = j.at("hold_kv_on_device").get<bool>();
      if (j.contains("kv")) {
        p.imported_kv = KvRowsFrom(j.at("kv"), attachment);
        attached = !p.imported_kv->device;
      }
    } else if (kind == "abort") {
      m.kind = EngineMessage::Kind::kAbort;
      m.id = Int<uint64_t>(j.at("id"));
    } else if (kind == "export_kv") {
      m.kind = EngineMessage::Kind::kExportKv;
      m.id = Int<uint64_t>(j.at("id"));
      m.device_ok = j.value("device_ok", false);
    } else if (kind == "release_kv") {
      m.kind = EngineMessage::Kind::kReleaseKv;
      m.id = Int<uint64_t>(j.at("id"));
    } else if (kind == "kv_rows") {
      m.kind = EngineMessage::Kind::kKvRows;
      m.id = Int<uint64_t>(j.at("id"));
      if (j.contains("kv")) {
        m.kv = KvRowsFrom(j.at("kv"), attachment);
        attached = !m.kv->device;
      } else {
        m.why = j.at("why").get<std::string>();
      }
    } else if (kind == "shutdown") {
      m.kind = EngineMessage::Kind::kShutdown;
    } else if (kind == "challenge") {
      m.kind = EngineMessage::Kind::kChallenge;
      m.challenge.nonce = j.at("nonce").get<std::string>();
      m.challenge.secret = j.at("secret").get<bool>();
    } else if (kind == "refused") {
      m.kind = EngineMessage::Kind::kRefused;
      m.why = j.at("why").get<std::string>();
    } else if (kind == "hello") {
      m.kind = EngineMessage::Kind::kHello;
      m.hello.dp_rank = Int<int>(j.at("dp_rank"));
      m.hello.proof = j.value("proof", "");
      m.hello.vocab_size = Int<int64_t>(j.at("vocab_size"));
      m.hello.max_model_len = Int<int64_t>(j.at("max_model_len"));
      m.hello.eos_token_ids = Ints<int32_t>(j.at("eos_token_ids"));
      m.hello.kv_blocks = Int<int64_t>(j.at("kv_blocks"));
      const json& layout = j.at("kv_layout");
      m.hello.kv_layout.model = layout.at("model").get<std::string>();
      m.hello.kv_layout.num_layers = Int<int64_t>(layout.at("layers"));
      m.hello.kv_layout.row_width = Int<int64_t>(layout.at("width"));
      m.hello.kv_layout.dtype = DTypeFrom(layout.at("dtype"));
    } else if (kind == "step") {
      m.kind = EngineMessage::Kind::kStep;
      for (const json& e : j.at("outputs")) {
        runtime::RequestOutput o;
        o.request_id = Int<uint64_t>(e.at("id"));
        o.token_ids = Ints<int32_t>(e.at("ids"));
        o.num_prompt_tokens = Int<int64_t>(e.at("n_prompt"));
        o.finished = e.at("finished").get<bool>();
        const int reason = Int<int>(e.at("reason"));
        AFD_CHECK(reason >= 0 && reason <= static_cast<int>(runtime::FinishReason::kError),
                  "finish reason {} out of range", reason);
        o.finish_reason = static_cast<runtime::FinishReason>(reason);
        o.stop_token_id = Int<int32_t>(e.at("stop_id"));
        if (e.contains("lps")) o.logprobs = LogprobsFrom(e["lps"]);
        if (e.contains("prompt_lps")) o.prompt_logprobs = LogprobsFrom(e["prompt_lps"]);
        if (e.contains("error")) o.error = e["error"].get<std::string>();
        o.rejected = e.value("rejected", false);
        o.kv_imported = e.value("kv_imported", false);
        if (e.contains("kv_held")) {
          o.kv_held = true;
          o.kv_positions = Int<int64_t>(e["kv_held"].at("positions"));
          o.kv_block_ids = Ints<int32_t>(e["kv_held"].at("blocks"));
        }
        m.outputs.push_back(std::move(o));
      }
      const auto s = Ints<int64_t>(j.at("stats"));
      AFD_CHECK(s.size() == 6, "stats has {} fields, expected 6", s.size());
      m.stats = {s[0], s[1], s[2], s[3], s[4], s[5]};
      m.round_trips.bucket_counts = Ints<int64_t>(j.at("rt").at("counts"));
      m.round_trips.sum_s = Real(j.at("rt").at("sum"));
      m.round_trips.count = Int<int64_t>(j.at("rt").at("n"));
    } else {
      AFD_THROW("unknown message kind \"{}\"", kind);
    }
    AFD_CHECK(attached || nul == std::string::npos,
              "a {} message with {} bytes attached that it does not use", kind, attachment.size());
  } catch (const json::exception& e) {
    AFD_THROW("malformed engine message from {}: {}", from, e.what());
  } catch (const Error& e) {
    AFD_THROW("malformed engine message from {}: {}", from, e.what());
  }
  return m;
}

}  // namespace afd::deploy
