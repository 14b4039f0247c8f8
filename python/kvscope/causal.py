"""Causal: what `kvscope why TRACE --causal` found (docs/causal.md) as pandas frames."""
import json
import os

import pandas as pd

from .trace import Trace, TraceError


def causal(path):
    """Opens a causal search's folder (TRACE.causal/), or the trace it ran on."""
    return Causal(path)


class Causal:
    def __init__(self, path):
        path = os.fspath(path)
        folder = path if os.path.isdir(path) else path + ".causal"
        report = os.path.join(folder, "causal.json")
        if not os.path.exists(report):
            raise TraceError(f"{report}: no causal search here (run `kvscope why TRACE --causal`)")
        self.folder = folder
        with open(report) as f:
            self.report = json.load(f)
        """The search's report: original, full_restoration, minimal_set, heads, layers, words."""
        self.replays = pd.read_csv(os.path.join(folder, "replays.csv"), keep_default_na=False)
        """One row per replay: label, interventions, heads_restored, answer_logprob,
        answer_rank, success, score, seconds, trace (an absolute path)."""
        self.replays["answer_logprob"] = pd.to_numeric(
            self.replays["answer_logprob"].replace("", None)).astype(float)
        self.replays["trace"] = [os.path.join(folder, t) for t in self.replays["trace"]]
        self.minimal_set = [tuple(int(x) for x in h.split(".")) for h in self.report["minimal_set"]]
        """The (layer, kv head) pairs whose restoration recovers the answer."""

    def heads(self):
        """One row per head of the minimal set: its log p restored alone and dropped from
        the full restoration."""
        rows = [{"layer": h["layer"], "kv_head": h["kv_head"],
                 "restore_logprob": (h["restore_alone"] or {}).get("logprob"),
                 "drop_logprob": (h["dropped_from_full"] or {}).get("logprob")}
                for h in self.report["heads"]]
        return pd.DataFrame(rows, columns=["layer", "kv_head", "restore_logprob", "drop_logprob"])

    def layers(self):
        """One row per layer restored alone: its log p."""
        rows = [{"layer": l["layer"], "restore_logprob": (l["restore_alone"] or {}).get("logprob")}
                for l in self.report["layers"]]
        return pd.DataFrame(rows, columns=["layer", "restore_logprob"])

    def open(self, replay):  # noqa: A003
        """Replay number `replay`'s trace (kvscope.Trace)."""
        return Trace(self.replays["trace"].iloc[int(replay)])

    def __repr__(self):
        return f"Causal({self.folder!r}: {self.report['replays']} replays, minimal set {self.minimal_set})"
