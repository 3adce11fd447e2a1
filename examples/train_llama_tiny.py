#!/usr/bin/python3
"""Trains a tiny LLaMA-shaped decoder with its parameters, gradients, AdamW state and saved
activations in u3m tiers, under a device budget smaller than they need (docs/pytorch.md).

    PYTHONPATH=build/release/python /usr/bin/python3 examples/train_llama_tiny.py --compare

The model is the repo's own (python/u3m_capture/model.py: RMSNorm, RoPE, GQA attention, SwiGLU),
randomly initialised; the data are random token batches; nothing is downloaded. With --compare
the same steps also run untiered (plain PyTorch) and under the trace capture alone, and the
report gives the losses' largest difference and the step times of each: measured on this
machine, median of the steps after the first (which warms up).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import u3m.torch as ut
from u3m_capture.model import Decoder, ModelConfig, lm_loss
from u3m_capture.tracer import machine_description


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-fraction", type=float, default=0.5,
                   help="device budget as a fraction of params + grads + AdamW state (default 0.5)")
    p.add_argument("--compare", action="store_true",
                   help="also run untiered and under the trace capture alone; report the differences")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--steps", type=int, default=6, help="training steps (default 6)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 keeps timing steady)")
    a = p.parse_args(argv)
    if not 0 < a.budget_fraction <= 1:
        p.error(f"--budget-fraction must be in (0, 1], got {a.budget_fraction}")
    for name in ("steps", "layers", "d_model", "seq_len", "batch", "threads"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(a, name)}")
    if a.d_model % 8:
        p.error(f"--d-model must be a multiple of 8 (4 heads of even size), got {a.d_model}")
    return a


def setup(a):
    """Model, AdamW and batches; the same seed gives the same bytes in every run."""
    torch.manual_seed(a.seed)
    cfg = ModelConfig(vocab_size=512, d_model=a.d_model, n_layers=a.layers, n_heads=4, n_kv_heads=2,
                      ffn_hidden=(8 * a.d_model // 3 + 7) // 8 * 8, max_seq_len=a.seq_len)
    model = Decoder(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    gen = torch.Generator().manual_seed(a.seed + 1)
    batches = [torch.randint(cfg.vocab_size, (a.batch, a.seq_len + 1), generator=gen) for _ in range(a.steps)]
    return model, opt, batches


def run(model, opt, batches, step_context=None):
    """The training loop, the same in every mode; returns losses and per-step wall times (ms)."""
    losses, times = [], []
    for tokens in batches:
        t0 = time.perf_counter()
        if step_context is None:
            loss = lm_loss(model, tokens)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        else:  # the trace capture drives the phases itself
            with step_context.step():
                loss = lm_loss(model, tokens)
                step_context.backward(loss)
                step_context.optimizer_step()
        losses.append(loss.item())
        times.append((time.perf_counter() - t0) * 1e3)
    return losses, times


def median_after_first(times):
    return statistics.median(times[1:] if len(times) > 1 else times)


def main(argv=None) -> int:
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    machine = machine_description()
    report = {"label": f"measured on this machine ({machine}), torch {torch.__version__}, "
                       f"{a.threads} thread(s); step times are medians of steps 2..{a.steps}",
              "steps": a.steps, "budget_fraction": a.budget_fraction}

    model, opt, batches = setup(a)
    off = ut.offload(model, opt, budget_fraction=a.budget_fraction)
    losses, times = run(model, opt, batches)
    st = off.stats()
    off.close()
    report.update(budget_bytes=off.budget_bytes, footprint_bytes=off.footprint_bytes,
                  peak_device_bytes=st["peak_device_bytes"], peak_host_bytes=st["peak_host_bytes"],
                  saved_activation_bytes=st["saved_activation_bytes"], evictions=st["evictions"],
                  prefetches=st["prefetches"], prefetch_hits=st["prefetch_hits"], misses=st["misses"],
                  stall_ms=st["stall_s"] * 1e3, losses_tiered=losses,
                  step_time_ms={"tiered": median_after_first(times)})
    ok = st["peak_device_bytes"] <= off.budget_bytes

    if a.compare:
        model, opt, batches = setup(a)
        ref, ref_times = run(model, opt, batches)
        model, opt, batches = setup(a)
        with ut.capture(model, opt) as cap:
            traced, traced_times = run(model, opt, batches, step_context=cap)
        untiered = median_after_first(ref_times)
        report["losses_untiered"] = ref
        report["max_abs_loss_diff"] = max(abs(x - y) for x, y in zip(losses, ref))
        report["losses_bitwise_equal"] = losses == ref
        report["step_time_ms"].update(untiered=untiered, traced=median_after_first(traced_times))
        report["offload_overhead"] = report["step_time_ms"]["tiered"] / untiered - 1
        report["tracing_overhead"] = report["step_time_ms"]["traced"] / untiered - 1
        report["trace_events"] = cap.counts()["events"]
        ok = ok and losses == ref and traced == ref

    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print(report["label"])
        print(f"  {a.steps} steps; device budget {report['budget_bytes']} B = {a.budget_fraction:.0%} of "
              f"params+grads+AdamW {report['footprint_bytes']} B; peak device-tier use "
              f"{report['peak_device_bytes']} B ({'within' if st['peak_device_bytes'] <= off.budget_bytes else 'OVER'} "
              f"the budget)")
        print(f"  saved activations offloaded: {report['saved_activation_bytes']} B; evictions "
              f"{report['evictions']}, prefetches {report['prefetches']} ({report['prefetch_hits']} hit), "
              f"demand misses {report['misses']}")
        print(f"  losses (tiered): {' '.join(f'{x:.6f}' for x in losses)}")
        print(f"  step time tiered: {report['step_time_ms']['tiered']:.1f} ms")
        if a.compare:
            s = report["step_time_ms"]
            print(f"  max |loss diff| vs untiered: {report['max_abs_loss_diff']:.3g} "
                  f"(bitwise equal: {report['losses_bitwise_equal']})")
            print(f"  step time untiered {s['untiered']:.1f} ms; offload overhead "
                  f"{100 * report['offload_overhead']:+.1f}%")
            print(f"  step time under the trace capture alone {s['traced']:.1f} ms; tracing overhead "
                  f"{100 * report['tracing_overhead']:+.1f}% ({report['trace_events']} events recorded)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
