// The causal map: what `kvscope why TRACE --causal` found (docs/causal.md),
// read from TRACE.causal/causal.json (or, for a replay in such a folder,
// from its folder). Layers x kv heads, each cell coloured by the share of
// the answer's log-probability gap (policy -> every loss restored) that
// restoring it alone recovers: the head's own replay where the search ran
// one (the heads of the minimal set), else its layer's (hatched); the
// minimal set's heads outlined. cell_at() maps a point to the cell and
// trace_of() to the replay to open against the original.
#pragma once

#include <QString>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "views/figure.h"
#include "views/trace_data.h"

namespace kvscope::views {

class CausalFigure : public Figure {
 public:
  // Throws InputError naming causal.json when it is there but unreadable.
  static std::shared_ptr<CausalFigure> load(TraceData& data);
  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  QString missing_data() const override;
  void write_csv(QTextStream& out) const override;

  // The cell (layer, kv head) under `point` in a figure painted into `area`; false: none.
  bool cell_at(const QRectF& area, const QPointF& point, int64_t* layer, int64_t* kv_head) const;
  // The replay trace restoring that cell alone (its head's, else its layer's); "" when none.
  std::string trace_of(int64_t layer, int64_t kv_head) const;
  QString describe(int64_t layer, int64_t kv_head) const;

  enum class Measured : uint8_t { None, Layer, Head };
  struct Cell {
    Measured measured = Measured::None;
    double logprob = 0;  // restored alone
    std::string trace;   // the replay's file in the folder
    bool minimal = false;
  };
  int64_t layers = 0, kv_heads = 0;
  std::vector<Cell> cells;  // [layer * K + kv head]
  double original = 0, full = 0;
  double threshold = 0;  // the log p that counts as recovered (NaN: success decides)
  struct Replay {
    double logprob = 0;
    bool recovered = false;
  };
  std::vector<Replay> replay_list;  // every replay of the search, in order
  bool recoverable = false;
  int64_t replays = 0;
  QString words;   // the search's verdict line
  QString folder;  // of causal.json ("" : none found)

 private:
  struct Layout;
  Layout layout(const QRectF& area) const;
  void read_report(const nlohmann::json& j);
  Cell& cell(int64_t layer, int64_t kv_head);
  double share(const Cell& c) const;
  void paint_replays(QPainter& p, const QRectF& r) const;
};

}  // namespace kvscope::views
