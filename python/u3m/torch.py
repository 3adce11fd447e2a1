"""PyTorch integration: trace capture and training offload under u3m (docs/pytorch.md).

    import u3m.torch as ut
    with ut.capture(model, opt) as cap:          # a u3m trace of real training steps
        for batch in data:
            with cap.step():
                loss = loss_fn(model, batch)
                cap.backward(loss)
                cap.optimizer_step()
    cap.save("train.u3mt")

    off = ut.offload(model, opt, budget_fraction=0.5)   # params, grads, Adam state in u3m tiers
    for batch in data:                                   # the loop is unchanged
        loss = loss_fn(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    off.stats()["peak_device_bytes"] <= off.budget_bytes
    off.close()                                          # parameters back in plain tensors

Note [Offload design]
The device tier is the engine's emulated device (a capacity-limited arena in
host memory; a real device later) with a budget in bytes. What lives in u3m:
every parameter, its gradient and its optimizer state (one engine tensor each),
and the activations autograd saves for backward. Between uses a parameter's
`.data` is a placeholder of the right shape (a NaN broadcast, so a use outside
the hooks shows up as NaN rather than as stale numbers); the bytes are only in
the engine, which moves them between device, host and SSD under pressure.

- Forward: a pre-hook on every module that owns parameters acquires them on the
  device (read leases) and points `.data` at the leased bytes
  (torch.frombuffer, no copy), so the module computes on device-tier memory;
  the post-hook releases the leases and restores the placeholders.
- Saved tensors (torch.autograd.graph.saved_tensors_hooks, pushed around the
  root module's forward): a saved view of a parameter is packed as a reference
  (parameter, size, stride, offset), not a copy; any other saved tensor (an
  activation) is copied into a new engine tensor (the strided span it covers,
  so its exact layout comes back) and the autograd graph keeps only a handle.
  Unpacking in backward acquires the engine tensor on the device and copies it
  into a fresh tensor, released at once: a lease cannot outlive the hook,
  since nothing tells us when autograd is done with the tensor. The handle's
  death (the graph is freed) removes the engine tensor.
- Gradients: a hook on each parameter's AccumulateGrad node (run after
  `.grad` is set) copies the gradient into the parameter's engine gradient
  tensor (adding, under gradient accumulation, as autograd would) and drops
  `.grad`.
- Optimizer: `optimizer.step` is replaced by a per-parameter loop: acquire the
  parameter (write), its gradient (read) and its state (write), point the
  optimizer at the leased bytes, run the original step for that one
  parameter, release. Adam, AdamW and SGD update each parameter on its own
  (torch 1.13 runs them per tensor on CPU by default), so the ops and bytes
  are those of the untiered run: the losses are bitwise equal on CPU. State
  the optimizer creates lazily (the first step) is moved into the engine after
  that step. Gradients die after the step (as with zero_grad(set_to_none)).
- Prefetch: driven by the access order recorded in the previous step (the
  first step records, each later step replays and re-records): every acquire
  finds its place in that order and prefetches the tensors that follow, up to
  `lookahead_bytes` ahead. This is the trace-replay predictor (DeepSpeed
  ZeRO-3's scheme), not u3m-seq: the order of a training step repeats exactly,
  and module granularity is coarse enough that Python-side bookkeeping stays
  small.
- What the budget does not cover: transient compute memory (a module's
  outputs until autograd saves or frees them, unpacked copies during a
  backward node, the loss computed outside the model's forward). That is the
  working set a device would need on top; the managed state is what grows
  with model size.
"""
from __future__ import annotations

import bisect
import contextlib
import math
import os
import tempfile
import warnings
from typing import Callable, Dict, List, Optional

import torch

from . import _core



def _frombuffer(lease, dtype):
    """torch.frombuffer over a lease. A read lease is a read-only buffer and torch, which has no
    read-only tensors, warns about it; the offload never writes through one, so the warning is
    silenced here only, not for the user's own code."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable",
                                category=UserWarning)
        return torch.frombuffer(lease, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Capture


class Capture:
    """Records real PyTorch training steps as a u3m trace, with stable names from module paths.

    Wraps u3m_capture's Recorder (a TorchDispatchMode; docs/capture.md explains the names):
    tensors are named `<job>.<phase>.<module path>.<op>#<n>.out<slot>`, parameters
    `<job>.param.<name>`, gradients `<job>.grad.<name>`, optimizer state
    `<job>.optim.<name>.<key>`, the same in every step.
    """

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *,
                 job: str = "train-0", max_events: int = 2_000_000):
        from u3m_capture.tracer import Recorder, machine_description

        self.model, self.optimizer = model, optimizer
        self.rec = Recorder(max_events=max_events)
        self.rec.add_meta("source", "u3m.torch.capture")
        self.rec.add_meta("time_model", f"measured wall clock, CPU, torch {torch.__version__}")
        self.rec.add_meta("machine", machine_description())
        self.job = self.rec.add_job(job)
        self.iteration = 0
        self._hooks: list = []
        self._recording = None

    def __enter__(self) -> "Capture":
        self._hooks = self.rec.attach(self.model)
        self.rec.register_model(self.model, self.job)
        self._recording = self.rec.recording()
        self._recording.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._recording.__exit__(*exc)
        finally:
            for h in self._hooks:
                h.remove()
            self._hooks = []

    @contextlib.contextmanager
    def step(self):
        """One training step (an iteration of the job); code inside runs in the forward phase."""
        with self.rec.iteration(self.job, self.iteration), self.rec.phase("forward"):
            yield self
        self.iteration += 1

    def backward(self, loss: torch.Tensor) -> None:
        with self.rec.phase("backward"):
            loss.backward()
        self.rec.bind_grads(self.model, self.job)

    def optimizer_step(self) -> None:
        """optimizer.step() then zero_grad(set_to_none=True), in the optimizer phase."""
        if self.optimizer is None:
            raise ValueError("Capture.optimizer_step: the capture was made without an optimizer")
        with self.rec.phase("optimizer"):
            self.optimizer.step()
            self.rec.bind_optimizer(self.optimizer, self.model, self.job)
            self.optimizer.zero_grad(set_to_none=True)

    @contextlib.contextmanager
    def phase(self, name: str):
        """Any other phase (e.g. "other" for logging that is not part of the step)."""
        with self.rec.phase(name):
            yield

    @contextlib.contextmanager
    def paused(self):
        with self.rec.paused():
            yield

    def counts(self) -> dict:
        return self.rec.counts()

    def save(self, path: str) -> dict:
        """Writes the trace: .jsonl as written by the recorder, anything else as binary .u3mt."""
        if path.endswith(".jsonl"):
            return self.rec.write_jsonl(path)
        with tempfile.TemporaryDirectory(prefix="u3m-capture-") as d:
            tmp = os.path.join(d, "trace.jsonl")
            counts = self.rec.write_jsonl(tmp)
            _core.load_trace(tmp).write(path)
        return counts

    def trace(self) -> "_core.Trace":
        """The trace as the C++ side reads it (u3m.Trace)."""
        with tempfile.TemporaryDirectory(prefix="u3m-capture-") as d:
            tmp = os.path.join(d, "trace.jsonl")
            self.rec.write_jsonl(tmp)
            return _core.load_trace(tmp)


def capture(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, **kw) -> Capture:
    """A Capture to use as a context manager (see Capture)."""
    return Capture(model, optimizer, **kw)


# ---------------------------------------------------------------------------------------------
# Offload


def _nan_placeholder(t: torch.Tensor) -> torch.Tensor:
    fill = math.nan if t.is_floating_point() else 0
    return torch.full((1,), fill, dtype=t.dtype).expand(t.shape)


def _storage_base(t: torch.Tensor) -> int:
    return t.data_ptr() - t.storage_offset() * t.element_size()


def _span(t: torch.Tensor) -> int:
    """Elements from t's first element to its last in storage (strides are >= 0 in torch)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


_STATE_COUNT = {torch.optim.Adam: 2, torch.optim.AdamW: 2, torch.optim.SGD: 1}


def _optimizer_state_tensors(opt: torch.optim.Optimizer, group: dict) -> int:
    """Full-size state tensors per parameter (Adam: exp_avg, exp_avg_sq; SGD: momentum if used)."""
    kind = type(opt)
    if kind not in _STATE_COUNT:
        raise ValueError(f"u3m.torch.offload: optimizer {kind.__name__} is not supported; it must update "
                         f"each parameter on its own (Adam, AdamW, SGD are)")
    if kind is torch.optim.SGD:
        return 1 if group.get("momentum", 0) else 0
    if group.get("foreach"):
        raise ValueError("u3m.torch.offload: foreach=True optimizers update all parameters at once; "
                         "use foreach=False (the CPU default)")
    return 3 if group.get("amsgrad") else 2


class _Param:
    __slots__ = ("p", "name", "pid", "gid", "nbytes", "placeholder", "state_ids", "lease")

    def __init__(self, p: torch.nn.Parameter, name: str):
        self.p, self.name = p, name
        self.pid = _core.stable_id(f"param.{name}")
        self.gid = _core.stable_id(f"grad.{name}")
        self.nbytes = p.numel() * p.element_size()
        self.placeholder = _nan_placeholder(p.data)
        self.state_ids: Dict[str, int] = {}
        self.lease = None  # the forward's read lease while the owning module runs


class _Saved:
    """What autograd keeps for a saved activation: the engine tensor holding a copy of its span."""
    __slots__ = ("off", "id", "dtype", "size", "stride", "span", "__weakref__")

    def __init__(self, off: "Offload", tid: int, t: torch.Tensor, span: int):
        self.off, self.id, self.dtype = off, tid, t.dtype
        self.size, self.stride, self.span = t.shape, t.stride(), span

    def __del__(self):
        self.off._drop(self.id)


class _ParamRef:
    """A saved view of a parameter: no copy, the parameter's engine tensor is read back."""
    __slots__ = ("param", "size", "stride", "offset")

    def __init__(self, param: _Param, t: torch.Tensor):
        self.param, self.size, self.stride, self.offset = param, t.shape, t.stride(), t.storage_offset()


class _OrderPrefetcher:
    """Prefetch by the order of the previous step's acquires (Note [Offload design], Prefetch)."""

    def __init__(self, rt: "_core.Runtime", lookahead_bytes: int, sizes: Dict[int, int], live: set):
        self.rt, self.lookahead, self.sizes, self.live = rt, lookahead_bytes, sizes, live
        self.prev: List[int] = []
        self.pos: Dict[int, List[int]] = {}
        self.cur: List[int] = []
        self.cursor = 0
        self.issued = 0
        self.prefetches = 0
        self.diverged = 0  # acquires not found ahead in the previous order

    def on_acquire(self, tid: int) -> None:
        self.cur.append(tid)
        if not self.prev:
            return
        if self.cursor < len(self.prev) and self.prev[self.cursor] == tid:
            self.cursor += 1
        else:
            at = self.pos.get(tid)
            k = bisect.bisect_left(at, self.cursor) if at else 0
            if not at or k == len(at):
                self.diverged += 1
                return
            self.cursor = at[k] + 1
        ahead, i = 0, self.cursor
        while i < len(self.prev) and ahead < self.lookahead:
            x = self.prev[i]
            ahead += self.sizes.get(x, 0)
            if i >= self.issued and x in self.live:
                self.rt.prefetch(x, "device")
                self.prefetches += 1
            i += 1
        self.issued = max(self.issued, i)

    def end_step(self) -> None:
        self.prev, self.cur = self.cur, []
        self.pos = {}
        for i, x in enumerate(self.prev):
            self.pos.setdefault(x, []).append(i)
        self.cursor = self.issued = 0


class Offload:
    """Keeps a model's parameters, gradients and optimizer state (and saved activations) in u3m tiers.

    Attach with `offload(model, optimizer, budget_fraction=...)`; the training loop stays as it
    was (optimizer.step and zero_grad are wrapped). Note [Offload design] explains how.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 budget_bytes: Optional[int] = None, budget_fraction: Optional[float] = None,
                 host_bytes: Optional[int] = None, lookahead_bytes: Optional[int] = None,
                 offload_activations: bool = True, ssd_dir: str = "", ssd_bytes: int = 0,
                 ssd_faults: str = ""):
        if (budget_bytes is None) == (budget_fraction is None):
            raise ValueError("u3m.torch.offload: give exactly one of budget_bytes and budget_fraction")
        self.model, self.optimizer = model, optimizer
        self.params: List[_Param] = []
        by_tensor: Dict[int, _Param] = {}
        names = {id(p): n for n, p in model.named_parameters()}
        state_per_param = 0
        for group in optimizer.param_groups:
            state_per_param = max(state_per_param, _optimizer_state_tensors(optimizer, group))
            for p in group["params"]:
                if id(p) not in names:
                    raise ValueError("u3m.torch.offload: the optimizer holds a parameter the model does not")
                if id(p) not in by_tensor:
                    by_tensor[id(p)] = _Param(p, names[id(p)])
                    self.params.append(by_tensor[id(p)])
        for n, p in model.named_parameters():
            if id(p) not in by_tensor:
                raise ValueError(f"u3m.torch.offload: parameter {n!r} is not in the optimizer")
        self._by_tensor = by_tensor
        param_bytes = sum(r.nbytes for r in self.params)
        # params + grads + full-size optimizer state: what the budget is a fraction of.
        self.footprint_bytes = param_bytes * (2 + state_per_param)
        if budget_fraction is not None:
            if not 0 < budget_fraction <= 1:
                raise ValueError(f"u3m.torch.offload: budget_fraction must be in (0, 1], got {budget_fraction}")
            budget_bytes = int(budget_fraction * self.footprint_bytes)
        largest = max(r.nbytes for r in self.params) * (2 + state_per_param)
        if budget_bytes < largest:
            # The optimizer step of the largest parameter holds all of its tensors at once.
            raise ValueError(f"u3m.torch.offload: budget {budget_bytes} bytes is below the "
                             f"{largest} bytes the largest parameter's optimizer step holds at once")
        self.budget_bytes = budget_bytes
        self.rt = _core.Runtime(budget_bytes, host_bytes or max(8 * self.footprint_bytes, 256 << 20),
                                ssd_dir, ssd_bytes, ssd_faults=ssd_faults)
        self.offload_activations = offload_activations
        self._sizes: Dict[int, int] = {}
        self._live: set = set()  # engine ids registered now
        self._deferred: List[int] = []  # removals that found the tensor busy
        self._leased_params: Dict[int, _Param] = {}  # storage address -> parameter, while leased
        self._act_n = 0  # saved tensors packed in this forward
        self._hooks_pushed = False
        self.prefetcher = _OrderPrefetcher(self.rt, lookahead_bytes or budget_bytes // 4, self._sizes,
                                           self._live)
        self.steps = 0
        self.saved_bytes = 0  # activation bytes copied into the engine
        self._keep = {_storage_base(b) for b in model.buffers()}  # saved as is (not managed)

        for r in self.params:
            self._register(r.pid, r.nbytes)
            lease = self.rt.acquire(r.pid, "device", "write")
            self._view(lease, r.p).copy_(r.p.data)
            self.rt.release(lease)
            r.p.data = r.placeholder
        self._handles = []
        self._grad_accs = []  # the AccumulateGrad nodes must stay alive for their hooks
        for path, mod in model.named_modules():
            own = [by_tensor[id(p)] for p in mod.parameters(recurse=False)]
            if own:
                self._handles.append(mod.register_forward_pre_hook(self._make_pre(own)))
                self._handles.append(mod.register_forward_hook(self._make_post(own)))
        self._handles.append(model.register_forward_pre_hook(self._root_pre))
        self._handles.append(model.register_forward_hook(self._root_post))
        for r in self.params:
            if r.p.requires_grad:
                acc = r.p.expand_as(r.p).grad_fn.next_functions[0][0]
                acc.register_hook(self._make_grad_hook(r))
                self._grad_accs.append(acc)
        self._orig_step, self._orig_zero = optimizer.step, optimizer.zero_grad
        optimizer.step = self._step
        optimizer.zero_grad = self._zero_grad

    # ---------------------------------------------------------------- engine helpers
    def _register(self, tid: int, nbytes: int) -> None:
        self.rt.add(tid, nbytes)
        self._sizes[tid] = nbytes
        self._live.add(tid)

    def _drop(self, tid: int) -> None:
        self._live.discard(tid)
        if not self.rt.remove(tid):
            self._deferred.append(tid)  # a write-back still in flight; retried later

    def _retry_drops(self) -> None:
        if self._deferred:
            self._deferred = [t for t in self._deferred if not self.rt.remove(t)]

    def _acquire(self, tid: int, access: str) -> "_core.Lease":
        # Ask without blocking first so the demand fetch is queued before the prefetches.
        lease = self.rt.try_acquire(tid, "device", access)
        self.prefetcher.on_acquire(tid)
        return lease if lease is not None else self.rt.acquire(tid, "device", access)

    @staticmethod
    def _view(lease: "_core.Lease", like: torch.Tensor) -> torch.Tensor:
        return _frombuffer(lease, like.dtype).view(like.shape)

    # ---------------------------------------------------------------- forward
    def _make_pre(self, own: List[_Param]):
        def pre(mod, inputs):
            for r in own:
                if r.lease is None:  # a module called re-entrantly keeps its first leases
                    r.lease = self._acquire(r.pid, "read")
                    r.p.data = self._view(r.lease, r.placeholder)
                    self._leased_params[r.lease.address] = r
        return pre

    def _make_post(self, own: List[_Param]):
        def post(mod, inputs, output):
            for r in own:
                if r.lease is not None:
                    r.p.data = r.placeholder
                    del self._leased_params[r.lease.address]
                    self.rt.release(r.lease)
                    r.lease = None
        return post

    def _root_pre(self, mod, inputs):
        self._retry_drops()
        self._act_n = 0
        if torch.is_grad_enabled() and not self._hooks_pushed:
            torch._C._autograd._push_saved_tensors_default_hooks(self._pack, self._unpack)
            self._hooks_pushed = True

    def _root_post(self, mod, inputs, output):
        if self._hooks_pushed:
            torch._C._autograd._pop_saved_tensors_default_hooks()
            self._hooks_pushed = False

    # ---------------------------------------------------------------- saved tensors
    def _pack(self, t: torch.Tensor):
        base = _storage_base(t)
        r = self._leased_params.get(base)
        if r is not None:
            return _ParamRef(r, t)
        span = _span(t)
        if not self.offload_activations or span == 0 or base in self._keep:
            return t
        # A stable name per step (the n-th saved tensor), so prefetch can find it next step.
        name, k = f"act.{self._act_n}", 0
        self._act_n += 1
        tid = _core.stable_id(name)
        while tid in self._live:  # still held by an earlier step's graph
            k += 1
            tid = _core.stable_id(f"{name}~{k}")
        nbytes = span * t.element_size()
        self._register(tid, nbytes)
        lease = self._acquire(tid, "write")
        flat = t.detach().as_strided((span,), (1,), t.storage_offset())  # no autograd for the copy
        _frombuffer(lease, t.dtype).copy_(flat)
        self.rt.release(lease)
        self.saved_bytes += nbytes
        return _Saved(self, tid, t, span)

    def _unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        if isinstance(packed, _ParamRef):
            r = packed.param
            lease = self._acquire(r.pid, "read")
            src = self._view(lease, r.placeholder).as_strided(packed.size, packed.stride, packed.offset)
            out = torch.empty_strided(packed.size, packed.stride, dtype=src.dtype)
            out.copy_(src)
            self.rt.release(lease)
            return out
        lease = self._acquire(packed.id, "read")
        out = torch.empty_strided(packed.size, packed.stride, dtype=packed.dtype)
        out.as_strided((packed.span,), (1,), 0).copy_(_frombuffer(lease, packed.dtype))
        self.rt.release(lease)
        return out

    # ---------------------------------------------------------------- gradients
    def _make_grad_hook(self, r: _Param):
        def hook(grad_inputs, grad_outputs):
            g = r.p.grad
            if g is None:
                return
            if r.gid in self._live:  # gradient accumulation: add, as autograd would
                lease = self._acquire(r.gid, "write")
                self._view(lease, r.placeholder).add_(g)
            else:
                self._register(r.gid, r.nbytes)
                lease = self._acquire(r.gid, "write")
                self._view(lease, r.placeholder).copy_(g)
            self.rt.release(lease)
            r.p.grad = None
        return hook

    # ---------------------------------------------------------------- optimizer
    def _step(self, closure: Optional[Callable] = None):
        if closure is not None:
            raise ValueError("u3m.torch.offload: optimizer.step(closure) is not supported")
        groups = self.optimizer.param_groups
        saved = [g["params"] for g in groups]
        try:
            for gi, group in enumerate(saved):
                for p in group:
                    r = self._by_tensor[id(p)]
                    if r.gid not in self._live:
                        continue  # no gradient this step: the optimizer would skip it too
                    for g in groups:
                        g["params"] = []
                    groups[gi]["params"] = [p]
                    self._step_one(r)
        finally:
            for g, ps in zip(groups, saved):
                g["params"] = ps
        self.steps += 1
        self.prefetcher.end_step()
        self._retry_drops()

    def _step_one(self, r: _Param) -> None:
        state = self.optimizer.state[r.p]
        leases = [self._acquire(r.pid, "write"), self._acquire(r.gid, "read")]
        r.p.data = self._view(leases[0], r.placeholder)
        r.p.grad = self._view(leases[1], r.placeholder)
        for key, sid in r.state_ids.items():
            lease = self._acquire(sid, "write")
            leases.append(lease)
            state[key] = self._view(lease, r.placeholder)
        try:
            self._orig_step()
        finally:
            # State the optimizer just created (its first step) moves into the engine.
            for key, val in list(state.items()):
                if key not in r.state_ids and key != "step" and isinstance(val, torch.Tensor) \
                        and val.shape == r.p.shape:
                    sid = _core.stable_id(f"optim.{r.name}.{key}")
                    self._register(sid, r.nbytes)
                    lease = self._acquire(sid, "write")
                    self._view(lease, r.placeholder).copy_(val)
                    self.rt.release(lease)
                    r.state_ids[key] = sid
            for key in r.state_ids:
                state[key] = r.placeholder
            r.p.grad = None
            r.p.data = r.placeholder
            for lease in leases:
                self.rt.release(lease)
            self._drop(r.gid)  # gradients die after the step (zero_grad(set_to_none))

    def _zero_grad(self, set_to_none: bool = True):
        for r in self.params:
            if r.gid in self._live:
                self._drop(r.gid)
        self._orig_zero(set_to_none=set_to_none)

    # ---------------------------------------------------------------- results
    def stats(self) -> dict:
        s = self.rt.stats()
        return {"budget_bytes": self.budget_bytes, "footprint_bytes": self.footprint_bytes,
                "peak_device_bytes": s["peak"]["device"], "peak_host_bytes": s["peak"]["host"],
                "device_used_bytes": s["used"]["device"], "evictions": s["evictions"],
                "prefetches": s["prefetches"], "prefetch_hits": s["prefetch_hits"],
                "misses": s["misses"], "acquires": s["acquires"], "stall_s": s["stall_s"],
                "saved_activation_bytes": self.saved_bytes, "order_divergences": self.prefetcher.diverged,
                "engine": s}

    def close(self) -> None:
        """Puts parameters and optimizer state back into plain tensors and detaches every hook."""
        if self._handles is None:
            return
        self.rt.drain()
        for h in self._handles:
            h.remove()
        self._handles = None
        self._grad_accs = []
        self.optimizer.step, self.optimizer.zero_grad = self._orig_step, self._orig_zero
        for r in self.params:
            lease = self.rt.acquire(r.pid, "device", "read")
            r.p.data = self._view(lease, r.placeholder).clone()
            self.rt.release(lease)
            state = self.optimizer.state[r.p]
            for key, sid in r.state_ids.items():
                lease = self.rt.acquire(sid, "device", "read")
                state[key] = self._view(lease, r.placeholder).clone()
                self.rt.release(lease)

    def __enter__(self) -> "Offload":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def offload(model: torch.nn.Module, optimizer: torch.optim.Optimizer, **kw) -> Offload:
    """Attaches u3m to a model and its optimizer (see Offload and Note [Offload design])."""
    return Offload(model, optimizer, **kw)

