"""Metrics and timelines of a Runtime (docs/operators.md).

    rt = u3m.Runtime(device_budget=..., host_budget=...)
    m = u3m.metrics.serve(rt, port=9400)     # http://127.0.0.1:9400/metrics
    tl = u3m.metrics.record_timeline(rt)     # ... run ...
    tl.write("run.json")                     # Chrome trace / Perfetto JSON

A runtime reports to one observer; serve_and_record() attaches both.
"""
from . import _core


def serve(runtime, port: int = 0, address: str = "127.0.0.1") -> "_core.Metrics":
    """Serves the runtime's Prometheus metrics on http://address:port/metrics (port 0: any
    free one, see .port) and returns the Metrics object; keep it while it should serve."""
    m = _core.Metrics()
    m.serve(port, address)
    runtime.set_observer(m)
    return m


def record_timeline(runtime) -> "_core.Timeline":
    """Records the runtime's transfers and tier occupancy; .write(path) saves the timeline."""
    tl = _core.Timeline()
    runtime.set_observer(tl)
    return tl


def serve_and_record(runtime, port: int = 0, address: str = "127.0.0.1"):
    """Both at once: returns (metrics, timeline)."""
    m, tl = _core.Metrics(), _core.Timeline()
    m.serve(port, address)
    runtime.set_observer(_core.Observers([m, tl]))
    return m, tl


def report_kv(metrics, kv_stats: dict, block_tokens: int, card: int = 0) -> None:
    """Passes a TieredKvStore's stats() to the metrics as vLLM names them: prefix queries and
    hits in tokens (full prompt blocks looked up and hit, times block_tokens) and the device
    tier's share of KV slots in use."""
    cap = kv_stats["slots_capacity"][0]
    metrics.set_kv(query_tokens=kv_stats["lookup_blocks"] * block_tokens,
                   hit_tokens=kv_stats["hit_blocks"] * block_tokens,
                   usage=kv_stats["slots_used"][0] / cap if cap else 0.0, card=card)
