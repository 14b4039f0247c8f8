// The row tables are declared once (core/trace/row_tables.cpp); the schema,
// the writer, the validator and the reader work from the declarations. These
// cases check the declarations against the catalogue and each other, and that
// a column's declared range is what the writer refuses, in its words.
#include <catch2/catch.hpp>

#include <cstring>
#include <set>

#include "core/trace/error.h"
#include "core/trace/reader.h"
#include "core/trace/row_tables.h"
#include "core/trace/schema.h"
#include "core/trace/writer.h"
#include "tests/core/trace_test_util.h"
#include "tests/support/paths.h"

using namespace kvscope;
using namespace kvscope::trace;

TEST_CASE("every row table's columns are datasets of the catalogue, on the table's own axis",
          "[trace][tables]") {
  std::set<std::string> groups;
  for (const RowTableSpec* t : row_tables()) {
    INFO(t->group);
    CHECK(groups.insert(t->group).second);
    CHECK_FALSE(t->rows_symbol.empty());
    CHECK_FALSE(t->columns.empty());
    CHECK(t->row_size > 0);
    if (t->step_rows) CHECK(t->columns[0].name == "step");
    bool grouped = false;
    for (const GroupSpec& g : group_catalogue()) grouped |= g.path == t->group;
    CHECK(grouped);
    for (const ColumnSpec& c : t->columns) {
      INFO(c.name);
      const DatasetSpec* found = nullptr;
      for (const DatasetSpec& d : dataset_catalogue())
        if (d.path == t->path(c)) found = &d;
      REQUIRE(found != nullptr);
      CHECK(found->elem == c.elem);
      CHECK(found->dims == std::vector<Axis>{Axis::TableRows});
      CHECK(axis_label(*found, 0) == t->rows_symbol);
      CHECK(found->since_minor == t->since_minor);
      CHECK(found->table == t->group);
    }
  }
  // The step tables are the ones StepData carries, in KVSCOPE_STEP_TABLES' order.
  REQUIRE(step_tables().size() == 6);
  CHECK(step_tables()[0] == &table_of<StallRow>());
  CHECK(step_tables()[4] == &table_of<KeyChannelRow>());
  CHECK(step_tables()[5] == &table_of<InterventionRow>());
}

TEST_CASE("a row's fields go into their columns' elements and back unchanged", "[trace][tables]") {
  const MergeRow merge{7, 3, 1, 42, 9, 0.25f};
  MergeRow back{};
  for (const ColumnSpec& c : table_of<MergeRow>().columns) {
    unsigned char element[8] = {};
    c.store(&merge, element);
    c.load(element, &back);
  }
  CHECK(std::memcmp(&merge, &back, sizeof merge) == 0);
  Event e;
  e.kind = EventKind::Demote;
  e.from_tier = 0;
  e.to_tier = 1;
  const ColumnSpec* kind = table_of<Event>().column("kind");
  REQUIRE(kind != nullptr);
  CHECK(kind->elem == Elem::U8);
  CHECK(int_value(*kind, &e) == 4);
}

namespace {
CaptureLayout eight_tokens() {
  CaptureLayout layout;
  layout.max_tokens = 8;
  return layout;
}
}  // namespace

TEST_CASE("the writer refuses a value outside its column's declared range", "[trace][tables]") {
  const LimitSizes sizes = limit_sizes(test::tiny_run(2, 2), eight_tokens(), 3, 5);
  const ColumnSpec& channel = *table_of<KeyChannelRow>().column("channel");
  const KeyChannelRow inside{0, 0, 0, 7}, outside{0, 0, 0, 8};  // head dim 8
  CHECK(range_problem(channel, &inside, sizes).empty());
  CHECK(range_problem(channel, &outside, sizes) == "is 8 (expected a channel 0 .. head_dim - 1)");
  const ColumnSpec& to_tier = *table_of<Event>().column("to_tier");
  Event evicted;
  evicted.to_tier = kNoTier;  // "not cached" is allowed beside the tiers
  CHECK(range_problem(to_tier, &evicted, sizes).empty());
  evicted.to_tier = 3;
  CHECK(range_problem(to_tier, &evicted, sizes) == "is 3 (expected a tier of tier_names or 255)");

  // Through the writer: an event of an unknown kind names its column.
  const std::string path = test::temp_dir() + "/kind.kvtrace.h5";
  auto w = TraceWriter::create(path, test::tiny_run(2, 2), eight_tokens());
  StepData step;
  step.step.kind = StepKind::Prefill;
  step.step.n_tokens = 1;
  step.tokens.push_back({});
  step.occupancy.assign(4, 0);
  step.events.push_back({0, 0, 0, 0, static_cast<EventKind>(9)});
  CHECK_THROWS_WITH(w->append_step(step),
                    Catch::EndsWith("/events/kind: is 9 (expected a kind 0 .. 5)"));
}

TEST_CASE("the reader counts every step table by its group, as kvscope info does",
          "[trace][tables]") {
  const std::string path = test::write_small_trace(test::temp_dir(), "tables.kvtrace.h5", 2);
  auto r = TraceReader::open(path);
  for (const RowTableSpec* t : step_tables()) CHECK(r->table_row_count(t->group) >= 0);
  CHECK(r->table_row_count("/stalls") == r->n_stalls());
  CHECK(r->table_row_count("/merges") == r->n_merges());
  CHECK_THROWS_AS(r->table_row_count("/events"), TraceError);
}
