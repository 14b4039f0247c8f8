#include "core/jinja/strings.h"

#include <algorithm>

#include "core/jinja/value.h"

namespace kvscope::jinja {

std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (const std::string& c : utf8_chars(s)) {
    auto b = static_cast<unsigned char>(c[0]);
    uint32_t cp = c.size() == 1 ? b : b & (0x7F >> c.size());
    for (size_t i = 1; i < c.size(); ++i)
      cp = (cp << 6) | (static_cast<unsigned char>(c[i]) & 0x3F);
    out.push_back(cp);
  }
  return out;
}

void append_code_point(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string encode_utf8(const std::vector<uint32_t>& cps) {
  std::string out;
  for (uint32_t cp : cps) append_code_point(out, cp);
  return out;
}

bool is_whitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

namespace {

uint32_t upper_cp(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c >= 0x100 && c <= 0x17F && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17F) {
    bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_lower ? (c % 2 == 0) : (c % 2 == 1)) return c - 1;
    return c;
  }
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

uint32_t lower_cp(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x138 && c != 0x149 && c != 0x17F) {
    bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_lower ? (c % 2 == 1) : (c % 2 == 0)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

bool is_cased(uint32_t c) {
  return upper_cp(c) != c || lower_cp(c) != c;
}

std::string map_cps(const std::string& s, uint32_t (*f)(uint32_t)) {
  std::string out;
  for (uint32_t cp : code_points(s)) append_code_point(out, f(cp));
  return out;
}

}  // namespace

bool is_alpha(uint32_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == 0xAA || c == 0xB5 || c == 0xBA ||
         (c >= 0xC0 && c <= 0x24F && c != 0xD7 && c != 0xF7) || (c >= 0x370 && c <= 0x3FF) ||
         (c >= 0x400 && c <= 0x4FF) || (c >= 0x4E00 && c <= 0x9FFF);
}

std::string to_upper(const std::string& s) {
  std::string out;
  for (uint32_t cp : code_points(s)) {
    if (cp == 0xDF) {
      out += "SS";  // Python: 'ß'.upper() == 'SS'
    } else {
      append_code_point(out, upper_cp(cp));
    }
  }
  return out;
}
std::string to_lower(const std::string& s) {
  return map_cps(s, lower_cp);
}

std::string to_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (uint32_t cp : code_points(s)) {
    append_code_point(out, prev_cased ? lower_cp(cp) : upper_cp(cp));
    prev_cased = is_cased(cp);
  }
  return out;
}

std::string capitalize(const std::string& s) {
  std::string out;
  bool first = true;
  for (uint32_t cp : code_points(s)) {
    append_code_point(out, first ? upper_cp(cp) : lower_cp(cp));
    first = false;
  }
  return out;
}

std::string strip_chars(const std::string& s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> cps = code_points(s);
  std::vector<uint32_t> set = chars ? code_points(*chars) : std::vector<uint32_t>{};
  auto strip_it = [&](uint32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : is_whitespace(c);
  };
  size_t lo = 0, hi = cps.size();
  while (left && lo < hi && strip_it(cps[lo])) ++lo;
  while (right && hi > lo && strip_it(cps[hi - 1])) --hi;
  return encode_utf8(std::vector<uint32_t>(cps.begin() + lo, cps.begin() + hi));
}

std::vector<std::string> split_sep(const std::string& s, const std::string& sep, int64_t maxsplit,
                                   bool from_right) {
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      size_t at = s.find(sep, start);
      if (at == std::string::npos) break;
      parts.push_back(s.substr(start, at - start));
      start = at + sep.size();
    }
    parts.push_back(s.substr(start));
    return parts;
  }
  size_t end = s.size();
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    if (end < sep.size()) break;
    size_t at = s.rfind(sep, end - sep.size());
    if (at == std::string::npos) break;
    parts.push_back(s.substr(at + sep.size(), end - at - sep.size()));
    end = at;
  }
  parts.push_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> split_whitespace(const std::string& s, int64_t maxsplit, bool from_right) {
  std::vector<uint32_t> cps = code_points(s);
  if (from_right) std::reverse(cps.begin(), cps.end());
  std::vector<std::string> parts;
  size_t i = 0, n = cps.size();
  while (true) {
    while (i < n && is_whitespace(cps[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
      size_t end = n;
      while (end > i && is_whitespace(cps[end - 1])) --end;
      std::vector<uint32_t> rest(cps.begin() + i, cps.begin() + end);
      if (from_right) std::reverse(rest.begin(), rest.end());
      parts.push_back(encode_utf8(rest));
      break;
    }
    size_t start = i;
    while (i < n && !is_whitespace(cps[i])) ++i;
    std::vector<uint32_t> word(cps.begin() + start, cps.begin() + i);
    if (from_right) std::reverse(word.begin(), word.end());
    parts.push_back(encode_utf8(word));
  }
  if (from_right) std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> split_lines(const std::string& s, bool keepends) {
  std::vector<uint32_t> cps = code_points(s);
  std::vector<std::string> lines;
  std::vector<uint32_t> line;
  for (size_t i = 0; i < cps.size(); ++i) {
    uint32_t c = cps[i];
    bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) ||
               c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      line.push_back(c);
      continue;
    }
    std::string end;
    append_code_point(end, c);
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') {
      end += '\n';
      ++i;
    }
    lines.push_back(encode_utf8(line) + (keepends ? end : ""));
    line.clear();
  }
  if (!line.empty()) lines.push_back(encode_utf8(line));
  return lines;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count) {
  if (from.empty()) {
    // Python inserts `to` between every character and at both ends.
    std::string out;
    int64_t done = 0;
    for (const std::string& c : utf8_chars(s)) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out += c;
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  std::string out;
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(from, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += to;
    start = at + from.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

int64_t count_occurrences(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<int64_t>(utf8_length(s)) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace kvscope::jinja
