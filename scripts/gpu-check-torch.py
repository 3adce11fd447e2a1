#!/usr/bin/env python3
"""The PyTorch steps of scripts/gpu-check.sh (issue 19), one phase per process so
a crash or hang in one leaves the others' results:

    train --mode untiered   a LLaMA-shaped model (TinyLlama's shape, ~1.1B parameters)
                            trained in bf16 for a few steps on the GPU, nothing tiered
    train --mode offload    the same model, the same batches, under
                            u3m.torch.offload(model, opt, budget_fraction=0.5)
    generate                greedy generation with the dense KV cache and with u3m's
                            tiered KV cache (u3m.kv_cache), tokens compared

It calls only the public API (u3m.torch.offload, u3m.kv_cache.TieredKVManager /
TieredKVCache, u3m_capture.model) and assumes nothing works: every failure is
written to the JSON result as its exception type, message and the last lines of
its traceback, with the step it happened at. Every figure is measured on this
machine; peak device memory is reported twice, as torch's allocator saw it
(torch.cuda.max_memory_allocated) and as the device saw it (the peak of
total - free from torch.cuda.mem_get_info, sampled after each step, minus the
phase's starting point), since memory u3m takes itself is invisible to torch.

--device cpu and small --layers/--d-model run the same code without a GPU (to
check the script itself; not a measurement of anything issue 19 asks).

Under offload it also records which backend u3m opened (a CUDA model must get
"cuda", its HBM and pinned host memory; "device-emu" would mean the engine's
tiers were not on the GPU at all) and, per step, the evidence of copies
overlapping compute (Note [Offload on CUDA] in python/u3m/torch.py): the bytes
and busy seconds of the engine's h2d and d2h links (copies on u3m's own
streams), the seconds the training thread stalled waiting for a fetch, and the
seconds it spent synchronizing torch's stream before a release. Busy link time
beyond the stall ran while torch computed.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("phase", choices=["train", "generate"])
    p.add_argument("--mode", choices=["untiered", "offload"], default="untiered")
    p.add_argument("--out", required=True, help="JSON result file")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=512)
    # TinyLlama-1.1B's shape: 22 layers, d_model 2048, 32 heads, 4 KV heads, FFN 5632, vocab 32000.
    p.add_argument("--layers", type=int, default=22)
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--budget-fraction", type=float, default=0.5)
    p.add_argument("--kv-budget-fraction", type=float, default=0.25)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    return p.parse_args(argv)


def failure(exc: BaseException, at: str) -> dict:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return {"at": at, "type": type(exc).__name__, "message": str(exc)[:2000],
            "traceback_tail": "".join(tb)[-3000:]}


class DeviceMemory:
    """Peak device memory of one phase, as torch saw it and as the device did."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.base = self.used() if self.cuda else 0
        self.peak = 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)

    def used(self) -> int:
        free, total = torch.cuda.mem_get_info()
        return total - free

    def sample(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = max(self.peak, self.used() - self.base)

    def report(self) -> dict:
        if not self.cuda:
            return {"torch_max_allocated_bytes": None, "device_used_peak_bytes": None}
        return {"torch_max_allocated_bytes": torch.cuda.max_memory_allocated(),
                "device_used_peak_bytes": self.peak,
                "method": "torch.cuda.max_memory_allocated; peak of (total - free) from "
                          "torch.cuda.mem_get_info after each step, minus the phase's start"}


def build_model(a, device: torch.device):
    from u3m_capture.model import Decoder, ModelConfig
    cfg = ModelConfig(vocab_size=a.vocab, d_model=a.d_model, n_layers=a.layers, n_heads=a.heads,
                      n_kv_heads=a.kv_heads, ffn_hidden=a.ffn, max_seq_len=max(a.seq_len + 1, 256))
    torch.manual_seed(0)  # the same weights in every phase
    # Built on the device itself (torch 2's device context) where there is one: 1B
    # parameters initialise in milliseconds there, in seconds on the CPU.
    with (torch.device(device) if device.type != "cpu" else contextlib.nullcontext()):
        model = Decoder(cfg)
    model = model.to(getattr(torch, a.dtype))
    return cfg, model


def batches(a, device):
    g = torch.Generator().manual_seed(1)  # the same tokens in every phase, drawn on the CPU
    return [torch.randint(0, a.vocab, (a.batch, a.seq_len + 1), generator=g).to(device)
            for _ in range(a.steps)]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def engine_counters(off) -> dict:
    """The offload's engine counters that the overlap evidence is built from."""
    s = off.rt.stats()
    links = s["links"]
    return {"h2d_bytes": links["h2d"]["bytes"], "d2h_bytes": links["d2h"]["bytes"],
            "h2d_busy_s": links["h2d"]["busy_s"], "d2h_busy_s": links["d2h"]["busy_s"],
            "stall_s": s["stall_s"], "misses": s["misses"], "prefetch_hits": s["prefetch_hits"],
            "release_sync_s": off.release_sync_s}  # 0 on CPU


def overlap_of(before: dict, after: dict, step_s: float) -> dict:
    d = {k: after[k] - before[k] for k in after}
    busy = d["h2d_busy_s"] + d["d2h_busy_s"]
    d["step_s"] = step_s
    # Copy time the thread did not wait for ran beside compute (an upper bound on what a
    # stall hides: the stall also counts queueing behind other copies).
    d["copy_busy_s"] = busy
    d["copy_hidden_s"] = max(0.0, busy - d["stall_s"])
    d["copy_hidden_fraction"] = d["copy_hidden_s"] / busy if busy > 0 else None
    d["h2d_gbps_while_busy"] = d["h2d_bytes"] / d["h2d_busy_s"] / 1e9 if d["h2d_busy_s"] > 0 else None
    d["d2h_gbps_while_busy"] = d["d2h_bytes"] / d["d2h_busy_s"] / 1e9 if d["d2h_busy_s"] > 0 else None
    return d


def train(a, device, out: dict) -> None:
    from u3m_capture.model import lm_loss
    mem = DeviceMemory(device)
    cfg, model = build_model(a, device)
    out["config"] = {**cfg.to_dict(), "dtype": a.dtype, "batch": a.batch, "seq_len": a.seq_len,
                     "steps": a.steps, "parameters": sum(p.numel() for p in model.parameters())}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    off = None
    if a.mode == "offload":
        import u3m.torch as ut
        try:
            off = ut.offload(model, opt, budget_fraction=a.budget_fraction)
            out["budget_bytes"] = off.budget_bytes
            out["footprint_bytes"] = off.footprint_bytes
            out["u3m_backend"] = {"name": off.rt.backend, "detail": off.rt.backend_detail,
                                  "test_double": off.rt.test_double,
                                  "on_the_model_device": (off.rt.backend == "cuda") == (device.type == "cuda")}
        except BaseException as e:  # noqa: BLE001 - the report records whatever happened
            out["error"] = failure(e, "u3m.torch.offload")
            out["memory"] = mem.report()
            return
    mem.sample()
    losses, times, overlap = [], [], []
    for i, tokens in enumerate(batches(a, device)):
        try:
            sync(device)
            before = engine_counters(off) if off is not None else None
            t0 = time.perf_counter()
            loss = lm_loss(model, tokens)
            loss.backward()
            opt.step()
            opt.zero_grad()
            sync(device)
            times.append(time.perf_counter() - t0)
            if off is not None:
                overlap.append(overlap_of(before, engine_counters(off), times[-1]))
            losses.append(float(loss.detach().float().cpu()))
            mem.sample()
        except BaseException as e:  # noqa: BLE001
            out["error"] = failure(e, f"training step {i}")
            break
    out["losses"] = losses
    out["step_times_s"] = times
    # The first step pays allocator and kernel warm-up: the median of the rest.
    rest = sorted(times[1:]) or sorted(times)
    out["step_time_s"] = rest[len(rest) // 2] if rest else None
    out["memory"] = mem.report()
    if off is not None:
        out["overlap_per_step"] = overlap
        out["overlap_note"] = ("measured: engine link busy seconds (copies on u3m's streams) vs the "
                               "thread's fetch stalls and stream syncs before releases, per step")
        try:
            s = off.stats()
            out["u3m_stats"] = {k: v for k, v in s.items() if k != "engine"}
            out["host_cache"] = s["engine"].get("host_cache")  # pinned blocks reused, cuda only
            off.close()
        except BaseException as e:  # noqa: BLE001
            out.setdefault("error", failure(e, "offload stats/close"))


def generate_phase(a, device, out: dict) -> None:
    from u3m_capture.model import generate
    from u3m.kv_cache import TieredKVCache, TieredKVManager, kv_footprint_bytes
    a.seq_len = 128
    cfg, model = build_model(a, device)
    model.eval()
    dtype = getattr(torch, a.dtype)
    g = torch.Generator().manual_seed(2)
    system = torch.randint(0, a.vocab, (64,), generator=g)
    prompts = [torch.cat([system.expand(a.batch, -1),
                          torch.randint(0, a.vocab, (a.batch, 32), generator=g)], dim=1).to(device)
               for _ in range(2)]  # two batches through one manager: the second hits the shared prefix
    total = prompts[0].shape[1] + a.new_tokens
    out["config"] = {**cfg.to_dict(), "dtype": a.dtype, "batch": a.batch, "prompt_tokens": prompts[0].shape[1],
                     "new_tokens": a.new_tokens, "batches": len(prompts)}
    dense, t_dense = [], 0.0
    for p in prompts:
        sync(device)
        t0 = time.perf_counter()
        dense.append(generate(model, p, a.new_tokens, temperature=0))
        sync(device)
        t_dense += time.perf_counter() - t0
    out["untiered_tokens_per_s"] = len(prompts) * a.batch * a.new_tokens / t_dense
    footprint = kv_footprint_bytes(cfg, a.batch, total, dtype)
    out["kv_footprint_bytes"] = footprint
    try:
        mgr = TieredKVManager(cfg, device_budget_bytes=int(a.kv_budget_fraction * footprint),
                              host_bytes=4 * footprint, dtype=dtype, model_id="gpu-check",
                              device=device)
        out["kv_budget_bytes"] = mgr.kv_budget_bytes
        out["u3m_backend"] = mgr.store.backend
        tiered, t_tiered = [], 0.0
        for p in prompts:
            caches = []

            def make_cache(b, n, p=p):
                caches.append(TieredKVCache(mgr, b, n, p))
                return caches[-1]

            sync(device)
            t0 = time.perf_counter()
            tiered.append(generate(model, p, a.new_tokens, temperature=0, make_cache=make_cache))
            sync(device)
            t_tiered += time.perf_counter() - t0
            for c in caches:
                c.close()
        out["tiered_tokens_per_s"] = len(prompts) * a.batch * a.new_tokens / t_tiered
        out["tokens_equal"] = all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(dense, tiered))
        out["peak_kv_device_bytes"] = mgr.peak_device_bytes
        out["within_kv_budget"] = mgr.peak_device_bytes <= mgr.kv_budget_bytes
    except BaseException as e:  # noqa: BLE001
        out["error"] = failure(e, "tiered KV generation")


def main(argv=None) -> int:
    a = parse_args(argv)
    out = {"phase": a.phase, "mode": a.mode if a.phase == "train" else None,
           "torch": torch.__version__, "measured_on": os.uname().nodename}
    device = torch.device(a.device)
    try:
        if device.type == "cuda":
            out["device_name"] = torch.cuda.get_device_name(device)
        if a.phase == "train":
            train(a, device, out)
        else:
            generate_phase(a, device, out)
    except BaseException as e:  # noqa: BLE001
        out.setdefault("error", failure(e, "setup"))
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main())
