"""Trace: one KVScope trace file (format kvscope-trace v1), read lazily."""
import json
import os
import shutil
import subprocess

import h5py
import numpy as np
import pandas as pd

FORMAT_VERSION = 1  # the major version this package reads
ROLES = ["prompt", "generated", "needle", "template", "question"]
EVENT_KINDS = ["admit", "reject", "select", "evict", "demote", "promote"]
STEP_KINDS = ["prefill", "decode", "reconstruction"]  # 2: format 1.5
NO_TIER = 255


class TraceError(Exception):
    """A file that is not a trace this package can read; says the file and field."""


def open(path):  # noqa: A001 - the package's entry point, as h5py.File
    """Opens a trace (the file stays open until close() or the end of a `with`)."""
    return Trace(path)


def why(path, kvscope=None, kl=None):
    """`kvscope why --json` on a trace: what the policy did to the needle (docs/tasks.md)."""
    exe = kvscope or os.environ.get("KVSCOPE") or shutil.which("kvscope")
    if not exe:
        raise TraceError("kvscope executable not found: pass kvscope= or set KVSCOPE")
    args = [exe, "why", os.fspath(path), "--json"] + ([] if kl is None else ["--kl", str(kl)])
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        raise TraceError(p.stderr.strip() or f"kvscope why exited {p.returncode}")
    return json.loads(p.stdout)


def _names(value):
    return [v.decode() if isinstance(v, bytes) else str(v) for v in np.atleast_1d(value)]


class Trace:
    def __init__(self, path):
        self.path = os.fspath(path)
        try:
            self._f = h5py.File(self.path, "r")
        except OSError as e:
            raise TraceError(f"{self.path}: cannot open as HDF5: {e}") from None
        if self._f.attrs.get("format") != "kvscope-trace":
            raise TraceError(f"{self.path}: /: attribute format is not 'kvscope-trace': not a "
                             "KVScope trace")
        version = int(self._f.attrs["version"])
        if version != FORMAT_VERSION:
            raise TraceError(f"{self.path}: /: version {version}: this package reads version "
                             f"{FORMAT_VERSION} (too {'new' if version > FORMAT_VERSION else 'old'})")
        self.n_steps = len(self._f["/steps/kind"])  # the commit marker
        if self.n_steps:
            last = self.n_steps - 1
            self.n_tokens = int(self._f["/steps/first_token"][last] + self._f["/steps/n_tokens"][last])
            self.n_events = int(self._f["/steps/event_begin"][last] + self._f["/steps/event_count"][last])
        else:
            self.n_tokens = self.n_events = 0

    def close(self):
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- run ----------------------------------------------------------------
    @property
    def run(self):
        """The /run attributes as a dict (model, policy, budget, task, ...)."""
        out = {}
        for k, v in self._f["/run"].attrs.items():
            out[k] = _names(v) if isinstance(v, np.ndarray) and v.dtype == object else (
                v.tolist() if isinstance(v, np.ndarray) else v.item() if hasattr(v, "item") else v)
        return out

    @property
    def complete(self):
        return bool(self._f["/run/complete"][()])

    @property
    def shape(self):
        """(layers, query heads, kv heads)."""
        a = self._f["/run"].attrs
        return int(a["n_layers"]), int(a["n_heads"]), int(a["n_kv_heads"])

    def _column(self, path, n):
        return self._f[path][:n]

    # ---- tokens and steps ---------------------------------------------------
    @property
    def tokens(self):
        """One row per token: id, position, role, step, text."""
        n = self.n_tokens
        begin = self._column("/tokens/text_begin", n)
        length = self._column("/tokens/text_len", n)
        blob = bytes(self._f["/tokens/text_bytes"][:int(begin[-1] + length[-1]) if n else 0])
        roles = self._column("/tokens/role", n)
        return pd.DataFrame({
            "id": self._column("/tokens/id", n),
            "position": self._column("/tokens/position", n),
            "role": pd.Categorical.from_codes(roles, ROLES),
            "step": self._column("/tokens/step", n),
            "text": [blob[b:b + l].decode("utf-8", "replace") for b, l in zip(begin, length)],
        })

    def token_indices(self, role):
        """Indices of the tokens with a role ("needle", "question", ...)."""
        return np.flatnonzero(self._column("/tokens/role", self.n_tokens) == ROLES.index(role))

    @property
    def steps(self):
        """One row per committed step: kind, first_token, n_tokens, wall_s, entries, kv_bytes."""
        n = self.n_steps
        cols = {k: self._column("/steps/" + k, n)
                for k in ("first_token", "n_tokens", "t_start_s", "wall_s", "entries", "kv_bytes")}
        return pd.DataFrame({"kind": pd.Categorical.from_codes(self._column("/steps/kind", n),
                                                               STEP_KINDS), **cols})

    # ---- events and lifetimes ------------------------------------------------
    @property
    def events(self):
        """One row per policy decision: step, layer, kv_head, token, kind, score, reason, tiers."""
        n = self.n_events
        reasons = self.run["reason_names"]
        cols = {k: self._column("/events/" + k, n)
                for k in ("step", "layer", "kv_head", "token", "score", "from_tier", "to_tier")}
        return pd.DataFrame({
            **{k: cols[k] for k in ("step", "layer", "kv_head", "token")},
            "kind": pd.Categorical.from_codes(self._column("/events/kind", n), EVENT_KINDS),
            "score": cols["score"],
            "reason": pd.Categorical.from_codes(self._column("/events/reason", n), reasons),
            "from_tier": cols["from_tier"],
            "to_tier": cols["to_tier"],
        })

    def lifetimes(self):
        """One row per (layer, kv_head, token) the cache ever admitted: admit_step and
        evict_step (-1 while it is still held at the end), from the events."""
        ev = self.events
        admit = ev[ev["kind"] == "admit"].groupby(["layer", "kv_head", "token"])["step"].min()
        evict = ev[ev["kind"] == "evict"].groupby(["layer", "kv_head", "token"])["step"].max()
        out = pd.DataFrame({"admit_step": admit})
        out["evict_step"] = evict.reindex(out.index).fillna(-1).astype(np.int64)
        return out.reset_index()

    # ---- attention statistics and the oracle ---------------------------------
    def received(self, step, layer, kv_head):
        """(tokens, mass) the cached entries of head (layer, kv_head) received at a step
        (capture level `received`)."""
        if "/attention/received" not in self._f:
            raise TraceError(f"{self.path}: /attention/received: absent (capture level received)")
        if not 0 <= step < self.n_steps:
            raise TraceError(f"{self.path}: step {step} outside [0, {self.n_steps})")
        g = self._f["/attention/received"]
        first, count = int(g["offset"][step, layer, kv_head]), int(g["count"][step, layer, kv_head])
        return g["token"][first:first + count], g["mass"][first:first + count]

    @property
    def oracle_kl(self):
        """KL(full || policy) of each committed step's next-token distribution (--oracle)."""
        if "/oracle" not in self._f:
            raise TraceError(f"{self.path}: /oracle: absent (capture with --oracle)")
        return self._f["/oracle/kl"][:self.n_steps]

    @property
    def generated_text(self):
        """The generation as text (/generation/text_bytes, UTF-8)."""
        return bytes(self._f["/generation/text_bytes"][:]).decode("utf-8", "replace")

    @property
    def success(self):
        """Task success: 1 found, 0 missed, -1 no task or unfinished."""
        return int(self._f["/generation/success"][()])

    @property
    def score(self):
        """Share of the task's expected answers the generation contains (RULER's
        string_match_all), NaN when no task. Traces before format 1.6: success as 1.0 / 0.0."""
        if "score" in self._f["/generation"]:
            return float(self._f["/generation/score"][()])
        return float("nan") if self.success < 0 else float(self.success)

    def why(self, kvscope=None, kl=None):
        return why(self.path, kvscope=kvscope, kl=kl)

    def __repr__(self):
        L, H, K = self.shape
        return (f"<kvscope.Trace {self.path!r}: {self.run.get('policy')}, {self.n_steps} steps, "
                f"{self.n_tokens} tokens, {self.n_events} events, {L} layers x {K} kv heads>")

