"""Rewrites a torch 1.13 Execution Trace (schema 1.0.1) in the layouts torch 2.x writes.

torch 2.x's ExecutionTraceObserver (torch/csrc/profiler/standalone/
execution_trace_observer.cpp) groups each node's arguments as
`inputs: {values, shapes, types}` and `outputs: {...}`, names its parent
`ctrl_deps`, and moves the other per-node fields into
`attrs: [{name, type, value}]`. The schemas differ in a few fields:

- "1.0.2-chakra.0.0.4" (torch 2.2/2.3): attrs rf_id, fw_parent, seq_id, scope,
  tid, fw_tid, op_schema;
- "1.1.0-chakra.0.0.4" (torch 2.4): also kernel_backend, kernel_file (the real
  sample data/pytorch-et/resnet_et.json.gz has exactly these fields);
- "1.1.1-chakra.0.0.4" (torch 2.5 and later): `strides` beside values, shapes
  and types in `inputs` and `outputs` (a tensor's strides, [] for any other
  value, nested like its shape), and a tensor_range attr (""
  unless integral input ranges are recorded).

In all of them the root ranges are named `[pytorch|profiler|execution_trace|...]`
and the process node (id 1, its own ctrl_deps) is written last.

Only the layout changes: every node, value, shape, type, id and schema string
is carried over as torch 1.13 recorded it (1.1.1's strides are those of a
contiguous tensor of the recorded shape: torch 1.13 does not record strides).
This lets the corpus and the importer's tests exercise the torch 2.x layouts
with programs we can run here (Debian ships torch 1.13); a trace rewritten
this way says so in its `u3m_note` field.
"""
from __future__ import annotations

SCHEMA = "1.1.0-chakra.0.0.4"
SCHEMAS = ("1.0.2-chakra.0.0.4", "1.1.0-chakra.0.0.4", "1.1.1-chakra.0.0.4")

_ATTRS = (("rf_id", "uint64", 0), ("fw_parent", "uint64", 0), ("seq_id", "int64", -1), ("scope", "uint64", 0),
          ("tid", "uint64", 0), ("fw_tid", "uint64", 0), ("op_schema", "string", ""))
_KERNEL_ATTRS = (("kernel_backend", "string", ""), ("kernel_file", "string", ""))


def _contiguous_strides(shape, type_name: str):
    """Strides of a contiguous tensor of `shape`; [] for a non-tensor; nested for lists."""
    if type_name.startswith("Tensor("):
        strides, step = [], 1
        for d in reversed(shape):
            strides.append(step)
            step *= max(int(d), 1)
        return list(reversed(strides))
    if type_name.startswith(("GenericList[", "Tuple[")) and isinstance(shape, list):
        inner = type_name[type_name.index("[") + 1:-1].split(",") if "[" in type_name else []
        return [_contiguous_strides(s, inner[i] if i < len(inner) else "") for i, s in enumerate(shape)]
    return []


def _group(node: dict, values: str, shapes: str, types: str, strides: bool) -> dict:
    g = {"values": node.get(values, []), "shapes": node.get(shapes, []), "types": node.get(types, [])}
    if strides:
        g["strides"] = [_contiguous_strides(s, t) for s, t in zip(g["shapes"], g["types"])]
    return g


def to_chakra(doc: dict, schema: str = SCHEMA) -> dict:
    if doc.get("schema") != "1.0.1":
        raise ValueError(f"to_chakra: expected schema 1.0.1, got {doc.get('schema')!r}")
    if schema not in SCHEMAS:
        raise ValueError(f"to_chakra: schema must be one of {', '.join(SCHEMAS)}, not {schema!r}")
    strides = schema == "1.1.1-chakra.0.0.4"
    attrs = _ATTRS + (_KERNEL_ATTRS if schema != "1.0.2-chakra.0.0.4" else ())
    if strides:
        attrs += (("tensor_range", "string", ""),)
    nodes, process = [], []
    for n in doc["nodes"]:
        name = n["name"].replace("[pytorch|profiler|execution_graph|", "[pytorch|profiler|execution_trace|")
        out = {
            "id": n["id"],
            "name": name,
            "ctrl_deps": n.get("parent", n["id"]),
            "inputs": _group(n, "inputs", "input_shapes", "input_types", strides),
            "outputs": _group(n, "outputs", "output_shapes", "output_types", strides),
            "attrs": [{"name": k, "type": t, "value": n.get(k, default)} for k, t, default in attrs],
        }
        (process if name.endswith("|process]") else nodes).append(out)
    out = {k: v for k, v in doc.items() if k not in ("schema", "nodes")}
    out["schema"] = schema
    out["u3m_note"] = ("layout rewritten from a torch 1.13 schema-1.0.1 capture by "
                       "python/u3m_capture/et_chakra.py; node contents unchanged")
    out["nodes"] = nodes + process
    return out


def main(argv=None) -> int:
    import argparse
    import gzip
    import json
    import sys
    ap = argparse.ArgumentParser(prog="python -m u3m_capture.et_chakra",
                                 description="Rewrite a schema-1.0.1 ET (.json or .json.gz) in a torch 2.x layout.")
    ap.add_argument("src")
    ap.add_argument("dst", help="written gzipped if it ends in .gz")
    ap.add_argument("--schema", default=SCHEMA, choices=SCHEMAS)
    a = ap.parse_args(argv)
    opener = gzip.open if a.src.endswith(".gz") else open
    try:
        with opener(a.src, "rt", encoding="utf-8") as f:
            doc = json.load(f)
        res = to_chakra(doc, a.schema)
    except (OSError, ValueError) as e:
        print(f"u3m_capture.et_chakra: error: {a.src}: {e}", file=sys.stderr)
        return 2
    opener = gzip.open if a.dst.endswith(".gz") else open
    with opener(a.dst, "wt", encoding="utf-8") as f:
        json.dump(res, f, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
