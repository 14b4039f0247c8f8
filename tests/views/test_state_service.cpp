// The current state notifies every view but the one that made the change;
// the worker replaces stale requests and drops superseded results.
#include <QCoreApplication>
#include <QEventLoop>
#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>

#include "tests/views/qt_app.h"
#include "tests/views/synthetic_fixture.h"
#include "views/current_state.h"
#include "views/trace_service.h"

using namespace kvscope;
using views::CurrentState;
using views::Selection;

namespace {
struct Recorder : views::StateObserver {
  std::vector<uint32_t> seen;
  void state_changed(const Selection&, uint32_t changes) override { seen.push_back(changes); }
};
}  // namespace

TEST_CASE("the current state tells every observer but the source, once per real change") {
  CurrentState state;
  Recorder a, b, c;
  state.attach(&a);
  state.attach(&b);
  state.attach(&c);
  state.set_trace("x.h5", 4, 8, 4, 30, 100, &a);
  CHECK(a.seen.empty());
  REQUIRE(b.seen.size() == 1);
  CHECK((b.seen[0] & views::kTraceChanged));
  CHECK(state.selection().step == 29);  // a new trace opens at its last step
  state.set_step(7, &b);
  CHECK(a.seen.size() == 1);
  CHECK(b.seen.size() == 1);
  CHECK(c.seen.size() == 2);
  CHECK(c.seen.back() == views::kStepChanged);
  CHECK(state.set_step(7) == 0);  // no change, no notification
  CHECK(c.seen.size() == 2);
  state.set_step(500);  // clamped to the last step
  CHECK(state.selection().step == 29);
  state.set_head(3, 7, &c);
  CHECK(state.selection().kv_head() == 3);  // 8 heads over 4 kv heads
  CHECK(a.seen.back() == views::kHeadChanged);
  state.set_tokens({50, 12, 50, 400, -1});
  CHECK(state.selection().tokens == std::vector<int64_t>{12, 50});
  state.detach(&c);
  size_t before = c.seen.size();
  state.set_step(0);
  CHECK(c.seen.size() == before);
}

TEST_CASE("the worker replaces queued requests with the same key and drops superseded results") {
  test::qt_app(true);
  std::string path = test::write_trace(test::small_spec());
  views::TraceService service;
  QObject context;
  // Hold the worker in a first job so that the next ones queue up.
  std::mutex m;
  std::condition_variable cv;
  bool release = false, started = false;
  service.request<int>(
      path, "block",
      [&](views::TraceData&) {
        std::unique_lock<std::mutex> lock(m);
        started = true;
        cv.notify_all();
        cv.wait(lock, [&] { return release; });
        return 0;
      },
      [](int) {}, &context);
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return started; });
  }
  std::vector<int> delivered;
  std::atomic<int> ran{0};
  for (int i = 0; i < 50; ++i)
    service.request<int>(
        path, "step",
        [i, &ran](views::TraceData& d) {
          ++ran;
          return i + int(d.reader().n_steps()) * 0;
        },
        [&](int v) { delivered.push_back(v); }, &context);
  int64_t before = service.jobs_run();
  {
    std::lock_guard<std::mutex> lock(m);
    release = true;
  }
  cv.notify_all();
  service.wait_idle();
  QCoreApplication::processEvents(QEventLoop::AllEvents);
  CHECK(ran == 1);  // 49 stale requests never ran
  CHECK(service.jobs_run() - before <= 2);
  REQUIRE(delivered.size() == 1);
  CHECK(delivered[0] == 49);
}

TEST_CASE("the worker runs the view in front before hidden ones") {
  test::qt_app(true);
  std::string path = test::write_trace(test::small_spec());
  views::TraceService service;
  QObject context;
  std::mutex m;
  std::condition_variable cv;
  bool release = false, started = false;
  service.request<int>(
      path, "block",
      [&](views::TraceData&) {
        std::unique_lock<std::mutex> lock(m);
        started = true;
        cv.notify_all();
        cv.wait(lock, [&] { return release; });
        return 0;
      },
      [](int) {}, &context);
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return started; });
  }
  std::vector<std::string> order;  // written by the worker only
  auto job = [&order](std::string name) {
    return std::function<int(views::TraceData&)>([&order, name](views::TraceData&) {
      order.push_back(name);
      return 0;
    });
  };
  service.request<int>(
      path, "hidden", job("hidden"), [](int) {}, &context, {}, 0);
  service.request<int>(
      path, "visible", job("visible"), [](int) {}, &context, {}, 1);
  service.request<int>(
      path, "heatmap", job("heatmap"), [](int) {}, &context, {}, 2);
  service.request<int>(
      path, "hidden2", job("hidden2"), [](int) {}, &context, {}, 0);
  {
    std::lock_guard<std::mutex> lock(m);
    release = true;
  }
  cv.notify_all();
  service.wait_idle();
  CHECK(order == std::vector<std::string>{"heatmap", "visible", "hidden", "hidden2"});
}

TEST_CASE("the worker reports a file that is not a trace through the failure path") {
  test::qt_app(true);
  std::string bad = test::temp_dir() + "/not-a-trace.h5";
  FILE* f = std::fopen(bad.c_str(), "w");
  std::fputs("hello", f);
  std::fclose(f);
  views::TraceService service;
  QObject context;
  QString error;
  bool done = false;
  service.request<int>(
      bad, "open", [](views::TraceData&) { return 1; }, [&](int) { done = true; }, &context,
      [&](QString e) { error = e; });
  service.wait_idle();
  QCoreApplication::processEvents(QEventLoop::AllEvents);
  CHECK_FALSE(done);
  CHECK(error.contains("not-a-trace.h5"));
}
