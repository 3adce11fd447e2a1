"""Rewrites a torch 1.13 Execution Trace (schema 1.0.1) in the layout torch 2.x writes.

torch >= 2.1's ExecutionTraceObserver writes schema "1.1.0-chakra.0.0.4": each
node's arguments are grouped as `inputs: {values, shapes, types}` and
`outputs: {...}`, its parent is `ctrl_deps`, and the other per-node fields move
into `attrs: [{name, type, value}]` (rf_id, fw_parent, seq_id, scope, tid,
fw_tid, op_schema, kernel_backend, kernel_file); the root ranges are named
`[pytorch|profiler|execution_trace|...]`. The sample written by torch 2.x in
data/pytorch-et/resnet_et.json.gz has exactly these fields.

Only the layout changes: every node, value, shape, type, id and schema string
is carried over as torch 1.13 recorded it. This lets the corpus test the
importer on the torch 2.x layout with programs we can run here (Debian ships
torch 1.13); a trace rewritten this way says so in its `u3m_note` field.
"""
from __future__ import annotations

SCHEMA = "1.1.0-chakra.0.0.4"

_ATTRS = (("rf_id", "uint64", 0), ("fw_parent", "uint64", 0), ("seq_id", "int64", -1), ("scope", "uint64", 0),
          ("tid", "uint64", 0), ("fw_tid", "uint64", 0), ("op_schema", "string", ""),
          ("kernel_backend", "string", ""), ("kernel_file", "string", ""))


def _group(node: dict, values: str, shapes: str, types: str) -> dict:
    return {"values": node.get(values, []), "shapes": node.get(shapes, []), "types": node.get(types, [])}


def to_chakra(doc: dict) -> dict:
    if doc.get("schema") != "1.0.1":
        raise ValueError(f"to_chakra: expected schema 1.0.1, got {doc.get('schema')!r}")
    nodes = []
    for n in doc["nodes"]:
        name = n["name"].replace("[pytorch|profiler|execution_graph|", "[pytorch|profiler|execution_trace|")
        nodes.append({
            "id": n["id"],
            "name": name,
            "ctrl_deps": n.get("parent", n["id"]),
            "inputs": _group(n, "inputs", "input_shapes", "input_types"),
            "outputs": _group(n, "outputs", "output_shapes", "output_types"),
            "attrs": [{"name": k, "type": t, "value": n.get(k, default)} for k, t, default in _ATTRS],
        })
    out = {k: v for k, v in doc.items() if k not in ("schema", "nodes")}
    out["schema"] = SCHEMA
    out["u3m_note"] = ("layout rewritten from a torch 1.13 schema-1.0.1 capture by "
                       "python/u3m_capture/et_chakra.py; node contents unchanged")
    out["nodes"] = nodes
    return out
