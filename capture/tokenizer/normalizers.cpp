#include "capture/tokenizer/normalizers.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <vector>

#include "capture/tokenizer/pattern.h"
#include "capture/tokenizer/unicode.h"

namespace kvscope::tokenizer {

namespace {

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void normalize(std::string* text) const override {
    for (const auto& p : parts_) p->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  // `tokenizers` prepends to non-empty pieces only.
  void normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string* text) const override {
    *text = pattern_.replace_all(*text, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// Unicode normalization forms through ICU (no hand-written tables).
class IcuNormalizer : public Normalizer {
 public:
  IcuNormalizer(const std::string& form, const std::string& file, const std::string& field) {
    UErrorCode status = U_ZERO_ERROR;
    if (form == "NFC") impl_ = icu::Normalizer2::getNFCInstance(status);
    if (form == "NFD") impl_ = icu::Normalizer2::getNFDInstance(status);
    if (form == "NFKC") impl_ = icu::Normalizer2::getNFKCInstance(status);
    if (form == "NFKD") impl_ = icu::Normalizer2::getNFKDInstance(status);
    if (U_FAILURE(status) || !impl_)
      throw InputError(file, field, "ICU has no " + form + " normalizer");
  }
  void normalize(std::string* text) const override {
    bool ascii = true;
    for (unsigned char c : *text) ascii = ascii && c < 0x80;
    if (ascii) return;  // every normalization form leaves ASCII unchanged
    UErrorCode status = U_ZERO_ERROR;
    icu::UnicodeString in = icu::UnicodeString::fromUTF8(*text);
    icu::UnicodeString out = impl_->normalize(in, status);
    if (U_FAILURE(status)) throw std::runtime_error("ICU normalization failed");
    text->clear();
    out.toUTF8String(*text);
  }

 private:
  const icu::Normalizer2* impl_ = nullptr;
};

// Rust's char::to_lowercase applied character by character (no final-sigma
// context), which is what `tokenizers` does.
class LowercaseNormalizer : public Normalizer {
 public:
  void normalize(std::string* text) const override {
    std::string out;
    out.reserve(text->size());
    for (size_t i = 0; i < text->size();) {
      uint32_t cp = 0;
      int len = unicode::decode(text->data(), text->size(), i, &cp);
      if (len == 0) len = 1;
      if (cp < 0x80) {
        out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
      } else {
        icu::UnicodeString one(static_cast<UChar32>(cp));
        one.toLower(icu::Locale::getRoot());
        one.toUTF8String(out);
      }
      i += static_cast<size_t>(len);
    }
    *text = std::move(out);
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        uint32_t cp = 0;
        int len = unicode::decode(text->data(), end, begin, &cp);
        if (len == 0 || !unicode::is_whitespace(cp)) break;
        begin += static_cast<size_t>(len);
      }
    }
    if (right_) {
      while (end > begin) {
        size_t i = end - 1;
        while (i > begin && (static_cast<unsigned char>((*text)[i]) & 0xC0) == 0x80) --i;
        uint32_t cp = 0;
        int len = unicode::decode(text->data(), end, i, &cp);
        if (len == 0 || !unicode::is_whitespace(cp)) break;
        end = i;
      }
    }
    *text = text->substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

}  // namespace

std::unique_ptr<Normalizer> make_prepend(std::string prefix) {
  return std::make_unique<PrependNormalizer>(std::move(prefix));
}

std::unique_ptr<Normalizer> make_replace(std::string from, std::string to) {
  return std::make_unique<ReplaceNormalizer>(Pattern::literal(std::move(from)), std::move(to));
}

std::unique_ptr<Normalizer> normalizer_from_json(const JsonAt& j) {
  if (j.is_null()) return nullptr;
  const std::string type = j.type();
  if (type == "Sequence") {
    JsonAt list = j.child("normalizers");
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list.array().size(); ++i) {
      auto n = normalizer_from_json(list.at(i));
      if (n) parts.push_back(std::move(n));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "Prepend") return make_prepend(j.child("prepend").str());
  if (type == "Replace")
    return std::make_unique<ReplaceNormalizer>(Pattern::from_json(j.child("pattern")),
                                               j.child("content").str());
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD")
    return std::make_unique<IcuNormalizer>(type, j.file, j.field);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip")
    return std::make_unique<StripNormalizer>(j.bool_or("strip_left", true),
                                             j.bool_or("strip_right", true));
  j.child("type").fail_value("unsupported normalizer \"" + type +
                             "\" (supported: Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD, "
                             "Lowercase, Strip)");
}

}  // namespace kvscope::tokenizer
