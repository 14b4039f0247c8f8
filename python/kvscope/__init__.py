"""KVScope traces from Python: numpy arrays and pandas frames, no HDF5 paths.

    import kvscope
    t = kvscope.open("run.kvtrace.h5")
    t.events            # one row per policy decision
    t.lifetimes()       # one row per (layer, kv head, token): admitted / evicted at which step
    t.why()             # `kvscope why --json` on the trace, as a dict
    s = kvscope.sweep("out/example")   # a `kvscope sweep` folder
    s.results           # one row per cell; s.grid(policy, task) is the depth x length grid
    c = kvscope.causal("run.kvtrace.h5")   # what `kvscope why --causal` found
    c.replays           # one row per replay; c.minimal_set, c.heads(), c.layers()

Only committed steps are read (a trace left by a killed capture holds rows of
steps that never committed; they are skipped, as the C++ reader does). The
format is docs/trace-format.md; a trace too new for this package is refused.
"""
from .causal import Causal, causal  # noqa: F401
from .sweep import Sweep, sweep  # noqa: F401
from .trace import Trace, TraceError, open, why  # noqa: F401

__version__ = "0.1.0"
