"""u3m: tiered memory (device / host / SSD) for LLM training and serving.

The C++ core is the extension `u3m._core` (src/python); this package re-exports
it. `u3m.torch` holds the PyTorch integration (capture, training offload).
Build and import (docs/pytorch.md):

    make            # or: ninja -C build/release u3m_python
    PYTHONPATH=build/release/python /usr/bin/python3 -c "import u3m"
"""
try:
    from . import _core
except ImportError as e:  # the .py files are importable from python/ without the build
    raise ImportError(
        "u3m: the C++ extension u3m._core is not built or not on the path; build it "
        "(make, or ninja -C build/release u3m_python) and put build/release/python on "
        f"PYTHONPATH (docs/pytorch.md): {e}") from e

# The whole public core: Runtime/Lease/EngineError (the engine), Trace/load_trace/stable_id,
# predictor_names/evaluate_predictor, simulate_training, InputError, and the KV store.
from ._core import *  # noqa: E402,F401,F403

__all__ = [n for n in dir(_core) if not n.startswith("_")]
__version__ = _core.__version__  # the release and the git commit of the build


def _runtime_from_config(path, **kwargs):
    """A Runtime made from a run config (docs/config.md): the file's [tiers] and
    [links]; keyword arguments (as Runtime's) win over the file. The file is
    checked as `--config` checks it (u3m.InputError names file, line and key)."""
    cfg = load_config(path)  # noqa: F405 (from _core)
    tiers, links = cfg.get("tiers", {}), cfg.get("links", {})
    dev, host, ssd = tiers.get("device", {}), tiers.get("host", {}), tiers.get("ssd", {})
    if "fraction" in dev:
        raise InputError(f"{path}: 'tiers.device.fraction' needs a trace's footprint; "  # noqa: F405
                         "a Runtime takes 'tiers.device.budget'")
    args = {}
    for key, value in (("device_budget", dev.get("budget")), ("host_budget", host.get("budget")),
                       ("ssd_dir", ssd.get("dir")), ("ssd_capacity", ssd.get("size")),
                       ("ssd_faults", ssd.get("faults")), ("h2d_gbps", links.get("h2d_gbps")),
                       ("d2h_gbps", links.get("d2h_gbps"))):
        if value is not None:
            args[key] = value
    for key, tier in (("device_watermarks", dev), ("host_watermarks", host)):
        if "high_watermark" in tier or "low_watermark" in tier:
            args[key] = (tier.get("high_watermark", 0.90), tier.get("low_watermark", 0.80))
    args.update(kwargs)
    if "device_budget" not in args:
        raise InputError(f"{path}: no 'tiers.device.budget' and no device_budget= given")  # noqa: F405
    return Runtime(**args)  # noqa: F405


Runtime.from_config = staticmethod(_runtime_from_config)  # noqa: F405
