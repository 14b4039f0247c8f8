"""Sweep: the results of `kvscope sweep` (docs/sweeps.md) as pandas frames."""
import os

import pandas as pd

from .trace import Trace, TraceError, why

# Columns whose empty CSV fields are missing numbers (a failed cell's metrics).
_INTEGER = ["tokens", "seed", "success", "needle_heads_whole", "needle_heads_none", "n_heads"]
_REAL = ["depth", "lost_mass", "max_kl", "wall_s"]


def sweep(folder):
    """Opens a sweep's output folder (results.csv or results.parquet, traces/)."""
    return Sweep(folder)


def _read_csv(path):
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    for c in _INTEGER:
        frame[c] = pd.to_numeric(frame[c].replace("", None)).astype("Int64")
    for c in _REAL:
        frame[c] = pd.to_numeric(frame[c].replace("", None)).astype(float)
    if "score" not in frame:  # tables written before the column existed: success decides
        frame["score"] = frame["success"].astype(float)
    else:
        frame["score"] = pd.to_numeric(frame["score"].replace("", None)).astype(float)
    if "task_base" not in frame:  # tables written before the column existed
        frame["task_base"] = frame["task"].str.replace(r"[:,]?tokens=.*$", "", regex=True)
    return frame


class Sweep:
    def __init__(self, folder):
        self.folder = os.fspath(folder)
        csv = os.path.join(self.folder, "results.csv")
        if not os.path.exists(csv):
            raise TraceError(f"{csv}: no results table (run `kvscope sweep PLAN -o "
                             f"{self.folder}`, or `--collect` after a Slurm run)")
        self.results = _read_csv(csv)
        """One row per cell: policy, task, tokens, depth, seed, status, success, score (the
        share of the expected answers found), needle columns, lost_mass, max_kl, wall_s; `trace` is an absolute path ('' when it failed)."""
        self.results["trace"] = [os.path.join(self.folder, t) if t else ""
                                 for t in self.results["trace"]]
        self.results["needle_survival"] = (self.results["needle_heads_whole"] /
                                           self.results["n_heads"]).astype(float)

    def __len__(self):
        return len(self.results)

    def _row(self, cell_id):
        rows = self.results[self.results["cell_id"] == cell_id]
        if rows.empty:
            raise KeyError(f"{self.folder}: no cell {cell_id}")
        return rows.iloc[0]

    def open(self, cell_id):  # noqa: A003
        """The cell's trace (kvscope.Trace)."""
        row = self._row(cell_id)
        if not row["trace"]:
            raise TraceError(f"cell {cell_id} failed: {row['error']}")
        return Trace(row["trace"])

    def why(self, cell_id, kvscope=None):
        """`kvscope why --json` on the cell's trace."""
        return why(self._row(cell_id)["trace"], kvscope=kvscope)

    def grid(self, policy, task, value="success"):
        """The needle-in-a-haystack grid of one policy and task: depth (rows) by length
        (columns) of `value` (success, needle_survival, max_kl, ...), averaged over seeds."""
        cells = self.results[(self.results["policy"] == policy) &
                             (self.results["task_base"] == task) & (self.results["status"] == "ok")]
        if cells.empty:
            raise KeyError(f"{self.folder}: no finished cell of policy {policy!r} and task "
                           f"{task!r} (policies: {sorted(set(self.results['policy']))}, tasks: "
                           f"{sorted(set(self.results['task_base']))})")
        return cells.pivot_table(index="depth", columns="tokens", values=value, aggfunc="mean")

    def __repr__(self):
        ok = self.results[self.results["status"] == "ok"]
        return (f"<kvscope.Sweep {self.folder}: {len(self.results)} cells, "
                f"{int(ok['success'].sum())} found the answer, "
                f"{len(self.results) - len(ok)} failed to run>")
