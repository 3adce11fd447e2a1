"""The remote KV tier on Redis under the Python KV cache (issue 21 item 1; docs/kv.md, "Remote
tier on Redis"): separate serving processes (tests/python/remote_kv_worker.py) share a prompt
prefix through a redis-server this test starts on a free loopback port. The second process's
prefix is a remote hit, its prefill skips it, and its tokens and K/V bytes are those of a run
without the remote. A server killed or paused mid-run degrades to the local tiers: same
tokens, bounded time.

Run (after building u3m_python): PYTHONPATH=build/release/python:python /usr/bin/python3 -m \
    unittest discover -s tests/python -p test_remote_kv.py -v
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import unittest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "remote_kv_worker.py")
PROMPT, NEW, SYSTEM_BLOCKS = 37, 8, 4  # the worker's prompt length, new tokens, shared blocks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """redis-server on loopback: no persistence, bounded memory, LRU eviction."""

    def __init__(self):
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not come up on port {self.port}")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


def run_worker(*args, timeout=120):
    """The worker's JSON and stderr; a hang fails the test (subprocess.TimeoutExpired)."""
    p = subprocess.run([sys.executable, WORKER, *args], capture_output=True, text=True,
                       timeout=timeout, env=os.environ)
    if p.returncode != 0:
        raise AssertionError(f"worker {args} exited {p.returncode}:\n{p.stderr}")
    return json.loads(p.stdout), p.stderr


class RemoteOptionsTest(unittest.TestCase):
    def test_bad_remote_options_are_refused_naming_them(self):
        from u3m.kv_cache import TieredKVManager
        from u3m_capture.model import ModelConfig
        cfg = ModelConfig(vocab_size=256, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, ffn_hidden=96,
                          max_seq_len=64)
        kw = dict(device_budget_bytes=1 << 20, host_bytes=1 << 20, block_tokens=8)
        with self.assertRaisesRegex(ValueError, "model_id"):
            TieredKVManager(cfg, remote="redis://127.0.0.1:1", **kw)
        for bad in ("127.0.0.1:6379", "redis://host", "redis://h:99999", "redis://user@h:1"):
            with self.assertRaisesRegex(ValueError, "remote"):
                TieredKVManager(cfg, remote=bad, model_id="m", **kw)
        # A server that is not there is not an error: the manager serves from its local tiers.
        m = TieredKVManager(cfg, remote=f"redis://127.0.0.1:{free_port()}", model_id="m", **kw)
        self.assertEqual(m.stats()["remote"]["errors"], 0)


@unittest.skipIf(shutil.which("redis-server") is None, "redis-server is not installed (scripts/install-deps.sh)")
class RemoteKvTest(unittest.TestCase):
    def setUp(self):
        self.redis = Redis()
        self.addCleanup(self.redis.stop)

    def test_a_second_process_skips_the_prefill_of_a_prefix_the_first_stored(self):
        first, _ = run_worker("--remote", self.redis.url, "--batches", "7:100")
        b = first["batches"][0]
        self.assertEqual(b["remote_blocks"], [0, 0])
        self.assertEqual(b["computed"], PROMPT + NEW - 1)  # full prefill, then decode
        self.assertEqual(first["remote"]["puts"], SYSTEM_BLOCKS)  # full blocks, row 1's are the same
        self.assertEqual(first["remote"]["errors"], 0)

        second, _ = run_worker("--remote", self.redis.url, "--batches", "7:200")
        b = second["batches"][0]
        # Row 0 fetches the shared blocks from the remote; row 1 then hits them locally.
        self.assertEqual(b["remote_blocks"], [SYSTEM_BLOCKS, 0])
        self.assertEqual(b["hit_blocks"], [SYSTEM_BLOCKS, SYSTEM_BLOCKS])
        self.assertEqual(b["skipped"], 8 * SYSTEM_BLOCKS)
        self.assertEqual(b["computed"], PROMPT - 8 * SYSTEM_BLOCKS + NEW - 1)
        self.assertEqual(second["remote"]["hits"], SYSTEM_BLOCKS)
        self.assertEqual(second["remote"]["puts"], 0)  # it fetched them: the index has them

        alone, _ = run_worker("--batches", "7:200")  # no remote, full prefill
        self.assertEqual(alone["batches"][0]["computed"], PROMPT + NEW - 1)
        self.assertEqual(b["tokens"], alone["batches"][0]["tokens"])
        self.assertEqual(b["kv_sha256"], alone["batches"][0]["kv_sha256"])

    @unittest.skipIf(shutil.which("redis-cli") is None, "redis-cli is not installed")
    def test_a_corrupted_value_is_a_miss_and_the_next_put_repairs_it(self):
        run_worker("--remote", self.redis.url, "--batches", "7:100")
        cli = ["redis-cli", "-p", str(self.redis.port)]
        keys = subprocess.run(cli + ["--scan", "--pattern", "u3m:kv1:*"], capture_output=True,
                              text=True, check=True, timeout=10).stdout.split()
        self.assertEqual(len(keys), SYSTEM_BLOCKS)
        for k in keys:  # one payload byte of every stored block (the header is 32 bytes)
            subprocess.run(cli + ["SETRANGE", k, "40", "\x7f"], check=True, capture_output=True, timeout=10)
        got, _ = run_worker("--remote", self.redis.url, "--batches", "7:200")
        want, _ = run_worker("--batches", "7:200")
        b = got["batches"][0]
        self.assertEqual(b["remote_blocks"], [0, 0])  # the checksum refused the first block
        self.assertEqual(got["remote"]["corrupt"], 1)
        self.assertEqual(b["computed"], PROMPT + NEW - 1)
        self.assertEqual(b["tokens"], want["batches"][0]["tokens"])
        self.assertEqual(b["kv_sha256"], want["batches"][0]["kv_sha256"])
        # It recomputed the prefix and put it again over the damaged values: a third process hits.
        self.assertEqual(got["remote"]["puts"], SYSTEM_BLOCKS)
        third, _ = run_worker("--remote", self.redis.url, "--batches", "7:300")
        self.assertEqual(third["batches"][0]["remote_blocks"], [SYSTEM_BLOCKS, 0])
        self.assertEqual(third["remote"]["corrupt"], 0)

    def test_killing_the_server_mid_run_falls_back_to_the_local_tiers(self):
        run_worker("--remote", self.redis.url, "--batches", "7:100")
        # Batch 0 fetches the prefix from the remote; batches 1 and 2 have prefixes of their own.
        # The server dies as batch 1's prefill starts (after its fetch missed): its put fails,
        # and batch 2's get and put find no server. Tokens are the no-remote run's.
        tails = "7:200,8:201,9:202"
        got, err = run_worker("--remote", self.redis.url, "--batches", tails,
                              "--kill-pid", str(self.redis.proc.pid), "--kill-at", "1", timeout=60)
        want, _ = run_worker("--batches", tails)
        self.assertEqual(got["batches"][0]["remote_blocks"], [SYSTEM_BLOCKS, 0])
        for g, w in zip(got["batches"], want["batches"]):
            self.assertEqual(g["tokens"], w["tokens"])
            self.assertEqual(g["kv_sha256"], w["kv_sha256"])
        self.assertEqual(got["remote"]["errors"], 3)  # batch 1's put, batch 2's get and put
        self.assertEqual(got["remote"]["hits"], SYSTEM_BLOCKS)
        self.assertEqual(err.count("serving from the local tiers"), 1, err)  # logged once

    def test_a_paused_server_costs_bounded_timeouts_not_a_hang(self):
        run_worker("--remote", self.redis.url, "--batches", "7:100")
        self.redis.proc.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        got, _ = run_worker("--remote", self.redis.url, "--batches", "7:200,8:201", timeout=60)
        wall = time.monotonic() - t0
        want, _ = run_worker("--batches", "7:200,8:201")
        for g, w in zip(got["batches"], want["batches"]):
            self.assertEqual(g["tokens"], w["tokens"])
        self.assertEqual(got["remote"]["hits"], 0)
        self.assertGreaterEqual(got["remote"]["errors"], 1)
        # One 200 ms timeout, then backoff skips the rest: far below the 60 s guard.
        self.assertLess(sum(b["wall_s"] for b in got["batches"]), 5.0)
        self.redis.proc.send_signal(signal.SIGCONT)


if __name__ == "__main__":
    unittest.main()
