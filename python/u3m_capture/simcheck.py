"""The PyTorch sim-versus-real check (issue 16 item 6; docs/pytorch.md, "Sim versus real").

Real: each model trains under u3m.torch.offload at each budget (a fraction of params + grads +
full-size optimizer state, as offload's budget_fraction), real PyTorch compute on this machine:
no sleeps, no throttles. A run's step time is the median of its steps after the first two (step
1 runs before any policy exists); the figure is the median over --runs runs, interleaved.

Simulated: the same training, captured untiered (u3m.torch.capture, 3 steps), rewritten as the
offload runs it (Note [Offload view] in include/u3m/experiments/offload_check.hpp) and run by
the simulator with the same policy at the same budget, on this machine's profile:
  - what `u3m hw calibrate` measures (memcpy bandwidth, the device-emu copy link, ...);
  - torch's own rates, measured here on calibration work that is none of the checked models:
    the GEMM rate (torch.mm over a grid of shapes and layouts, one thread; Note [GEMM rate
    for the roofline]); the cost of one op of a training step (a
    tiny MLP whose every op is overhead: its untiered step time over its captured ops); and
    the cost of one offload copy (the same MLP under offload at budget 1.0: its extra time
    over its copy ops).

Prints every point's error, sim / real - 1, and exits 1 if any |error| exceeds --max-error
(so the check can fail), 2 on bad arguments. Also printed, as a row of its own: the untiered
step against the captured ops' simulated compute, the compute model alone.

    PYTHONPATH=build/release/python:python /usr/bin/python3 -m u3m_capture.simcheck
    ... --models llama,lstm --budgets 1.0,0.5 --runs 3 --json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time

import torch
import torch.nn as nn

import u3m
from u3m_capture.train_cases import MODELS, one_run

CAPTURE_STEPS = 3
DEFAULT_MODELS = "llama,llama-lora,encoder,lstm"


def machine() -> str:
    return f"{platform.node()}, {os.cpu_count()} cores"


# ------------------------------------------------------------------------------- the profile
def _median_s(fn, n: int) -> float:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


# Note [GEMM rate for the roofline]
# The roofline charges every matmul at one rate, so the rate must be what a
# mix of training's GEMMs achieves, not the best square case: backward runs
# A^T B and A B^T, and skinny shapes run slower (on vm, 2 cores: 5.5 GFLOPS
# at 256^3, 3.8-5.8 over this grid, 5.0 over all of it). The grid is generic,
# not the checked models' shapes; the achieved rate over it (total FLOPs over
# total time) weighs each shape by its time, as a step's sum does.
GEMM_SIZES = (64, 256, 512)


def gemm_rate() -> float:
    flops = seconds = 0.0
    for m in GEMM_SIZES:
        for k in GEMM_SIZES:
            for n in GEMM_SIZES:
                for a, b in ((torch.randn(m, k), torch.randn(k, n)),
                             (torch.randn(k, m).t(), torch.randn(k, n)),
                             (torch.randn(m, k), torch.randn(n, k).t())):
                    seconds += _median_s(lambda: torch.mm(a, b), 5)
                    flops += 2 * m * k * n
    return flops / seconds


def _calibration_model():
    """A tiny MLP + Adam: every op is so small that its time is the per-op cost."""
    model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(8, 8), nn.ReLU())])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    data = [torch.randn(4, 8, generator=gen) for _ in range(64)]

    def loss(m, d):
        return m(d).square().mean()
    return model, opt, data, loss


def set_field(toml: str, field: str, value: float, unit: str, source: str) -> str:
    """Replaces `field = { value = ..., unit = ..., source = ... }` in a profile's TOML text."""
    line = f'{field} = {{ value = {value:.6g}, unit = "{unit}", source = {json.dumps(source)} }}'
    out, n = re.subn(rf"^{field} = \{{.*\}}$", line, toml, count=1, flags=re.M)
    if n != 1:
        raise RuntimeError(f"simcheck: the calibrated profile has no '{field}' line")
    return out


def capture_trace(make, steps: int, path: str) -> "u3m._core.Trace":
    import u3m.torch as ut
    torch.manual_seed(0)
    model, opt, data, loss_fn = make()
    cap = ut.capture(model, opt)
    with cap:
        for d in data[:steps]:
            with cap.step():
                loss = loss_fn(model, d)
            cap.backward(loss)
            cap.optimizer_step()
    cap.save(path)
    return u3m._core.load_trace(path)


def calibrate(out_dir: str, seconds: float, steps: int, progress) -> dict:
    """This machine's profile for the check: u3m hw calibrate's, with torch's GEMM rate and
    per-op cost in place of u3m's own GEMM and device-emu's empty op; and the offload's cost per
    copy. Returns {"profile": path, "access_overhead_s": ..., "figures": {...}}."""
    date = datetime.date.today().isoformat()
    where = f"measured on {machine()} by u3m_capture.simcheck, {date}"
    progress("calibrate: u3m hw calibrate")
    toml = u3m._core.calibrate_profile(seconds, "/var/tmp", machine(), date)
    progress("calibrate: torch GEMM and per-op cost")
    gemm = gemm_rate()
    toml = set_field(toml, "peak_flops", gemm / 1e9, "GFLOPS",
                     f"{where}: torch.mm float32, one torch thread, achieved rate (total FLOPs / "
                     f"total time) over m, k, n in {GEMM_SIZES} in the layouts training runs "
                     f"(A B, A^T B, A B^T), median of 5 each")
    # The roofline alone (a profile field must be > 0: 1 ps per op is nothing here).
    zero = set_field(toml, "launch_overhead", 1e-6, "us", "calibration step only")
    zero_path = os.path.join(out_dir, "zero-overhead.toml")
    with open(zero_path, "w") as f:
        f.write(zero.replace('name = "local"', 'name = "local-torch-zero"', 1))
    trace = capture_trace(_calibration_model, CAPTURE_STEPS, os.path.join(out_dir, "calibration.jsonl"))
    ops = sum(1 for o in trace.ops() if o["iteration"] >= 1) / (CAPTURE_STEPS - 1)
    untiered, _, _, _ = one_run(_calibration_model, steps, None, None)
    tiered, _, _, st = one_run(_calibration_model, steps, 1.0, "u3m")
    sim = u3m._core.simulate_offload(trace, zero_path, st["budget_bytes"], access_overhead_s=0.0)
    per_op = max(untiered - sim["captured_compute_step_s"], 0) / ops
    copies = sim["copy_ops"] / CAPTURE_STEPS
    access = max(tiered - untiered - (sim["compute_step_s"] - sim["captured_compute_step_s"]), 0) / copies
    toml = set_field(toml, "launch_overhead", per_op * 1e6, "us",
                     f"{where}: one op of a training step, a 6-layer 8-wide MLP + Adam (every op "
                     f"overhead), untiered step {untiered * 1e3:.2f} ms / {ops:.0f} captured ops")
    toml = toml.replace('name = "local"', 'name = "local-torch"', 1)
    path = os.path.join(out_dir, "local-torch.toml")
    with open(path, "w") as f:
        f.write(toml)
    return {"profile": path, "access_overhead_s": access,
            "figures": {"gemm_flops": gemm, "op_overhead_s": per_op, "access_overhead_s": access,
                        "calibration_ops_per_step": ops, "calibration_copies_per_step": copies,
                        "calibration_untiered_step_s": untiered, "calibration_offload_step_s": tiered,
                        "source": f"{where}; the access overhead: the same MLP under offload at "
                                  f"budget 1.0, ({tiered * 1e3:.2f} - {untiered * 1e3:.2f}) ms "
                                  f"less the copies' bytes, / {copies:.0f} copy ops a step"}}


# ------------------------------------------------------------------------------- the check
def check_model(name: str, budgets, policy: str, steps: int, runs: int, cal: dict, out_dir: str,
                progress) -> dict:
    make = MODELS[name]
    progress(f"{name}: capture")
    trace = capture_trace(make, CAPTURE_STEPS, os.path.join(out_dir, f"{name}.jsonl"))
    real = {"untiered": []}
    real.update({b: [] for b in budgets})
    budget_bytes, stats, ref = {}, {}, None
    for r in range(runs):
        progress(f"{name}: run {r + 1} of {runs}")
        t, _, ref, _ = one_run(make, steps, None, None)
        real["untiered"].append(t)
        for b in budgets:
            t, _, losses, st = one_run(make, steps, b, policy)
            if losses != ref:
                raise SystemExit(f"simcheck: {name} at budget {b}: losses differ from untiered")
            real[b].append(t)
            budget_bytes[b], stats[b] = st["budget_bytes"], st
    points = []
    for b in budgets:
        sim = u3m._core.simulate_offload(trace, cal["profile"], budget_bytes[b], policy=policy,
                                         access_overhead_s=cal["access_overhead_s"])
        if not sim["ok"]:
            raise SystemExit(f"simcheck: {name} at budget {b}: the simulation failed: {sim['first_error']}")
        step = statistics.median(real[b])
        st = stats[b]
        points.append({"budget": b, "budget_bytes": budget_bytes[b], "real_step_s": step,
                       "real_step_s_range": [min(real[b]), max(real[b])], "sim_step_s": sim["step_s"],
                       "error": sim["step_s"] / step - 1,
                       "real": {"evictions": st["evictions"], "prefetches": st["prefetches"],
                                "prefetch_hits": st["prefetch_hits"], "stall_s": st["stall_s"]},
                       "sim": {k: sim[k] for k in ("stall_s", "h2d_bytes", "d2h_bytes", "evictions",
                                                   "peak_device", "compute_step_s")}})
    untiered = statistics.median(real["untiered"])
    captured = sim["captured_compute_step_s"]  # the same for every budget
    return {"untiered_real_step_s": untiered, "untiered_sim_compute_s": captured,
            "untiered_error": captured / untiered - 1, "points": points}


def parse_budgets(text: str, parser) -> list:
    out = []
    for part in text.split(","):
        try:
            b = float(part)
        except ValueError:
            parser.error(f"--budgets: '{part}' is not a number")
        if not 0 < b <= 1:
            parser.error(f"--budgets: {b} is outside (0, 1]")
        out.append(b)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m u3m_capture.simcheck", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=DEFAULT_MODELS, help=f"of {', '.join(MODELS)} (default %(default)s)")
    p.add_argument("--budgets", default="1.0,0.7,0.5,0.3", help="budget fractions (default %(default)s)")
    p.add_argument("--policy", default="u3m", help="tiering policy, both sides (default %(default)s)")
    p.add_argument("--steps", type=int, default=8, help="steps per real run, >= 4 (default %(default)s)")
    p.add_argument("--runs", type=int, default=2, help="real runs per point (default %(default)s)")
    p.add_argument("--calibrate-seconds", type=float, default=3, help="u3m hw calibrate's time (default %(default)s)")
    p.add_argument("--profile", help="use this profile instead of calibrating (with --access-overhead-us)")
    p.add_argument("--access-overhead-us", type=float, help="the offload's cost per copy, with --profile")
    p.add_argument("--max-error", type=float, default=0.10, help="fail above this |sim/real - 1| (default %(default)s)")
    p.add_argument("--out", help="keep the profile and traces here (default: a temporary directory)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    a = p.parse_args(argv)
    models = a.models.split(",")
    for m in models:
        if m not in MODELS:
            p.error(f"--models: unknown model '{m}' (expected {', '.join(MODELS)})")
    budgets = parse_budgets(a.budgets, p)
    if a.steps < 4:
        p.error(f"--steps must be >= 4 (two warm-up steps are dropped), got {a.steps}")
    if a.runs < 1:
        p.error(f"--runs must be >= 1, got {a.runs}")
    if not a.max_error >= 0:
        p.error(f"--max-error must be >= 0, got {a.max_error}")
    if not a.calibrate_seconds > 0:
        p.error(f"--calibrate-seconds must be > 0, got {a.calibrate_seconds}")
    if (a.profile is None) != (a.access_overhead_us is None):
        p.error("--profile and --access-overhead-us go together")
    if a.profile is not None and not os.path.isfile(a.profile):
        p.error(f"--profile: no file '{a.profile}'")
    if a.policy not in u3m._core.tiering_policy_names():
        p.error(f"--policy: unknown policy '{a.policy}' (expected {', '.join(u3m._core.tiering_policy_names())})")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(1)

    def progress(msg):
        if not a.quiet:
            print(f"simcheck: {msg}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="u3m-simcheck-") as tmp:
        out_dir = a.out or tmp
        if a.profile:
            cal = {"profile": a.profile, "access_overhead_s": a.access_overhead_us * 1e-6,
                   "figures": {"source": "given: --profile and --access-overhead-us"}}
        else:
            cal = calibrate(out_dir, a.calibrate_seconds, a.steps, progress)
        report = {"real": f"measured on {machine()} (torch {torch.__version__}, 1 torch thread), wall clock",
                  "sim": f"simulated with profile {cal['profile']}, policy {a.policy}",
                  "calibration": cal["figures"], "max_error": a.max_error, "models": {}}
        for m in models:
            report["models"][m] = check_model(m, budgets, a.policy, a.steps, a.runs, cal, out_dir, progress)
    worst = max(abs(pt["error"]) for r in report["models"].values() for pt in r["points"])
    report["worst_error"] = worst
    report["pass"] = worst <= a.max_error
    if a.json:
        print(json.dumps(report, indent=1))
    else:
        f = cal["figures"]
        print(f"real: {report['real']}")
        print(f"sim:  {report['sim']}")
        if "gemm_flops" in f:
            print(f"      torch GEMM {f['gemm_flops'] / 1e9:.2f} GFLOPS, {f['op_overhead_s'] * 1e6:.2f} us per op, "
                  f"{f['access_overhead_s'] * 1e6:.2f} us per offload copy (calibration MLP, measured)")
        print(f"{'model':11s} {'budget':>8s} {'real step':>10s} {'sim step':>10s} {'error':>7s}")
        for m, r in report["models"].items():
            print(f"{m:11s} {'untiered':>8s} {r['untiered_real_step_s'] * 1e3:8.1f} ms "
                  f"{r['untiered_sim_compute_s'] * 1e3:8.1f} ms {100 * r['untiered_error']:+6.1f}%  (compute model alone)")
            for pt in r["points"]:
                bad = "" if abs(pt["error"]) <= a.max_error else "  over the bound"
                print(f"{'':11s} {pt['budget']:8.2f} {pt['real_step_s'] * 1e3:8.1f} ms "
                      f"{pt['sim_step_s'] * 1e3:8.1f} ms {100 * pt['error']:+6.1f}%{bad}")
        print(f"worst |error| {100 * worst:.1f}% against {100 * a.max_error:.0f}%: "
              f"{'pass' if report['pass'] else 'FAIL'}")
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
