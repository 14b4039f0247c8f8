// jinja2's built-in filters, tests and globals, plus transformers' tojson.
#include "core/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include "core/jinja/json.h"
#include "core/jinja/ops.h"
#include "core/jinja/strings.h"

namespace kvscope::jinja {
namespace {

const Value* opt(const Args& a, size_t i, const char* name) {
  const Value* v = a.get(i, name);
  return v && !v->is_undefined() ? v : nullptr;
}

bool flag(const Args& a, size_t i, const char* name, bool dflt = false) {
  const Value* v = opt(a, i, name);
  return v ? v->truthy() : dflt;
}

int64_t int_param(const Args& a, size_t i, const char* name, int64_t dflt) {
  const Value* v = opt(a, i, name);
  if (!v || v->is_none()) return dflt;
  if (!v->is_int() && !v->is_bool())
    throw_type_error("'" + v->type_name() + "' object cannot be interpreted as an integer");
  return v->as_int();
}

std::string str_param(const Args& a, size_t i, const char* name, const std::string& dflt) {
  const Value* v = opt(a, i, name);
  return v ? v->to_str() : dflt;
}

// jinja2's make_attrgetter: "a.b.0" looks up item by item.
Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  for (const std::string& part : split_sep(path, ".", -1, false)) {
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    errno = 0;
    const long long index = digits ? std::strtoll(part.c_str(), nullptr, 10) : 0;
    // An index past int64 finds nothing either way: look it up as the string.
    cur =
        get_item(cur, digits && errno != ERANGE ? Value(static_cast<int64_t>(index)) : Value(part));
  }
  return cur;
}

Value key_for_sort(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(to_lower(v.str()));
  return v;
}

// ---- filters ----

Value f_tojson(Renderer& r, const Value& v, Args& a) {
  JsonOptions o;
  o.ensure_ascii = flag(a, 0, "ensure_ascii");
  const Value* indent = opt(a, 1, "indent");
  if (indent && !indent->is_none()) {
    o.indent = true;
    o.indent_text = indent->is_string() ? indent->str()
                                        : std::string(std::max<int64_t>(0, indent->as_int()), ' ');
  }
  o.item_separator = o.indent ? "," : ", ";
  o.key_separator = ": ";
  const Value* seps = opt(a, 2, "separators");
  if (seps && !seps->is_none()) {
    std::vector<Value> parts = iterate(*seps);
    if (parts.size() != 2) throw TemplateError("separators must be a pair", "ValueError");
    o.item_separator = parts[0].to_str();
    o.key_separator = parts[1].to_str();
  }
  o.sort_keys = flag(a, 3, "sort_keys");
  return Value(to_json(v, o, r.limits().max_depth));
}

Value f_length(Renderer&, const Value& v, Args&) {
  switch (v.kind()) {
    case Kind::Undefined: return Value(0);
    case Kind::String: return Value(static_cast<int64_t>(utf8_length(v.str())));
    case Kind::List: return Value(static_cast<int64_t>(v.list().size()));
    case Kind::Dict: return Value(static_cast<int64_t>(v.dict_ref().items.size()));
    default: throw_type_error("object of type '" + v.type_name() + "' has no len()");
  }
}

Value f_first(Renderer&, const Value& v, Args&) {
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Renderer&, const Value& v, Args&) {
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_join(Renderer&, const Value& v, Args& a) {
  std::string sep = str_param(a, 0, "d", "");
  const Value* attribute = opt(a, 1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    out += (first ? "" : sep) + (attribute ? attr_path(item, attribute->to_str()) : item).to_str();
    first = false;
  }
  return Value(out);
}

Value f_upper(Renderer&, const Value& v, Args&) {
  return Value(to_upper(v.to_str()));
}
Value f_lower(Renderer&, const Value& v, Args&) {
  return Value(to_lower(v.to_str()));
}
Value f_title(Renderer&, const Value& v, Args&) {
  return Value(to_title(v.to_str()));
}
Value f_capitalize(Renderer&, const Value& v, Args&) {
  return Value(capitalize(v.to_str()));
}
Value f_string(Renderer&, const Value& v, Args&) {
  return Value(v.to_str());
}
Value f_safe(Renderer&, const Value& v, Args&) {
  return v.is_string() ? v : Value(v.to_str());
}
Value f_escape(Renderer&, const Value& v, Args&) {
  return Value(html_escape(v.to_str()));
}

Value f_trim(Renderer&, const Value& v, Args& a) {
  const Value* chars = opt(a, 0, "chars");
  std::string set = chars && !chars->is_none() ? chars->to_str() : "";
  return Value(strip_chars(v.to_str(), chars && !chars->is_none() ? &set : nullptr, true, true));
}

Value f_replace(Renderer&, const Value& v, Args& a) {
  return Value(replace_all(v.to_str(), str_param(a, 0, "old", ""), str_param(a, 1, "new", ""),
                           int_param(a, 2, "count", -1)));
}

Value f_default(Renderer&, const Value& v, Args& a) {
  const Value* dflt = a.get(0, "default_value");
  bool boolean = flag(a, 1, "boolean");
  if (v.is_undefined() || (boolean && !v.truthy())) return dflt ? *dflt : Value("");
  return v;
}

Value f_list(Renderer&, const Value& v, Args&) {
  return Value(iterate(v));
}

bool parse_int(const std::string& text, int64_t base, int64_t& out) {
  std::string s = strip_chars(text, nullptr, true, true);
  std::string digits;
  for (size_t i = 0; i < s.size(); ++i) {
    bool inner_underscore = s[i] == '_' && i > 0 && i + 1 < s.size() &&
                            std::isalnum(static_cast<unsigned char>(s[i - 1])) &&
                            std::isalnum(static_cast<unsigned char>(s[i + 1]));
    if (!inner_underscore) digits += s[i];
  }
  if (digits.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(digits.c_str(), &end, static_cast<int>(base));
  if (*end != '\0' || errno == ERANGE) return false;
  out = n;
  return true;
}

bool parse_float(const std::string& text, double& out) {
  std::string s = strip_chars(text, nullptr, true, true);
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return *end == '\0';
}

Value f_int(Renderer&, const Value& v, Args& a) {
  const Value* dflt = opt(a, 0, "default");
  int64_t base = int_param(a, 1, "base", 10);
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float() && std::isfinite(v.as_double()))
    return Value(static_cast<int64_t>(std::trunc(v.as_double())));
  int64_t n = 0;
  double f = 0;
  if (v.is_string() && parse_int(v.str(), base, n)) return Value(n);
  if (v.is_string() && parse_float(v.str(), f) && std::isfinite(f))
    return Value(static_cast<int64_t>(std::trunc(f)));
  return dflt ? *dflt : Value(0);
}

Value f_float(Renderer&, const Value& v, Args& a) {
  const Value* dflt = opt(a, 0, "default");
  if (v.is_number()) return Value(v.as_double());
  double f = 0;
  if (v.is_string() && parse_float(v.str(), f)) return Value(f);
  return dflt ? *dflt : Value(0.0);
}

Value f_abs(Renderer&, const Value& v, Args&) {
  if (v.is_float()) return Value(std::fabs(v.as_double()));
  if (v.is_number()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  v.require_defined();
  throw_type_error("bad operand type for abs(): '" + v.type_name() + "'");
}

Value f_round(Renderer&, const Value& v, Args& a) {
  int64_t precision = int_param(a, 0, "precision", 0);
  std::string method = str_param(a, 1, "method", "common");
  if (!v.is_number()) {
    v.require_defined();
    throw_type_error("type " + v.type_name() + " doesn't define __round__ method");
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return Value(std::ceil(v.as_double() * scale) / scale);
  if (method == "floor") return Value(std::floor(v.as_double() * scale) / scale);
  if (method != "common")
    throw TemplateError("method must be 'common', 'ceil' or 'floor'", "FilterArgumentError");
  if (!v.is_float()) return Value(v.as_int());
  if (!std::isfinite(v.as_double())) return v;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::max<int64_t>(0, precision)),
                v.as_double());
  if (precision < 0) return Value(std::nearbyint(v.as_double() * scale) / scale);
  return Value(std::strtod(buf, nullptr));
}

// map(filter, *args) or map(attribute=..., default=...).
Value f_map(Renderer& r, const Value& v, Args& a) {
  List out;
  const Value* attribute = opt(a, a.positional.size(), "attribute");
  std::vector<Value> items = iterate(v);
  r.count_iterations(static_cast<int64_t>(items.size()));
  if (attribute) {
    const Value* dflt = opt(a, a.positional.size(), "default");
    for (const Value& item : items) {
      Value got = attr_path(item, attribute->to_str());
      out.push_back(got.is_undefined() && dflt ? *dflt : got);
    }
    return Value(std::move(out));
  }
  if (a.positional.empty())
    throw TemplateError("map requires a filter argument", "FilterArgumentError");
  std::string name = a.positional[0].to_str();
  Args rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.kwargs = a.kwargs;
  for (const Value& item : items) {
    Args copy = rest;
    out.push_back(r.apply_filter(name, item, copy));
  }
  return Value(std::move(out));
}

// select/reject/selectattr/rejectattr: which items pass a test.
Value select_items(Renderer& r, const Value& v, Args& a, bool by_attr, bool keep) {
  size_t first_test = by_attr ? 1 : 0;
  std::string attribute = by_attr ? str_param(a, 0, "attribute", "") : "";
  std::vector<Value> items = iterate(v);
  r.count_iterations(static_cast<int64_t>(items.size()));
  List out;
  for (const Value& item : items) {
    Value subject = by_attr ? attr_path(item, attribute) : item;
    bool pass;
    if (a.positional.size() <= first_test) {
      pass = subject.truthy();
    } else {
      Args test_args;
      test_args.positional.assign(a.positional.begin() + first_test + 1, a.positional.end());
      pass = r.apply_test(a.positional[first_test].to_str(), subject, test_args);
    }
    if (pass == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

Value f_select(Renderer& r, const Value& v, Args& a) {
  return select_items(r, v, a, false, true);
}
Value f_reject(Renderer& r, const Value& v, Args& a) {
  return select_items(r, v, a, false, false);
}
Value f_selectattr(Renderer& r, const Value& v, Args& a) {
  return select_items(r, v, a, true, true);
}
Value f_rejectattr(Renderer& r, const Value& v, Args& a) {
  return select_items(r, v, a, true, false);
}

Value f_unique(Renderer&, const Value& v, Args& a) {
  bool case_sensitive = flag(a, 0, "case_sensitive");
  const Value* attribute = opt(a, 1, "attribute");
  List out, seen;
  for (const Value& item : iterate(v)) {
    Value key =
        key_for_sort(attribute ? attr_path(item, attribute->to_str()) : item, case_sensitive);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value(std::move(out));
}

Value f_sort(Renderer&, const Value& v, Args& a) {
  bool reverse = flag(a, 0, "reverse");
  bool case_sensitive = flag(a, 1, "case_sensitive");
  const Value* attribute = opt(a, 2, "attribute");
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : iterate(v))
    keyed.emplace_back(
        key_for_sort(attribute ? attr_path(item, attribute->to_str()) : item, case_sensitive),
        item);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first) < 0 : compare(x.first, y.first) < 0;
  });
  List out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value(std::move(out));
}

Value f_reverse(Renderer&, const Value& v, Args&) {
  if (v.is_string()) {
    auto chars = utf8_chars(v.str());
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
    return Value(out);
  }
  std::vector<Value> items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value(std::move(items));
}

Value f_items(Renderer&, const Value& v, Args&) {
  if (v.is_undefined()) return Value(List{});
  if (!v.is_dict()) throw_type_error("Can only get item pairs from a mapping.");
  List out;
  for (const auto& kv : v.dict_ref().items) out.emplace_back(List{kv.first, kv.second}, true);
  return Value(std::move(out));
}

Value f_dictsort(Renderer& r, const Value& v, Args& a) {
  bool case_sensitive = flag(a, 0, "case_sensitive");
  std::string by = str_param(a, 1, "by", "key");
  bool reverse = flag(a, 2, "reverse");
  Args none;
  List pairs = f_items(r, v, none).list();
  size_t pos = by == "value" ? 1 : 0;
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    Value kx = key_for_sort(x.list()[pos], case_sensitive);
    Value ky = key_for_sort(y.list()[pos], case_sensitive);
    return reverse ? compare(ky, kx) < 0 : compare(kx, ky) < 0;
  });
  return Value(std::move(pairs));
}

Value f_batch(Renderer&, const Value& v, Args& a) {
  int64_t size = int_param(a, 0, "linecount", 1);
  if (size <= 0) throw TemplateError("batch size must be positive", "FilterArgumentError");
  const Value* fill = opt(a, 1, "fill_with");
  List out, current;
  for (const Value& item : iterate(v)) {
    current.push_back(item);
    if (static_cast<int64_t>(current.size()) == size) {
      out.emplace_back(std::move(current));
      current.clear();
    }
  }
  if (!current.empty()) {
    while (fill && !fill->is_none() && static_cast<int64_t>(current.size()) < size)
      current.push_back(*fill);
    out.emplace_back(std::move(current));
  }
  return Value(std::move(out));
}

Value f_indent(Renderer&, const Value& v, Args& a) {
  const Value* width = opt(a, 0, "width");
  std::string pad = width && width->is_string()
                        ? width->str()
                        : std::string(width ? std::max<int64_t>(0, width->as_int()) : 4, ' ');
  bool first = flag(a, 1, "first"), blank = flag(a, 2, "blank");
  std::vector<std::string> lines = split_lines(v.to_str() + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n" + (blank || !lines[i].empty() ? pad : "");
    out += lines[i];
  }
  return Value(first ? pad + out : out);
}

Value f_striptags(Renderer&, const Value& v, Args&) {
  std::string s = v.to_str(), text;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 4, "<!--") == 0) {
      size_t end = s.find("-->", i);
      if (end != std::string::npos) {
        i = end + 2;
        continue;
      }
    }
    size_t close = s[i] == '<' ? s.find('>', i) : std::string::npos;
    if (close != std::string::npos) {
      i = close;
      continue;
    }
    text += s[i];
  }
  std::string out;
  for (const std::string& w : split_whitespace(text, -1, false))
    out += (out.empty() ? "" : " ") + w;
  return Value(out);
}

Value f_wordcount(Renderer&, const Value& v, Args&) {
  int64_t n = 0;
  bool in_word = false;
  for (uint32_t cp : code_points(v.to_str())) {
    bool word = is_alpha(cp) || (cp >= '0' && cp <= '9') || cp == '_' || cp > 0x7F;
    if (word && !in_word) ++n;
    in_word = word && !is_whitespace(cp);
  }
  return Value(n);
}

Value f_center(Renderer&, const Value& v, Args& a) {
  std::string s = v.to_str();
  int64_t width = int_param(a, 0, "width", 80), n = static_cast<int64_t>(utf8_length(s));
  if (width <= n) return Value(s);
  int64_t marg = width - n, left = marg / 2 + (marg & width & 1);
  return Value(std::string(left, ' ') + s + std::string(marg - left, ' '));
}

Value min_max(const Value& v, Args& a, bool want_max) {
  bool case_sensitive = flag(a, 0, "case_sensitive");
  const Value* attribute = opt(a, 1, "attribute");
  std::vector<Value> items = iterate(v);
  if (items.empty())
    return Value::undefined(std::string("No aggregated item, sequence was empty."));
  size_t best = 0;
  auto key = [&](size_t i) {
    return key_for_sort(attribute ? attr_path(items[i], attribute->to_str()) : items[i],
                        case_sensitive);
  };
  for (size_t i = 1; i < items.size(); ++i) {
    int c = compare(key(i), key(best));
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

Value f_min(Renderer&, const Value& v, Args& a) {
  return min_max(v, a, false);
}
Value f_max(Renderer&, const Value& v, Args& a) {
  return min_max(v, a, true);
}

Value f_sum(Renderer&, const Value& v, Args& a) {
  const Value* attribute = opt(a, 0, "attribute");
  const Value* start = opt(a, 1, "start");
  Value total = start ? *start : Value(0);
  for (const Value& item : iterate(v))
    total = binary_op("+", total, attribute ? attr_path(item, attribute->to_str()) : item);
  return total;
}

Value f_format(Renderer&, const Value& v, Args& a) {
  return Value(percent_format(v.to_str(), Value(a.positional, true)));
}

Value f_truncate(Renderer&, const Value& v, Args& a) {
  std::string s = v.to_str();
  int64_t length = int_param(a, 0, "length", 255);
  bool killwords = flag(a, 1, "killwords");
  std::string end = str_param(a, 2, "end", "...");
  int64_t leeway = int_param(a, 3, "leeway", 5);
  auto chars = utf8_chars(s);
  if (static_cast<int64_t>(chars.size()) <= length + leeway) return Value(s);
  int64_t keep = std::max<int64_t>(0, length - static_cast<int64_t>(utf8_length(end)));
  std::string head;
  for (int64_t i = 0; i < keep && i < static_cast<int64_t>(chars.size()); ++i) head += chars[i];
  if (killwords) return Value(head + end);
  return Value(split_sep(head, " ", 1, true)[0] + end);
}

Value f_groupby(Renderer&, const Value& v, Args& a) {
  std::string attribute = str_param(a, 0, "attribute", "");
  const Value* dflt = opt(a, 1, "default");
  bool case_sensitive = flag(a, 2, "case_sensitive");
  auto raw_key = [&](const Value& item) {
    Value k = attr_path(item, attribute);
    return k.is_undefined() && dflt ? *dflt : k;
  };
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : iterate(v))
    keyed.emplace_back(key_for_sort(raw_key(item), case_sensitive), item);
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& x, const auto& y) { return compare(x.first, y.first) < 0; });
  List groups;
  for (size_t i = 0; i < keyed.size();) {
    List members;
    size_t j = i;
    for (; j < keyed.size() && equals(keyed[j].first, keyed[i].first); ++j)
      members.push_back(keyed[j].second);
    Value grouper = raw_key(members.front());
    groups.emplace_back(List{grouper, Value(std::move(members))}, true);
    i = j;
  }
  return Value(std::move(groups));
}

Value f_attr(Renderer&, const Value& v, Args& a) {
  return get_attr(v, str_param(a, 0, "name", ""));
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> table = {
      {"tojson", f_tojson},
      {"length", f_length},
      {"count", f_length},
      {"first", f_first},
      {"last", f_last},
      {"join", f_join},
      {"upper", f_upper},
      {"lower", f_lower},
      {"title", f_title},
      {"capitalize", f_capitalize},
      {"string", f_string},
      {"safe", f_safe},
      {"escape", f_escape},
      {"e", f_escape},
      {"forceescape", f_escape},
      {"trim", f_trim},
      {"replace", f_replace},
      {"default", f_default},
      {"d", f_default},
      {"list", f_list},
      {"int", f_int},
      {"float", f_float},
      {"abs", f_abs},
      {"round", f_round},
      {"map", f_map},
      {"select", f_select},
      {"reject", f_reject},
      {"selectattr", f_selectattr},
      {"rejectattr", f_rejectattr},
      {"unique", f_unique},
      {"sort", f_sort},
      {"reverse", f_reverse},
      {"items", f_items},
      {"dictsort", f_dictsort},
      {"batch", f_batch},
      {"indent", f_indent},
      {"striptags", f_striptags},
      {"wordcount", f_wordcount},
      {"center", f_center},
      {"min", f_min},
      {"max", f_max},
      {"sum", f_sum},
      {"format", f_format},
      {"truncate", f_truncate},
      {"attr", f_attr},
      {"groupby", f_groupby},
  };
  return table;
}

}  // namespace

FilterFn find_filter(const std::string& name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

}  // namespace kvscope::jinja
