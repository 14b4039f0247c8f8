#include "capture/tokenizer/pre_tokenizers.h"

#include <algorithm>
#include <stdexcept>

#include "capture/tokenizer/pattern.h"
#include "capture/tokenizer/unicode.h"

namespace kvscope::tokenizer {

const char* const kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// `tokenizers` NormalizedString::split: turn (span, is_match) runs into the
// spans to keep, following the delimiter behaviour.
std::vector<std::pair<size_t, size_t>> split_spans(std::vector<Span> matches, Behavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  switch (behavior) {
    case Behavior::Isolated:
      for (const Span& s : matches) out.emplace_back(s.start, s.end);
      break;
    case Behavior::Removed:
      for (const Span& s : matches)
        if (!s.match) out.emplace_back(s.start, s.end);
      break;
    case Behavior::Contiguous: {
      bool previous = false;
      for (const Span& s : matches) {
        if (s.match == previous && !out.empty())
          out.back().second = s.end;
        else
          out.emplace_back(s.start, s.end);
        previous = s.match;
      }
      break;
    }
    case Behavior::MergedWithPrevious: {
      bool previous = false;
      for (const Span& s : matches) {
        if (s.match && !previous && !out.empty())
          out.back().second = s.end;
        else
          out.emplace_back(s.start, s.end);
        previous = s.match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool previous = false;
      for (size_t k = matches.size(); k-- > 0;) {
        const Span& s = matches[k];
        if (s.match && !previous && !out.empty())
          out.back().first = s.start;
        else
          out.emplace_back(s.start, s.end);
        previous = s.match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  return out;
}

// Splits every non-token piece with `pattern` and `behavior`.
void split_pieces(std::vector<Piece>* pieces, const Pattern& pattern, Behavior behavior,
                  bool invert) {
  std::vector<Piece> out;
  out.reserve(pieces->size() * 4);
  for (Piece& p : *pieces) {
    if (p.token >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    std::vector<Span> matches = pattern.find_matches(p.text);
    if (invert)
      for (Span& s : matches) s.match = !s.match;
    for (const auto& [a, b] : split_spans(std::move(matches), behavior)) {
      if (a == b) continue;
      out.push_back(Piece{p.text.substr(a, b - a), p.at_origin && a == 0, -1});
    }
  }
  *pieces = std::move(out);
}

Behavior behavior_from_json(const JsonAt& j) {
  std::string b = j.str();
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  j.fail_value("unknown behavior \"" + b +
               "\" (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>* pieces) const override {
    split_pieces(pieces, pattern_, behavior_, invert_);
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

// Optional prefix space, optional GPT-2 regex split, then every byte mapped
// through the byte->unicode table (formats.md 4.5).
class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space),
        regex_(use_regex ? std::make_unique<Pattern>(Pattern::regex(kGpt2Regex)) : nullptr) {}
  void pre_tokenize(std::vector<Piece>* pieces) const override {
    if (add_prefix_space_)
      for (Piece& p : *pieces)
        if (p.token < 0 && !p.text.empty() && p.text[0] != ' ') p.text.insert(0, " ");
    if (regex_) split_pieces(pieces, *regex_, Behavior::Isolated, false);
    const auto& table = unicode::byte_to_char();
    std::string mapped;
    for (Piece& p : *pieces) {
      if (p.token >= 0) continue;
      mapped.clear();
      for (unsigned char b : p.text) mapped += table[b];
      p.text.swap(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> regex_;
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  enum class Prepend { Always, First, Never };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(split) {
    uint32_t cp = 0;
    unicode::decode(replacement_.data(), replacement_.size(), 0, &cp);
    replacement_pattern_ = std::make_unique<Pattern>(Pattern::character(cp));
  }
  void pre_tokenize(std::vector<Piece>* pieces) const override {
    static const Pattern space = Pattern::literal(" ");
    for (Piece& p : *pieces) {
      if (p.token >= 0 || p.text.empty()) continue;
      p.text = space.replace_all(p.text, replacement_);
      bool starts = p.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (prepend_ == Prepend::Always || (prepend_ == Prepend::First && p.at_origin)))
        p.text.insert(0, replacement_);
    }
    if (split_) split_pieces(pieces, *replacement_pattern_, Behavior::MergedWithNext, false);
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
  std::unique_ptr<Pattern> replacement_pattern_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Piece>* pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

bool is_digit_class(uint32_t cp) {
  return unicode::is_numeric(cp);
}
bool is_space_class(uint32_t cp) {
  return unicode::is_whitespace(cp);
}

}  // namespace

std::unique_ptr<PreTokenizer> make_split_isolated(const std::string& regex) {
  return std::make_unique<SplitPreTokenizer>(Pattern::regex(regex), Behavior::Isolated, false);
}

std::unique_ptr<PreTokenizer> make_byte_level(bool add_prefix_space, bool use_regex) {
  return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, use_regex);
}

std::unique_ptr<PreTokenizer> make_digits(bool individual) {
  return std::make_unique<SplitPreTokenizer>(Pattern::predicate(is_digit_class),
                                             individual ? Behavior::Isolated : Behavior::Contiguous,
                                             false);
}

std::unique_ptr<PreTokenizer> make_sequence(std::vector<std::unique_ptr<PreTokenizer>> parts) {
  return std::make_unique<SequencePreTokenizer>(std::move(parts));
}

std::unique_ptr<PreTokenizer> pre_tokenizer_from_json(const JsonAt& j) {
  if (j.is_null()) return nullptr;
  const std::string type = j.type();
  if (type == "Sequence") {
    JsonAt list = j.child("pretokenizers");
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list.array().size(); ++i) {
      auto p = pre_tokenizer_from_json(list.at(i));
      if (p) parts.push_back(std::move(p));
    }
    return make_sequence(std::move(parts));
  }
  if (type == "Split")
    return std::make_unique<SplitPreTokenizer>(Pattern::from_json(j.child("pattern")),
                                               behavior_from_json(j.child("behavior")),
                                               j.bool_or("invert", false));
  if (type == "ByteLevel")
    return make_byte_level(j.bool_or("add_prefix_space", true), j.bool_or("use_regex", true));
  if (type == "Digits") return make_digits(j.bool_or("individual_digits", false));
  if (type == "Metaspace") {
    std::string replacement = j.str_or("replacement", "\xE2\x96\x81");
    uint32_t cp = 0;
    if (replacement.empty() || unicode::decode(replacement.data(), replacement.size(), 0, &cp) !=
                                   static_cast<int>(replacement.size()))
      j.child("replacement").fail_value("expected exactly one character");
    auto prepend = MetaspacePreTokenizer::Prepend::Always;
    if (j.has("prepend_scheme")) {
      std::string s = j.child("prepend_scheme").str();
      if (s == "first")
        prepend = MetaspacePreTokenizer::Prepend::First;
      else if (s == "never")
        prepend = MetaspacePreTokenizer::Prepend::Never;
      else if (s != "always")
        j.child("prepend_scheme")
            .fail_value("expected \"always\", \"first\" or \"never\", got \"" + s + "\"");
    } else if (j.has("add_prefix_space") && !j.child("add_prefix_space").boolean()) {
      prepend = MetaspacePreTokenizer::Prepend::Never;  // the older spelling
    }
    return std::make_unique<MetaspacePreTokenizer>(replacement, prepend, j.bool_or("split", true));
  }
  if (type == "Whitespace") {
    // `tokenizers` keeps the matches of \w+|[^\w\s]+ (Removed + invert),
    // compiled by Rust's `regex` crate, not Oniguruma: its \w is Alphabetic,
    // marks, Nd, Pc and Join_Control (ZWJ), its \s White_Space. Spelled out
    // because PCRE2's \w is narrower.
    const std::string word = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control})";
    const std::string space =
        R"(\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
    return std::make_unique<SplitPreTokenizer>(
        Pattern::regex("[" + word + "]+|[^" + word + space + "]+"), Behavior::Removed, true);
  }
  if (type == "WhitespaceSplit")
    return std::make_unique<SplitPreTokenizer>(Pattern::predicate(is_space_class),
                                               Behavior::Removed, false);
  j.child("type").fail_value("unsupported pre-tokenizer \"" + type +
                             "\" (supported: Sequence, Split, ByteLevel, Digits, Metaspace, "
                             "Whitespace, WhitespaceSplit)");
}

}  // namespace kvscope::tokenizer
