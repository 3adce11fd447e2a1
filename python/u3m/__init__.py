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
