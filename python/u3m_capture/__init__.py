"""u3m_capture: run a real PyTorch program and record its tensor accesses as a u3m trace.

    PYTHONPATH=python /usr/bin/python3 -m u3m_capture {train,generate,rlhf} [options] -o OUT.jsonl

See docs/capture.md. `model` holds the LLaMA-shaped decoder, `tracer` the
recorder (a TorchDispatchMode), `workloads` the drivers, `jsonl` a reader and
validator for the trace files.
"""
from .model import Decoder, KVCache, ModelConfig, generate, lm_loss, policy_gradient_loss
from .tracer import Recorder

__all__ = ["Decoder", "KVCache", "ModelConfig", "Recorder", "generate", "lm_loss", "policy_gradient_loss"]
