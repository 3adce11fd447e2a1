"""One serving process of tests/python/test_remote_kv.py: generates batches of two prompts that share
a 32-token system prefix (batch spec SYSTEM_SEED:TAIL_SEED), through a TieredKVManager (with --remote, sharing prefix blocks
through Redis), and prints one JSON line: per batch the tokens, the hit blocks (and how many of
them came from the remote), the positions prefill skipped and the positions computed, and a
digest of every layer's prompt K/V as read back from the cache; then the remote's counters.

    remote_kv_worker.py [--remote redis://127.0.0.1:PORT] [--batches 7:100,8:101] \
        [--kill-pid PID --kill-at BATCH]   # SIGKILLs PID as batch BATCH's prefill starts
"""
import argparse
import contextlib
import hashlib
import json
import os
import signal
import sys
import time

import torch

from u3m.kv_cache import TieredKVCache, TieredKVManager
from u3m_capture.model import Decoder, ModelConfig, generate

CFG = ModelConfig(vocab_size=256, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, ffn_hidden=96,
                  max_seq_len=64)
BLOCK, SYSTEM, TAIL, NEW = 8, 32, 5, 8  # 4 full system blocks, then a partial one


def prompts_for(system_seed: int, tail_seed: int) -> torch.Tensor:
    system = torch.randint(0, 256, (SYSTEM,), generator=torch.Generator().manual_seed(system_seed))
    tails = torch.randint(0, 256, (2, TAIL), generator=torch.Generator().manual_seed(tail_seed))
    return torch.cat([system.expand(2, -1), tails], 1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--remote", default="")
    ap.add_argument("--batches", default="7:100")
    ap.add_argument("--kill-pid", type=int, default=0)
    ap.add_argument("--kill-at", type=int, default=-1)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = Decoder(CFG).eval()
    m = TieredKVManager(CFG, device_budget_bytes=1 << 20, host_bytes=4 << 20, block_tokens=BLOCK,
                        model_id="remote-kv-test-seed0", remote=a.remote, remote_timeout_ms=200)
    out = {"batches": []}
    for i, spec in enumerate(a.batches.split(",")):
        prompts = prompts_for(*(int(x) for x in spec.split(":")))
        caches = []

        def make(b, total, prompts=prompts):
            caches.append(TieredKVCache(m, b, total, prompts, skip_prefix=True))
            return caches[-1]

        @contextlib.contextmanager
        def step(phase, index, i=i):
            if phase == "prefill" and i == a.kill_at and a.kill_pid:
                os.kill(a.kill_pid, signal.SIGKILL)  # after this batch's remote fetch, before its put
            yield

        t0 = time.monotonic()
        with torch.no_grad():
            tokens = generate(model, prompts, NEW, temperature=0, make_cache=make, step_context=step)
        c = caches[0]
        digest = hashlib.sha256()
        for layer in range(CFG.n_layers):
            for t in c.gather(layer, prompts.shape[1]):
                digest.update(t.numpy().tobytes())
        out["batches"].append({"tokens": tokens.tolist(), "hit_blocks": c.hit_blocks,
                               "remote_blocks": c.remote_blocks, "skipped": c.cached_prefix,
                               "computed": c.computed_positions, "kv_sha256": digest.hexdigest(),
                               "wall_s": time.monotonic() - t0})
        c.close()
    out["remote"] = m.stats().get("remote")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
