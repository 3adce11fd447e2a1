"""What catching a parameter use outside its unit costs (issue 16, item 1), per mechanism.

A 2-layer nn.TransformerEncoder (d 64) forward+backward, untouched and under each way of
seeing parameter uses, no offload: the figure is the mechanism's own cost. Prints measured
wall clock on this machine (median of 5 repeats of 60 steps).

    /usr/bin/python3 bench/torch_guard_cost.py
"""
import platform
import statistics
import time

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

D = 64
DTF = torch._C.DisableTorchFunction


def model():
    torch.manual_seed(0)
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(D, 4, 128, dropout=0.0, batch_first=True), 2)


X = torch.randn(4, 16, D)


def step_us(m, n=60, repeats=5):
    for _ in range(5):
        m(X).sum().backward()
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            m(X).sum().backward()
        runs.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(runs)


def passthrough(cls, func, types, args=(), kwargs=None):
    with DTF():
        return func(*args, **(kwargs or {}))


class Guarded(nn.Parameter):  # what u3m.torch.offload uses
    __torch_function__ = classmethod(passthrough)


class EveryOp(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class EveryAtenOp(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class ParamDict(dict):  # ZeRO-3's `_parameters` interception
    def __getitem__(self, k):
        return dict.__getitem__(self, k)


def main():
    res = {"none": step_us(model())}
    m = model()
    for p in m.parameters():
        p.__class__ = Guarded
    res["guarded parameter class (__torch_function__)"] = step_us(m)
    m = model()
    for mod in m.modules():
        mod._parameters = ParamDict(mod._parameters)
    res["_parameters dict interception"] = step_us(m)
    m = model()
    with EveryOp():
        res["TorchFunctionMode (every op)"] = step_us(m)
    m = model()
    with EveryAtenOp():
        res["TorchDispatchMode (every aten op)"] = step_us(m)
    print(f"measured on {platform.node()} ({torch.get_num_threads()} torch threads, torch {torch.__version__})")
    for k, v in res.items():
        print(f"{k:46s} {v:8.0f} us/step  {100 * (v / res['none'] - 1):+6.1f}%")


if __name__ == "__main__":
    main()
