// All trace reads of the GUI happen here, on one worker thread that owns one
// TraceData (and so one TraceReader) per open trace; the UI thread never
// touches HDF5. Requests carry a key (e.g. "heatmap"): a request still
// queued is replaced by a newer one with the same key, and a result whose key
// was requested again meanwhile is dropped, so scrubbing the step slider
// never builds a backlog. Level-of-detail caches are built on a separate
// thread per trace (with its own reader) so they never delay a view.
#pragma once

#include <QObject>
#include <QPointer>
#include <QString>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "views/trace_data.h"

namespace kvscope::views {

class TraceService : public QObject {
  Q_OBJECT
 public:
  explicit TraceService(QObject* parent = nullptr);
  ~TraceService() override;

  // Runs `work` on the worker with the TraceData of `trace` (opened on first
  // use), then `done` on the GUI thread with the result, or `failed` with
  // the error text. Neither runs if `context` is gone or the key was
  // requested again since. Higher `priority` runs first (the view in
  // front before hidden tabs); equal priorities run in request order.
  template <typename R>
  void request(const std::string& trace, const QString& key, std::function<R(TraceData&)> work,
               std::function<void(R)> done, QObject* context,
               std::function<void(QString)> failed = {}, int priority = 0) {
    auto result = std::make_shared<std::optional<R>>();
    auto error = std::make_shared<QString>();
    enqueue(
        trace, key, context, priority,
        [work = std::move(work), result, error](TraceData* data, const QString& open_error) {
          if (!data) {
            *error = open_error;
            return;
          }
          try {
            result->emplace(work(*data));
          } catch (const std::exception& e) {
            *error = QString::fromStdString(e.what());
          }
        },
        [done = std::move(done), failed = std::move(failed), result, error] {
          if (result->has_value()) {
            done(std::move(**result));
          } else if (failed) {
            failed(*error);
          }
        });
  }

  // Starts building (or opening) the LOD cache of a complete trace in the
  // background; lodProgress/lodReady follow. No-op when already started.
  void ensure_lod(const std::string& trace);
  // Forgets a trace (closes its reader on the worker, cancels its LOD build).
  void close(const std::string& trace);
  // Requests processed so far (tests: proves stale ones were skipped).
  int64_t jobs_run() const { return jobs_run_.load(); }
  // Blocks until the queue is empty and the worker idle (tests, export).
  void wait_idle();

 signals:
  void lodProgress(QString trace, qint64 done, qint64 total);
  void lodReady(QString trace, QString cache_path);
  void lodFailed(QString trace, QString error);
  // The trace needs no cache (no pooled attention, or not complete yet).
  void lodNotNeeded(QString trace);

 private:
  struct Job {
    std::string trace;
    QString key;
    uint64_t id = 0;
    int priority = 0;
    QPointer<QObject> context;
    std::function<void(TraceData*, const QString&)> work;  // null data: open failed
    std::function<void()> deliver;
  };
  void enqueue(const std::string& trace, const QString& key, QObject* context, int priority,
               std::function<void(TraceData*, const QString&)> work, std::function<void()> deliver);
  void run();
  TraceData& data_for(const std::string& trace);  // worker thread only

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<Job> queue_;
  bool busy_ = false, stopping_ = false;
  std::map<QString, uint64_t> latest_;                              // GUI thread: newest id per key
  std::map<std::string, std::unique_ptr<TraceData>> traces_;        // worker thread
  std::map<std::string, std::shared_ptr<TraceData*>> lod_targets_;  // guarded by mutex_
  std::map<std::string, std::shared_ptr<const analysis::AttentionLod>> lods_;  // guarded by mutex_
  // Caches being built: the heads done so far (guarded by mutex_).
  std::map<std::string, std::shared_ptr<PartialLod>> partial_lods_;
  std::map<std::string, std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> builders_;
  uint64_t next_id_ = 1;
  std::atomic<int64_t> jobs_run_{0};
  std::thread worker_;
};

}  // namespace kvscope::views
