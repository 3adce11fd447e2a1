"""What u3m.torch.offload costs against untiered training, per model, and what its online
recorder costs (issue 16, item 7; goals: offload <= 10%, recorder < 0.5% of step time).

Each model trains `--steps` steps untiered, then under offload at the budget (default 0.5 of
params + grads + optimizer state) with each policy asked for, and with policy "none" (no
recorder and no policy: engine LRU, demand fetches only). The runs of one model alternate
(untiered, each policy, untiered, ...) `--runs` times, so load on the machine hits all alike;
a run's step time is the median of its steps after the first two (warm-up; step 1 records
before any policy exists). Printed per model: the median over runs of each figure and the
min..max over runs. Figures are wall clock measured on the machine this runs on.

The recorder's own cost is timed in C++ per access (u3m._core.recorder_cost; the difference
of two Python-timed loops with the recorder on and off is below this machine's noise), then
given as a fraction of each model's step: ns per access x accesses per step / the untiered
step time. The models' matmuls and convolutions take 100 us or more, so Python overhead is not all
this measures.

    PYTHONPATH=build/release/python:python /usr/bin/python3 bench/torch_offload_cost.py
    ... --models llama,lstm --policies u3m,lookahead --runs 5 --json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch

import u3m
from u3m_capture.train_cases import MODELS, one_run


def recorder_ns(rounds=7):
    """The online recorder's cost per access, timed in C++ (u3m._core.recorder_cost: the
    index lookup, clock read and append PolicyDriver does per access, with end_step every 1000
    accesses), median of `rounds`; and, for scale, a whole PolicyDriver.acquire + release of a
    resident tensor from Python (what every offload access pays with or without the recorder)."""
    costs = [u3m._core.recorder_cost(1000, 1000) for _ in range(rounds)]
    rec = [c["ns_per_access"] for c in costs]
    cpu = [c["cpu_ns_per_access"] for c in costs]
    calls = []
    for _ in range(rounds):
        rt = u3m.Runtime(1 << 20)
        drv = u3m._core.PolicyDriver(rt, "lru")
        drv.add(1, 4096, "param.w", "param")
        rt.release(drv.acquire(1, "write", "forward"))
        t = time.perf_counter_ns()
        for _ in range(20000):
            rt.release(drv.acquire(1, "read", "forward"))
        calls.append((time.perf_counter_ns() - t) / 20000)
    return {"recorder_ns": statistics.median(rec), "recorder_ns_range": [min(rec), max(rec)],
            "recorder_cpu_ns": statistics.median(cpu),
            "acquire_release_ns": statistics.median(calls)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--policies", default="u3m,lookahead,lru,none")
    p.add_argument("--budget", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    models = a.models.split(",")
    policies = a.policies.split(",")
    for m in models:
        if m not in MODELS:
            p.error(f"--models: unknown model '{m}' (expected {', '.join(MODELS)})")
    if a.steps < 4:
        p.error(f"--steps must be >= 4 (two warm-up steps are dropped), got {a.steps}")
    rec = recorder_ns()
    report = {"label": f"measured on {platform.node()} ({platform.machine()}, {torch.get_num_threads()} "
                       f"torch thread, torch {torch.__version__}), wall clock, shared machine",
              "budget_fraction": a.budget, "steps": a.steps, "runs": a.runs, "recorder": rec, "models": {}}
    for m in models:
        runs = {k: [] for k in ["untiered", *policies]}
        cpu = {k: [] for k in ["untiered", *policies]}
        stats, ref = {}, None
        for _ in range(a.runs):
            t, c, ref, _ = one_run(MODELS[m], a.steps, a.budget, None)
            runs["untiered"].append(t)
            cpu["untiered"].append(c)
            for pol in policies:
                t, c, losses, st = one_run(MODELS[m], a.steps, a.budget, pol)
                if losses != ref:
                    raise SystemExit(f"{m}: losses under policy {pol} differ from untiered")
                runs[pol].append(t)
                cpu[pol].append(c)
                stats[pol] = st
        base = statistics.median(runs["untiered"])
        base_cpu = statistics.median(cpu["untiered"])
        row = {"untiered_step_ms": base * 1e3, "untiered_cpu_ms": base_cpu * 1e3,
               "untiered_step_ms_range": [min(runs["untiered"]) * 1e3, max(runs["untiered"]) * 1e3]}
        for pol in policies:
            over = [t / u - 1 for t, u in zip(runs[pol], runs["untiered"])]
            st = stats[pol]
            over_cpu = [t / u - 1 for t, u in zip(cpu[pol], cpu["untiered"])]
            row[pol] = {"step_ms": statistics.median(runs[pol]) * 1e3,
                        "cpu_ms": statistics.median(cpu[pol]) * 1e3,
                        "cpu_overhead": statistics.median(over_cpu),
                        "cpu_overhead_range": [min(over_cpu), max(over_cpu)],
                        "overhead": statistics.median(over), "overhead_range": [min(over), max(over)],
                        "stall_s": st["stall_s"], "prefetches": st["prefetches"],
                        "prefetch_hits": st["prefetch_hits"], "evictions": st["evictions"],
                        "peak_device_bytes": st["peak_device_bytes"], "budget_bytes": st["budget_bytes"],
                        "accesses_per_step": st["policy"]["accesses"] / a.steps,
                        "policy_s_per_step": st["policy"]["policy_s"] / a.steps,
                        "diverged": st["policy"]["diverged"]}
        acc = max(row[p]["accesses_per_step"] for p in policies)
        row["recorder_fraction"] = rec["recorder_ns"] * 1e-9 * acc / base
        report["models"][m] = row
        print(f"{m}: untiered {base * 1e3:.1f} ms/step", file=sys.stderr)
    if a.json:
        print(json.dumps(report, indent=1))
        return
    print(report["label"])
    print(f"recorder: {rec['recorder_ns']:.1f} ns per access, timed in C++ "
          f"[{rec['recorder_ns_range'][0]:.1f}..{rec['recorder_ns_range'][1]:.1f}] wall, "
          f"{rec['recorder_cpu_ns']:.1f} ns thread CPU time; a whole acquire+release "
          f"call from Python: {rec['acquire_release_ns']:.0f} ns")
    print(f"offload at budget {a.budget} of the footprint, {a.runs} runs of {a.steps} steps, "
          f"overhead against untiered (median [min..max] over runs):")
    for m, row in report["models"].items():
        print(f"  {m:8s} untiered {row['untiered_step_ms']:7.1f} ms/step ({row['untiered_cpu_ms']:.1f} ms CPU); recorder "
              f"{100 * row['recorder_fraction']:.3f}% of a step")
        for pol in policies:
            r = row[pol]
            print(f"    {pol:10s} {r['step_ms']:7.1f} ms  {100 * r['overhead']:+6.1f}% "
                  f"[{100 * r['overhead_range'][0]:+.1f}..{100 * r['overhead_range'][1]:+.1f}]  "
                  f"CPU {100 * r['cpu_overhead']:+.1f}% "
                  f"[{100 * r['cpu_overhead_range'][0]:+.1f}..{100 * r['cpu_overhead_range'][1]:+.1f}]  "
                  f"stall {r['stall_s']:.3f} s  prefetches {r['prefetches']} (used {r['prefetch_hits']})  "
                  f"accesses/step {r['accesses_per_step']:.0f}  policy {1e3 * r['policy_s_per_step']:.2f} ms/step")


if __name__ == "__main__":
    main()
