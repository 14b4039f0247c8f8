// UTF-8 string helpers with Python's str semantics (code points, not bytes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope::jinja {

std::vector<uint32_t> code_points(const std::string& s);
std::string encode_utf8(const std::vector<uint32_t>& cps);
void append_code_point(std::string& out, uint32_t cp);

bool is_whitespace(uint32_t cp);  // str.isspace()
bool is_alpha(uint32_t cp);       // letters (ASCII, Latin-1, Latin Extended, Greek, Cyrillic)

// Case mapping covers ASCII, Latin-1, Greek and Cyrillic; other scripts pass through.
std::string to_upper(const std::string& s);
std::string to_lower(const std::string& s);
std::string to_title(const std::string& s);
std::string capitalize(const std::string& s);

// chars == nullptr strips whitespace.
std::string strip_chars(const std::string& s, const std::string* chars, bool left, bool right);
std::vector<std::string> split_sep(const std::string& s, const std::string& sep, int64_t maxsplit,
                                   bool from_right);
std::vector<std::string> split_whitespace(const std::string& s, int64_t maxsplit, bool from_right);
std::vector<std::string> split_lines(const std::string& s, bool keepends);
std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count);
int64_t count_occurrences(const std::string& s, const std::string& sub);
std::string html_escape(const std::string& s);

}  // namespace kvscope::jinja
