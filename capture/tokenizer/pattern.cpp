#include "capture/tokenizer/pattern.h"

#include <stdexcept>

#include "capture/tokenizer/unicode.h"

namespace kvscope::tokenizer {

Pattern Pattern::literal(std::string text) {
  Pattern p;
  p.kind_ = Kind::Literal;
  p.literal_ = std::move(text);
  return p;
}

Pattern Pattern::regex(const std::string& pattern) {
  Pattern p;
  p.kind_ = Kind::Regex;
  p.regex_ = std::make_shared<Regex>(pattern);
  return p;
}

Pattern Pattern::predicate(bool (*fn)(uint32_t)) {
  Pattern p;
  p.kind_ = Kind::Predicate;
  p.predicate_ = fn;
  return p;
}

Pattern Pattern::character(uint32_t cp) {
  Pattern p;
  p.kind_ = Kind::Char;
  p.char_ = cp;
  return p;
}

Pattern Pattern::from_json(const JsonAt& j) {
  if (j.has("String")) return literal(j.child("String").str());
  if (j.has("Regex")) {
    JsonAt r = j.child("Regex");
    try {
      return regex(r.str());
    } catch (const std::invalid_argument& e) {
      r.fail_value(e.what());
    }
  }
  j.fail("{\"String\": ...} or {\"Regex\": ...}");
}

std::vector<Span> Pattern::find_matches(const std::string& s) const {
  std::vector<Span> out;
  if (kind_ == Kind::Predicate || kind_ == Kind::Char) {
    // One match per matching character; the runs between are non-matches.
    size_t last = 0;
    for (size_t i = 0; i < s.size();) {
      uint32_t cp = 0;
      int len = unicode::decode(s.data(), s.size(), i, &cp);
      if (len == 0) len = 1;  // input is validated upstream; stay safe regardless
      bool hit = kind_ == Kind::Char ? cp == char_ : predicate_(cp);
      if (hit) {
        if (last < i) out.push_back({last, i, false});
        out.push_back({i, i + len, true});
        last = i + len;
      }
      i += len;
    }
    if (last < s.size()) out.push_back({last, s.size(), false});
    return out;
  }
  if (s.empty()) return {{0, 0, false}};
  if (kind_ == Kind::Literal && literal_.empty()) return {{0, s.size(), false}};
  std::vector<std::pair<size_t, size_t>> matches;
  if (kind_ == Kind::Regex) {
    regex_->find_all(s.data(), s.size(), &matches);
  } else {
    for (size_t pos = s.find(literal_); pos != std::string::npos;
         pos = s.find(literal_, pos + literal_.size()))
      matches.emplace_back(pos, pos + literal_.size());
  }
  size_t prev = 0;
  for (const auto& [a, b] : matches) {
    if (prev != a) out.push_back({prev, a, false});
    out.push_back({a, b, true});
    prev = b;
  }
  if (prev != s.size()) out.push_back({prev, s.size(), false});
  return out;
}

std::string Pattern::replace_all(const std::string& s, const std::string& content) const {
  if (kind_ == Kind::Literal && !literal_.empty() && s.find(literal_) == std::string::npos)
    return s;
  std::string out;
  out.reserve(s.size());
  for (const Span& sp : find_matches(s)) {
    if (sp.match)
      out += content;
    else
      out.append(s, sp.start, sp.end - sp.start);
  }
  return out;
}

}  // namespace kvscope::tokenizer
