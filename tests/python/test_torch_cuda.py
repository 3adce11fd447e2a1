"""The CUDA path of the Runtime, u3m.torch.offload and the tiered KV cache, tested without a GPU
(Note [Offload on CUDA] in python/u3m/torch.py).

With U3M_TEST_CUDA_DOUBLE (ctest sets it: u3m's test double of the CUDA runtime over host
memory, tests/mem/doubles) the Runtime opens on backend "cuda" and its copies go through the
cuda backend into the double's "device" memory. Torch cannot run kernels on that memory, so these
tests check the interface a lease offers torch and the bytes the C++ side moved, not torch on CUDA:
that needs a GPU (scripts/gpu-check.sh).
"""
import contextlib
import ctypes
import os
import unittest

import torch

import u3m
import u3m.torch as ut
from u3m import _core

DOUBLE = os.environ.get("U3M_TEST_CUDA_DOUBLE", "")


@contextlib.contextmanager
def cuda_runtime_library(path):
    """The cuda backend loads `path` as libcudart (and as libcuda for VMM) while inside."""
    keys = ("U3M_CUDART_LIBRARY", "U3M_CUDA_DRIVER_LIBRARY")
    old = {k: os.environ.get(k) for k in keys}
    for k in keys:
        os.environ[k] = path
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def double_calls(lib, api: str) -> int:
    lib.u3m_double_calls.restype = ctypes.c_uint64
    return lib.u3m_double_calls(api.encode())


class BackendOptionTest(unittest.TestCase):
    def test_the_default_backend_is_device_emu_and_its_leases_are_host_buffers(self):
        rt = u3m.Runtime(device_budget=1 << 20)
        self.assertEqual(rt.backend, "device-emu")
        self.assertIn("emulated", rt.backend_detail)
        self.assertFalse(rt.test_double)
        rt.add(1, 4096)
        lease = rt.acquire(1, "device", "write")
        memoryview(lease)[:4] = b"abcd"  # the emulated device is host memory
        self.assertFalse(hasattr(lease, "__cuda_array_interface__"))
        rt.release(lease)
        self.assertNotIn("host_cache", rt.stats())  # device-emu's host tier is not pinned by a runtime

    def test_cuda_without_a_runtime_is_one_error_with_the_registrys_reason(self):
        with cuda_runtime_library("/nonexistent/libcudart.so"):
            with self.assertRaises(ValueError) as cm:
                u3m.Runtime(device_budget=1 << 20, backend="cuda")
        msg = str(cm.exception)
        self.assertIn("backend 'cuda' cannot open", msg)
        self.assertIn("/nonexistent/libcudart.so", msg)  # the registry's reason names the library

    def test_an_unknown_backend_is_refused_naming_the_choices(self):
        with self.assertRaises(ValueError) as cm:
            u3m.Runtime(device_budget=1 << 20, backend="tpu")
        self.assertIn("auto, device-emu, cuda, acl", str(cm.exception))

    def test_a_link_throttle_is_refused_on_a_real_backend(self):
        with cuda_runtime_library("/nonexistent/libcudart.so"):
            with self.assertRaises(ValueError) as cm:
                u3m.Runtime(device_budget=1 << 20, backend="cuda", h2d_gbps=1.0)
        self.assertIn("device-emu only", str(cm.exception))


@unittest.skipUnless(DOUBLE, "U3M_TEST_CUDA_DOUBLE is not set (ctest sets it)")
class CudaDoubleRuntimeTest(unittest.TestCase):
    def setUp(self):
        self.env = cuda_runtime_library(DOUBLE)
        self.env.__enter__()
        self.lib = ctypes.CDLL(DOUBLE)  # the very instance the backend loads
        self.lib.u3m_double_reset()

    def tearDown(self):
        self.env.__exit__(None, None, None)

    def test_leases_offer_host_buffers_and_device_cuda_arrays(self):
        rt = u3m.Runtime(device_budget=4 << 20, host_budget=16 << 20, backend="cuda")
        self.assertEqual(rt.backend, "cuda")
        self.assertTrue(rt.test_double)
        self.assertIn("test double", rt.backend_detail)
        n = 64 << 10
        data = bytes((i * 7 + 3) % 251 for i in range(n))
        rt.add(1, n)
        host = rt.acquire(1, "host", "write")  # pinned host memory: a buffer
        memoryview(host)[:] = data
        self.assertFalse(hasattr(host, "__cuda_array_interface__"))
        rt.release(host)

        copies = double_calls(self.lib, "cudaMemcpyAsync")
        dev = rt.acquire(1, "device", "read")  # an h2d copy on the backend's stream
        self.assertGreater(double_calls(self.lib, "cudaMemcpyAsync"), copies)
        cai = dev.__cuda_array_interface__
        self.assertEqual(cai["shape"], (n,))
        self.assertEqual(cai["typestr"], "|u1")
        self.assertEqual(cai["version"], 3)
        self.assertIsNone(cai["stream"])  # acquire waited for the copy
        self.assertIsNone(cai["strides"])
        ptr, readonly = cai["data"]
        self.assertEqual(ptr, dev.address)
        self.assertTrue(readonly)
        with self.assertRaises(BufferError) as cm:
            memoryview(dev)  # device memory is not host memory
        self.assertIn("__cuda_array_interface__", str(cm.exception))
        # Only on the double is "device" memory readable from the CPU: the copy landed there.
        self.assertEqual(ctypes.string_at(ptr, n), data)
        rt.release(dev)
        with self.assertRaises(BufferError):
            dev.__cuda_array_interface__  # released

        # Written on the device, moved back by the engine (d2h), read on the host.
        dev = rt.acquire(1, "device", "write")
        self.assertFalse(dev.__cuda_array_interface__["data"][1])
        ctypes.memmove(dev.address, b"\x5a" * 100, 100)
        rt.release(dev)
        rt.evict(1, "device")
        rt.drain()
        self.assertEqual(rt.residency(1)["valid"], ["host"])
        host = rt.acquire(1, "host", "read")
        self.assertEqual(bytes(memoryview(host)), b"\x5a" * 100 + data[100:])
        rt.release(host)
        self.assertTrue(rt.remove(1))
        # Note [Pinned host cache]: the removed tensor's pinned block is kept, not freed.
        hc = rt.stats()["host_cache"]
        self.assertEqual((hc["live_bytes"], hc["cached_bytes"]), (0, n))
        self.assertEqual(double_calls(self.lib, "cudaFreeHost"), 0)

    def test_a_cpu_model_never_opens_the_cuda_backend(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        off = ut.offload(model, opt, budget_fraction=1.0)
        loss = model(torch.randn(8, 32)).square().mean()
        loss.backward()
        opt.step()
        self.assertEqual(off.backend, "device-emu")
        self.assertEqual(off.rt.backend, "device-emu")
        self.assertEqual(off.stats()["release_sync_s"], 0.0)
        off.close()
        opened = sum(double_calls(self.lib, api)
                     for api in ("cudaGetDeviceCount", "cudaSetDevice", "cudaMalloc", "cudaHostAlloc"))
        self.assertEqual(opened, 0)

    def test_the_tiered_kv_cache_keeps_its_blocks_in_cuda_memory(self):
        from u3m_capture.model import KVCache, ModelConfig
        from u3m.kv_cache import TieredKVCache, TieredKVManager
        cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                          ffn_hidden=64, max_seq_len=64)
        mgr = TieredKVManager(cfg, device_budget_bytes=64 << 10, host_bytes=1 << 20,
                              block_tokens=4, device="cuda")
        self.assertEqual(mgr.backend, "cuda")
        self.assertEqual(mgr.store.backend, "cuda")
        prompts = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(3))
        dense = KVCache(cfg, 2, 12)
        h2d = double_calls(self.lib, "cudaMemcpy")
        with TieredKVCache(mgr, 2, 12, prompts) as tiered:
            g = torch.Generator().manual_seed(4)
            for start, n in ((0, 6), (6, 1), (7, 1)):
                for layer in range(cfg.n_layers):
                    k = torch.randn(2, n, cfg.n_kv_heads, cfg.head_dim, generator=g)
                    v = torch.randn(2, n, cfg.n_kv_heads, cfg.head_dim, generator=g)
                    want = dense.update(layer, start, k, v)
                    got = tiered.update(layer, start, k, v)
                    self.assertTrue(torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]))
        # The blocks' bytes went through the backend's synchronous copies (h2d and d2h).
        self.assertGreater(double_calls(self.lib, "cudaMemcpy"), h2d)


class DeviceDetectionTest(unittest.TestCase):
    def _model_opt(self, device_of_second="cpu"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        model[1].to(device_of_second)
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    def test_parameters_on_two_devices_are_refused(self):
        model, opt = self._model_opt("meta")
        with self.assertRaises(ValueError) as cm:
            ut.offload(model, opt, budget_fraction=1.0)
        self.assertIn("more than one device (cpu, meta)", str(cm.exception))

    def test_a_device_type_without_a_backend_is_refused(self):
        model = torch.nn.Linear(4, 4).to("meta")
        with self.assertRaises(ValueError) as cm:
            ut.offload(model, torch.optim.SGD(model.parameters(), lr=0.1), budget_fraction=1.0)
        self.assertIn("u3m runs on cpu, cuda, npu models", str(cm.exception))

    def test_lease_tensors_on_cpu_are_buffers(self):
        rt = u3m.Runtime(device_budget=1 << 20)
        rt.add(1, 16)
        lease = rt.acquire(1, "device", "write")
        t = ut._lease_tensor(lease, torch.float32, torch.device("cpu"))
        t.copy_(torch.arange(4.0))
        self.assertEqual(bytes(memoryview(lease)), torch.arange(4.0).numpy().tobytes())
        del t
        rt.release(lease)


if __name__ == "__main__":
    unittest.main()
