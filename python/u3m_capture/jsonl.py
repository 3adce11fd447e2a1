"""Reads and checks a u3m JSONL trace (docs/trace-format.md) in Python.

`read_trace(path)` returns a `LoadedTrace` with every record, after checking
each line the way the C++ reader does: the header, the record kinds, required
fields and their types, enum values, and that every index refers to a record
declared earlier. A violation raises `TraceFormatError` naming the file, the
line and the field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import List, Tuple

DTYPES = {"f32", "f16", "bf16", "f64", "f8", "i64", "i32", "i16", "i8", "u8", "bool", "other"}
ROLES = {"param", "grad", "optim_master", "optim_m", "optim_v", "activation", "kv", "workspace", "other"}
CLASSES = {"matmul", "attn_prefill", "attn_decode", "norm", "softmax", "elementwise", "embedding", "optimizer",
           "collective", "copy", "loss", "other"}
PHASES = {"forward", "backward", "optimizer", "prefill", "decode", "collective", "other"}
KINDS = {"alloc", "read", "write", "free"}


class TraceFormatError(ValueError):
    pass


@dataclass
class LoadedTrace:
    meta: List[Tuple[str, str]] = field(default_factory=list)
    jobs: List[str] = field(default_factory=list)
    tensors: List[dict] = field(default_factory=list)
    ops: List[dict] = field(default_factory=list)
    events: List[dict] = field(default_factory=list)

    def meta_value(self, key: str):
        return next((v for k, v in self.meta if k == key), None)


def read_trace(path: str) -> LoadedTrace:
    tr = LoadedTrace()
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()

    def fail(lineno: int, what: str):
        raise TraceFormatError(f"{path}:{lineno}: {what}")

    def need(lineno, rec, key, kind, required=True, check=None):
        if key not in rec:
            if required:
                fail(lineno, f"missing field '{key}'")
            return None
        v = rec[key]
        ok = isinstance(v, kind) and not (kind is not bool and isinstance(v, bool))
        if not ok:
            fail(lineno, f"field '{key}' has the wrong type ({type(v).__name__})")
        if check is not None and not check(v):
            fail(lineno, f"field '{key}' has a bad value {v!r}")
        return v

    header_seen = False
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            fail(lineno, f"not JSON: {e}")
        if not isinstance(obj, dict) or len(obj) != 1:
            fail(lineno, "a line must be one object with one key")
        if not header_seen:
            if obj != {"u3m_trace": 1}:
                fail(lineno, 'the first line must be {"u3m_trace": 1}')
            header_seen = True
            continue
        (kind, rec), = obj.items()
        if kind == "meta":
            tr.meta.append((need(lineno, rec, "key", str), need(lineno, rec, "value", str)))
        elif kind == "job":
            if not isinstance(rec, str):
                fail(lineno, "field 'job' must be a string")
            tr.jobs.append(rec)
        elif kind == "tensor":
            need(lineno, rec, "name", str)
            need(lineno, rec, "bytes", int, check=lambda v: v >= 0)
            need(lineno, rec, "dtype", str, False, lambda v: v in DTYPES)
            need(lineno, rec, "role", str, False, lambda v: v in ROLES)
            need(lineno, rec, "layer", int, False, lambda v: v >= -1)
            need(lineno, rec, "job", int, False, lambda v: 0 <= v < len(tr.jobs))
            tr.tensors.append(rec)
        elif kind == "op":
            need(lineno, rec, "name", str)
            need(lineno, rec, "class", str, False, lambda v: v in CLASSES)
            need(lineno, rec, "phase", str, False, lambda v: v in PHASES)
            need(lineno, rec, "job", int, False, lambda v: 0 <= v < len(tr.jobs))
            need(lineno, rec, "iteration", int, False, lambda v: v >= 0)
            need(lineno, rec, "layer", int, False, lambda v: v >= -1)
            need(lineno, rec, "flops", (int, float), False, lambda v: v >= 0)
            need(lineno, rec, "bytes", int, False, lambda v: v >= 0)
            tr.ops.append(rec)
        elif kind == "event":
            need(lineno, rec, "t", int, check=lambda v: v >= 0)
            need(lineno, rec, "op", int, check=lambda v: 0 <= v < len(tr.ops))
            need(lineno, rec, "tensor", int, check=lambda v: 0 <= v < len(tr.tensors))
            need(lineno, rec, "kind", str, check=lambda v: v in KINDS)
            tr.events.append(rec)
        else:
            fail(lineno, f"unknown record '{kind}'")
    if not header_seen:
        raise TraceFormatError(f"{path}: empty file, no header")
    return tr
