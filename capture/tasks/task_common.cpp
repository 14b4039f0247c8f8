#include "capture/tasks/task_common.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>

#include "core/common/input_error.h"

namespace kvscope::tasks {

uint64_t SplitMix::next() {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

namespace {

std::string list(const std::vector<std::string>& items, const char* last_joiner) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += i + 1 == items.size() ? last_joiner : ", ";
    out += items[i];
  }
  return out;
}

std::string format_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return s;
}

}  // namespace

TaskSpec::TaskSpec(const std::string& name, const std::string& spec, std::vector<std::string> keys)
    : name_(name) {
  const size_t colon = spec.find(':');
  const std::string rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  for (size_t pos = 0; pos < rest.size();) {
    const size_t comma = std::min(rest.find(',', pos), rest.size());
    const std::string item = rest.substr(pos, comma - pos);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq),
                      value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
      fail(key, "unknown (expected " + list(keys, ", ") + ")");
    values_[key] = value;
    pos = comma + 1;
  }
}

void TaskSpec::fail(const std::string& key, const std::string& what) const {
  throw InputError("--task", name_ + ":" + key, what);
}

int64_t TaskSpec::integer(const std::string& key, int64_t lo, int64_t hi, int64_t fallback) const {
  const auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  const std::string& value = it->second;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end || errno || v < lo || v > hi)
    fail(key, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                  "], got '" + value + "'");
  return v;
}

double TaskSpec::number(const std::string& key, double lo, double hi, double fallback) const {
  const auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  const std::string& value = it->second;
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end || !(v >= lo && v <= hi))
    fail(key, "expected a number in [" + format_number(lo) + ", " + format_number(hi) + "], got '" +
                  value + "'");
  return v;
}

std::string TaskSpec::choice(const std::string& key, const std::vector<std::string>& choices,
                             const std::string& fallback) const {
  const auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  if (std::find(choices.begin(), choices.end(), it->second) == choices.end())
    fail(key, "expected " + list(choices, " or ") + ", got '" + it->second + "'");
  return it->second;
}

std::string TaskSpec::text(const std::string& key, const std::string& fallback) const {
  const auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  if (it->second.empty()) fail(key, "expected a value, got ''");
  return it->second;
}

std::vector<std::pair<int64_t, int64_t>> token_spans(
    const tokenizer::Tokenizer& tok, const std::string& text, const std::vector<int32_t>& ids,
    const std::vector<std::pair<size_t, size_t>>& ranges) {
  // Each token's bytes in the text: [starts[i], ends[i]).
  std::vector<size_t> starts(ids.size()), ends(ids.size());
  size_t cursor = 0;
  bool aligned = true;
  for (size_t i = 0; i < ids.size() && aligned; ++i) {
    const std::string b = tok.token_bytes(ids[i]);
    starts[i] = cursor;
    if (!b.empty() && text.compare(cursor, b.size(), b) == 0) {
      cursor += b.size();
    } else if (b.size() > 1 && b[0] == ' ' && text.compare(cursor, b.size() - 1, b, 1) == 0) {
      cursor += b.size() - 1;  // the dummy-prefix space of a SentencePiece word
    } else if (!tok.is_special(ids[i]) && !(ids[i] == tok.bos_id())) {
      aligned = false;
    }
    ends[i] = cursor;
  }
  aligned = aligned && cursor == text.size();

  std::vector<std::pair<int64_t, int64_t>> spans;
  spans.reserve(ranges.size());
  if (aligned) {
    for (const auto& range : ranges) {
      // Named copies: a C++17 lambda cannot capture structured bindings (clang refuses).
      const size_t b = range.first, e = range.second;
      const size_t first =
          size_t(std::partition_point(ends.begin(), ends.end(), [&](size_t x) { return x <= b; }) -
                 ends.begin());
      const size_t last = size_t(
          std::partition_point(starts.begin(), starts.end(), [&](size_t x) { return x < e; }) -
          starts.begin());
      spans.emplace_back(int64_t(first), int64_t(std::max(first, last)));
    }
  } else {
    spans = prefix_token_spans(tok, text, ranges);
  }
  return spans;
}

std::vector<std::pair<int64_t, int64_t>> prefix_token_spans(
    const tokenizer::Tokenizer& tok, const std::string& text,
    const std::vector<std::pair<size_t, size_t>>& ranges) {
  auto count = [&](size_t n) { return int64_t(tok.encode(text.substr(0, n), true).size()); };
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (auto [b, e] : ranges) spans.emplace_back(std::max<int64_t>(0, count(b) - 1), count(e));
  return spans;
}

UserPrompt wrap_user_message(const tokenizer::Tokenizer& tok, bool chat, const std::string& user,
                             const std::string& intro, const std::string& suffix) {
  if (!chat) return {user + suffix, 0};
  UserPrompt p;
  p.text = tok.apply_chat_template({{"user", user}});
  p.offset = p.text.find(intro);
  return p;
}

int64_t answers_found(const std::vector<std::string>& expected, const std::string& output) {
  const std::string out = lower(output);
  int64_t n = 0;
  for (const std::string& e : expected) n += out.find(lower(e)) != std::string::npos;
  return n;
}

double answer_score(const std::vector<std::string>& expected, const std::string& output) {
  if (expected.empty()) return 1.0;
  return double(answers_found(expected, output)) / double(expected.size());
}

std::string join_answers(const std::vector<std::string>& answers) {
  std::string out;
  for (size_t i = 0; i < answers.size(); ++i) out += (i ? ", " : "") + answers[i];
  return out;
}

int64_t fit_units(int64_t target, int64_t n0, double per_unit, int64_t min_n,
                  const std::function<int64_t(int64_t)>& tokens_of) {
  const int64_t tolerance = std::max<int64_t>(2, target / 200);
  int64_t n = std::max(min_n, n0), best_n = n, best_t = 0;
  int64_t best_diff = std::numeric_limits<int64_t>::max();
  std::set<int64_t> seen;
  int64_t prev_n = -1, prev_t = 0;
  for (int round = 0; round < 10; ++round) {
    seen.insert(n);
    const int64_t t = tokens_of(n);
    const int64_t diff = std::llabs(t - target);
    if (diff < best_diff || (diff == best_diff && t < best_t)) {
      best_diff = diff;
      best_n = n;
      best_t = t;
    }
    if (diff <= tolerance) break;
    // The slope measured so far (secant) once two counts are known.
    if (prev_n >= 0 && n != prev_n && t != prev_t) {
      const double slope = double(t - prev_t) / double(n - prev_n);
      if (slope > 0) per_unit = slope;
    }
    prev_n = n;
    prev_t = t;
    int64_t step = std::llround(double(target - t) / std::max(per_unit, 1e-3));
    if (step == 0) step = t < target ? 1 : -1;
    int64_t next = std::max(min_n, n + step);
    if (seen.count(next)) break;
    n = next;
  }
  return best_n;
}

}  // namespace kvscope::tasks
