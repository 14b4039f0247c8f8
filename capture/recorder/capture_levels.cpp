#include "capture/recorder/capture_levels.h"

#include <cstdlib>

#include "core/common/input_error.h"

namespace kvscope::recorder {

namespace {

int64_t parse_positive(const std::string& item, const std::string& value, int64_t max) {
  char* end = nullptr;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != 0 || v < 1 || v > max)
    throw InputError("--capture", item, "expected an integer in 1.." + std::to_string(max));
  return v;
}

std::vector<std::string> split_items(const std::string& spec) {
  // '+' separates levels; ',' does too, except inside dense:L.H,L.H lists.
  std::vector<std::string> items;
  std::string current;
  for (char c : spec) {
    bool sep = c == '+' || (c == ',' && current.rfind("dense:", 0) != 0);
    if (sep) {
      if (!current.empty()) items.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) items.push_back(current);
  return items;
}

}  // namespace

CaptureLevels parse_capture_levels(const std::string& spec, int64_t n_layers, int64_t n_heads) {
  CaptureLevels out;
  std::vector<std::string> items = split_items(spec);
  if (items.empty())
    throw InputError("--capture", "", "empty (expected e.g. events or received+pooled)");
  std::vector<std::string> names;
  for (const std::string& item : items) {
    size_t colon = item.find(':');
    std::string key = item.substr(0, colon);
    std::string arg = colon == std::string::npos ? "" : item.substr(colon + 1);
    if (key == "none" && arg.empty()) {
      out.none = true;
    } else if (key == "events" && arg.empty()) {
    } else if (key == "received" && arg.empty()) {
      out.received = true;
    } else if (key == "pooled") {
      out.pooled_block = arg.empty() ? 16 : parse_positive(item, arg, 1 << 16);
    } else if (key == "topk") {
      out.topk = parse_positive(item, arg, 1024);
    } else if (key == "dense") {
      size_t pos = 0;
      while (pos < arg.size()) {
        size_t comma = arg.find(',', pos);
        std::string pair =
            arg.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        size_t dot = pair.find('.');
        if (dot == std::string::npos)
          throw InputError("--capture", item, "'" + pair + "' is not LAYER.HEAD");
        int64_t l = std::strtoll(pair.substr(0, dot).c_str(), nullptr, 10);
        int64_t h = std::strtoll(pair.substr(dot + 1).c_str(), nullptr, 10);
        if (pair.find_first_not_of("0123456789.") != std::string::npos || l < 0 || l >= n_layers ||
            h < 0 || h >= n_heads)
          throw InputError("--capture", item,
                           "'" + pair + "' is not LAYER.HEAD with layer < " +
                               std::to_string(n_layers) + " and head < " + std::to_string(n_heads));
        out.dense.emplace_back(int32_t(l), int32_t(h));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
      if (out.dense.empty())
        throw InputError("--capture", item, "expected dense:LAYER.HEAD[,LAYER.HEAD...]");
    } else {
      throw InputError(
          "--capture", item,
          "unknown level (expected none, events, received, pooled[:B], dense:L.H,..., topk:K)");
    }
    names.push_back(item);
  }
  if (out.none && items.size() > 1)
    throw InputError("--capture", "none", "cannot be combined with other levels");
  out.text = "events";
  for (const std::string& n : names)
    if (n != "events") out.text += "+" + n;
  if (out.none) out.text = "none";
  return out;
}

}  // namespace kvscope::recorder
