// Python's str, dict and list methods, as jinja2's immutable sandbox exposes them.
#include <algorithm>

#include "core/jinja/ops.h"
#include "core/jinja/strings.h"

namespace kvscope::jinja {
namespace {

const Value* arg(const Args& args, size_t i, const char* name) {
  return args.get(i, name);
}

std::string str_arg(const Args& args, size_t i, const char* name, const std::string& method) {
  const Value* v = arg(args, i, name);
  if (!v) throw_type_error(method + "() missing required argument");
  if (!v->is_string()) throw_type_error("must be str, not " + v->type_name());
  return v->str();
}

int64_t int_arg(const Args& args, size_t i, const char* name, int64_t dflt) {
  const Value* v = arg(args, i, name);
  if (!v || v->is_none()) return dflt;
  if (!v->is_int() && !v->is_bool())
    throw_type_error("'" + v->type_name() + "' object cannot be interpreted as an integer");
  return v->as_int();
}

// Optional chars argument of strip/lstrip/rstrip; nullptr = whitespace.
Value strip_method(const std::string& s, const Args& args, bool left, bool right) {
  const Value* chars = arg(args, 0, "chars");
  if (chars && !chars->is_none() && !chars->is_string())
    throw_type_error("strip arg must be None or str");
  bool whitespace = !chars || chars->is_none();
  return Value(strip_chars(s, whitespace ? nullptr : &chars->str(), left, right));
}

bool prefix_or_suffix(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& v) {
    if (!v.is_string())
      throw_type_error(std::string(prefix ? "startswith" : "endswith") +
                       " first arg must be str or a tuple of str, not " + v.type_name());
    const std::string& a = v.str();
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0
                  : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_tuple()) {
    for (const Value& v : affix.list())
      if (one(v)) return true;
    return false;
  }
  return one(affix);
}

Value list_of(const std::vector<std::string>& parts) {
  List out;
  for (const auto& p : parts) out.emplace_back(p);
  return Value(std::move(out));
}

int64_t find_in(const std::string& s, const std::string& sub, bool reverse) {
  size_t at = reverse ? s.rfind(sub) : s.find(sub);
  if (at == std::string::npos) return -1;
  return static_cast<int64_t>(utf8_length(s.substr(0, at)));
}

bool all_chars(const std::string& s, bool (*pred)(uint32_t)) {
  if (s.empty()) return false;
  for (uint32_t cp : code_points(s))
    if (!pred(cp)) return false;
  return true;
}

Value string_query(const std::string& s, const std::string& name, Args& args);

// The methods that build a new string or list: strip, case, split, replace.
Value string_method(const std::string& s, const std::string& name, Args& args) {
  if (name == "strip") return strip_method(s, args, true, true);
  if (name == "lstrip") return strip_method(s, args, true, false);
  if (name == "rstrip") return strip_method(s, args, false, true);
  if (name == "upper") return Value(to_upper(s));
  if (name == "lower") return Value(to_lower(s));
  if (name == "title") return Value(to_title(s));
  if (name == "capitalize") return Value(capitalize(s));
  if (name == "split" || name == "rsplit") {
    const Value* sep = arg(args, 0, "sep");
    int64_t maxsplit = int_arg(args, 1, "maxsplit", -1);
    if (sep && !sep->is_none()) {
      if (!sep->is_string()) throw_type_error("must be str or None, not " + sep->type_name());
      if (sep->str().empty()) throw TemplateError("empty separator", "ValueError");
      return list_of(split_sep(s, sep->str(), maxsplit, name == "rsplit"));
    }
    return list_of(split_whitespace(s, maxsplit, name == "rsplit"));
  }
  if (name == "splitlines") {
    const Value* keep = arg(args, 0, "keepends");
    return list_of(split_lines(s, keep && keep->truthy()));
  }
  return string_query(s, name, args);
}

// The methods that inspect rather than transform: find, count, is*, ...
Value string_query(const std::string& s, const std::string& name, Args& args) {
  if (name == "startswith" || name == "endswith") {
    const Value* affix = arg(args, 0, "prefix");
    if (!affix) throw_type_error(name + "() takes at least 1 argument (0 given)");
    const Value* start = arg(args, 1, "start");
    if (start && (start->is_int() || start->is_bool())) {
      Value rest = slice(Value(s), start, arg(args, 2, "end"), nullptr);
      return Value(prefix_or_suffix(rest.str(), *affix, name == "startswith"));
    }
    return Value(prefix_or_suffix(s, *affix, name == "startswith"));
  }
  if (name == "replace") {
    std::string from = str_arg(args, 0, "old", name), to = str_arg(args, 1, "new", name);
    return Value(replace_all(s, from, to, int_arg(args, 2, "count", -1)));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    int64_t at = find_in(s, str_arg(args, 0, "sub", name), name[0] == 'r');
    if (at < 0 && (name == "index" || name == "rindex"))
      throw TemplateError("substring not found", "ValueError");
    return Value(at);
  }
  if (name == "count") return Value(count_occurrences(s, str_arg(args, 0, "sub", name)));
  if (name == "join") {
    const Value* items = arg(args, 0, "iterable");
    if (!items) throw_type_error("join() takes exactly one argument (0 given)");
    std::string out;
    size_t index = 0;
    for (const Value& v : iterate(*items)) {
      if (!v.is_string())
        throw_type_error("sequence item " + std::to_string(index) + ": expected str instance, " +
                         v.type_name() + " found");
      out += (index++ ? s : "") + v.str();
    }
    return Value(out);
  }
  if (name == "swapcase") {
    std::string out;
    for (const std::string& c : utf8_chars(s)) {
      std::string up = to_upper(c);
      out += up != c ? up : to_lower(c);
    }
    return Value(out);
  }
  if (name == "casefold") return Value(to_lower(s));
  if (name == "removeprefix" || name == "removesuffix") {
    std::string affix = str_arg(args, 0, "prefix", name);
    bool prefix = name == "removeprefix";
    if (affix.empty() || !prefix_or_suffix(s, Value(affix), prefix)) return Value(s);
    return Value(prefix ? s.substr(affix.size()) : s.substr(0, s.size() - affix.size()));
  }
  if (name == "partition" || name == "rpartition") {
    std::string sep = str_arg(args, 0, "sep", name);
    if (sep.empty()) throw TemplateError("empty separator", "ValueError");
    size_t at = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (at == std::string::npos)
      return name == "partition" ? Value(List{Value(s), Value(""), Value("")}, true)
                                 : Value(List{Value(""), Value(""), Value(s)}, true);
    return Value(List{Value(s.substr(0, at)), Value(sep), Value(s.substr(at + sep.size()))}, true);
  }
  if (name == "ljust" || name == "rjust" || name == "zfill") {
    int64_t width = int_arg(args, 0, "width", 0);
    int64_t n = static_cast<int64_t>(utf8_length(s));
    if (width <= n) return Value(s);
    std::string fill = name == "zfill"            ? "0"
                       : arg(args, 1, "fillchar") ? str_arg(args, 1, "fillchar", name)
                                                  : " ";
    std::string pad;
    for (int64_t i = 0; i < width - n; ++i) pad += fill;
    if (name == "ljust") return Value(s + pad);
    if (name == "zfill" && !s.empty() && (s[0] == '-' || s[0] == '+'))
      return Value(s.substr(0, 1) + pad + s.substr(1));
    return Value(pad + s);
  }
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric")
    return Value(all_chars(s, [](uint32_t c) { return c >= '0' && c <= '9'; }));
  if (name == "isalpha") return Value(all_chars(s, is_alpha));
  if (name == "isalnum")
    return Value(all_chars(s, [](uint32_t c) { return is_alpha(c) || (c >= '0' && c <= '9'); }));
  if (name == "isspace") return Value(all_chars(s, is_whitespace));
  if (name == "islower") return Value(s != to_upper(s) && s == to_lower(s));
  if (name == "isupper") return Value(s != to_lower(s) && s == to_upper(s));
  throw TemplateError("no such method", "AttributeError");
}

Value dict_method(const Value& d, const std::string& name, Args& args) {
  const Dict& dict = d.dict_ref();
  if (name == "items" || name == "keys" || name == "values") {
    List out;
    for (const auto& kv : dict.items) {
      if (name == "items")
        out.emplace_back(List{kv.first, kv.second}, true);
      else
        out.push_back(name == "keys" ? kv.first : kv.second);
    }
    return Value(std::move(out));
  }
  // get
  const Value* key = arg(args, 0, "key");
  if (!key) throw_type_error("get expected at least 1 argument, got 0");
  if (const Value* v = dict.find(*key)) return *v;
  const Value* dflt = arg(args, 1, "default");
  return dflt ? *dflt : Value(nullptr);
}

Value list_method(const Value& l, const std::string& name, Args& args) {
  const Value* x = arg(args, 0, "value");
  if (!x) throw_type_error(name + "() takes exactly one argument (0 given)");
  const List& items = l.list();
  if (name == "count")
    return Value(static_cast<int64_t>(
        std::count_if(items.begin(), items.end(), [&](const Value& v) { return equals(v, *x); })));
  for (size_t i = 0; i < items.size(); ++i)
    if (equals(items[i], *x)) return Value(static_cast<int64_t>(i));
  throw TemplateError(x->repr() + " is not in list", "ValueError");
}

bool one_of(const std::string& name, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (name == n) return true;
  return false;
}

}  // namespace

Value bound_method(const Value& obj, const std::string& name, bool* found) {
  *found = true;
  std::string type;
  if (obj.is_string()) {
    if (one_of(
            name,
            {"strip",        "lstrip",    "rstrip",     "upper",      "lower",      "title",
             "capitalize",   "split",     "rsplit",     "splitlines", "startswith", "endswith",
             "replace",      "find",      "rfind",      "index",      "rindex",     "count",
             "join",         "isdigit",   "isdecimal",  "isnumeric",  "isalpha",    "isalnum",
             "isspace",      "islower",   "isupper",    "swapcase",   "casefold",   "removeprefix",
             "removesuffix", "partition", "rpartition", "ljust",      "rjust",      "zfill"})) {
      std::string s = obj.str();
      return Value::function("str." + name,
                             [s, name](Args& a) { return string_method(s, name, a); });
    }
  } else if (obj.is_dict() && !obj.is_namespace()) {
    if (one_of(name, {"items", "keys", "values", "get"}))
      return Value::function("dict." + name,
                             [obj, name](Args& a) { return dict_method(obj, name, a); });
    if (one_of(name, {"pop", "popitem", "setdefault", "update", "clear"})) type = "dict";
  } else if (obj.is_list() && !obj.is_tuple()) {
    if (one_of(name, {"index", "count"}))
      return Value::function("list." + name,
                             [obj, name](Args& a) { return list_method(obj, name, a); });
    if (one_of(name, {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"}))
      type = "list";
  } else if (obj.is_tuple() && one_of(name, {"index", "count"})) {
    return Value::function("tuple." + name,
                           [obj, name](Args& a) { return list_method(obj, name, a); });
  }
  if (!type.empty()) {
    // jinja2's unsafe_undefined: any use raises SecurityError.
    return Value::undefined("access to attribute '" + name + "' of '" + type +
                            "' object is unsafe.");
  }
  *found = false;
  return Value();
}

}  // namespace kvscope::jinja
