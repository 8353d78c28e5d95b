#include "afd/text/tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

#include "afd/common/error.h"
#include "afd/text/tokenizer/regex.h"
#include "afd/text/tokenizer/utf8.h"

namespace afd::text {

namespace {

bool IsAscii(const std::string& s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(int options) : options_(options) {}
  std::string Normalize(const std::string& text) const override {
    if (IsAscii(text)) return text;  // every normalization form leaves ASCII unchanged
    utf8proc_uint8_t* out = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                static_cast<utf8proc_ssize_t>(text.size()), &out,
                                static_cast<utf8proc_option_t>(options_));
    AFD_CHECK(n >= 0, "unicode normalization failed: {}", utf8proc_errmsg(n));
    std::string result(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    std::free(out);
    return result;
  }

 private:
  int options_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  std::string Normalize(const std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t pos = 0, len; pos < text.size(); pos += len) {
      const char32_t cp = DecodeUtf8(text, pos, &len);
      if (cp == 0x130) {  // the one unconditional multi-character lowercase mapping
        out += "i\xCC\x87";
        continue;
      }
      AppendUtf8(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))), &out);
    }
    return out;
  }
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(const std::string& regex, std::string content, const std::string& where)
      : regex_(regex, where), content_(std::move(content)) {}
  std::string Normalize(const std::string& text) const override {
    std::string out;
    size_t prev = 0;
    for (const auto& [b, e] : regex_.FindAll(text)) {
      out.append(text, prev, b - prev);
      out += content_;
      prev = e;
    }
    out.append(text, prev, std::string::npos);
    return out;
  }

 private:
  Regex regex_;
  std::string content_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  std::string Normalize(const std::string& text) const override {
    return text.empty() ? text : prepend_ + text;
  }

 private:
  std::string prepend_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string Normalize(const std::string& text) const override {
    const std::vector<char32_t> cps = ToCodePoints(text);
    size_t b = 0, e = cps.size();
    if (left_) {
      while (b < e && IsWhitespace(cps[b])) ++b;
    }
    if (right_) {
      while (e > b && IsWhitespace(cps[e - 1])) --e;
    }
    std::string out;
    for (size_t i = b; i < e; ++i) AppendUtf8(cps[i], &out);
    return out;
  }

 private:
  bool left_, right_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  std::string Normalize(const std::string& text) const override {
    std::string s = text;
    for (const auto& n : parts_) s = n->Normalize(s);
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::string PatternToRegex(const nlohmann::json& pattern, const std::string& where) {
  AFD_CHECK(pattern.is_object() && pattern.size() == 1,
            "{}.pattern: expected {{\"String\": ...}} or {{\"Regex\": ...}}", where);
  if (pattern.contains("String")) return Regex::Escape(pattern["String"].get<std::string>());
  if (pattern.contains("Regex")) return pattern["Regex"].get<std::string>();
  AFD_THROW("{}.pattern: expected {{\"String\": ...}} or {{\"Regex\": ...}}", where);
}

std::unique_ptr<Normalizer> MakeNormalizer(const nlohmann::json& config, const std::string& where) {
  if (config.is_null()) return nullptr;
  AFD_CHECK(config.is_object() && config.contains("type"), "{}: expected an object with a type",
            where);
  const std::string type = config["type"].get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    const auto& list = config.at("normalizers");
    for (size_t i = 0; i < list.size(); ++i) {
      parts.push_back(MakeNormalizer(list[i], fmt::format("{}.normalizers[{}]", where, i)));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  if (type == "NFD") {
    return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  }
  if (type == "NFKC") {
    return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE |
                                               UTF8PROC_COMPAT);
  }
  if (type == "NFKD") {
    return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE |
                                               UTF8PROC_COMPAT);
  }
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(PatternToRegex(config.at("pattern"), where),
                                               config.at("content").get<std::string>(), where);
  }
  if (type == "Prepend") {
    return std::make_unique<PrependNormalizer>(config.at("prepend").get<std::string>());
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(config.value("strip_left", true),
                                             config.value("strip_right", true));
  }
  AFD_THROW("{}: unsupported normalizer type \"{}\"", where, type);
}

}  // namespace afd::text
