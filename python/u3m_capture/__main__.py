"""Command line: python -m u3m_capture {train,generate,rlhf} [options] -o OUT.jsonl"""
from __future__ import annotations

import argparse
import math
import json
import os
import platform
import sys
import time

import torch

from .model import ModelConfig
from .tracer import Recorder, machine_description
from .workloads import WORKLOADS, Progress, Session, max_len_needed

DESCRIPTION = """\
Runs a real PyTorch program (a small LLaMA-shaped decoder on the CPU) and writes
every aten operator it executes, with the tensors each one reads and writes, as
a u3m JSONL trace (docs/trace-format.md; docs/capture.md explains the capture).

workloads:
  train     training steps (forward, backward, AdamW) on random token batches; job train-0
  generate  batched generation with a KV cache: a prefill then one decode step per token; job infer-0
  rlhf      rounds of: generate rollouts (infer-0), then policy-gradient training steps on them
            (train-0); train-0 owns the shared parameters
"""


def _positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value
    return parse


def _non_negative_float(text):
    """A finite float >= 0 (NaN and inf would reach torch as a traceback)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("output and limits")
    g.add_argument("-o", "--output", required=True, help="trace file to write (.jsonl)")
    g.add_argument("--max-events", type=_positive(int), default=2_000_000,
                   help="stop recording after this many events (the trace is then marked truncated)")
    g.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    g.add_argument("--seed", type=int, default=0, help="seed for weights, data and sampling")
    g.add_argument("--threads", type=_positive(int), default=1,
                   help="torch intra-op threads (1 keeps op timing and order steady)")
    m = common.add_argument_group("model (LLaMA-shaped decoder)")
    m.add_argument("--layers", type=_positive(int), default=2, help="decoder layers")
    m.add_argument("--d-model", type=_positive(int), default=128, help="hidden size")
    m.add_argument("--heads", type=_positive(int), default=4, help="attention heads")
    m.add_argument("--kv-heads", type=_positive(int), default=2,
                   help="key/value heads (fewer than --heads: grouped-query attention)")
    m.add_argument("--ffn-hidden", type=_positive(int), default=344, help="SwiGLU hidden size")
    m.add_argument("--vocab", type=_positive(int), default=512, help="vocabulary size")

    parser = argparse.ArgumentParser(prog="python -m u3m_capture", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="workload", required=True, metavar="{train,generate,rlhf}")

    t = sub.add_parser("train", parents=[common], formatter_class=fmt, help="training steps",
                       description="Training steps of the decoder on random token batches (job train-0).")
    t.add_argument("--steps", type=_positive(int), default=4, help="optimizer steps")
    t.add_argument("--batch", type=_positive(int), default=4, help="sequences per batch")
    t.add_argument("--seq-len", type=_positive(int), default=64, help="tokens per training sequence")

    gen = sub.add_parser("generate", parents=[common], formatter_class=fmt, help="KV-cache generation",
                         description="Batched autoregressive generation with a KV cache (job infer-0).")
    gen.add_argument("--rounds", type=_positive(int), default=2, help="prompt batches, generated one after another")

    r = sub.add_parser("rlhf", parents=[common], formatter_class=fmt, help="rollouts + training, interleaved",
                       description="RLHF-style loop: generate rollouts (infer-0), then policy-gradient "
                                   "training steps on them with a toy reward (train-0), repeated.")
    r.add_argument("--rounds", type=_positive(int), default=3, help="rollout + training rounds")
    r.add_argument("--train-steps", type=_positive(int), default=2, help="optimizer steps per round")

    for p, new_tokens in ((gen, 32), (r, 16)):
        p.add_argument("--batch", type=_positive(int), default=4, help="prompts per batch")
        p.add_argument("--prompt-len", type=_positive(int), default=16, help="tokens per prompt")
        p.add_argument("--new-tokens", type=_positive(int), default=new_tokens, help="tokens generated per prompt")
        p.add_argument("--temperature", type=_non_negative_float, default=1.0, help="sampling temperature (0 = greedy)")
        p.add_argument("--kv-block", type=_positive(int), default=16,
                       help="positions per KV block (the unit KV tensors are named and allocated by)")
    for p in (t, r):
        p.add_argument("--lr", type=_non_negative_float, default=3e-3, help="AdamW learning rate")
        p.add_argument("--weight-decay", type=_non_negative_float, default=0.1, help="AdamW weight decay")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        cfg = ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                          n_kv_heads=args.kv_heads, ffn_hidden=args.ffn_hidden, max_seq_len=max_len_needed(args))
    except ValueError as e:
        print(f"u3m_capture: error: {e}", file=sys.stderr)
        return 2
    progress = Progress(quiet=args.quiet)
    rec = Recorder(max_events=args.max_events, kv_block=getattr(args, "kv_block", 16))
    options = {k: v for k, v in vars(args).items() if k not in ("output", "quiet")}
    rec.add_meta("source", f"python/u3m_capture {args.workload}")
    rec.add_meta("workload", args.workload)
    rec.add_meta("time_model", f"measured wall clock, CPU, torch {torch.__version__}")
    rec.add_meta("machine", machine_description())
    rec.add_meta("torch_threads", str(args.threads))
    rec.add_meta("python", platform.python_version())
    rec.add_meta("options", options)
    rec.add_meta("model_config", cfg.to_dict())
    rec.add_meta("identity", "storage-based logical tensors, names <job>.<phase>.<module path>.<op>#<n>.out<slot>; "
                             "see docs/capture.md")
    if args.workload == "rlhf":
        rec.add_meta("param_owner", "train-0 (infer-0 reads train-0's parameter tensors)")
    progress(f"{args.workload}: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads "
             f"({cfg.n_kv_heads} kv), vocab {cfg.vocab_size}; recording")
    t0 = time.perf_counter()
    session = Session(cfg, rec, seed=args.seed, lr=getattr(args, "lr", 3e-3),
                      weight_decay=getattr(args, "weight_decay", 0.1), progress=progress)
    try:
        with rec.recording():
            WORKLOADS[args.workload](session, args)
    finally:
        session.close()
    rec.add_meta("capture_wall_s", f"{time.perf_counter() - t0:.2f} (measured, this machine)")
    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    counts = rec.write_jsonl(args.output)
    progress(f"wrote {args.output}: {json.dumps(counts)}" + (" (TRUNCATED)" if rec.truncated else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
