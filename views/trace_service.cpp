#include "views/trace_service.h"

#include <QMetaObject>
#include <algorithm>

namespace kvscope::views {

TraceService::TraceService(QObject* parent) : QObject(parent) {
  worker_ = std::thread([this] { run(); });
}

TraceService::~TraceService() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  wake_.notify_all();
  worker_.join();
  for (auto& [path, b] : builders_) {
    b.second->store(true);
    if (b.first.joinable()) b.first.join();
  }
}

void TraceService::enqueue(const std::string& trace, const QString& key, QObject* context,
                           int priority, std::function<void(TraceData*, const QString&)> work,
                           std::function<void()> deliver) {
  std::lock_guard<std::mutex> lock(mutex_);
  Job job{trace, key, next_id_++, priority, context, std::move(work), std::move(deliver)};
  latest_[key] = job.id;
  for (Job& queued : queue_)
    if (queued.key == key && queued.priority == priority) {  // stale: replace, keep its turn
      queued = std::move(job);
      return;
    }
  for (auto it = queue_.begin(); it != queue_.end(); ++it)
    if (it->key == key) {  // stale, but the priority changed: requeue below
      queue_.erase(it);
      break;
    }
  auto at = std::find_if(queue_.begin(), queue_.end(),
                         [&](const Job& q) { return q.priority < job.priority; });
  queue_.insert(at, std::move(job));
  wake_.notify_one();
}

TraceData& TraceService::data_for(const std::string& trace) {
  auto it = traces_.find(trace);
  if (it == traces_.end()) {
    it = traces_.emplace(trace, std::make_unique<TraceData>(trace::TraceReader::open(trace))).first;
    it->second->peer = [this](const std::string& other) -> TraceData& { return data_for(other); };
  }
  std::shared_ptr<const analysis::AttentionLod> lod;
  std::shared_ptr<const PartialLod> partial;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto l = lods_.find(trace);
    if (l != lods_.end()) lod = l->second;
    auto pl = partial_lods_.find(trace);
    if (pl != partial_lods_.end()) partial = pl->second;
  }
  if (lod && it->second->lod() != lod) it->second->set_lod(lod);
  if (it->second->partial_lod() != partial) it->second->set_partial_lod(partial);
  return *it->second;
}

void TraceService::run() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      busy_ = false;
      idle_.notify_all();
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    if (job.key == "__close__") {
      traces_.erase(job.trace);
      continue;
    }
    TraceData* data = nullptr;
    QString open_error;
    try {
      data = &data_for(job.trace);
    } catch (const std::exception& e) {
      open_error = QString::fromStdString(e.what());
    }
    job.work(data, open_error);
    ++jobs_run_;
    QPointer<QObject> ctx = job.context;
    uint64_t id = job.id;
    QString key = job.key;
    auto deliver = std::move(job.deliver);
    QMetaObject::invokeMethod(
        this,
        [this, ctx, id, key, deliver] {
          if (!ctx || latest_[key] != id) return;  // a newer request superseded this one
          deliver();
        },
        Qt::QueuedConnection);
  }
}

void TraceService::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void TraceService::ensure_lod(const std::string& trace) {
  if (builders_.count(trace)) return;
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  QString qtrace = QString::fromStdString(trace);
  std::thread t([this, trace, qtrace, cancel] {
    try {
      auto reader = trace::TraceReader::open(trace);
      if (reader->layout().pooled_block <= 0 || !reader->complete()) {
        QMetaObject::invokeMethod(
            this, [this, qtrace] { emit lodNotNeeded(qtrace); }, Qt::QueuedConnection);
        return;
      }
      std::string path = analysis::AttentionLod::default_cache_path(trace);
      auto partial = std::make_shared<PartialLod>(reader->n_layers(), reader->n_heads());
      {
        std::lock_guard<std::mutex> lock(mutex_);
        partial_lods_[trace] = partial;
      }
      auto lod = analysis::AttentionLod::open_or_build(
          *reader, path,
          [&](int64_t done, int64_t total) {
            if (done % 16 == 0 || done == total)
              QMetaObject::invokeMethod(
                  this, [this, qtrace, done, total] { emit lodProgress(qtrace, done, total); },
                  Qt::QueuedConnection);
          },
          cancel.get(),
          [&](int layer, int head, const analysis::AttentionGrid& thumb,
              const std::vector<float>& metrics) { partial->add(layer, head, thumb, metrics); });
      if (!lod) return;
      std::shared_ptr<const analysis::AttentionLod> shared(std::move(lod));
      {
        std::lock_guard<std::mutex> lock(mutex_);
        lods_[trace] = shared;
        partial_lods_.erase(trace);
      }
      QString cache = QString::fromStdString(path);
      QMetaObject::invokeMethod(
          this, [this, qtrace, cache] { emit lodReady(qtrace, cache); }, Qt::QueuedConnection);
    } catch (const std::exception& e) {
      QString msg = QString::fromStdString(e.what());
      QMetaObject::invokeMethod(
          this, [this, qtrace, msg] { emit lodFailed(qtrace, msg); }, Qt::QueuedConnection);
    }
  });
  builders_.emplace(trace, std::make_pair(std::move(t), cancel));
}

void TraceService::close(const std::string& trace) {
  auto b = builders_.find(trace);
  if (b != builders_.end()) {
    b->second.second->store(true);
    if (b->second.first.joinable()) b->second.first.join();
    builders_.erase(b);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lods_.erase(trace);
    partial_lods_.erase(trace);
  }
  enqueue(
      trace, "__close__", this, 0, [](TraceData*, const QString&) {}, [] {});
}

}  // namespace kvscope::views
