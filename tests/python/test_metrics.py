"""u3m.metrics (docs/operators.md): a Runtime's metrics scraped over loopback HTTP while it
moves data, and its timeline written as trace-event JSON."""
import json
import os
import tempfile
import unittest
import urllib.request

import u3m
import u3m.metrics


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


H2D = 'u3m_link_bytes_total{card="0",link="h2d",from="host",to="device"}'


def churn(rt, n=6):
    """Writes n tensors of 1 MiB through a 3 MiB device tier and reads them back."""
    for tid in range(1, n + 1):
        rt.add(tid, 1 << 20)
        lease = rt.acquire(tid, "device", "write")
        memoryview(lease)[:4] = b"abcd"
        rt.release(lease)
    for tid in range(1, n + 1):
        lease = rt.acquire(tid, "device", "read")
        assert bytes(memoryview(lease)[:4]) == b"abcd"
        rt.release(lease)
    rt.drain()


class MetricsTest(unittest.TestCase):
    def test_served_metrics_move_with_the_runtime(self):
        rt = u3m.Runtime(device_budget=3 << 20, host_budget=64 << 20)
        m = u3m.metrics.serve(rt, port=0)
        self.assertGreater(m.port, 0)
        before = scrape(m.port)
        churn(rt)
        after = scrape(m.port)
        self.assertEqual(before[H2D], 0)
        self.assertGreater(after[H2D], before[H2D])
        self.assertEqual(after['u3m_tier_capacity_bytes{card="0",tier="device"}'], 3 << 20)
        self.assertGreater(after['u3m_tier_misses_total{card="0",tier="device"}'], 0)
        self.assertIn('u3m_monitor_time_to_oom_seconds{card="0",tier="device"}', after)
        self.assertNotIn('u3m:prefix_cache_hits_total{card="0"}', after)
        m.set_kv(query_tokens=64, hit_tokens=16, usage=0.5)
        kv = scrape(m.port)
        self.assertEqual(kv['u3m:prefix_cache_queries_total{card="0"}'], 64)
        self.assertEqual(kv['u3m:prefix_cache_hits_total{card="0"}'], 16)
        self.assertEqual(kv['u3m:kv_cache_usage_perc{card="0"}'], 0.5)
        del rt  # the engine goes; its counters stay
        self.assertGreaterEqual(scrape(m.port)[H2D], after[H2D])

    def test_timeline_and_metrics_together(self):
        rt = u3m.Runtime(device_budget=3 << 20, host_budget=64 << 20)
        m, tl = u3m.metrics.serve_and_record(rt)
        churn(rt)
        self.assertGreater(tl.counts()["transfers"], 0)
        self.assertGreater(scrape(m.port)[H2D], 0)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.json")
            tl.write(path)
            with open(path) as f:
                doc = json.load(f)
        cats = {e.get("cat") for e in doc["traceEvents"]}
        self.assertTrue({"transfer", "occupancy"} <= cats, cats)
        with self.assertRaises(u3m.InputError):
            tl.write("/nonexistent-dir/t.json")


if __name__ == "__main__":
    unittest.main()
