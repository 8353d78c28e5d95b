#include "afd/deploy/engine_wire.h"

#include <poll.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
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

const char* KindName(EngineMessage::Kind k) {
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
  }
  return "?";
}

}  // namespace

std::string EngineHelloProof(const std::optional<std::string>& secret, const std::string& nonce,
                             int dp_rank) {
  if (!secret) return "";
  const Digest mac =
      HmacSha256(*secret, "afd engine hello|" + nonce + "|" + std::to_string(dp_rank));
  return ToHex(AsBytes(mac));
}

std::string EncodeEngineMessage(const EngineMessage& m) {
  json j = {{"kind", KindName(m.kind)}};
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
      break;
    }
    case EngineMessage::Kind::kAbort:
      j["id"] = m.id;
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
  return j.dump();
}

EngineMessage DecodeEngineMessage(const std::string& body, const std::string& from) {
  EngineMessage m;
  try {
    const json j = json::parse(body);
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
    } else if (kind == "abort") {
      m.kind = EngineMessage::Kind::kAbort;
      m.id = Int<uint64_t>(j.at("id"));
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
  } catch (const json::exception& e) {
    AFD_THROW("malformed engine message from {}: {}", from, e.what());
  } catch (const Error& e) {
    AFD_THROW("malformed engine message from {}: {}", from, e.what());
  }
  return m;
}

}  // namespace afd::deploy
