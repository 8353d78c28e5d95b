#include "afd/text/tokenizer/decoder.h"

#include <cctype>

#include "afd/common/error.h"
#include "afd/text/tokenizer/byte_level.h"
#include "afd/text/tokenizer/normalizer.h"
#include "afd/text/tokenizer/regex.h"
#include "afd/text/tokenizer/utf8.h"

namespace afd::text {

namespace {

class ByteLevelDecoder : public Decoder {
 public:
  std::vector<std::string> DecodeChain(std::vector<std::string> tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t mark = bytes.size();
      if (!UnicodeToBytes(t, &bytes)) {  // a token outside the byte map is taken as it is
        bytes.resize(mark);
        bytes += t;
      }
    }
    return {Utf8Lossy(bytes)};
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool prepend)
      : replacement_(std::move(replacement)), prepend_(prepend) {}
  std::vector<std::string> DecodeChain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t pos = 0; pos < t.size();) {
        if (!replacement_.empty() && t.compare(pos, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && prepend_)) out += ' ';
          pos += replacement_.size();
        } else {
          out += t[pos++];
        }
      }
      tokens[i] = std::move(out);
    }
    return tokens;
  }

 private:
  std::string replacement_;
  bool prepend_;
};

class ByteFallbackDecoder : public Decoder {
 public:
  std::vector<std::string> DecodeChain(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (Utf8Lossy(pending) == pending) {  // valid UTF-8: the bytes as text
        out.push_back(pending);
      } else {  // as Rust's String::from_utf8 failing: one U+FFFD per byte
        for (size_t i = 0; i < pending.size(); ++i) out.push_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (std::string& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
          std::isxdigit(static_cast<unsigned char>(t[3])) &&
          std::isxdigit(static_cast<unsigned char>(t[4]))) {
        byte = std::stoi(t.substr(3, 2), nullptr, 16);
      }
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    return out;
  }
};

class FuseDecoder : public Decoder {
 public:
  std::vector<std::string> DecodeChain(std::vector<std::string> tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    return {all};
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  std::vector<std::string> DecodeChain(std::vector<std::string> tokens) const override {
    for (std::string& t : tokens) {
      const std::vector<char32_t> cps = ToCodePoints(t);
      size_t b = 0, e = cps.size();
      while (b < start_ && b < cps.size() && cps[b] == content_) ++b;
      for (size_t i = 0; i < stop_ && e > 0 && cps[e - 1] == content_; ++i) --e;
      std::string out;
      for (size_t i = b; i < std::max(b, e); ++i) AppendUtf8(cps[i], &out);
      t = std::move(out);
    }
    return tokens;
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(const std::string& regex, std::string content, const std::string& where)
      : regex_(regex, where), content_(std::move(content)) {}
  std::vector<std::string> DecodeChain(std::vector<std::string> tokens) const override {
    for (std::string& t : tokens) {
      std::string out;
      size_t prev = 0;
      for (const auto& [b, e] : regex_.FindAll(t)) {
        out.append(t, prev, b - prev);
        out += content_;
        prev = e;
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
    return tokens;
  }

 private:
  Regex regex_;
  std::string content_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  std::vector<std::string> DecodeChain(std::vector<std::string> tokens) const override {
    for (const auto& d : parts_) tokens = d->DecodeChain(std::move(tokens));
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> MakeDecoder(const nlohmann::json& config, const std::string& where) {
  if (config.is_null()) return nullptr;
  AFD_CHECK(config.is_object() && config.contains("type"), "{}: expected an object with a type",
            where);
  const std::string type = config["type"].get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    const auto& list = config.at("decoders");
    for (size_t i = 0; i < list.size(); ++i) {
      parts.push_back(MakeDecoder(list[i], fmt::format("{}.decoders[{}]", where, i)));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    bool prepend = config.value("add_prefix_space", true);
    if (config.contains("prepend_scheme")) prepend = config["prepend_scheme"] != "never";
    return std::make_unique<MetaspaceDecoder>(config.value("replacement", "\xE2\x96\x81"), prepend);
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const std::string content = config.value("content", " ");
    const std::vector<char32_t> cps = ToCodePoints(content);
    AFD_CHECK(cps.size() == 1, "{}.content: expected one character", where);
    return std::make_unique<StripDecoder>(cps[0], config.value("start", size_t{0}),
                                          config.value("stop", size_t{0}));
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(PatternToRegex(config.at("pattern"), where),
                                            config.at("content").get<std::string>(), where);
  }
  AFD_THROW("{}: unsupported decoder type \"{}\"", where, type);
}

}  // namespace afd::text
