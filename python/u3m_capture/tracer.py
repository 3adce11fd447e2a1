"""Records every aten op of a PyTorch program as a u3m trace (docs/trace-format.md).

The recorder is a TorchDispatchMode: with it active, every aten operator call
(including the ones the autograd engine runs in backward) passes through
`__torch_dispatch__`, where we see the op's schema, its tensor arguments and its
results. The driver (workloads.py) tells the recorder which job, iteration and
phase is running; module hooks tell it which module is running.

Note [Logical tensors are storages]
At run time a tensor is identified by its storage: (storage data pointer).
Every view of a storage (slices, transposes, detach, the aliases autograd saves)
is the same logical tensor, because it is the same memory; an allocator or a
tier manager moves storages, never views. The logical tensor's size is the
storage's size. Alias-only ops (view, t, transpose, expand, slice, detach, ...;
schema: every result aliases an input and nothing is written) touch no data
and are not recorded, though their results keep the storage alive.

Note [Stable names]
A storage gets its name when it first appears as an op result:
  <job>.<phase tag>.<module path>[@call].<op>#<ordinal>.out<slot>
e.g. `train-0.fwd.layers.1.attn.q_proj.aten::mm#0.out0`. The phase tag is fwd,
bwd, opt, prefill or decode; the module path is the innermost module running
(`model` for the root module, `top` outside any module); @call counts repeated
invocations of the same module within one iteration and phase (omitted for the
first); the ordinal counts calls of that op name within that module invocation.
All counters restart at every iteration, so step k+1 reproduces step k's names.
Parameters, gradients and optimizer state are renamed by the driver once it
knows what they are (`<owner>.param.<name>`, `.grad.<name>`,
`.optim.<name>.exp_avg` / `.exp_avg_sq` / `.step`); the first name stays an
alias, so a gradient allocated afresh each step maps to the same record.
Storages first seen as an input (created before the capture) are named like a
result with `in<slot>`. If a name is still held by a live storage when it is
produced again (a driver holding last step's token while the next is made), the
new storage gets `~1`, `~2`, ... appended: a double buffer, stable in turn.

Note [KV cache blocks]
The driver registers the KV cache's buffers ([batch, max_len, kv_heads, dim],
one per layer for K and for V). An access to them is mapped, element by
element, to blocks of `kv_block` positions of one batch slot:
`<job>.kv.slot<b>.layer<l>.<k|v>.blk<j>`, role kv. A block is allocated at its
first access (the prefill or decode write that fills it) and freed when the
cache buffer dies, so the number of live KV blocks grows during decode.

Note [Frees]
Each tensor object the recorder sees gets a weakref callback; when the last
seen tensor of a storage dies, the storage is freed (event at that moment,
attributed to the most recent op). Autograd may keep a storage alive through a
tensor we never saw (a saved result it re-wraps in C++); if such a storage is
read again, the free was premature and is withdrawn. Storages that outlive the
capture (parameters, optimizer state) get no free event.

Note [Backward attribution]
Backward ops run in the autograd engine, outside any module's forward. The
driver sets the phase to backward around loss.backward(). For the module path,
forward hooks register tensor hooks: one on each module output (fires when the
gradient reaching that output is ready, i.e. just before the module's backward
starts: "enter") and one on each module input (fires when the gradient
leaving the module is complete: "exit", back to the parent, ignored if another
module was entered meanwhile). The CPU autograd engine runs nodes in a fixed
order, so the attribution is the same in every step.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

EVENT_KINDS = ("alloc", "read", "write", "free")
ALLOC, READ, WRITE, FREE = range(4)

PHASES = ("forward", "backward", "optimizer", "prefill", "decode", "collective", "other")
PHASE_TAG = {"forward": "fwd", "backward": "bwd", "optimizer": "opt", "prefill": "prefill",
             "decode": "decode", "collective": "coll", "other": "other"}

_DTYPES = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "bool",
}

# In-place ops that overwrite their destination without reading it.
_OVERWRITE_OPS = {"aten::copy_", "aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_",
                  "aten::random_", "aten::bernoulli_", "aten::exponential_", "aten::set_"}
# Ops that take a tensor argument only for its shape, dtype and device.
_METADATA_ONLY_OPS = {"aten::new_empty", "aten::new_empty_strided", "aten::new_zeros", "aten::new_ones",
                      "aten::new_full", "aten::empty_like", "aten::zeros_like", "aten::ones_like",
                      "aten::full_like", "aten::rand_like", "aten::randn_like", "aten::randint_like"}
# Ops inside an attention-core module that are the attention arithmetic proper.
_ATTENTION_OPS = {"aten::bmm", "aten::baddbmm", "aten::mm", "aten::_softmax", "aten::softmax",
                  "aten::_softmax_backward_data"}
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def _within(path: str, ancestor: str) -> bool:
    """Module `path` is `ancestor` or inside it; the root module "model" holds every module."""
    return path == ancestor or ancestor == "model" or path.startswith(ancestor + ".")


def layer_of(path: str) -> int:
    m = _LAYER_RE.search(path)
    return int(m.group(1)) if m else -1


def storage_key(t: torch.Tensor) -> int:
    return t.storage().data_ptr()


def storage_bytes(t: torch.Tensor) -> int:
    return t.storage().nbytes()


def machine_description() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


@dataclass
class TensorRec:
    name: str
    bytes: int
    dtype: str
    role: str
    layer: int
    job: int
    live_key: Optional[int] = None  # storage currently bound to this record


@dataclass
class StorageState:
    key: int  # storage data pointer
    rec: Optional[int]  # record index; None for KV buffers and not-yet-named storages
    live: int = 0  # tensor objects we watch that use this storage
    dead: bool = False
    free_events: List[int] = field(default_factory=list)  # to withdraw on resurrection
    kv: Optional["KVBuffer"] = None


@dataclass
class KVBuffer:
    job: int
    layer_kind: Tuple[int, str]  # (layer, "k" | "v")
    block_of_elem: torch.Tensor  # storage element -> slot * blocks_per_slot + block
    blocks_per_slot: int
    block_bytes: int
    dtype: str
    recs: Dict[int, int] = field(default_factory=dict)  # flat block -> record index
    allocated: set = field(default_factory=set)


@dataclass
class Frame:
    path: str
    call: int
    hint: Optional[str]
    counters: Dict[str, int] = field(default_factory=dict)


@dataclass
class _OpSchema:
    name: str
    is_view: bool
    written: Dict[str, bool]  # argument name -> True if overwritten (not read), False if read+written
    arg_names: List[str]
    returns_alias: List[bool]  # result i aliases an input (in-place/out= results)


class Recorder(TorchDispatchMode):
    """Collects a u3m trace in memory; `write_jsonl` writes it.

    Use as a context manager (it is a dispatch mode) around the program,
    with `iteration(job, i)` and `phase(name)` contexts from the driver.
    """

    def __init__(self, max_events: int = 2_000_000, kv_block: int = 16):
        super().__init__()
        self.t0 = time.perf_counter_ns()
        self.max_events = max_events
        self.kv_block = kv_block
        self.meta: List[Tuple[str, str]] = []
        self.jobs: List[str] = []
        self.tensors: List[TensorRec] = []
        self.by_name: Dict[str, int] = {}
        self.redirect: Dict[int, int] = {}
        # op record: [name, cls, phase, job, iteration, layer, flops, bytes]
        self.ops: List[list] = []
        # event: [t, op, tensor, kind]; kind None = withdrawn
        self.events: List[list] = []
        self.storages: Dict[int, StorageState] = {}
        self._watched: Dict[int, weakref.ref] = {}
        self._pending_frees: List[Tuple[StorageState, int]] = []
        self._schemas: Dict[object, _OpSchema] = {}
        self.active = False
        self.truncated = False
        self.job = 0
        self.iter = 0
        self.cur_phase = "other"
        self._fwd_stack: List[Frame] = []
        self._bwd_frame: Optional[Frame] = None
        self._frames: Dict[Tuple[str, str], Frame] = {}  # latest frame by (phase, path)
        self._calls: Dict[Tuple[str, str], int] = {}
        self._top: Dict[str, Frame] = {}
        self._last_t = 0
        self.withdrawn_frees = 0

    # ------------------------------------------------------------------ driver API
    def add_job(self, name: str) -> int:
        self.jobs.append(name)
        return len(self.jobs) - 1

    def add_meta(self, key: str, value) -> None:
        self.meta.append((key, value if isinstance(value, str) else json.dumps(value, sort_keys=True)))

    def now(self) -> int:
        return time.perf_counter_ns() - self.t0

    @contextlib.contextmanager
    def recording(self):
        """Activates the dispatch mode and starts recording."""
        with self:
            self.active = True
            try:
                yield self
            finally:
                self.active = False
                self._flush_frees()

    @contextlib.contextmanager
    def paused(self):
        """Ops run inside are not recorded (setup the trace should not show)."""
        was, self.active = self.active, False
        try:
            yield
        finally:
            self.active = was and not self.truncated

    @contextlib.contextmanager
    def iteration(self, job: int, index: int):
        self._flush_frees()
        self.job, self.iter = job, index
        self._frames.clear()
        self._calls.clear()
        self._top.clear()
        self._fwd_stack.clear()
        self._bwd_frame = None
        yield
        self._flush_frees()

    @contextlib.contextmanager
    def phase(self, name: str):
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}")
        self._flush_frees()
        prev, self.cur_phase = self.cur_phase, name
        self._bwd_frame = None
        try:
            yield
        finally:
            self._flush_frees()
            self.cur_phase = prev

    def attach(self, model: torch.nn.Module) -> list:
        """Installs the module hooks; returns the handles (call .remove() on each to detach)."""
        handles = []
        for path, mod in model.named_modules():
            path = path or "model"
            hint = getattr(mod, "trace_op_class", None)
            handles.append(mod.register_forward_pre_hook(self._make_pre_hook(path, hint)))
            handles.append(mod.register_forward_hook(self._make_post_hook(path, hint)))
        return handles

    def register_model(self, model: torch.nn.Module, job: int) -> None:
        """Names parameters `<job>.param.<name>` and buffers `<job>.buffer.<name>`."""
        jname = self.jobs[job]
        for name, p in model.named_parameters():
            self._bind(p, f"{jname}.param.{name}", "param", layer_of(name), job)
        for name, b in model.named_buffers():
            self._bind(b, f"{jname}.buffer.{name}", "other", layer_of(name), job)

    def bind_grads(self, model: torch.nn.Module, job: int) -> None:
        """After backward: the storages now held as .grad are `<job>.grad.<name>`."""
        jname = self.jobs[job]
        for name, p in model.named_parameters():
            if p.grad is not None:
                self._bind(p.grad, f"{jname}.grad.{name}", "grad", layer_of(name), job)

    def bind_optimizer(self, opt: torch.optim.Optimizer, model: torch.nn.Module, job: int) -> None:
        """After an optimizer step: names Adam state `<job>.optim.<param>.<key>`."""
        jname = self.jobs[job]
        roles = {"exp_avg": "optim_m", "exp_avg_sq": "optim_v", "max_exp_avg_sq": "optim_v"}
        for name, p in model.named_parameters():
            for key, val in opt.state.get(p, {}).items():
                if isinstance(val, torch.Tensor):
                    self._bind(val, f"{jname}.optim.{name}.{key}", roles.get(key, "other"), layer_of(name), job)

    def register_kv(self, tensor: torch.Tensor, job: int, layer: int, kind: str) -> None:
        """Declares a KV buffer [batch, max_len, kv_heads, head_dim] (see Note [KV cache blocks])."""
        if tensor.dim() != 4 or not tensor.is_contiguous():
            raise ValueError(f"register_kv: expected a contiguous [batch, len, heads, dim] tensor, "
                             f"got shape {tuple(tensor.shape)}")
        b, s, h, d = tensor.shape
        bps = -(-s // self.kv_block)
        key = storage_key(tensor)
        # Install the state before any torch op here can see the buffer.
        st = self.storages[key] = StorageState(key=key, rec=None)
        self._watch(tensor, key)
        with self.paused():
            pos = torch.arange(s).repeat_interleave(h * d)
            blk = (torch.arange(b)[:, None] * bps + (pos // self.kv_block)[None, :]).reshape(-1)
        st.kv = KVBuffer(job=job, layer_kind=(layer, kind), block_of_elem=blk, blocks_per_slot=bps,
                         block_bytes=self.kv_block * h * d * tensor.element_size(),
                         dtype=_DTYPES.get(tensor.dtype, "other"))

    # ------------------------------------------------------------------ hooks
    def _make_pre_hook(self, path: str, hint: Optional[str]):
        def pre(mod, inputs):
            if not self.active:
                return
            ck = (self.cur_phase, path)
            call = self._calls.get(ck, 0)
            self._calls[ck] = call + 1
            self._fwd_stack.append(Frame(path, call, hint))
            if torch.is_grad_enabled():
                for x in inputs:
                    if isinstance(x, torch.Tensor) and x.requires_grad:
                        x.register_hook(lambda g: self._bwd_exit(path))
        return pre

    def _make_post_hook(self, path: str, hint: Optional[str]):
        def post(mod, inputs, output):
            if not self.active:
                return
            if self._fwd_stack and self._fwd_stack[-1].path == path:
                self._fwd_stack.pop()
            if torch.is_grad_enabled():
                outs = output if isinstance(output, (tuple, list)) else (output,)
                for y in outs:
                    if isinstance(y, torch.Tensor) and y.requires_grad:
                        y.register_hook(lambda g: self._bwd_enter(path, hint))
        return post

    def _bwd_enter(self, path: str, hint: Optional[str]) -> None:
        if self.cur_phase != "backward":
            return
        cur = self._bwd_frame
        # A module whose output is its last child's output (lm_head in the model, down_proj
        # in the MLP) gets both hooks on one tensor: the innermost module wins.
        if cur is not None and _within(cur.path, path):
            return
        self._bwd_frame = self._new_frame(path, hint)

    def _bwd_exit(self, path: str) -> None:
        cur = self._bwd_frame
        if self.cur_phase != "backward" or cur is None:
            return
        if _within(cur.path, path):
            parent = path.rsplit(".", 1)[0] if "." in path else ("model" if path != "model" else None)
            if parent is None:
                self._bwd_frame = None
            else:
                self._bwd_frame = self._frames.get((self.cur_phase, parent)) or self._new_frame(parent, None)

    def _new_frame(self, path: str, hint: Optional[str]) -> Frame:
        ck = (self.cur_phase, path)
        call = self._calls.get(ck, 0)
        self._calls[ck] = call + 1
        f = Frame(path, call, hint)
        self._frames[ck] = f
        return f

    def _frame(self) -> Frame:
        if self.cur_phase == "backward" and self._bwd_frame is not None:
            return self._bwd_frame
        if self.cur_phase != "backward" and self._fwd_stack:
            return self._fwd_stack[-1]
        f = self._top.get(self.cur_phase)
        if f is None:
            f = self._top[self.cur_phase] = Frame("top", 0, None)
        return f

    # ------------------------------------------------------------------ storage tracking
    def _watch(self, t: torch.Tensor, key: int) -> None:
        tid = id(t)
        if tid in self._watched:
            return
        st = self.storages.get(key)
        if st is None:
            st = self.storages[key] = StorageState(key=key, rec=None)
        if st.dead:
            self._resurrect(st)
        st.live += 1

        def died(_ref, tid=tid, st=st):
            # `st`, not the key: by the time frees are flushed a new storage may sit at the key.
            self._watched.pop(tid, None)
            st.live -= 1
            if st.live == 0:
                self._pending_frees.append((st, self.now()))

        self._watched[tid] = weakref.ref(t, died)

    def _resurrect(self, st: StorageState) -> None:
        # The storage outlived every tensor we saw (see Note [Frees]): withdraw its free.
        self.withdrawn_frees += len(st.free_events)
        for i in st.free_events:
            self.events[i][3] = None
        st.free_events.clear()
        st.dead = False
        if st.rec is not None:
            self.tensors[self._resolve(st.rec)].live_key = st.key

    def _flush_frees(self, op: Optional[int] = None) -> None:
        if not self._pending_frees:
            return
        pending, self._pending_frees = self._pending_frees, []
        if self.truncated:
            return  # the event budget is spent; keep the bound firm
        op = len(self.ops) - 1 if op is None else op
        for st, t in pending:
            if st.live > 0 or st.dead:
                continue
            st.dead = True
            if op < 0:
                continue
            recs = []
            if st.kv is not None:
                # Blocks stay marked allocated: the buffer is never reused (a new one is
                # registered afresh), and a resurrection must not allocate them twice.
                recs = [st.kv.recs[b] for b in sorted(st.kv.allocated)]
            elif st.rec is not None:
                recs = [st.rec]
                if self.tensors[st.rec].live_key == st.key:
                    self.tensors[st.rec].live_key = None
            for r in recs:
                st.free_events.append(self._event(max(t, self._last_t), op, r, FREE))

    def _event(self, t: int, op: int, rec: int, kind: int) -> int:
        self._last_t = max(self._last_t, t)
        self.events.append([t, op, rec, kind])
        return len(self.events) - 1

    def _new_rec(self, name: str, nbytes: int, dtype: str, role: str, layer: int, job: int) -> int:
        self.tensors.append(TensorRec(name, nbytes, dtype, role, layer, job))
        idx = len(self.tensors) - 1
        self.by_name[name] = idx
        return idx

    def _resolve(self, idx: int) -> int:
        while idx in self.redirect:
            idx = self.redirect[idx]
        return idx

    def _bind(self, t: torch.Tensor, name: str, role: str, layer: int, job: int) -> None:
        """Gives the storage of `t` the stable name `name` (merging records if the name exists)."""
        key = storage_key(t)
        st = self.storages.get(key)
        if st is None or st.dead:
            st = self.storages[key] = StorageState(key=key, rec=None)
        self._watch(t, key)
        target = self.by_name.get(name)
        target = self._resolve(target) if target is not None else None
        cur = self._resolve(st.rec) if st.rec is not None else None
        if cur is None and target is None:
            st.rec = self._new_rec(name, storage_bytes(t), _DTYPES.get(t.dtype, "other"), role, layer, job)
        elif cur is None:
            st.rec = target
        elif target is None or target == cur:
            rec = self.tensors[cur]
            self.by_name[name] = cur
            rec.name, rec.role, rec.layer, rec.job = name, role, layer, job
            st.rec = cur
        else:
            self.redirect[cur] = target  # events already written against `cur` now mean `target`
            st.rec = target
        rec = self.tensors[st.rec]
        rec.live_key = key
        rec.bytes = max(rec.bytes, storage_bytes(t))

    # ------------------------------------------------------------------ dispatch
    def _schema(self, func) -> _OpSchema:
        s = self._schemas.get(func)
        if s is None:
            sch = func._schema
            written = {}
            for a in sch.arguments:
                if a.alias_info is not None and a.alias_info.is_write:
                    written[a.name] = a.name == "out" or sch.name in _OVERWRITE_OPS
            rets_alias = [r.alias_info is not None for r in sch.returns]
            is_view = not written and bool(sch.returns) and all(rets_alias)
            s = _OpSchema(sch.name, is_view, written, [a.name for a in sch.arguments], rets_alias)
            self._schemas[func] = s
        return s

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.active:
            out = func(*args, **kwargs)
            self._forget_reused(out)
            return out
        self._flush_frees()
        t_start = self.now()
        out = func(*args, **kwargs)
        t_end = self.now()
        self._record(func, args, kwargs, out, t_start, t_end)
        return out

    def _forget_reused(self, out) -> None:
        # A storage made while paused may sit where a storage we saw die used to be:
        # forget the dead one, so reading the new one is not taken for a resurrection.
        self._flush_frees()  # a death not yet flushed is still a death
        for o in self._flat(out if isinstance(out, (tuple, list)) else (out,)):
            st = self.storages.get(storage_key(o))
            if st is not None and st.dead:
                del self.storages[st.key]

    def _record(self, func, args, kwargs, out, t_start: int, t_end: int) -> None:
        sch = self._schema(func)
        if sch.name.startswith("profiler::"):
            return  # record_function scaffolding (optimizer.step/zero_grad ranges), not data
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))]
        if sch.is_view:
            if sch.name in ("aten::lift_fresh", "aten::lift"):
                self._forget_reused(out)  # torch.tensor(data): a new storage, allocated unseen
            for o in outs:
                if isinstance(o, torch.Tensor):
                    self._watch(o, storage_key(o))
            return
        # Tensor arguments: (slot, tensor, mode) with mode None=read, True=overwrite, False=read+write.
        targs = []
        slot = 0
        named = list(zip(sch.arg_names, args)) + list(kwargs.items())
        for aname, val in named:
            vals = val if isinstance(val, (list, tuple)) else (val,)
            for v in vals:
                if isinstance(v, torch.Tensor):
                    if sch.name not in _METADATA_ONLY_OPS:
                        targs.append((slot, v, sch.written.get(aname)))
                    slot += 1
        fresh = [(i, o) for i, o in enumerate(self._flat(outs))
                 if not (i < len(sch.returns_alias) and sch.returns_alias[i])]
        if not targs and not fresh:
            return
        if not sch.written and fresh:
            # Unannotated aliases (aten::_unsafe_view, lift_fresh): results that share an
            # input's storage touch no data, like the annotated views above.
            in_keys = {storage_key(t) for _, t, _ in targs}
            if all(storage_key(o) in in_keys for _, o in fresh):
                for _, o in fresh:
                    self._watch(o, storage_key(o))
                return
        frame = self._frame()
        n = frame.counters.get(sch.name, 0)
        frame.counters[sch.name] = n + 1
        stem = f"{self.jobs[self.job]}.{PHASE_TAG[self.cur_phase]}.{frame.path}" \
               f"{'@' + str(frame.call) if frame.call else ''}.{sch.name}#{n}"
        # Note [Explicit op classes]: the C++ side derives a class from the op name
        # (data/op_classes.tsv). Two cases it cannot see: attention done in eager code is
        # plain bmm/softmax (we know it from the AttentionCore module), and the single-tensor
        # AdamW is plain mul_/addcdiv_ (we know it from the optimizer phase).
        cls = None
        if self.cur_phase == "optimizer":
            cls = "optimizer"
        elif frame.hint == "attention" and sch.name in _ATTENTION_OPS:
            cls = "attn_decode" if self.cur_phase == "decode" else "attn_prefill"
        layer = layer_of(frame.path)
        op_bytes = sum(t.numel() * t.element_size() for _, t, _ in targs)
        op_bytes += sum(o.numel() * o.element_size() for _, o in fresh)
        op = [sch.name, cls, self.cur_phase, self.job, self.iter, layer, _flops(sch.name, args), op_bytes]
        self.ops.append(op)
        op_idx = len(self.ops) - 1

        touched = []
        for slot_i, t, mode in targs:
            if mode is True:
                continue
            for rec in self._access(t, stem, f"in{slot_i}", op_idx, t_start, READ):
                touched.append(rec)
        self._flush_frees(op_idx)
        for slot_i, t, mode in targs:
            if mode is not None:
                touched.extend(self._access(t, stem, f"in{slot_i}", op_idx, t_end, WRITE))
        for i, o in fresh:
            touched.extend(self._produce(o, f"{stem}.out{i}", op_idx, t_end))
        if layer < 0:
            for r in touched:
                if self.tensors[r].layer >= 0 and self.tensors[r].role != "activation":
                    op[5] = self.tensors[r].layer
                    break
        if len(self.events) >= self.max_events and not self.truncated:
            self.truncated = True
            self.active = False
            print(f"[u3m_capture] event limit {self.max_events} reached; recording stops here "
                  f"(trace marked truncated)", file=sys.stderr)

    @staticmethod
    def _flat(outs):
        flat = []
        for o in outs:
            if isinstance(o, (list, tuple)):
                flat.extend(x for x in o if isinstance(x, torch.Tensor))
            elif isinstance(o, torch.Tensor):
                flat.append(o)
        return flat

    def _access(self, t: torch.Tensor, stem: str, slot: str, op: int, time_ns: int, kind: int) -> List[int]:
        """Read or write of an existing (or pre-capture) storage; returns the records touched."""
        if storage_bytes(t) == 0:
            return []
        key = storage_key(t)
        st = self.storages.get(key)
        if st is not None and st.kv is not None:
            self._watch(t, key)
            return self._kv_access(st.kv, t, op, time_ns, kind)
        self._watch(t, key)
        st = self.storages[key]
        if st.rec is None:
            # Storage made before the capture, or only seen through views so far.
            name = self._free_name(f"{stem}.{slot}", key)
            idx = self.by_name.get(name)
            if idx is None:
                idx = self._new_rec(name, storage_bytes(t), _DTYPES.get(t.dtype, "other"), "other", -1, self.job)
            st.rec = self._resolve(idx)
            self.tensors[st.rec].live_key = key
            # It was allocated unseen (before the capture, or while paused): it starts here.
            self._event(time_ns, op, st.rec, ALLOC)
        rec = self._resolve(st.rec)
        if not self._seen_in_op(rec, op, kind):
            self._event(time_ns, op, rec, kind)
        return [rec]

    def _seen_in_op(self, rec: int, op: int, kind: int) -> bool:
        # One read and one write per tensor per op, even if passed twice (addcmul_(g, g)).
        for e in reversed(self.events):
            if e[1] != op:
                return False
            if e[2] == rec and e[3] == kind:
                return True
        return False

    def _produce(self, o: torch.Tensor, name: str, op: int, time_ns: int) -> List[int]:
        """A result of the op: a new storage is allocated and named, or an existing one written."""
        nbytes = storage_bytes(o)
        if nbytes == 0:
            return []
        key = storage_key(o)
        st = self.storages.get(key)
        if st is not None and not st.dead:
            return self._access(o, name, "", op, time_ns, WRITE)
        # A new allocation (possibly reusing a dead storage's address).
        st = self.storages[key] = StorageState(key=key, rec=None)
        name = self._free_name(name, key)
        idx = self.by_name.get(name)
        if idx is None:
            role = "activation" if self.cur_phase != "optimizer" else "other"
            idx = self._new_rec(name, nbytes, _DTYPES.get(o.dtype, "other"), role,
                                layer_of(name.split(".", 2)[-1]), self.job)
        idx = self._resolve(idx)
        rec = self.tensors[idx]
        rec.bytes = max(rec.bytes, nbytes)
        rec.live_key = key
        st.rec = idx
        self._watch(o, key)
        self._event(time_ns, op, idx, ALLOC)
        self._event(time_ns, op, idx, WRITE)
        return [idx]

    def _free_name(self, name: str, key: int) -> str:
        """`name`, or `name~k` if `name` is held by another live storage (a double buffer)."""
        cand, k = name, 0
        while True:
            idx = self.by_name.get(cand)
            if idx is None:
                return cand
            rec = self.tensors[self._resolve(idx)]
            if rec.live_key is None or rec.live_key == key:
                return cand
            k += 1
            cand = f"{name}~{k}"

    def _kv_access(self, kv: KVBuffer, t: torch.Tensor, op: int, time_ns: int, kind: int) -> List[int]:
        elems = torch.as_strided(kv.block_of_elem, t.size(), t.stride(), t.storage_offset())
        blocks = torch.unique(elems).tolist()
        layer, which = kv.layer_kind
        jname = self.jobs[kv.job]
        recs = []
        for b in blocks:
            rec = kv.recs.get(b)
            if rec is None:
                slot, j = divmod(b, kv.blocks_per_slot)
                name = f"{jname}.kv.slot{slot}.layer{layer}.{which}.blk{j}"
                rec = self.by_name.get(name)
                if rec is None:
                    rec = self._new_rec(name, kv.block_bytes, kv.dtype, "kv", layer, kv.job)
                kv.recs[b] = rec
            if b not in kv.allocated:
                kv.allocated.add(b)
                self._event(time_ns, op, rec, ALLOC)
            self._event(time_ns, op, rec, kind)
            recs.append(rec)
        return recs

    # ------------------------------------------------------------------ output
    def counts(self) -> dict:
        live = [e for e in self.events if e[3] is not None]
        per_kind = {k: 0 for k in EVENT_KINDS}
        for e in live:
            per_kind[EVENT_KINDS[e[3]]] += 1
        return {"jobs": len(self.jobs), "tensors": len(self.tensors) - len(self.redirect),
                "ops": len(self.ops), "events": len(live), **per_kind}

    def write_jsonl(self, path: str) -> dict:
        """Writes the trace; returns the counts written."""
        keep = [i for i in range(len(self.tensors)) if i not in self.redirect]
        new_index = {old: new for new, old in enumerate(keep)}
        dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
        with open(path, "w", encoding="utf-8") as f:
            f.write('{"u3m_trace":1}\n')
            meta = list(self.meta) + [("truncated", "true" if self.truncated else "false"),
                                      ("withdrawn_frees", str(self.withdrawn_frees))]
            for k, v in meta:
                f.write(dumps({"meta": {"key": k, "value": v}}) + "\n")
            for j in self.jobs:
                f.write(dumps({"job": j}) + "\n")
            for i in keep:
                r = self.tensors[i]
                f.write(dumps({"tensor": {"name": r.name, "bytes": r.bytes, "dtype": r.dtype, "role": r.role,
                                          "layer": r.layer, "job": r.job}}) + "\n")
            for name, cls, phase, job, it, layer, flops, nbytes in self.ops:
                rec = {"name": name, "phase": phase, "job": job, "iteration": it, "layer": layer,
                       "flops": flops, "bytes": nbytes}
                if cls is not None:
                    rec["class"] = cls
                f.write(dumps({"op": rec}) + "\n")
            for t, op, ten, kind in self.events:
                if kind is None:
                    continue
                f.write(dumps({"event": {"t": t, "op": op, "tensor": new_index[self._resolve(ten)],
                                         "kind": EVENT_KINDS[kind]}}) + "\n")
        return self.counts()


def _flops(name: str, args) -> float:
    """FLOPs of matmul-type ops from their operand shapes (multiply-add = 2); 0 otherwise."""
    try:
        if name == "aten::mm":
            (m, k), n = args[0].shape, args[1].shape[1]
            return 2.0 * m * k * n
        if name == "aten::addmm":
            (m, k), n = args[1].shape, args[2].shape[1]
            return 2.0 * m * k * n + m * n
        if name == "aten::bmm":
            (b, m, k), n = args[0].shape, args[1].shape[2]
            return 2.0 * b * m * k * n
        if name == "aten::baddbmm":
            (b, m, k), n = args[1].shape, args[2].shape[2]
            return 2.0 * b * m * k * n + b * m * n
        if name == "aten::mv":
            m, k = args[0].shape
            return 2.0 * m * k
        if name == "aten::dot":
            return 2.0 * args[0].shape[0]
    except (AttributeError, IndexError, ValueError, TypeError):
        return 0.0
    return 0.0
