#include "capture/tokenizer/decoders.h"

#include "capture/tokenizer/pattern.h"
#include "capture/tokenizer/unicode.h"

namespace kvscope::tokenizer {

namespace {

const char* const kReplacementChar = "\xEF\xBF\xBD";

// Every character of the token must be in the byte table, else the token's
// own UTF-8 is used (added tokens such as <|im_end|> with unmapped chars).
class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>* tokens, bool raw) const override {
    std::string bytes;
    for (const std::string& t : *tokens) {
      size_t mark = bytes.size();
      bool all = true;
      for (size_t i = 0; i < t.size();) {
        uint32_t cp = 0;
        int len = unicode::decode(t.data(), t.size(), i, &cp);
        int b = len ? unicode::char_to_byte(cp) : -1;
        if (b < 0) {
          all = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
        i += static_cast<size_t>(len);
      }
      if (!all) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens->assign(1, raw ? bytes : unicode::to_valid_lossy(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>* tokens, bool) const override {
    for (std::string& t : *tokens) t = pattern_.replace_all(t, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// Parses a <0xHH> token the way `tokenizers` does (u8::from_str_radix on the
// two characters after "<0x", which also accepts "+H"); -1 if it is not one.
int byte_token_value(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (t[3] == '+') return hex(t[4]);
  int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>* tokens, bool raw) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string run;
    size_t run_len = 0;
    auto flush = [&] {
      if (run_len == 0) return;
      if (raw || unicode::find_invalid(run) == std::string::npos) {
        out.push_back(run);
      } else {
        // An invalid run becomes one U+FFFD per byte.
        for (size_t k = 0; k < run_len; ++k) out.push_back(kReplacementChar);
      }
      run.clear();
      run_len = 0;
    };
    for (std::string& t : *tokens) {
      int b = byte_token_value(t);
      if (b >= 0) {
        run.push_back(static_cast<char>(b));
        ++run_len;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    *tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>* tokens, bool) const override {
    std::string all;
    for (const std::string& t : *tokens) all += t;
    tokens->assign(1, std::move(all));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(uint32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>* tokens, bool raw) const override {
    if (raw) return;
    for (std::string& t : *tokens) {
      std::vector<std::pair<size_t, uint32_t>> chars;  // (offset, code point)
      for (size_t i = 0; i < t.size();) {
        uint32_t cp = 0;
        int len = unicode::decode(t.data(), t.size(), i, &cp);
        if (len == 0) len = 1, cp = 0xFFFFFFFF;
        chars.emplace_back(i, cp);
        i += static_cast<size_t>(len);
      }
      size_t start_cut = 0;
      for (size_t i = 0; i < start_ && i < chars.size() && chars[i].second == content_; ++i)
        start_cut = i + 1;
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size(); ++i) {
        size_t index = chars.size() - i - 1;
        if (chars[index].second != content_) break;
        stop_cut = index;
      }
      if (stop_cut < start_cut) stop_cut = start_cut;
      size_t a = start_cut < chars.size() ? chars[start_cut].first : t.size();
      size_t b = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
      t = t.substr(a, b - a);
    }
  }

 private:
  uint32_t content_;
  size_t start_, stop_;
};

// Replacement characters become spaces, except in the first token where they
// are dropped (unless the prepend scheme is "never").
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool prepend)
      : replacement_(std::move(replacement)), prepend_(prepend) {}
  void decode_chain(std::vector<std::string>* tokens, bool raw) const override {
    for (size_t k = 0; k < tokens->size(); ++k) {
      const std::string& t = (*tokens)[k];
      std::string out;
      for (size_t pos = 0;;) {
        size_t hit = t.find(replacement_, pos);
        out.append(t, pos, hit == std::string::npos ? std::string::npos : hit - pos);
        if (hit == std::string::npos) break;
        if (!(k == 0 && prepend_ && !raw)) out.push_back(' ');
        pos = hit + replacement_.size();
      }
      (*tokens)[k] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool prepend_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>* tokens, bool raw) const override {
    for (const auto& p : parts_) p->decode_chain(tokens, raw);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> make_byte_level_decoder() {
  return std::make_unique<ByteLevelDecoder>();
}

std::unique_ptr<Decoder> make_sentencepiece_decoder(bool strip_leading_space) {
  std::vector<std::unique_ptr<Decoder>> parts;
  parts.push_back(std::make_unique<ReplaceDecoder>(Pattern::literal("\xE2\x96\x81"), " "));
  parts.push_back(std::make_unique<ByteFallbackDecoder>());
  parts.push_back(std::make_unique<FuseDecoder>());
  if (strip_leading_space) parts.push_back(std::make_unique<StripDecoder>(' ', 1, 0));
  return std::make_unique<SequenceDecoder>(std::move(parts));
}

std::unique_ptr<Decoder> decoder_from_json(const JsonAt& j) {
  if (j.is_null()) return nullptr;
  const std::string type = j.type();
  if (type == "Sequence") {
    JsonAt list = j.child("decoders");
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list.array().size(); ++i) {
      auto d = decoder_from_json(list.at(i));
      if (d) parts.push_back(std::move(d));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (type == "ByteLevel") return make_byte_level_decoder();
  if (type == "Replace")
    return std::make_unique<ReplaceDecoder>(Pattern::from_json(j.child("pattern")),
                                            j.child("content").str());
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    std::string content = j.child("content").str();
    uint32_t cp = 0;
    if (content.empty() ||
        unicode::decode(content.data(), content.size(), 0, &cp) != static_cast<int>(content.size()))
      j.child("content").fail_value("expected exactly one character");
    int64_t start = j.int_or("start", 0), stop = j.int_or("stop", 0);
    if (start < 0 || stop < 0) j.fail_value("Strip start/stop must not be negative");
    return std::make_unique<StripDecoder>(cp, static_cast<size_t>(start),
                                          static_cast<size_t>(stop));
  }
  if (type == "Metaspace") {
    std::string replacement = j.str_or("replacement", "\xE2\x96\x81");
    bool prepend = true;
    if (j.has("prepend_scheme"))
      prepend = j.child("prepend_scheme").str() != "never";
    else if (j.has("add_prefix_space"))
      prepend = j.child("add_prefix_space").boolean();
    return std::make_unique<MetaspaceDecoder>(replacement, prepend);
  }
  j.child("type").fail_value("unsupported decoder \"" + type +
                             "\" (supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, "
                             "Strip, Metaspace)");
}

}  // namespace kvscope::tokenizer
