"""`u3m report` and `u3m plan cost` end to end (issue 20 items 3 and 6).

The results are made by the built `u3m` (U3M_BIN) on small inputs, so a change
in a command's JSON that the report cannot read fails here. The report is
rendered in headless Chromium to a screenshot, which must be a page with
plots on it: its size, and enough non-white, many-coloured pixels.
"""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

U3M = os.environ.get("U3M_BIN", "build/release/apps/u3m/u3m")


def run(*args, check=True):
    p = subprocess.run([U3M, *args], capture_output=True, text=True, timeout=240)
    if check and p.returncode != 0:
        raise AssertionError(f"u3m {' '.join(args)}: exit {p.returncode}\n{p.stderr}")
    return p


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    raise AssertionError("no chromium: scripts/install-deps.sh installs Debian's chromium")


# A timeline as the trace-event format has it: counters per tier, plus the metadata and spans
# a real one carries (the report plots any counter track).
TIMELINE = {"traceEvents": [
    {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "card 0"}},
    {"name": "matmul", "ph": "X", "pid": 0, "tid": 1, "ts": 0, "dur": 500},
] + [{"name": f"{tier} used", "cat": "occupancy", "ph": "C", "pid": 0, "tid": 0,
      "ts": 1000 * i, "args": {"bytes": (i % 7 + k) * 2 ** 28}}
     for i in range(40) for k, tier in enumerate(["device", "host", "ssd"])],
    "otherData": {"clock": "virtual clock, the test timeline (not measured)"}}


class ReportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="u3m-report-test.")
        d = cls.dir
        cls.files = {}

        def save(name, proc):
            path = os.path.join(d, name)
            with open(path, "w") as f:
                f.write(proc.stdout)
            cls.files[name] = path

        trace = os.path.join(d, "mixed.u3mt")
        run("trace", "gen", "--model", "tiny", "--workload", "mixed", "--pattern", "timeshare",
            "--requests", "4", "-o", trace)
        save("predict.json", run("predict", "eval", trace, "--json"))
        save("serve.json", run("serve", "capacity", "--requests", "rag:requests=200",
                               "--model", "llama3-8b", "--policies", "hbm-only,u3m", "--json"))
        save("train.json", run("train", "capacity", "--policies", "hbm-only,u3m", "--full-ft",
                               "none", "--resolution", "0.25", "--steps", "2", "--json"))
        save("plan.json", run("plan", "cost", "--train", "llama2-13b", "--hw", "nvidia-h200",
                              "--max-cards", "8", "--json"))
        path = os.path.join(d, "timeline.json")
        with open(path, "w") as f:
            json.dump(TIMELINE, f)
        cls.files["timeline.json"] = path

    def test_report_renders_in_chromium(self):
        out = os.path.join(self.dir, "report.html")
        p = run("report", *self.files.values(), "-o", out, "--summary")
        self.assertIn("report: ", p.stdout)
        with open(out) as f:
            page = f.read()
        # One figure per plotted result: train (1 sweep), serve, predict (1 trace), timeline, plan.
        self.assertEqual(page.count("<img "), 5, p.stdout)
        self.assertNotIn("src='http", page)  # self-contained: images are data: URLs
        # Every figure is labelled with how its numbers were obtained, from the results.
        for label in ["simulated with profile ascend-910b-32g", "simulated (profile "
                      "ascend-910b-32g, model llama3-8b", "computed from the trace",
                      "virtual clock, the test timeline", "simulated (profile nvidia-h200"]:
            self.assertTrue(label in page, f"no label '{label}' in the report")
        shot = os.path.join(self.dir, "shot.png")
        subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", "--window-size=1000,2400", f"--screenshot={shot}",
                        "file://" + out], capture_output=True, timeout=120, check=True)
        import matplotlib.image
        img = matplotlib.image.imread(shot)
        self.assertEqual(img.shape[:2], (2400, 1000))
        rgb = img[:, :, :3]
        ink = (rgb.min(axis=2) < 0.9).mean()  # share of pixels that are not (near) white
        colours = len({tuple(px) for px in (rgb[::7, ::7] * 15).astype(int).reshape(-1, 3)})
        self.assertGreater(ink, 0.03, "the screenshot is (nearly) a blank page")
        self.assertGreater(colours, 20, "the screenshot has no plots (too few colours)")

    def test_summary_says_how_figures_were_obtained(self):
        p = run("report", self.files["serve.json"], self.files["predict.json"], "--summary")
        lines = p.stdout.splitlines()
        self.assertEqual(len(lines), 2, p.stdout)
        self.assertIn("simulated (profile ascend-910b-32g", lines[0])
        self.assertIn("computed from", lines[1])

    def bad(self, *args):
        p = run("report", *args, check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        self.assertTrue(p.stderr.startswith("u3m: error: "), p.stderr)
        return p.stderr

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_bad_input_is_one_line_exit_2(self):
        out = os.path.join(self.dir, "x.html")
        self.assertIn("not a result u3m report knows",
                      self.bad(self.write("other.json", '{"a": 1}'), "-o", out))
        self.assertIn("bad.json:2: not JSON", self.bad(self.write("bad.json", '{\n  "a": ]'),
                                                       "-o", out))
        # A known result with a field removed or of the wrong type names the field.
        with open(self.files["serve.json"]) as f:
            doc = json.load(f)
        del doc["policies"]["u3m"]["tried"][0]["met_fraction"]
        err = self.bad(self.write("cut.json", json.dumps(doc)), "-o", out)
        self.assertIn("policies.u3m.tried[0]: missing field 'met_fraction'", err)
        doc = dict(TIMELINE, traceEvents=[{"ph": "C", "name": "x", "ts": "soon", "args": {}}])
        self.assertIn("traceEvents[0].ts: expected a number",
                      self.bad(self.write("tl.json", json.dumps(doc)), "-o", out))
        self.assertIn("cannot read", self.bad(os.path.join(self.dir, "missing.json"), "-o", out))
        self.assertIn("give -o", self.bad(self.files["serve.json"]))
        self.assertFalse(os.path.exists(out))

    def test_missing_matplotlib_is_one_line_exit_2(self):
        shim = os.path.join(self.dir, "shim", "matplotlib")
        os.makedirs(shim, exist_ok=True)
        with open(os.path.join(shim, "__init__.py"), "w") as f:
            f.write("raise ImportError('No module named matplotlib (test shim)')\n")
        env = dict(os.environ, PYTHONPATH=os.path.dirname(shim))
        p = subprocess.run([U3M, "report", self.files["serve.json"], "-o",
                            os.path.join(self.dir, "y.html")], capture_output=True, text=True,
                           env=env, timeout=60)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("needs matplotlib", p.stderr)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)


class PlanCostTest(unittest.TestCase):
    def test_cheapest_is_the_cheapest_that_meets(self):
        p = run("plan", "cost", "--train", "llama2-13b", "--hw", "nvidia-h200", "--max-cards",
                "8", "--json")
        j = json.loads(p.stdout)
        best = j["cheapest"]
        self.assertIsNotNone(best)
        self.assertTrue(best["meets"])
        # Note [Cost search]: everything cheaper that was simulated missed the target.
        for c in j["configs"]:
            if c["cost"] is not None and c["cost"] < best["cost"]:
                self.assertFalse(c["meets"], c)
        # Every price it used carries a source and a date.
        for k, v in j["prices"].items():
            self.assertTrue(v["source"] and len(v["date"]) == 10, k)
        self.assertIn("simulated (profile nvidia-h200", j["figures"])

    def test_unpriced_card_gives_a_break_even(self):
        p = run("plan", "cost", "--train", "llama2-13b", "--max-cards", "8")
        self.assertIn("not found", p.stdout)  # the 910B has no sourced price

    def test_bad_price_table_is_one_line_exit_2(self):
        d = tempfile.mkdtemp(prefix="u3m-prices-test.")
        src = os.path.join(os.path.dirname(__file__), "..", "..", "data", "prices.json")
        with open(src) as f:
            doc = json.load(f)
        cases = [("source", "missing 'source'"), ("date", "missing 'date'")]
        for key, want in cases:
            bad = json.loads(json.dumps(doc))
            del bad["items"]["dram_gb"][key]
            path = os.path.join(d, f"no_{key}.json")
            with open(path, "w") as f:
                json.dump(bad, f)
            q = run("plan", "cost", "--train", "llama2-13b", "--prices", path, check=False)
            self.assertEqual(q.returncode, 2, q.stderr)
            self.assertIn('items."dram_gb"', q.stderr)
            self.assertIn(want, q.stderr)
            self.assertEqual(len(q.stderr.strip().splitlines()), 1, q.stderr)
        bad = json.loads(json.dumps(doc))
        bad["items"]["dram_gb"]["colour"] = "red"
        path = os.path.join(d, "extra.json")
        with open(path, "w") as f:
            json.dump(bad, f)
        q = run("plan", "cost", "--train", "llama2-13b", "--prices", path, check=False)
        self.assertEqual(q.returncode, 2)
        self.assertIn("unknown key 'colour'", q.stderr)
        q = run("plan", "cost", "--train", "llama2-13b", "--serve-rate", "3", check=False)
        self.assertEqual(q.returncode, 2)
        self.assertIn("exactly one target", q.stderr)


if __name__ == "__main__":
    unittest.main()
