#include "afd/text/tokenizer/pre_tokenizer.h"

#include <functional>

#include "afd/common/error.h"
#include "afd/text/tokenizer/byte_level.h"
#include "afd/text/tokenizer/normalizer.h"
#include "afd/text/tokenizer/regex.h"
#include "afd/text/tokenizer/split.h"
#include "afd/text/tokenizer/utf8.h"

namespace afd::text {

namespace {

using Ranges = std::vector<std::pair<size_t, size_t>>;

// Replaces each piece by the ranges `split` returns for its text.
void SplitPieces(std::vector<Piece>* pieces,
                 const std::function<Ranges(const std::string&)>& split) {
  std::vector<Piece> out;
  out.reserve(pieces->size());
  for (Piece& p : *pieces) {
    for (const auto& [b, e] : split(p.text)) {
      out.push_back({p.text.substr(b, e - b), p.at_start && b == 0});
    }
  }
  *pieces = std::move(out);
}

// Matches: every character for which `pred` holds, one match per character.
Ranges CharMatches(const std::string& s, bool (*pred)(char32_t)) {
  Ranges matches;
  for (size_t pos = 0, len; pos < s.size(); pos += len) {
    if (pred(DecodeUtf8(s, pos, &len))) matches.emplace_back(pos, pos + len);
  }
  return matches;
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(const std::string& regex, SplitBehavior behavior, bool invert,
                    const std::string& where)
      : regex_(regex, where), behavior_(behavior), invert_(invert) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    SplitPieces(pieces, [&](const std::string& s) {
      return ApplySplitBehavior(SegmentsFromMatches(regex_.FindAll(s), s.size(), invert_),
                                behavior_);
    });
  }

 private:
  Regex regex_;
  SplitBehavior behavior_;
  bool invert_;
};

// GPT-2's pattern, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = std::make_unique<Regex>(kGpt2Pattern, where);
  }
  void PreTokenize(std::vector<Piece>* pieces) const override {
    if (add_prefix_space_) {
      for (Piece& p : *pieces) {
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(p.text.begin(), ' ');
      }
    }
    if (regex_) {
      SplitPieces(pieces, [&](const std::string& s) {
        return ApplySplitBehavior(SegmentsFromMatches(regex_->FindAll(s), s.size(), false),
                                  SplitBehavior::kIsolated);
      });
    }
    for (Piece& p : *pieces) p.text = BytesToUnicode(p.text);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class DigitsPreTokenizer : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    SplitPieces(pieces, [&](const std::string& s) {
      return ApplySplitBehavior(
          SegmentsFromMatches(CharMatches(s, IsNumeric), s.size(), false),
          individual_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
    });
  }

 private:
  bool individual_;
};

// Whitespace keeps the matches of \w+|[^\w\s]+ with Oniguruma's Unicode \w (Alphabetic, marks,
// decimal digits, connector punctuation and the join controls ZWNJ/ZWJ).
class WhitespacePreTokenizer : public PreTokenizer {
 public:
  explicit WhitespacePreTokenizer(const std::string& where)
      : regex_(
            R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}]+|[^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}\s]+)",
            where) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    SplitPieces(pieces, [&](const std::string& s) {
      return ApplySplitBehavior(SegmentsFromMatches(regex_.FindAll(s), s.size(), true),
                                SplitBehavior::kRemoved);
    });
  }

 private:
  Regex regex_;
};

class WhitespaceSplitPreTokenizer : public PreTokenizer {
 public:
  void PreTokenize(std::vector<Piece>* pieces) const override {
    SplitPieces(pieces, [&](const std::string& s) {
      return ApplySplitBehavior(SegmentsFromMatches(CharMatches(s, IsWhitespace), s.size(), false),
                                SplitBehavior::kRemoved);
    });
  }
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    for (Piece& p : *pieces) {
      std::string t;
      for (char c : p.text) {
        if (c == ' ') {
          t += replacement_;
        } else {
          t += c;
        }
      }
      const bool starts = t.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts &&
          (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && p.at_start))) {
        t.insert(0, replacement_);
      }
      p.text = std::move(t);
    }
    if (!split_) return;
    SplitPieces(pieces, [&](const std::string& s) {
      Ranges matches;
      for (size_t pos = s.find(replacement_); pos != std::string::npos;
           pos = s.find(replacement_, pos + replacement_.size())) {
        matches.emplace_back(pos, pos + replacement_.size());
      }
      return ApplySplitBehavior(SegmentsFromMatches(matches, s.size(), false),
                                SplitBehavior::kMergedWithNext);
    });
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    for (const auto& p : parts_) p->PreTokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

PrependScheme ParsePrependScheme(const nlohmann::json& config, const std::string& where) {
  if (config.contains("prepend_scheme")) {
    const std::string s = config["prepend_scheme"].get<std::string>();
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    AFD_THROW("{}.prepend_scheme: unknown value \"{}\"", where, s);
  }
  return config.value("add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

}  // namespace

std::unique_ptr<PreTokenizer> MakePreTokenizer(const nlohmann::json& config,
                                               const std::string& where) {
  if (config.is_null()) return nullptr;
  AFD_CHECK(config.is_object() && config.contains("type"), "{}: expected an object with a type",
            where);
  const std::string type = config["type"].get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    const auto& list = config.at("pretokenizers");
    for (size_t i = 0; i < list.size(); ++i) {
      parts.push_back(MakePreTokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i)));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(
        PatternToRegex(config.at("pattern"), where),
        ParseSplitBehavior(config.at("behavior").get<std::string>(), where + ".behavior"),
        config.value("invert", false), where);
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(config.value("add_prefix_space", true),
                                                   config.value("use_regex", true), where);
  }
  if (type == "Digits") {
    return std::make_unique<DigitsPreTokenizer>(config.value("individual_digits", false));
  }
  if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>(where);
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplitPreTokenizer>();
  if (type == "Metaspace") {
    return std::make_unique<MetaspacePreTokenizer>(config.value("replacement", "\xE2\x96\x81"),
                                                   ParsePrependScheme(config, where),
                                                   config.value("split", true));
  }
  AFD_THROW("{}: unsupported pre-tokenizer type \"{}\"", where, type);
}

}  // namespace afd::text
