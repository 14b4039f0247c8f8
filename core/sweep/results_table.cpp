#include "core/sweep/results_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "core/common/atomic_file.h"
#include "core/common/input_error.h"
#include "core/common/parquet_writer.h"

namespace kvscope::sweep {

namespace {

using Kind = ResultColumn::Kind;

std::string quoted(const std::string& field) {
  if (field.find_first_of(",\"\n\r") == std::string::npos) return field;
  std::string out = "\"";
  for (char c : field) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string format_real(double x) {
  std::ostringstream o;
  o.precision(10);
  o << x;
  return o.str();
}

// One CSV record and the line it starts on.
struct Record {
  int64_t line = 0;
  std::vector<std::string> fields;
};

// RFC 4180: fields separated by commas, quoted fields may hold commas,
// doubled quotes and newlines (generated text does).
std::vector<Record> parse_csv(const std::string& text) {
  std::vector<Record> records;
  Record cur{1, {}};
  std::string field;
  bool quoted_field = false, in_quotes = false;
  int64_t line = 1;
  auto end_field = [&] {
    cur.fields.push_back(field);
    field.clear();
    quoted_field = false;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_quotes) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        in_quotes = false;
      } else {
        line += c == '\n';
        field += c;
      }
    } else if (c == '"' && field.empty() && !quoted_field) {
      in_quotes = quoted_field = true;
    } else if (c == ',') {
      end_field();
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      end_field();
      records.push_back(cur);
      cur = Record{++line, {}};
    } else {
      field += c;
    }
  }
  // A record counts once its newline is written: a worker appending a row
  // while another process reads leaves a torn last record, which is the
  // unfinished cell and is dropped (it runs again).
  return records;
}

void set_field(const ResultColumn& col, const std::string& value, const std::string& where,
               ResultRow& row) {
  if (col.kind == Kind::Text) {
    row.*col.text = value;
    return;
  }
  if (value.empty()) return;  // unknown (a failed cell's metrics)
  const char* begin = value.c_str();
  char* end = nullptr;
  if (col.kind == Kind::Integer) {
    const long long v = std::strtoll(begin, &end, 10);
    if (*end != '\0') throw InputError(where, col.name, "expected an integer, got '" + value + "'");
    row.*col.integer = v;
  } else {
    const double v = std::strtod(begin, &end);
    if (*end != '\0') throw InputError(where, col.name, "expected a number, got '" + value + "'");
    row.*col.real = v;
  }
}

// The task spec without the tokens/depth/seed a sweep appends ("niah:keys=4").
std::string task_base_of(const std::string& task) {
  const size_t at = task.find("tokens=");
  if (at == std::string::npos) return task;
  std::string base = task.substr(0, at);
  if (!base.empty() && (base.back() == ',' || base.back() == ':')) base.pop_back();
  return base;
}

}  // namespace

double ResultRow::needle_survival() const {
  if (!needle_heads_whole || !n_heads || *n_heads <= 0) return std::nan("");
  return double(*needle_heads_whole) / double(*n_heads);
}

const std::vector<ResultColumn>& result_columns() {
  using R = ResultRow;
  static const std::vector<ResultColumn> columns = {
      {"cell_id", Kind::Text, &R::cell_id},
      {"model", Kind::Text, &R::model},
      {"policy", Kind::Text, &R::policy},
      {"task", Kind::Text, &R::task},
      {"tokens", Kind::Integer, nullptr, &R::tokens},
      {"depth", Kind::Real, nullptr, nullptr, &R::depth},
      {"seed", Kind::Integer, nullptr, &R::seed},
      {"status", Kind::Text, &R::status},
      {"success", Kind::Integer, nullptr, &R::success},
      {"expected", Kind::Text, &R::expected},
      {"generated", Kind::Text, &R::generated},
      {"needle_heads_whole", Kind::Integer, nullptr, &R::needle_heads_whole},
      {"needle_heads_none", Kind::Integer, nullptr, &R::needle_heads_none},
      {"n_heads", Kind::Integer, nullptr, &R::n_heads},
      {"lost_mass", Kind::Real, nullptr, nullptr, &R::lost_mass},
      {"max_kl", Kind::Real, nullptr, nullptr, &R::max_kl},
      {"wall_s", Kind::Real, nullptr, nullptr, &R::wall_s},
      {"trace", Kind::Text, &R::trace},
      {"error", Kind::Text, &R::error},
      {"task_base", Kind::Text, &R::task_base, nullptr, nullptr, true},
      {"score", Kind::Real, nullptr, nullptr, &R::score, true},
      {"device", Kind::Text, &R::device, nullptr, nullptr, true},
      {"dtype", Kind::Text, &R::dtype, nullptr, nullptr, true},
      {"budget", Kind::Real, nullptr, nullptr, &R::budget, true},
      {"kv_bytes_mean", Kind::Real, nullptr, nullptr, &R::kv_bytes_mean, true},
      {"kv_bytes_peak", Kind::Integer, nullptr, &R::kv_bytes_peak, nullptr, true},
      {"causal_set", Kind::Text, &R::causal_set, nullptr, nullptr, true},
      {"causal_set_size", Kind::Integer, nullptr, &R::causal_set_size, nullptr, true},
      {"causal_replays", Kind::Integer, nullptr, &R::causal_replays, nullptr, true},
      {"causal_minimal", Kind::Integer, nullptr, &R::causal_minimal, nullptr, true},
      {"n_kv_heads", Kind::Integer, nullptr, &R::n_kv_heads, nullptr, true},
  };
  return columns;
}

std::string csv_header() {
  std::string out;
  for (const ResultColumn& c : result_columns())
    out += (out.empty() ? "" : ",") + std::string(c.name);
  return out;
}

std::string csv_row(const ResultRow& row) {
  std::string out;
  bool first = true;
  for (const ResultColumn& c : result_columns()) {
    if (!first) out += ',';
    first = false;
    if (c.kind == Kind::Text) {
      out += quoted(row.*c.text);
    } else if (c.kind == Kind::Integer) {
      if (const auto& v = row.*c.integer) out += std::to_string(*v);
    } else if (const auto& v = row.*c.real; v && !std::isnan(*v)) {
      out += format_real(*v);
    }
  }
  return out;
}

std::vector<ResultRow> read_results_csv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", "cannot open the results table");
  std::stringstream buf;
  buf << in.rdbuf();
  const std::vector<Record> records = parse_csv(buf.str());
  if (records.empty())
    throw InputError(path, "header", "empty file (expected " + csv_header() + ")");
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < records[0].fields.size(); ++i) index[records[0].fields[i]] = i;
  std::vector<std::pair<const ResultColumn*, size_t>> present;
  for (const ResultColumn& c : result_columns()) {
    const auto it = index.find(c.name);
    if (it != index.end())
      present.emplace_back(&c, it->second);
    else if (!c.added_later)
      throw InputError(path + ":1", "header", std::string("column '") + c.name + "' missing");
  }
  std::vector<ResultRow> rows;
  for (size_t r = 1; r < records.size(); ++r) {
    const Record& rec = records[r];
    if (rec.fields.size() == 1 && rec.fields[0].empty()) continue;  // blank line
    const std::string where = path + ":" + std::to_string(rec.line);
    if (rec.fields.size() != records[0].fields.size())
      throw InputError(where, "row",
                       "expected " + std::to_string(records[0].fields.size()) + " fields, got " +
                           std::to_string(rec.fields.size()));
    ResultRow row;
    for (const auto& [col, i] : present) set_field(*col, rec.fields[i], where, row);
    if (row.task_base.empty()) row.task_base = task_base_of(row.task);
    rows.push_back(std::move(row));
  }
  return rows;
}

void write_results_csv(const std::string& path, const std::vector<ResultRow>& rows) {
  write_stream_atomically(
      path,
      [&](std::ostream& out) {
        out << csv_header() << "\n";
        for (const ResultRow& r : rows) out << csv_row(r) << "\n";
      },
      "the results table");
}

void write_results_parquet(const std::string& path, const std::vector<ResultRow>& rows) {
  std::vector<parquet::Column> columns;
  for (const ResultColumn& c : result_columns()) {
    parquet::Column col;
    col.name = c.name;
    col.type = c.kind == Kind::Text      ? parquet::Column::Type::Text
               : c.kind == Kind::Integer ? parquet::Column::Type::Int64
                                         : parquet::Column::Type::Double;
    for (const ResultRow& r : rows) {
      if (c.kind == Kind::Text) {
        col.text.push_back(r.*c.text);
      } else if (c.kind == Kind::Integer) {
        col.integers.push_back(r.*c.integer);
      } else {
        const auto& v = r.*c.real;
        col.reals.push_back(v && !std::isnan(*v) ? v : std::nullopt);
      }
    }
    columns.push_back(std::move(col));
  }
  try {
    parquet::write_table(path, columns, "kvscope sweep");
  } catch (const std::runtime_error& e) {
    throw InputError(path, "", e.what());
  }
}

std::string results_csv_path(const std::string& dir) {
  return (std::filesystem::path(dir) / "results.csv").string();
}

std::string results_parquet_path(const std::string& dir) {
  return (std::filesystem::path(dir) / "results.parquet").string();
}

std::string shard_csv_path(const std::string& dir, int shard, int shards) {
  return (std::filesystem::path(dir) / "shards" /
          ("results." + std::to_string(shard) + "-of-" + std::to_string(shards) + ".csv"))
      .string();
}

std::vector<ResultRow> gather_results(const std::string& dir,
                                      const std::vector<std::string>& plan_order) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  if (fs::exists(results_csv_path(dir))) files.push_back(results_csv_path(dir));
  const fs::path shards = fs::path(dir) / "shards";
  if (fs::is_directory(shards)) {
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(shards))
      if (e.path().extension() == ".csv") found.push_back(e.path().string());
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  std::map<std::string, ResultRow> by_cell;
  std::vector<std::string> seen_order;
  for (const std::string& f : files)
    for (ResultRow& r : read_results_csv(f)) {
      const auto it = by_cell.find(r.cell_id);
      if (it == by_cell.end()) {
        seen_order.push_back(r.cell_id);
        by_cell.emplace(r.cell_id, std::move(r));
      } else if (!it->second.ok() && r.ok()) {
        it->second = std::move(r);
      }
    }
  std::vector<ResultRow> rows;
  for (const std::string& id : plan_order) {
    const auto it = by_cell.find(id);
    if (it == by_cell.end()) continue;
    rows.push_back(std::move(it->second));
    by_cell.erase(it);
  }
  for (const std::string& id : seen_order)
    if (by_cell.count(id)) rows.push_back(std::move(by_cell.at(id)));
  return rows;
}

std::set<std::string> finished_cells_in(const std::string& dir, bool count_failed) {
  std::set<std::string> done;
  for (const ResultRow& r : gather_results(dir, {}))
    if (r.ok() || count_failed) done.insert(r.cell_id);
  return done;
}

std::vector<ResultRow> collect_results(const std::string& dir,
                                       const std::vector<std::string>& plan_order) {
  std::vector<ResultRow> rows = gather_results(dir, plan_order);
  write_results_csv(results_csv_path(dir), rows);
  write_results_parquet(results_parquet_path(dir), rows);
  write_leaderboard_csv(leaderboard_csv_path(dir), rows);
  return rows;
}

std::string leaderboard_csv_path(const std::string& dir) {
  return (std::filesystem::path(dir) / "leaderboard.csv").string();
}

std::string press_of(const ResultRow& r) {
  if (!r.budget) return r.policy;
  std::string spec = r.policy;
  const size_t first_end = std::min(spec.find('+'), spec.size());
  const size_t at = spec.rfind("budget=", first_end);
  if (at == std::string::npos || at == 0 || (spec[at - 1] != ',' && spec[at - 1] != ':'))
    return spec;
  const size_t end = std::min(spec.find(',', at), first_end);
  if (spec[at - 1] == ',')
    spec.erase(at - 1, end - (at - 1));
  else if (end < first_end)  // "name:budget=B,k=v": the comma after it goes
    spec.erase(at, end + 1 - at);
  else  // "name:budget=B": the colon goes too
    spec.erase(at - 1, end - (at - 1));
  return spec;
}

std::string dataset_of(const ResultRow& r) {
  std::string spec = r.task_base;
  if (spec.rfind("dataset:", 0) != 0) return spec;
  for (const char* key : {"row=", "question="}) {
    const size_t at = spec.find(key);
    if (at == std::string::npos || at == 0 || (spec[at - 1] != ',' && spec[at - 1] != ':'))
      continue;
    const size_t end = std::min(spec.find(',', at), spec.size());
    if (spec[at - 1] == ',')
      spec.erase(at - 1, end - (at - 1));
    else  // "dataset:row=N,...": its comma goes
      spec.erase(at, end + (end < spec.size()) - at);
  }
  return spec;
}

namespace {

double compression_ratio(const ResultRow& r) {
  if (!r.budget) return 0;
  if (*r.budget <= 1) return 1 - *r.budget;
  return r.tokens && *r.tokens > 0 ? std::max(0.0, 1 - *r.budget / double(*r.tokens)) : 0.0;
}

}  // namespace

void write_leaderboard_csv(const std::string& path, const std::vector<ResultRow>& rows) {
  struct Line {
    double sum = 0;
    int64_t n = 0;
  };
  std::map<std::tuple<std::string, std::string, std::string, double>, Line> lines;
  for (const ResultRow& r : rows) {
    if (!r.ok() || !r.score || std::isnan(*r.score)) continue;
    Line& l = lines[{r.model, dataset_of(r), press_of(r), compression_ratio(r)}];
    l.sum += *r.score;
    ++l.n;
  }
  write_stream_atomically(
      path,
      [&](std::ostream& out) {
        out << "model,dataset,press,compression_ratio,score,n\n";
        for (const auto& [key, l] : lines)
          out << quoted(std::get<0>(key)) << "," << quoted(std::get<1>(key)) << ","
              << quoted(std::get<2>(key)) << "," << format_real(std::get<3>(key)) << ","
              << format_real(100.0 * l.sum / double(l.n)) << "," << l.n << "\n";
      },
      "the leaderboard table");
}

}  // namespace kvscope::sweep
