#!/usr/bin/python3
"""Greedy generation with a tiny LLaMA-shaped decoder whose KV cache lives in u3m's tiered KV
manager, under an HBM budget smaller than the KV it needs (docs/kv.md, "The Python KV cache").

    PYTHONPATH=build/release/python:python /usr/bin/python3 examples/generate_llama_tiny.py --compare

The model is the repo's own (python/u3m_capture/model.py), randomly initialised; prompts are
random tokens behind a shared system prompt; nothing is downloaded. Several batches run one
after another through one manager, so later batches hit the prompt blocks earlier ones stored.
The device budget is --kv-budget-fraction of the KV footprint of one batch (what the dense
KVCache of one generate() call holds); the blocks that do not fit live in host DRAM (and, with
--ssd-slots, on the SSD tier). With --compare the same batches also run untiered (the dense
KVCache) and the report says whether the tokens are identical. Every figure is measured on
this machine: peak_kv_device_bytes is the engine's peak of device-tier bytes, tokens_per_s is
generated tokens over wall time of the generate() calls.

With --remote redis://HOST:PORT the manager shares prefix blocks with other processes through a
Redis server (docs/kv.md, "Remote tier on Redis"), and --skip-prefix starts prefill after the
hit blocks every row shares; run it twice (a second --question-seed for other questions) and the
second run's prefill skips the system prompt the first one stored.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from u3m.kv_cache import TieredKVCache, TieredKVManager, kv_bytes_per_token_layer, kv_footprint_bytes
from u3m_capture.model import Decoder, ModelConfig, generate
from u3m_capture.tracer import machine_description


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kv-budget-fraction", type=float, default=0.25,
                   help="HBM budget as a fraction of one batch's KV footprint (default 0.25)")
    p.add_argument("--compare", action="store_true", help="also run untiered; report tokens_equal")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--batches", type=int, default=2, help="generate() calls through one manager")
    p.add_argument("--system-tokens", type=int, default=32, help="shared prompt prefix")
    p.add_argument("--question-tokens", type=int, default=20, help="random per-row prompt tail")
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--layers-per-group", type=int, default=1)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--ssd-slots", type=int, default=0, help="SSD tier in KV blocks (0: none)")
    p.add_argument("--policy", default="lru", help="eviction policy: lru, lfu, pgdsf")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--question-seed", type=int, default=None,
                   help="seed of the per-row questions (default: drawn after the system prompt)")
    p.add_argument("--remote", default="", help="redis://HOST:PORT: a shared KV tier below DRAM")
    p.add_argument("--remote-ttl-s", type=int, default=3600)
    p.add_argument("--skip-prefix", action="store_true",
                   help="prefill starts after the hit blocks every row shares")
    a = p.parse_args(argv)
    if not 0 < a.kv_budget_fraction <= 1:
        p.error(f"--kv-budget-fraction must be in (0, 1], got {a.kv_budget_fraction}")
    for name in ("batch", "batches", "question_tokens", "new_tokens", "block_tokens", "layers",
                 "layers_per_group", "d_model", "threads"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(a, name)}")
    if a.system_tokens < 0 or a.ssd_slots < 0:
        p.error("--system-tokens and --ssd-slots must be >= 0")
    if a.d_model % 8:
        p.error(f"--d-model must be a multiple of 8 (4 heads of even size), got {a.d_model}")
    return a


def setup(a):
    """Model and prompt batches; the same seed gives the same bytes in every run."""
    torch.manual_seed(a.seed)
    total = a.system_tokens + a.question_tokens + a.new_tokens
    cfg = ModelConfig(vocab_size=512, d_model=a.d_model, n_layers=a.layers, n_heads=4, n_kv_heads=2,
                      ffn_hidden=(8 * a.d_model // 3 + 7) // 8 * 8, max_seq_len=total)
    model = Decoder(cfg).eval()
    gen = torch.Generator().manual_seed(a.seed + 1)
    system = torch.randint(0, cfg.vocab_size, (a.system_tokens,), generator=gen)
    batches = []
    if a.question_seed is not None:
        gen = torch.Generator().manual_seed(a.question_seed)
    for _ in range(a.batches):
        q = torch.randint(0, cfg.vocab_size, (a.batch, a.question_tokens), generator=gen)
        batches.append(torch.cat([system.expand(a.batch, -1), q], dim=1))
    return cfg, model, batches


def run_untiered(model, batches, new_tokens):
    out, t = [], 0.0
    for prompts in batches:
        t0 = time.perf_counter()
        out.append(generate(model, prompts, new_tokens, temperature=0))
        t += time.perf_counter() - t0
    return out, t


def run_tiered(model, batches, new_tokens, mgr, skip_prefix=False):
    out, t, hit_diff, hit_blocks = [], 0.0, 0.0, 0
    run_tiered.computed = 0  # positions the model computed per row, summed over the batches
    for prompts in batches:
        caches = []

        def make_cache(b, total, prompts=prompts):
            caches.append(TieredKVCache(mgr, b, total, prompts, skip_prefix=skip_prefix))
            return caches[-1]

        t0 = time.perf_counter()
        out.append(generate(model, prompts, new_tokens, temperature=0, make_cache=make_cache))
        t += time.perf_counter() - t0
        for c in caches:
            hit_diff = max(hit_diff, c.hit_max_abs_diff)
            hit_blocks += sum(c.hit_blocks)
            run_tiered.computed += c.computed_positions
            c.close()
    mgr.store.check_agreement()  # the engine holds every block where the manager says
    return out, t, hit_diff, hit_blocks


def main(argv=None) -> int:
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    cfg, model, batches = setup(a)
    max_len = a.system_tokens + a.question_tokens + a.new_tokens
    footprint = kv_footprint_bytes(cfg, a.batch, max_len)
    budget = int(a.kv_budget_fraction * footprint)
    # DRAM holds what HBM does not, for every batch (cached prompt blocks stay).
    slot = a.block_tokens * a.layers_per_group * kv_bytes_per_token_layer(cfg)
    try:
        # The remote's values are right only for these weights: model_id names them.
        mgr = TieredKVManager(cfg, device_budget_bytes=budget, host_bytes=(a.batches + 1) * footprint,
                              ssd_bytes=a.ssd_slots * slot, block_tokens=a.block_tokens,
                              layers_per_group=a.layers_per_group, policy=a.policy,
                              model_id=f"generate_llama_tiny:seed={a.seed}:d={a.d_model}:l={a.layers}",
                              remote=a.remote, remote_ttl_s=a.remote_ttl_s)
    except ValueError as e:
        print(f"generate_llama_tiny.py: error: --remote {a.remote!r}: {e}", file=sys.stderr)
        return 2
    tokens, t_tiered, hit_diff, hit_blocks = run_tiered(model, batches, a.new_tokens, mgr, a.skip_prefix)
    st = mgr.stats()
    generated = a.batch * a.new_tokens * a.batches
    report = {
        "label": f"measured on this machine ({machine_description()}), torch {torch.__version__}, "
                 f"{a.threads} thread(s); tokens_per_s = generated tokens / wall time of generate()",
        "model": {"layers": cfg.n_layers, "d_model": cfg.d_model, "kv_heads": cfg.n_kv_heads,
                  "head_dim": cfg.head_dim, "dtype": "float32"},
        "batch": a.batch, "batches": a.batches, "prompt_tokens": a.system_tokens + a.question_tokens,
        "shared_prefix_tokens": a.system_tokens, "new_tokens": a.new_tokens,
        "block_tokens": a.block_tokens, "layers_per_group": a.layers_per_group,
        "kv_footprint_bytes": footprint,
        "kv_budget_fraction": a.kv_budget_fraction,
        "kv_budget_bytes": mgr.kv_budget_bytes,
        "peak_kv_device_bytes": mgr.peak_device_bytes,
        "peak_kv_host_bytes": st["engine_peak_bytes"][1],
        "prefix_hit_blocks": hit_blocks,
        "prefix_hit_max_abs_diff": hit_diff,
        "kv_reads_by_tier": dict(zip(("device", "host", "ssd"), st["reads_by_tier"])),
        "kv_blocks_moved": st["moved"], "kv_bytes_moved": st["moved_bytes"],
        # Positions the model computed (prefill + decode) for each row, summed over the batches.
        "computed_positions": run_tiered.computed,
        "remote": st.get("remote"),
        "tokens_per_s": {"tiered": generated / t_tiered},
    }
    ok = report["peak_kv_device_bytes"] <= report["kv_budget_bytes"]
    if a.compare:
        ref, t_untiered = run_untiered(model, batches, a.new_tokens)
        report["tokens_equal"] = all(torch.equal(x, y) for x, y in zip(tokens, ref))
        report["tokens_per_s"]["untiered"] = generated / t_untiered
        ok = ok and report["tokens_equal"]
    report["ok"] = ok

    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print(report["label"])
        print(f"  {a.batches} batch(es) of {a.batch} prompts ({report['prompt_tokens']} tokens, "
              f"{a.system_tokens} shared) + {a.new_tokens} new tokens, greedy")
        print(f"  KV footprint of one batch {footprint} B; HBM budget {report['kv_budget_bytes']} B "
              f"({report['kv_budget_bytes'] / footprint:.0%}); peak device-tier KV "
              f"{report['peak_kv_device_bytes']} B ({'within' if report['peak_kv_device_bytes'] <= report['kv_budget_bytes'] else 'OVER'} the budget), "
              f"peak host-tier KV {report['peak_kv_host_bytes']} B")
        print(f"  prefix hits: {hit_blocks} blocks (stored vs recomputed max |diff| {hit_diff:g}); KV reads "
              f"by tier {report['kv_reads_by_tier']}; blocks moved {report['kv_blocks_moved']}; "
              f"positions computed {report['computed_positions']}")
        if report["remote"] is not None:
            r = report["remote"]
            print(f"  remote {a.remote}: hits {r['hits']}, misses {r['misses']}, puts {r['puts']}, "
                  f"errors {r['errors']}, corrupt {r['corrupt']}")
        tps = report["tokens_per_s"]
        line = f"  tokens/s tiered {tps['tiered']:.1f}"
        if a.compare:
            line += f", untiered {tps['untiered']:.1f}; tokens_equal: {report['tokens_equal']}"
        print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
