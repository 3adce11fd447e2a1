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
every parameter (trainable or frozen), its gradient and its optimizer state
(one engine tensor each), and the activations autograd saves for backward.

- One storage per tensor (FSDP's scheme). Each managed tensor keeps one torch
  storage for its life: the parameter object itself (its `.data` points at it),
  its `.grad` and each full-size optimizer state entry (a guarded tensor each).
  Freed, the storage has zero bytes and the shape stays as metadata (never a
  NaN or zero placeholder). Gathered, it is resized and filled from a read
  lease, which stays held so the bytes count in the device tier until the
  tensor is freed; a write made while gathered (an in-place op, a version
  bump, or gathered(write=True)) is copied back into the engine on free.
  Every alias of that storage (views autograd saved, views a module kept) sees
  the bytes whenever the tensor is gathered.
- Units (FSDP's wrapped unit, ZeRO-3's module subtree). A module's pre-hook
  gathers its unit, the post-hook frees it. The default policy (size_policy)
  walks from the root down: the first module whose subtree's parameters not yet
  in a unit take <= unit_bytes (budget/4) is a unit of that whole subtree; a
  module too big keeps only its own parameters. unit_policy= chooses others.
- Guard (uses outside a unit: tied weights, nn.MultiheadAttention reading
  out_proj.weight, functional calls, clip_grad_norm_ reading grads, user code).
  The parameter's class is swapped for a guarded twin and grads/state are a
  guarded subclass; their __torch_function__ gathers any freed managed argument
  ("fault"), then runs the op with torch functions disabled. Metadata reads
  (shape, dtype, .grad, ...) skip it. An output that aliases a managed storage is
  returned guarded too, so a view used later is faulted in again. Faults are
  held in a FIFO of budget/4 bytes, emptied at each boundary (a new forward,
  step, zero_grad, the end of backward): safe, since every alias is guarded or a
  reference (below). bench/torch_guard_cost.py compares the mechanisms; on the
  loaded 2-core VM the guarded class and ZeRO-3's `_parameters` interception
  were within the noise of each other and of a TorchFunctionMode, and a
  TorchDispatchMode was clearly dearest (docs/pytorch.md has the figures). The
  class also sees uses through references the module tree does not (closures,
  optimizer lists). A fault the budget cannot serve raises OffloadError naming
  the tensor.
- Saved tensors (torch.autograd.graph.saved_tensors_hooks, pushed by the
  outermost unit, or around a guarded op outside any forward): an alias of a
  gathered storage is packed as a reference (the alias itself, no copy); unpack
  gathers it and holds it until the next node boundary (an AccumulateGrad post
  hook, when no other node is running) or the end of backward. Any other saved
  tensor (an activation) is copied into a new engine tensor (its strided span)
  and copied back out at unpack; the handle's death removes it.
- Checkpointing. A forward that runs inside backward is a recompute. Reentrant
  torch.utils.checkpoint has no saved-tensor hooks on top, so ours are pushed
  and the recompute's saves are references as above. The non-reentrant one
  saves through its own hooks (raw aliases we cannot see), so the units it
  recomputes stay gathered until the end of that backward.
- Gradients: a tensor hook on each trainable parameter clears `.grad` before
  AccumulateGrad (so it never adds into a zero-byte storage); a post hook on the
  AccumulateGrad node copies the new gradient into the engine (adding under
  accumulation, as autograd would) and sets `.grad` to the guarded face.
  zero_grad(set_to_none=False) zeroes the engine copy; True drops it.
- Optimizer: `optimizer.step` runs the original step once per parameter with
  the parameter, its gradient and its state leased on the device (no copy).
  Adam, AdamW, SGD, Adagrad and RMSprop update each parameter on its own in
  torch 1.13 (the CPU foreach ops loop per tensor too), so the ops and bytes are
  the untiered run's: losses are bitwise equal on CPU. State created lazily (the
  first step) or by load_state_dict moves into the engine. A parameter whose
  step does not fit the budget at once steps on the host (Note [Oversized steps]).
- Checkpoints: model.state_dict() (a state-dict hook) and optimizer.state_dict()
  return materialised copies; load_state_dict writes through the guard.
- Decisions: a tiering policy of u3m's one list (policy::tiering_policies(),
  the objects `train sim` and `run replay` drive; `policy=`, default
  DEFAULT_POLICY) decides prefetch, demotion, the eviction order (published
  victim scores) and the tier each phase's accesses lease in. Python keeps only
  the hooks: every engine access goes through _core.PolicyDriver, which records
  it in C++ (Note [Online recording] in src/python/online_recorder.hpp) and,
  once the access holds its lease, runs the policy's on_step for it (Note
  [Policy on a real run] in src/python/policy_driver.hpp). The first step runs
  under the engine's LRU with demand fetches only; its recording is the trace
  the policy is made for.
- What the budget does not cover: transient compute memory (a module's
  outputs until autograd saves or frees them, unpacked activation copies during
  a backward node, the loss computed outside the model's forward).

Note [Oversized steps]
A parameter's step leases its bytes, its gradient and each full-size state
tensor at once (4 x the parameter for Adam), so a large embedding at budget 0.3
cannot step on the device. Such a step (decided once, at attach: its bytes above
the budget) runs where ZeRO-Offload runs every step: on the host. Its tensors are
leased in the host tier (Runtime.acquire(..., "host"); the engine copies them
there and holds no device lease for them) and the optimizer's own step runs
on them whole, so the ops and bytes are the untiered run's: bitwise equal on CPU,
for any optimizer offload takes (the same code, no per-optimizer proof needed).
The next forward gathers the parameter back onto the device as any other.
Not chunks: the engine leases a tensor whole (a lease is the unit of residency
and of the budget), so stepping a slice on the device would need a sub-range
lease in the engine or a copy through scratch tensors, and an optimizer's shared
scalars (Adam's `step`) counted once across chunks; the host needs none of it.
What it costs: the step's bytes cross the link (d2h, then h2d at the next
forward), and these leases go past the tiering policy (not recorded in its
trace, so it plans the other accesses only). The forward still gathers each
parameter whole: a budget below the largest parameter is refused. On CUDA a
host step would set a device parameter's .data to a host tensor, which torch
refuses, so an oversized step there is refused naming the parameter (a chunked
device step is the way there, not built). stats()["host_steps"] counts them.

Note [Offload on CUDA]
The offload follows the model: all parameters on one device, whose type picks
the Runtime's backend through the one registry (mem::open_backend, via
_core.Runtime(backend=...)): cpu -> device-emu (everything above, bitwise as
before), cuda:N -> cuda on device N, whose device tier is real GPU memory and
whose host tier is the runtime's pinned memory (cudaHostAlloc). If the cuda
backend cannot open, offload raises one OffloadError with the registry's reason.
- Leases as tensors (_lease_tensor). A host lease is pinned host memory with the
  buffer protocol (torch.frombuffer, a CPU tensor); a device lease on cuda has
  no buffer protocol (BufferError: it is not host memory) but a
  __cuda_array_interface__ (Note [Lease as a CUDA array] in
  src/python/bind_runtime.cpp), which torch.as_tensor(lease, device=...) wraps
  without a copy. So the design above holds as is: a gather is a device-to-device
  copy (torch's, on the current stream) from the lease into the parameter's own
  CUDA storage (resized by untyped_storage().resize_, storage().resize_ in
  torch 1.13); the optimizer step runs on the leased device bytes; saved
  activations are copied into device leases.
- Stream order. u3m's h2d and d2h moves run on the cuda backend's own
  non-blocking streams, one per link (Note [Copies on u3m's streams] in
  src/engine/transport.cpp), never on torch's nor on the legacy default
  stream; SSD moves are file I/O into pinned host memory, on no stream.
  Engine -> torch: acquire returns after the fetch's copy completed (its stream
  was synchronized), so torch may read at once ("stream": None in the
  interface). Torch -> engine: before any lease is released, the kernels torch
  queued that read or write it must be done, or the engine could copy (d2h on
  eviction) or reuse the bytes under them. The simplest correct rule is used:
  _release synchronizes torch's current stream first. Not yet an event
  (cudaStreamWaitEvent would let the CPU run ahead); the GPU check measures
  what it costs (stats()["release_sync_s"], scripts/gpu-check-torch.py), once
  it has run on one.
- What overlaps. Prefetches the policy issues (the next units, the next
  step's activations) and write-backs of evicted tensors run on u3m's streams
  while torch's kernels run on its own: that is the overlap of copies and
  compute. What does not: a demand fetch (a miss) blocks the Python thread
  until it lands, and each release waits for torch's stream, so the CPU does not
  queue kernels past a unit boundary. The tiered KV cache's block reads and
  writes are the backend's synchronous copies (cudaMemcpy, the legacy default
  stream): they serialize with torch's default stream, and K/V stage through
  host tensors, so its CUDA path is correct, not fast.
- Memory. A gathered parameter exists twice on the GPU: the engine's lease (in
  the budget) and the parameter's storage (torch's caching allocator, outside
  the budget, freed at the unit's end), as on CPU. Saved activations are
  copied, not moved. Host-tier blocks are cudaHostAlloc's, kept when freed for
  the next allocation of their size (Note [Pinned host cache] in
  include/u3m/mem/host_cache.hpp), so steady steps pin nothing new;
  stats()["engine"]["host_cache"] counts hits and misses.
- torch_npu (Ascend) gets the same design on the acl backend (a model on npu:N
  opens backend "acl"), but a device lease has no zero-copy torch_npu view
  (the CUDA Array Interface has no NPU counterpart in torch_npu that u3m
  uses), so an npu model is refused with an OffloadError naming that; nothing of
  it has run on Ascend hardware (docs/accelerators.md).
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
import time
import warnings
from typing import Callable, Dict, List, Optional

import torch
import torch.utils.checkpoint

from . import _core



_READ_ONLY_WARNED = False


# The Runtime backend for a model on each torch device type (Note [Offload on CUDA]).
_BACKEND_OF_DEVICE = {"cpu": "device-emu", "cuda": "cuda", "npu": "acl"}


def _resize_storage(t: torch.Tensor, elems: int) -> None:
    """Resizes t's storage to `elems` elements of t's dtype: torch >= 2 has untyped_storage
    (bytes), torch 1.13 only storage() (a TypedStorage, elements)."""
    if hasattr(t, "untyped_storage"):
        t.untyped_storage().resize_(elems * t.element_size())
    else:
        t.storage().resize_(elems)


def _lease_tensor(lease, dtype, device: torch.device) -> torch.Tensor:
    """A lease's bytes as a flat tensor of `dtype`, no copy: a CUDA tensor over a device lease of
    the cuda backend (its __cuda_array_interface__), else a CPU tensor over its buffer."""
    if device.type == "cuda" and lease.tier == "device":
        return torch.as_tensor(lease, device=device).view(dtype)
    return _frombuffer(lease, dtype)


def _frombuffer(lease, dtype):
    """torch.frombuffer over a lease (no copy). A read lease is a read-only buffer and torch, which
    has no read-only tensors, warns about it, once per process (TORCH_WARN_ONCE); the offload never
    writes through one, so that warning is silenced, here only and not for the user's code. After
    it has fired no catch_warnings is needed (one per lease cost ~8 us)."""
    global _READ_ONLY_WARNED
    if _READ_ONLY_WARNED:
        return torch.frombuffer(lease, dtype=dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable",
                                category=UserWarning)
        out = torch.frombuffer(lease, dtype=dtype)
    _READ_ONLY_WARNED = not lease.writable
    return out


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

_DTF = torch._C.DisableTorchFunction


_CHECKPOINT_FILE = torch.utils.checkpoint.__file__


def _recompute_kind() -> str:
    """Which torch.utils.checkpoint recomputes the forward running inside backward: the
    nearest checkpoint frame is CheckpointFunction.backward ("reentrant") or the
    non-reentrant saved-tensor hook ("hooked"; also any other caller)."""
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename == _CHECKPOINT_FILE:
            return "reentrant" if f.f_code.co_name == "backward" else "hooked"
        f = f.f_back
    return "hooked"


# The tiering policy offload runs by default: the best of policy::tiering_policies() on this path,
# by measurement (docs/pytorch.md, bench/torch_offload_cost.py).
DEFAULT_POLICY = "u3m"


_AUTOGRAD_FILE = torch.autograd.__file__


def _under_autograd() -> bool:
    """Whether torch.autograd.backward or .grad is on the Python stack: a backward started from
    Python runs under one of them. Asked before queue_callback, whose refusal outside backward
    costs a C++ exception with a backtrace (~0.8 ms measured on the 2-core VM, per unit entered)."""
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename == _AUTOGRAD_FILE:
            return True
        f = f.f_back
    return False


class OffloadError(_core.EngineError):
    """A managed tensor could not be served (it names the parameter); an EngineError."""


def _storage_base(t: torch.Tensor) -> int:
    return t.data_ptr() - t.storage_offset() * t.element_size()


def _span(t: torch.Tensor) -> int:
    """Elements from t's first element to its last in storage (strides are >= 0 in torch)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


# Full-size state tensors per parameter, by optimizer (the group's options add some).
def _state_count(opt: torch.optim.Optimizer, group: dict) -> int:
    kind = type(opt)
    if kind in (torch.optim.Adam, torch.optim.AdamW):
        return 3 if group.get("amsgrad") else 2
    if kind is torch.optim.SGD:
        return 1 if group.get("momentum", 0) else 0
    if kind is torch.optim.Adagrad:
        return 1
    if kind is torch.optim.RMSprop:
        return 1 + (1 if group.get("momentum", 0) else 0) + (1 if group.get("centered") else 0)
    raise ValueError(f"u3m.torch.offload: optimizer {kind.__name__} is not supported; it must update "
                     f"each parameter on its own (Adam, AdamW, SGD, Adagrad, RMSprop do)")


# Tensor attributes and methods that read metadata only: no fault-in (Note [Offload design], Guard).
_NO_DATA = {getattr(torch.Tensor, n).__get__ for n in (
    "shape", "dtype", "device", "requires_grad", "is_leaf", "grad_fn", "layout", "ndim", "names",
    "is_sparse", "is_cuda", "is_quantized", "is_meta", "_version", "grad", "_backward_hooks",
    "is_mkldnn", "is_nested", "output_nr", "_base")} | {
    torch.Tensor.requires_grad.__set__, torch.Tensor._backward_hooks.__set__,
    torch.Tensor.size, torch.Tensor.dim, torch.Tensor.stride, torch.Tensor.numel,
    torch.Tensor.nelement, torch.Tensor.element_size, torch.Tensor.is_contiguous,
    torch.Tensor.storage_offset, torch.Tensor.is_floating_point, torch.Tensor.is_complex,
    torch.Tensor.requires_grad_, torch.Tensor.register_hook, torch.Tensor.get_device,
    torch.Tensor.__len__, torch.Tensor._is_view, torch.Tensor.retain_grad}
_GRAD_SET = torch.Tensor.grad.__set__
_DATA_SET = torch.Tensor.data.__set__
_INPLACE_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
                    "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__",
                    "__ilshift__", "__irshift__"}


def _writes(func, kwargs) -> bool:
    name = getattr(func, "__name__", "")
    return (name.endswith("_") and not name.endswith("__")) or name in _INPLACE_DUNDERS or \
        kwargs.get("out") is not None


def _slots_in(args, kwargs) -> list:
    found = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            for b in a:
                s = getattr(b, "_u3m_slot", None)
                if s is not None:
                    found.append(s)
        else:
            s = getattr(a, "_u3m_slot", None)
            if s is not None:
                found.append(s)
    return found


def _guard(cls, func, types, args=(), kwargs=None):
    """__torch_function__ of every managed tensor (parameters, gradients, optimizer state)."""
    kwargs = kwargs or {}
    if func in _NO_DATA:
        with _DTF():
            return func(*args, **kwargs)
    slots = _slots_in(args, kwargs)
    if not slots:  # a managed tensor's class, but not managed now (after close)
        with _DTF():
            return func(*args, **kwargs)
    return slots[0].off._call(func, args, kwargs, slots)


class _Guarded(torch.Tensor):
    """A gradient, an optimizer state tensor or a view of a managed tensor: uses are guarded."""
    __torch_function__ = classmethod(_guard)


_PARAM_CLASSES: Dict[type, type] = {}


def _guarded_class(cls: type) -> type:
    """The guarded twin of a parameter class (nn.Parameter or a subclass), made once."""
    if cls not in _PARAM_CLASSES:
        _PARAM_CLASSES[cls] = type(f"U3MOffloaded{cls.__name__}", (cls,),
                                   {"__torch_function__": classmethod(_guard), "__module__": __name__})
    return _PARAM_CLASSES[cls]


class _Slot:
    """One managed tensor: one engine tensor and one torch storage (Note [Offload design]).

    `face` is what the program sees (the parameter itself, the `.grad`, the optimizer state
    entry); `base` is a plain tensor on the same storage. Freed, the storage has zero bytes and
    the shape lives on as metadata; gathered, it holds a copy of the engine bytes while a read
    lease keeps them on the device."""
    __slots__ = ("off", "tid", "tname", "role", "name", "face", "base", "size", "stride", "span",
                 "dtype", "nbytes", "lease", "holds", "ver", "dirty", "ptr")

    def __init__(self, off: "Offload", tname: str, role: str, name: str, like: torch.Tensor,
                 face_of=None):
        # tname: the engine's and the recorder's name, the same in every step; role: its trace role.
        self.off, self.tid, self.tname, self.role, self.name = off, _core.stable_id(tname), tname, role, name
        self.size, self.stride, self.dtype = like.shape, like.stride(), like.dtype
        self.span = _span(like)
        self.nbytes = self.span * like.element_size()
        self.base = torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=off.device)
        _resize_storage(self.base, 0)
        self.face = face_of if face_of is not None else self.base.as_subclass(_Guarded)
        self.face._u3m_slot = self
        self.lease, self.holds, self.ver, self.dirty, self.ptr = None, 0, 0, False, 0

    def flat(self) -> torch.Tensor:
        return self.base.as_strided((self.span,), (1,), 0)

    def view(self, lease: "_core.Lease") -> torch.Tensor:
        return self.off._lease_tensor(lease, self.dtype).as_strided(self.size, self.stride, 0)


class _Saved:
    """What autograd keeps for a saved activation: the engine tensor holding a copy of its span."""
    __slots__ = ("off", "id", "dtype", "size", "stride", "span", "device", "__weakref__")

    def __init__(self, off: "Offload", tid: int, t: torch.Tensor, span: int):
        self.off, self.id, self.dtype, self.device = off, tid, t.dtype, t.device
        self.size, self.stride, self.span = t.shape, t.stride(), span

    def __del__(self):
        self.off._drop(self.id)


class _Ref:
    """A saved alias of a managed tensor: the alias itself (on the slot's one storage), no copy."""
    __slots__ = ("slot", "t")

    def __init__(self, slot: _Slot, t: torch.Tensor):
        self.slot, self.t = slot, t


class _Param:
    __slots__ = ("p", "name", "cls", "w", "g", "state", "trainable", "in_opt")

    def __init__(self, off: "Offload", p: torch.nn.Parameter, name: str, in_opt: bool):
        self.p, self.name, self.cls, self.in_opt = p, name, type(p), in_opt
        self.trainable = p.requires_grad
        self.w = _Slot(off, f"param.{name}", "param", f"parameter {name!r}", p, face_of=p)
        self.g = _Slot(off, f"grad.{name}", "grad", f"gradient of {name!r}", p)
        self.state: Dict[str, _Slot] = {}


def size_policy(unit_bytes: int) -> Callable[[str, torch.nn.Module, int], bool]:
    """The default unit policy: a module is a unit when the parameters of its subtree not yet in
    a unit take at most `unit_bytes` (checked from the root down, as FSDP's size-based wrap)."""
    return lambda path, module, subtree_bytes: subtree_bytes <= unit_bytes


class _Unit:
    __slots__ = ("path", "slots", "nbytes")

    def __init__(self, path: str, slots: List[_Slot]):
        self.path, self.slots = path, slots
        self.nbytes = sum(s.nbytes for s in slots)


class Offload:
    """Keeps a model's parameters, gradients and optimizer state (and saved activations) in u3m tiers.

    Attach with `offload(model, optimizer, budget_fraction=...)`; the training loop stays as it
    was (optimizer.step, zero_grad, state_dict and load_state_dict are wrapped). Note [Offload
    design] explains how.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 budget_bytes: Optional[int] = None, budget_fraction: Optional[float] = None,
                 host_bytes: Optional[int] = None, policy: str = DEFAULT_POLICY, lookahead: int = 16,
                 host_optimizer: bool = False,
                 offload_activations: bool = True, ssd_dir: str = "", ssd_bytes: int = 0,
                 ssd_faults: str = "", unit_policy: Optional[Callable] = None,
                 unit_bytes: Optional[int] = None):
        if (budget_bytes is None) == (budget_fraction is None):
            raise ValueError("u3m.torch.offload: give exactly one of budget_bytes and budget_fraction")
        self.model, self.optimizer = model, optimizer
        in_opt: Dict[int, int] = {}  # id(param) -> full-size state tensors of its group
        for group in optimizer.param_groups:
            k = _state_count(optimizer, group)
            for p in group["params"]:
                in_opt[id(p)] = k
        named = list(model.named_parameters())  # each parameter once, under its first name
        names = {id(p) for _, p in named}
        for pid in in_opt:
            if pid not in names:
                raise ValueError("u3m.torch.offload: the optimizer holds a parameter the model does not")
        self.device = self._model_device(named)  # before any slot: theirs are on it
        if host_optimizer and self.device.type != "cpu":
            # The step would set a device parameter's .data to a host tensor, which torch refuses.
            raise ValueError(f"u3m.torch.offload: host_optimizer=True runs the step on host "
                             f"tensors; it is for CPU models, not one on {self.device}")
        self._live: set = set()  # engine ids registered now
        self.params: List[_Param] = []
        self._by_tensor: Dict[int, _Param] = {}
        for n, p in named:
            if p.numel() == 0:
                raise ValueError(f"u3m.torch.offload: parameter {n!r} is empty")
            r = _Param(self, p, n, id(p) in in_opt)
            self.params.append(r)
            self._by_tensor[id(p)] = r
        # params + grads (trainable ones) + full-size optimizer state: what the budget is a fraction of.
        per = [r.w.nbytes * (1 + r.trainable + in_opt.get(id(r.p), 0)) for r in self.params]
        self.footprint_bytes = sum(per)
        if budget_fraction is not None:
            if not 0 < budget_fraction <= 1:
                raise ValueError(f"u3m.torch.offload: budget_fraction must be in (0, 1], got {budget_fraction}")
            budget_bytes = int(budget_fraction * self.footprint_bytes)
        largest = max(r.w.nbytes for r in self.params)
        if budget_bytes < largest:
            # The forward gathers each parameter whole; its optimizer step may run on the host.
            raise ValueError(f"u3m.torch.offload: budget {budget_bytes} bytes is below the "
                             f"{largest} bytes of the largest parameter, which its forward gathers whole")
        # Note [Oversized steps]: a step whose tensors do not fit the budget at once runs on the host.
        self._host_step = {id(r.p) for r, b in zip(self.params, per) if b > budget_bytes and r.in_opt}
        if self._host_step and self.device.type != "cpu":
            big = next(r for r in self.params if id(r.p) in self._host_step)
            raise ValueError(f"u3m.torch.offload: the optimizer step of parameter {big.name!r} "
                             f"({per[self.params.index(big)]} bytes) does not fit the budget "
                             f"({budget_bytes} bytes); it runs on the host, which is for CPU models, "
                             f"not one on {self.device} (Note [Oversized steps])")
        self.host_steps = 0  # parameter steps run on the host (Note [Oversized steps])
        self.budget_bytes = budget_bytes
        self.backend = _BACKEND_OF_DEVICE[self.device.type]
        try:
            self.rt = _core.Runtime(budget_bytes, host_bytes or max(8 * self.footprint_bytes, 256 << 20),
                                    ssd_dir, ssd_bytes, ssd_faults=ssd_faults, backend=self.backend,
                                    device=self.device.index or 0)
        except ValueError as e:  # u3m.InputError: the registry's reason
            if self.backend == "device-emu" or f"backend '{self.backend}' cannot open" not in str(e):
                raise
            raise OffloadError(f"u3m.torch.offload: the model is on {self.device}, but u3m's "
                               f"{self.backend} backend cannot open: {e}") from e
        if self.device.type == "npu":  # Note [Offload on CUDA]: no zero-copy lease view yet
            raise OffloadError(f"u3m.torch.offload: the model is on {self.device}; the acl backend "
                               "opened, but a device lease has no torch_npu tensor view yet "
                               "(docs/accelerators.md: designed, not built, untested)")
        # Note [Offload on CUDA]: torch's queued work on a lease ends before its release.
        self._cuda = self.device.type == "cuda"
        self.release_sync_s = 0.0  # seconds releases waited for torch's stream (CUDA only)
        self._release = self._release_synced if self._cuda else self.rt.release
        self.offload_activations = offload_activations
        self._deferred: List[int] = []  # removals that found the tensor busy
        self._gathered: Dict[int, _Slot] = {}  # storage address -> slot, while gathered
        self._loose: Dict[_Slot, None] = {}  # faulted in outside a unit, oldest first
        self._loose_bytes = 0
        self._loose_cap = max(budget_bytes // 4, max(r.w.nbytes for r in self.params))
        self._bwd: Dict[_Slot, None] = {}  # unpacked in backward: freed at the next node boundary
        self._bwd_end: Dict[_Slot, None] = {}  # gathered by a forward run inside backward
        self._cb_queued = False
        self._act_n = 0  # saved tensors packed in this forward
        self._pushed: List[bool] = []  # per active unit: did it push the saved-tensor hooks
        self._units_held: List[Optional[_Unit]] = []  # per active unit call
        self._hooks_pushed = False
        # The tiering policy decides prefetch, eviction order and op tiers (Note [Offload design]).
        self.drv = _core.PolicyDriver(self.rt, policy, lookahead=lookahead, host_optimizer=host_optimizer,
                                      record=policy != "none")
        self.steps = 0
        self.saved_bytes = 0  # activation bytes copied into the engine
        self.faults = 0  # gathers of a tensor used outside its unit
        self._keep = {_storage_base(b) for b in model.buffers()}  # saved as is (not managed)

        accs = {}  # AccumulateGrad nodes, found while the parameters still have their bytes
        with _DTF():
            for r in self.params:
                if r.trainable:
                    accs[id(r.p)] = r.p.expand_as(r.p).grad_fn.next_functions[0][0]
                self._register(r.w)
                lease = self.rt.acquire(self.drv.engine_id(r.w.tid), "device", "write")
                r.w.view(lease).copy_(r.p.data)
                self._release(lease)
                r.p.data = r.w.base  # the parameter's one storage, now zero bytes
                r.p.__class__ = _guarded_class(r.cls)
                r.p._u3m_slot = r.w
        self.units = self._make_units(unit_policy or size_policy(unit_bytes or max(budget_bytes // 4, 1)))
        self._handles = []
        self._grad_accs = []  # the AccumulateGrad nodes must stay alive for their hooks
        unit_of = {u.path: u for u in self.units}
        for path, mod in model.named_modules():
            if path in unit_of:
                self._handles.append(mod.register_forward_pre_hook(self._make_pre(unit_of[path], path == "")))
                self._handles.append(mod.register_forward_hook(self._make_post()))
        if "" not in unit_of:
            self._handles.append(model.register_forward_pre_hook(self._make_pre(None, True)))
            self._handles.append(model.register_forward_hook(self._make_post()))
        self._handles.append(model._register_state_dict_hook(self._state_dict_hook))
        with _DTF():
            for r in self.params:
                if r.trainable:
                    self._handles.append(r.p.register_hook(self._make_grad_pre(r)))
                    acc = accs[id(r.p)]
                    self._handles.append(acc.register_hook(self._make_grad_post(r)))
                    self._grad_accs.append(acc)
        self._orig = {k: getattr(optimizer, k) for k in ("step", "zero_grad", "state_dict", "load_state_dict")}
        optimizer.step = self._step
        optimizer.zero_grad = self._zero_grad
        optimizer.state_dict = self._opt_state_dict
        optimizer.load_state_dict = self._opt_load_state_dict

    @staticmethod
    def _model_device(named) -> torch.device:
        """The one device every parameter is on (Note [Offload on CUDA])."""
        devices = {p.device for _, p in named}
        if not devices:
            raise ValueError("u3m.torch.offload: the model has no parameters")
        if len(devices) != 1:
            raise ValueError("u3m.torch.offload: the parameters are on more than one device "
                             f"({', '.join(sorted(str(d) for d in devices))}); move the model to one")
        d = devices.pop()
        if d.type not in _BACKEND_OF_DEVICE:
            raise ValueError(f"u3m.torch.offload: parameters on {d}: u3m runs on "
                             f"{', '.join(_BACKEND_OF_DEVICE)} models")
        if d.type == "cuda" and d.index is None:
            d = torch.device("cuda", torch.cuda.current_device())
        return d

    def _lease_tensor(self, lease, dtype) -> torch.Tensor:
        return _lease_tensor(lease, dtype, self.device)

    def _release_synced(self, lease) -> None:
        # Note [Offload on CUDA]: kernels torch queued on the lease finish before u3m may move it.
        t0 = time.perf_counter()
        torch.cuda.current_stream(self.device).synchronize()
        self.release_sync_s += time.perf_counter() - t0
        self.rt.release(lease)

    def _make_units(self, policy: Callable) -> List[_Unit]:
        """Units from the root down: the first module the policy accepts takes every parameter
        of its subtree not already in a unit; a module it refuses keeps only its own."""
        seen: set = set()
        units: List[_Unit] = []

        def free_params(mod, recurse):
            return [self._by_tensor[id(p)] for p in mod.parameters(recurse=recurse) if id(p) not in seen]

        def visit(path, mod):
            sub = free_params(mod, True)
            if not sub:
                return
            if policy(path, mod, sum(r.w.nbytes for r in sub)):
                take = sub
            else:
                take = free_params(mod, False)
                for name, child in mod.named_children():
                    visit(f"{path}.{name}" if path else name, child)
                take = [r for r in take if id(r.p) not in seen]
            if take:
                seen.update(id(r.p) for r in take)
                units.append(_Unit(path, [r.w for r in take]))

        visit("", self.model)
        return units

    # ---------------------------------------------------------------- engine helpers
    def _register(self, s, tid: Optional[int] = None, nbytes: int = 0, name: str = "",
                  role: str = "") -> None:
        """Registers a slot (or, with s None, a saved activation) with the engine through the driver."""
        if s is not None:
            tid, nbytes, name, role = s.tid, s.nbytes, s.tname, s.role
        if tid in self._deferred:  # its earlier life is still being removed: let that finish
            self.rt.drain()
            self._retry_drops()
        self.drv.add(tid, nbytes, name, role)
        self._live.add(tid)

    def _drop(self, tid: int) -> None:
        self._live.discard(tid)
        if not self.drv.remove(tid):
            self._deferred.append(tid)  # a write-back still in flight; retried later

    def _retry_drops(self) -> None:
        if self._deferred:
            self._deferred = [t for t in self._deferred if not self.drv.remove(t)]

    def _acquire(self, tid: int, access: str, phase: str) -> "_core.Lease":
        # The driver leases it in the tier the policy runs the phase in, then the policy decides.
        return self.drv.acquire(tid, access, phase)

    def _acquire_named(self, s: _Slot, access: str, phase: str = "forward") -> "_core.Lease":
        try:
            return self._acquire(s.tid, access, phase)
        except _core.EngineError as e:
            raise OffloadError(f"u3m.torch.offload: cannot bring the {s.name} ({s.nbytes} bytes) onto "
                               f"the device (budget {self.budget_bytes} bytes): {e}") from e

    def _acquire_on_host(self, s: _Slot, access: str, phase: str) -> "_core.Lease":
        # Note [Oversized steps]: the engine's own lease, in the host tier, past the policy.
        try:
            return self.rt.acquire(self.drv.engine_id(s.tid), "host", access)
        except _core.EngineError as e:
            raise OffloadError(f"u3m.torch.offload: cannot bring the {s.name} ({s.nbytes} bytes) "
                               f"into the host tier for its {phase} step: {e}") from e

    # ---------------------------------------------------------------- gather and free
    def _hold(self, s: _Slot, phase: str = "forward") -> None:
        """One more holder of s; the first one copies the engine bytes into its storage."""
        if s.lease is None:
            if s.tid not in self._live:
                raise OffloadError(f"u3m.torch.offload: the {s.name} has no data (freed or never written)")
            lease = self._acquire_named(s, "read", phase)
            _resize_storage(s.base, s.span)
            s.flat().copy_(self._lease_tensor(lease, s.dtype))
            s.lease, s.ptr, s.dirty = lease, s.base.data_ptr(), False
            s.ver = s.face._version
            self._gathered[s.ptr] = s
        s.holds += 1

    def _unhold(self, s: _Slot) -> None:
        s.holds -= 1
        if s.holds:
            return
        lease, s.lease = s.lease, None
        del self._gathered[s.ptr]
        self._release(lease)
        if s.dirty or s.face._version != s.ver:  # written while gathered: back into the engine
            w = self._acquire_named(s, "write", "other")
            self._lease_tensor(w, s.dtype).copy_(s.flat())
            self._release(w)
        _resize_storage(s.base, 0)

    def _hold_in(self, group: Dict[_Slot, None], s: _Slot, phase: str = "forward") -> None:
        if s not in group:
            self._hold(s, phase)
            group[s] = None

    def _flush(self, group: Dict[_Slot, None]) -> None:
        while group:
            s = next(iter(group))
            del group[s]
            if group is self._loose:
                self._loose_bytes -= s.nbytes
            self._unhold(s)

    def _in_backward(self) -> bool:
        """True inside a backward pass (then the end-of-backward callback is queued)."""
        if self._cb_queued:
            return True
        if not _under_autograd():
            return False
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        except RuntimeError:
            return False
        self._cb_queued = True
        return True

    def _end_backward(self) -> None:
        self._cb_queued = False
        with _DTF():
            self._flush(self._bwd)
            self._flush(self._bwd_end)

    def _fault(self, s: _Slot) -> None:
        """A managed tensor used outside its unit: gathered now, freed at the next boundary."""
        self.faults += 1
        if torch.is_grad_enabled() and self._in_backward():
            self._hold_in(self._bwd_end, s, "backward")  # a recompute's raw saves may alias it
            return
        if s in self._loose:
            return
        while self._loose and self._loose_bytes + s.nbytes > self._loose_cap:
            old = next(iter(self._loose))  # oldest first: every alias of it is guarded or a _Ref
            del self._loose[old]
            self._loose_bytes -= old.nbytes
            self._unhold(old)
        self._hold_in(self._loose, s, "other")
        self._loose_bytes += s.nbytes

    @contextlib.contextmanager
    def gathered(self, tensors, write: bool = False):
        """Managed tensors (parameters, their .grad, optimizer state) materialised for the block,
        as DeepSpeed's GatheredParameters; what the block writes goes back into the engine."""
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        slots = []
        with _DTF():
            for t in tensors:
                s = getattr(t, "_u3m_slot", None)
                if s is None or s.off is not self:
                    raise ValueError("u3m.torch.offload: gathered() takes tensors this offload manages")
                self._hold(s, "other")
                slots.append(s)
        try:
            yield
        finally:
            with _DTF():
                for s in slots:
                    s.dirty |= write
                    self._unhold(s)

    # ---------------------------------------------------------------- the guard
    def _call(self, func, args, kwargs, slots):
        with _DTF():
            if func is _GRAD_SET:
                return self._set_grad(args[0], args[1])
            if func is _DATA_SET:
                raise OffloadError(f"u3m.torch.offload: assigning .data of the {slots[0].name} is not "
                                   f"supported while offload is attached; use load_state_dict or copy_")
            write = _writes(func, kwargs)
            for s in slots:
                if s.lease is None:
                    self._fault(s)
                s.dirty |= write
            push = torch.is_grad_enabled() and not self._hooks_pushed and not self._in_backward()
            if push:  # autograd must save aliases of managed storage as references
                self._push_hooks()
            try:
                out = func(*args, **kwargs)
            finally:
                if push:
                    self._pop_hooks()
            return self._guard_aliases(out)

    def _guard_aliases(self, out):
        """An output that aliases a managed storage is returned guarded, so a later use of it
        is faulted in as well."""
        if isinstance(out, (tuple, list)):
            return type(out)(self._guard_aliases(o) for o in out)
        if isinstance(out, torch.Tensor) and getattr(out, "_u3m_slot", None) is None and out.numel():
            s = self._gathered.get(_storage_base(out))
            if s is not None:
                out = out.as_subclass(_Guarded)
                out._u3m_slot = s
        return out

    def _set_grad(self, p, value):
        r = self._by_tensor.get(id(p))
        if r is None:  # a guarded view's .grad
            p.grad = value
            return
        if value is None:
            if r.g.tid in self._live:
                self._drop_grad(r)
            p.grad = None
            return
        if getattr(value, "_u3m_slot", None) is r.g:
            p.grad = value
            return
        self._store_grad(r, value, add=False)

    # ---------------------------------------------------------------- forward
    def _push_hooks(self) -> None:
        torch._C._autograd._push_saved_tensors_default_hooks(self._pack, self._unpack)
        self._hooks_pushed = True

    def _pop_hooks(self) -> None:
        torch._C._autograd._pop_saved_tensors_default_hooks()
        self._hooks_pushed = False

    def _unwind(self) -> None:
        """What a forward that raised left behind: its units' holds and its pushed hooks."""
        while self._pushed:  # first, so that nothing below can leave them on the stack
            if self._pushed.pop():
                try:
                    self._pop_hooks()
                except RuntimeError:  # pushed inside a backward node: autograd restored its TLS
                    self._hooks_pushed = False
        units, self._units_held = self._units_held, []
        for unit in units:
            for s in unit.slots if unit is not None else ():
                self._unhold(s)

    def _make_pre(self, unit: Optional[_Unit], root: bool):
        def pre(mod, inputs):
            with _DTF():
                in_bwd = torch.is_grad_enabled() and self._in_backward()
                if root and self._units_held and not in_bwd:
                    self._unwind()  # the root is entered afresh: an earlier forward raised
                if not self._pushed:  # the outermost unit: a new forward
                    self._flush(self._loose)
                    self._retry_drops()
                    if not in_bwd:
                        self._act_n = 0
                # A recompute inside backward (checkpointing) may save through our hooks only
                # when no one else's are on top: reentrant checkpoint's are not, the
                # non-reentrant one's are (Note [Offload design], Checkpointing).
                raw = in_bwd and _recompute_kind() != "reentrant"
                push = torch.is_grad_enabled() and not self._hooks_pushed and not raw
                if push:
                    self._push_hooks()
                self._pushed.append(push)
                if unit is not None:
                    for s in unit.slots:
                        self._hold(s)
                        if raw:  # autograd keeps raw aliases of these until backward ends
                            self._hold_in(self._bwd_end, s)
                self._units_held.append(unit)
        return pre

    def _make_post(self):
        def post(mod, inputs, output):
            with _DTF():
                unit = self._units_held.pop()
                if unit is not None:
                    for s in unit.slots:
                        self._unhold(s)
                if self._pushed.pop():
                    self._pop_hooks()
        return post

    # ---------------------------------------------------------------- saved tensors
    def _pack(self, t: torch.Tensor):
        with _DTF():
            base = _storage_base(t)
            s = self._gathered.get(base)
            if s is not None:
                return _Ref(s, t)
            span = _span(t)
            if not self.offload_activations or span == 0 or base in self._keep:
                return t
            if base == 0:
                raise OffloadError("u3m.torch.offload: autograd saved a tensor whose storage is freed")
            # A stable name per step (the n-th saved tensor), so prefetch can find it next step.
            name, k = f"act.{self._act_n}", 0
            self._act_n += 1
            tid = _core.stable_id(name)
            while tid in self._live:  # still held by an earlier step's graph
                k += 1
                tid = _core.stable_id(f"{name}~{k}")
            nbytes = span * t.element_size()
            self._register(None, tid, nbytes, name if k == 0 else f"{name}~{k}", "activation")
            lease = self._acquire(tid, "write", "backward" if self._cb_queued else "forward")
            flat = t.detach().as_strided((span,), (1,), t.storage_offset())  # no autograd for the copy
            self._lease_tensor(lease, t.dtype).copy_(flat)
            self._release(lease)
            self.saved_bytes += nbytes
            return _Saved(self, tid, t, span)

    def _unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        with _DTF():
            if isinstance(packed, _Ref):
                # Gathered until the next node boundary: the node that unpacks it is running now.
                self._hold_in(self._bwd if self._in_backward() else self._loose, packed.slot, "backward")
                return packed.t
            lease = self._acquire(packed.id, "read", "backward")
            out = torch.empty_strided(packed.size, packed.stride, dtype=packed.dtype, device=packed.device)
            out.as_strided((packed.span,), (1,), 0).copy_(self._lease_tensor(lease, packed.dtype))
            self._release(lease)
            return out

    # ---------------------------------------------------------------- gradients
    def _store_grad(self, r: _Param, g: torch.Tensor, add: bool) -> None:
        if r.g.lease is not None:
            raise OffloadError(f"u3m.torch.offload: the {r.g.name} is gathered while a new one arrives")
        if add and r.g.tid in self._live:  # gradient accumulation: add, as autograd would
            lease = self._acquire_named(r.g, "write", "backward")
            r.g.view(lease).add_(g)
        else:
            if r.g.tid not in self._live:
                self._register(r.g)
            lease = self._acquire_named(r.g, "write", "backward")
            r.g.view(lease).copy_(g)
        self._release(lease)
        r.p.grad = r.g.face

    def _drop_grad(self, r: _Param) -> None:
        if r.g.lease is not None:
            raise OffloadError(f"u3m.torch.offload: the {r.g.name} is freed while gathered")
        self._drop(r.g.tid)

    def _make_grad_pre(self, r: _Param):
        def pre(grad):
            # AccumulateGrad must not add into the zero-byte face: it gets no .grad, and the
            # post hook adds the new gradient to the engine's copy instead.
            with _DTF():
                if r.p.grad is not None:
                    r.p.grad = None
        return pre

    def _make_grad_post(self, r: _Param):
        def hook(grad_inputs, grad_outputs):
            with _DTF():
                self._flush(self._bwd)  # a node boundary: every earlier node has finished
                g = r.p.grad
                if g is not None:
                    self._store_grad(r, g, add=True)
        return hook

    def _zero_grad(self, set_to_none: bool = False):
        with _DTF():
            self._flush(self._loose)
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    r = self._by_tensor[id(p)]
                    if r.g.tid not in self._live:
                        continue
                    if set_to_none:
                        self._drop_grad(r)
                        p.grad = None
                    else:
                        lease = self._acquire_named(r.g, "write", "other")
                        r.g.view(lease).zero_()
                        self._release(lease)

    # ---------------------------------------------------------------- optimizer
    def _step(self, closure: Optional[Callable] = None):
        if closure is not None:
            raise ValueError("u3m.torch.offload: optimizer.step(closure) is not supported")
        with _DTF():
            self._flush(self._loose)
            groups = self.optimizer.param_groups
            saved = [g["params"] for g in groups]
            try:
                for gi, group in enumerate(saved):
                    for p in group:
                        r = self._by_tensor[id(p)]
                        if r.g.tid not in self._live:
                            continue  # no gradient: the optimizer would skip it too
                        for g in groups:
                            g["params"] = []
                        groups[gi]["params"] = [p]
                        self._step_one(r)
            finally:
                for g, ps in zip(groups, saved):
                    g["params"] = ps
        self.steps += 1
        self.drv.end_step()
        self._retry_drops()

    def _step_one(self, r: _Param) -> None:
        """The original step for one parameter, on its leased bytes (no copy): on the device, or
        on the host when its tensors do not fit the budget at once (Note [Oversized steps])."""
        if r.w.lease is not None or r.g.lease is not None:
            raise OffloadError(f"u3m.torch.offload: optimizer step while the {r.w.name} is gathered")
        on_host = id(r.p) in self._host_step
        acquire = self._acquire_on_host if on_host else self._acquire_named
        state = self.optimizer.state[r.p]
        leases = [acquire(r.w, "write", "optimizer"), acquire(r.g, "read", "optimizer")]
        r.p.data = r.w.view(leases[0])
        r.p.grad = r.g.view(leases[1])
        for key, s in r.state.items():
            leases.append(acquire(s, "write", "optimizer"))
            state[key] = s.view(leases[-1])
        try:
            self._orig["step"]()
            self.host_steps += on_host
        finally:
            self._adopt_state(r, state, acquire)
            r.p.grad = r.g.face
            r.p.data = r.w.base
            for lease in leases:
                self._release(lease)

    def _adopt_state(self, r: _Param, state: dict, acquire=None) -> None:
        """Full-size state tensors the optimizer created (or a load put there) move into the
        engine (through `acquire`, the step's: device or host); every managed entry points back
        at its face."""
        acquire = acquire or self._acquire_named
        for key, val in list(state.items()):
            if key in r.state or not isinstance(val, torch.Tensor) or val.shape != r.p.shape:
                continue
            s = _Slot(self, f"optim.{r.name}.{key}", "optim_v" if key == "exp_avg_sq" else "optim_m",
                      f"optimizer state {key!r} of {r.name!r}", val)
            self._register(s)
            lease = acquire(s, "write", "optimizer")
            s.view(lease).copy_(val)
            self._release(lease)
            r.state[key] = s
        for key, s in r.state.items():
            state[key] = s.face

    # ---------------------------------------------------------------- checkpoints
    def _materialise(self, t: torch.Tensor) -> torch.Tensor:
        s = getattr(t, "_u3m_slot", None)
        if s is None or s.off is not self:
            return t
        with _DTF():
            self._hold(s, "other")
            try:
                out = t.as_subclass(torch.Tensor).clone()
            finally:
                self._unhold(s)
        return out

    def _state_dict_hook(self, module, state_dict, prefix, local_metadata):
        for k, v in state_dict.items():
            if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter):
                state_dict[k] = self._materialise(v)

    def _opt_state_dict(self) -> dict:
        with _DTF():
            sd = self._orig["state_dict"]()
        sd["state"] = {k: {n: self._materialise(v) if isinstance(v, torch.Tensor) else v
                           for n, v in st.items()} for k, st in sd["state"].items()}
        return sd

    def _opt_load_state_dict(self, state_dict: dict) -> None:
        with _DTF():
            self._orig["load_state_dict"](state_dict)
            for r in self.params:
                state = self.optimizer.state.get(r.p)
                if not state:
                    continue
                for key, s in r.state.items():
                    val = state.get(key)
                    if isinstance(val, torch.Tensor) and val.shape == r.p.shape:
                        lease = self._acquire_named(s, "write", "other")
                        s.view(lease).copy_(val)
                        self._release(lease)
                self._adopt_state(r, state)

    # ---------------------------------------------------------------- results
    def stats(self) -> dict:
        s = self.rt.stats()
        return {"budget_bytes": self.budget_bytes, "footprint_bytes": self.footprint_bytes,
                "peak_device_bytes": s["peak"]["device"], "peak_host_bytes": s["peak"]["host"],
                "device_used_bytes": s["used"]["device"], "evictions": s["evictions"],
                "prefetches": s["prefetches"], "prefetch_hits": s["prefetch_hits"],
                "misses": s["misses"], "acquires": s["acquires"], "stall_s": s["stall_s"],
                "saved_activation_bytes": self.saved_bytes, "policy": self.drv.stats(),
                "faults": self.faults, "host_steps": self.host_steps, "units": len(self.units),
                "backend": self.rt.backend,
                "release_sync_s": self.release_sync_s, "engine": s}

    def close(self) -> None:
        """Puts parameters, gradients and optimizer state back into plain tensors and detaches
        every hook. A tensor the engine lost (an SSD copy that failed for good) raises the
        EngineError after everything else is restored; its parameter stays guarded, so a use
        raises again, naming it, instead of reading freed storage."""
        if self._handles is None:
            return
        errors = []
        with _DTF():
            handles, self._handles = self._handles, None
            for h in handles:
                h.remove()
            self._grad_accs = []
            for k, f in self._orig.items():
                setattr(self.optimizer, k, f)
            for group in (self._loose, self._bwd, self._bwd_end):
                group.clear()
            for s in [s for u in self._units_held if u is not None for s in u.slots]:
                s.holds = max(s.holds - 1, 0)
            self._units_held = []
            self._unwind()
            for s in list(self._gathered.values()):  # any other holder left behind
                s.holds = 1
                try:
                    self._unhold(s)
                except _core.EngineError as e:
                    errors.append(e)
            self.rt.drain()

            def back(s: _Slot) -> torch.Tensor:
                lease = self.rt.acquire(self.drv.engine_id(s.tid), "device", "read")
                out = s.view(lease).clone()
                self._release(lease)
                return out

            for r in self.params:
                try:
                    data = back(r.w)
                    grad = back(r.g) if r.g.tid in self._live else None
                    state = {key: back(s) for key, s in r.state.items()}
                except _core.EngineError as e:
                    errors.append(e)
                    continue
                r.p.__class__ = r.cls
                del r.p._u3m_slot
                r.p.data = data
                r.p.grad = grad
                if r.p in self.optimizer.state:
                    self.optimizer.state[r.p].update(state)
        if errors:
            raise errors[0]

    def __enter__(self) -> "Offload":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def offload(model: torch.nn.Module, optimizer: torch.optim.Optimizer, **kw) -> Offload:
    """Attaches u3m to a model and its optimizer (see Offload and Note [Offload design])."""
    return Offload(model, optimizer, **kw)
