"""The PyTorch sim-versus-real check (u3m_capture.simcheck, issue 16 item 6): it runs real
training against the simulator's prediction, and it can fail.

Run (after building u3m_python): PYTHONPATH=build/release/python /usr/bin/python3 -m unittest \
    discover -s tests/python -p test_simcheck.py -v
"""
import contextlib
import io
import json
import math
import os
import tempfile
import unittest

import u3m
from u3m_capture import simcheck

SMALL = ["--models", "lstm", "--budgets", "1.0,0.5", "--steps", "4", "--runs", "1", "--quiet"]


def run(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = simcheck.main(argv)
    return rc, out.getvalue()


class SimCheckTest(unittest.TestCase):
    def test_a_wrong_profile_fails_the_check(self):
        # A machine 1000x faster than this one: the simulator predicts far shorter steps than
        # the real runs take, and the check must say so and exit 1.
        with tempfile.TemporaryDirectory() as d:
            toml = u3m._core.calibrate_profile(0.5, "/var/tmp", "test", "2026-01-01")
            toml = simcheck.set_field(toml, "peak_flops", 5000, "GFLOPS", "wrong on purpose")
            toml = simcheck.set_field(toml, "launch_overhead", 0.001, "us", "wrong on purpose")
            path = os.path.join(d, "fast.toml")
            with open(path, "w") as f:
                f.write(toml)
            rc, out = run(SMALL + ["--profile", path, "--access-overhead-us", "0", "--json"])
        self.assertEqual(rc, 1)
        rep = json.loads(out)
        self.assertFalse(rep["pass"])
        points = rep["models"]["lstm"]["points"]
        self.assertEqual([p["budget"] for p in points], [1.0, 0.5])
        for p in points:
            self.assertLess(p["error"], -0.5, p)
            self.assertGreater(p["real_step_s"], 0)

    def test_a_calibrated_run_reports_every_point(self):
        # Whether it passes depends on the machine (a benchmark's business); what it reports
        # must be whole: each budget, both sides, a finite error, and the compute-model row.
        rc, out = run(SMALL + ["--json", "--calibrate-seconds", "0.5"])
        rep = json.loads(out)
        self.assertEqual(rc, 0 if rep["pass"] else 1)
        cal = rep["calibration"]
        self.assertGreater(cal["gemm_flops"], 1e8)
        self.assertGreater(cal["op_overhead_s"], 0)
        r = rep["models"]["lstm"]
        self.assertGreater(r["untiered_real_step_s"], 0)
        self.assertGreater(r["untiered_sim_compute_s"], 0)
        for p in r["points"]:
            self.assertTrue(math.isfinite(p["error"]), p)
            self.assertGreater(p["sim_step_s"], 0)
            self.assertAlmostEqual(p["error"], p["sim_step_s"] / p["real_step_s"] - 1)
        # The lower budget moves more state in the simulation.
        lo, hi = r["points"][1]["sim"], r["points"][0]["sim"]
        self.assertGreater(lo["h2d_bytes"] + lo["d2h_bytes"], hi["h2d_bytes"] + hi["d2h_bytes"])
        self.assertAlmostEqual(rep["worst_error"], max(abs(p["error"]) for p in r["points"]))

    def test_bad_arguments_exit_2(self):
        for argv in (["--budgets", "1.5"], ["--budgets", "x"], ["--models", "nope"],
                     ["--steps", "2"], ["--profile", "/nonexistent.toml", "--access-overhead-us", "1"],
                     ["--profile", "/x.toml"], ["--policy", "nope"], ["--max-error", "-1"],
                     ["--calibrate-seconds", "0"], ["--runs", "0"]):
            with self.subTest(argv=argv), contextlib.redirect_stderr(io.StringIO()):
                with self.assertRaises(SystemExit) as cm:
                    simcheck.main(argv)
                self.assertEqual(cm.exception.code, 2)


if __name__ == "__main__":
    unittest.main()
