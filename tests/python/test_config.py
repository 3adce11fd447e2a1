"""The run config from Python (docs/config.md): u3m.load_config and
u3m.Runtime.from_config read the same file, with the same checks, as --config."""
import os
import tempfile
import unittest

import u3m

SRC = os.environ.get("U3M_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


class ConfigTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, text):
        path = os.path.join(self.dir.name, "u3m.toml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_example_loads(self):
        cfg = u3m.load_config(os.path.join(SRC, "examples", "u3m.toml"))
        self.assertEqual(cfg["tiers"]["host"]["budget"], 64 << 30)
        self.assertEqual(cfg["policy"]["tiering"], "u3m")
        self.assertEqual(cfg["kv"]["policy"], "u3m-tiered")

    def test_bad_key_names_file_line_and_key(self):
        path = self.write("[tiers.device]\nbudget = \"64M\"\nhigh_watermak = 0.9\n")
        with self.assertRaises(u3m.InputError) as e:
            u3m.load_config(path)
        self.assertIn(f"{path}:3: unknown key 'high_watermak' in [tiers.device]", str(e.exception))
        with self.assertRaises(u3m.InputError):
            u3m.Runtime.from_config(path)

    def test_runtime_from_config_and_keywords_win(self):
        path = self.write("[tiers.device]\nbudget = \"64M\"\nhigh_watermark = 0.5\n"
                          "low_watermark = 0.4\n[tiers.host]\nbudget = \"256M\"\n")
        rt = u3m.Runtime.from_config(path)
        self.assertEqual(rt.device_budget, 64 << 20)
        self.assertEqual(rt.host_budget, 256 << 20)
        rt = u3m.Runtime.from_config(path, device_budget=32 << 20)
        self.assertEqual(rt.device_budget, 32 << 20)
        self.assertEqual(rt.host_budget, 256 << 20)

    def test_watermarks_reach_the_engine(self):
        # At a 0.5 high watermark the engine evicts once more than half of the
        # budget is held; at the default 0.9 the same tensors all stay.
        def resident_after_fill(extra):
            path = self.write("[tiers.device]\nbudget = \"8M\"\n" + extra)
            rt = u3m.Runtime.from_config(path)
            for i in range(6):  # 6 MiB of 8
                rt.add(i + 1, 1 << 20)
                lease = rt.acquire(i + 1, "device", "write")
                rt.release(lease)
            rt.drain()
            return rt.stats()["used"]["device"]
        self.assertGreater(resident_after_fill(""), 5 << 20)
        self.assertLessEqual(resident_after_fill("high_watermark = 0.5\nlow_watermark = 0.4\n"),
                             4 << 20)

    def test_needs_a_device_budget(self):
        with self.assertRaises(u3m.InputError):
            u3m.Runtime.from_config(self.write("[tiers.host]\nbudget = \"1G\"\n"))
        with self.assertRaises(u3m.InputError):
            u3m.Runtime.from_config(self.write("[tiers.device]\nfraction = 0.5\n"))

    def test_version_names_the_build(self):
        self.assertTrue(u3m.__version__.startswith("u3m 0.1.0 ("), u3m.__version__)


if __name__ == "__main__":
    unittest.main()
