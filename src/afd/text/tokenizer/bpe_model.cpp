#include "afd/text/tokenizer/bpe_model.h"

#include <queue>

#include "afd/common/error.h"
#include "afd/common/thread_annotations.h"
#include "afd/text/tokenizer/utf8.h"

namespace afd::text {

namespace {

std::string OptionalString(const nlohmann::json& config, const char* key) {
  if (!config.contains(key) || config[key].is_null()) return "";
  return config[key].get<std::string>();
}

}  // namespace

BpeModel::BpeModel(const nlohmann::json& config, const std::string& where) {
  AFD_CHECK(config.contains("vocab") && config["vocab"].is_object(),
            "{}.vocab: expected an object of token -> id", where);
  if (config.contains("dropout") && !config["dropout"].is_null()) {
    AFD_CHECK(config["dropout"].get<double>() == 0.0,
              "{}.dropout: BPE dropout is not supported (inference must be deterministic)", where);
  }
  vocab_.reserve(config["vocab"].size());
  uint32_t max_id = 0;
  for (const auto& [token, id] : config["vocab"].items()) {
    AFD_CHECK(id.is_number_unsigned(), "{}.vocab[\"{}\"]: expected a non-negative id", where,
              token);
    const auto v = id.get<uint32_t>();
    vocab_.emplace(token, v);
    max_id = std::max(max_id, v);
  }
  id_to_token_.resize(vocab_.empty() ? 0 : max_id + 1);
  has_id_.resize(id_to_token_.size());
  for (const auto& [token, id] : vocab_) {
    id_to_token_[id] = token;
    has_id_[id] = true;
  }
  if (config.contains("unk_token") && !config["unk_token"].is_null()) {
    unk_token_ = config["unk_token"].get<std::string>();
  }
  continuing_subword_prefix_ = OptionalString(config, "continuing_subword_prefix");
  end_of_word_suffix_ = OptionalString(config, "end_of_word_suffix");
  fuse_unk_ = config.value("fuse_unk", false);
  byte_fallback_ = config.value("byte_fallback", false);
  ignore_merges_ = config.value("ignore_merges", false);

  const auto& merges = config.contains("merges") ? config["merges"] : nlohmann::json::array();
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& m = merges[rank];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      AFD_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
                "{}.merges[{}]: \"{}\" is not two tokens separated by one space", where, rank, s);
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else {
      AFD_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                "{}.merges[{}]: expected \"a b\" or [\"a\", \"b\"]", where, rank);
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    const auto ia = vocab_.find(a), ib = vocab_.find(b);
    AFD_CHECK(ia != vocab_.end() && ib != vocab_.end(), "{}.merges[{}]: token \"{}\" not in vocab",
              where, rank, ia == vocab_.end() ? a : b);
    const size_t prefix_len = continuing_subword_prefix_.size();
    const std::string merged =
        a + (b.compare(0, prefix_len, continuing_subword_prefix_) == 0 ? b.substr(prefix_len) : b);
    const auto im = vocab_.find(merged);
    AFD_CHECK(im != vocab_.end(), "{}.merges[{}]: merged token \"{}\" not in vocab", where, rank,
              merged);
    merges_.emplace(PairKey(ia->second, ib->second),
                    Merge{static_cast<uint32_t>(rank), im->second});
  }
  if (unk_token_) {
    AFD_CHECK(vocab_.count(*unk_token_), "{}.unk_token: \"{}\" not in vocab", where, *unk_token_);
  }
}

std::optional<uint32_t> BpeModel::TokenToId(std::string_view token) const {
  const auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(uint32_t id) const {
  if (id >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::Symbols(std::string_view word, std::vector<uint32_t>* ids,
                       std::vector<uint32_t>* lens) const {
  std::optional<std::pair<uint32_t, uint32_t>> unk;  // (id, byte length) pending
  std::string s;
  for (size_t pos = 0, len; pos < word.size(); pos += len) {
    DecodeUtf8(word, pos, &len);
    s.clear();
    if (pos > 0) s += continuing_subword_prefix_;
    s.append(word.substr(pos, len));
    if (pos + len >= word.size()) s += end_of_word_suffix_;
    const auto it = vocab_.find(s);
    if (it != vocab_.end()) {
      if (unk) {
        ids->push_back(unk->first);
        lens->push_back(unk->second);
        unk.reset();
      }
      ids->push_back(it->second);
      lens->push_back(static_cast<uint32_t>(len));
      continue;
    }
    if (byte_fallback_) {
      std::vector<uint32_t> bytes;
      for (unsigned char c : s) {
        const auto ib = vocab_.find(fmt::format("<0x{:02X}>", c));
        if (ib == vocab_.end()) break;
        bytes.push_back(ib->second);
      }
      if (bytes.size() == s.size()) {
        for (uint32_t id : bytes) {
          ids->push_back(id);
          lens->push_back(1);
        }
        continue;
      }
    }
    if (unk_token_) {
      const uint32_t unk_id = vocab_.at(*unk_token_);
      if (unk && fuse_unk_) {
        unk->second += static_cast<uint32_t>(len);
      } else {
        if (unk) {
          ids->push_back(unk->first);
          lens->push_back(unk->second);
        }
        unk = {unk_id, static_cast<uint32_t>(len)};
      }
    }
  }
  if (unk) {
    ids->push_back(unk->first);
    lens->push_back(unk->second);
  }
}

void BpeModel::MergeWord(std::string_view word, std::vector<uint32_t>* out) const {
  std::vector<uint32_t> ids, lens;
  Symbols(word, &ids, &lens);
  const int n = static_cast<int>(ids.size());
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    uint32_t rank;
    int pos;
    uint32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    const auto it = merges_.find(PairKey(ids[pos], ids[next[pos]]));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const int pos = top.pos;
    if (!alive[pos] || next[pos] < 0) continue;
    const int right = next[pos];
    const auto it = merges_.find(PairKey(ids[pos], ids[right]));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // stale
    ids[pos] = top.new_id;
    alive[right] = false;
    next[pos] = next[right];
    if (next[pos] >= 0) prev[next[pos]] = pos;
    push(prev[pos]);
    push(pos);
  }
  for (int i = 0; i < n; ++i) {
    if (alive[i]) out->push_back(ids[i]);
  }
}

void BpeModel::Tokenize(std::string_view piece, std::vector<uint32_t>* ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    const auto it = vocab_.find(std::string(piece));
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedWordBytes;
  std::string key;
  if (cacheable) {
    key.assign(piece);
    MutexLock lock(cache_mu_);
    const auto it = cache_.find(key);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids->size();
  MergeWord(piece, ids);
  if (cacheable) {
    MutexLock lock(cache_mu_);
    if (cache_.size() < kCacheCapacity) {
      cache_.emplace(std::move(key), std::vector<uint32_t>(ids->begin() + first, ids->end()));
    }
  }
}

}  // namespace afd::text
