"""Reading u3m's JSON results into what the report plots.

Each kind is recognised by the keys its command writes (Note [Result kinds]);
a file that is none of them, or that breaks its kind's shape, is a ReportError
naming the file and the field: one line, exit 2.
"""
import json
import math

# Note [Result kinds]
# The CLI's results carry no "kind" field, so each is told by its shape:
#   train capacity  "policies" of objects with "max_params" and "tried"
#   serve capacity  "policies" of objects with "rate_scale" and "tried"
#   predict eval    "predictors" and "per_trace"
#   plan cost       "plan" == "cost"
#   timeline        "traceEvents" (Chrome trace-event format), or a bare list
#                   of events with "ph"
# A kind's reader checks every field it uses (field()), so a truncated or
# hand-edited file ends in a ReportError, never a traceback.


class ReportError(Exception):
    pass


def field(obj, key, kind, where, *, optional=False, default=None):
    """obj[key] checked to be of `kind` (a type or a tuple); `where` names it."""
    if not isinstance(obj, dict):
        raise ReportError(f"{where}: expected an object")
    if key not in obj:
        if optional:
            return default
        raise ReportError(f"{where}: missing field '{key}'")
    v = obj[key]
    if kind is float:
        kind = (int, float)
    if isinstance(v, bool) and kind in ((int, float), int):
        raise ReportError(f"{where}.{key}: expected a number, got {json.dumps(v)}")
    if not isinstance(v, kind):
        raise ReportError(f"{where}.{key}: expected {_kind_name(kind)}, got {_short(v)}")
    if isinstance(v, float) and not math.isfinite(v):
        raise ReportError(f"{where}.{key}: not a finite number")
    return v


def _kind_name(kind):
    names = {dict: "an object", list: "a list", str: "a string", bool: "true or false",
             int: "an integer", (int, float): "a number"}
    return names.get(kind, str(kind))


def _short(v):
    s = json.dumps(v)
    return s if len(s) <= 40 else s[:37] + "..."


def load(path):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ReportError(f"{path}: cannot read ({e.strerror})")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ReportError(f"{path}: not UTF-8 text (byte {e.start})")
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}:{e.lineno}: not JSON, column {e.colno}: {e.msg}")
    return parse(doc, path)


def parse(doc, path):
    """(kind, data) for a decoded document; ReportError when it is not one u3m writes."""
    if isinstance(doc, list) and doc and all(isinstance(e, dict) and "ph" in e for e in doc):
        return "timeline", timeline({"traceEvents": doc}, path)
    if isinstance(doc, dict):
        if "traceEvents" in doc:
            return "timeline", timeline(doc, path)
        if doc.get("plan") == "cost":
            return "plan_cost", plan_cost(doc, path)
        if "predictors" in doc and "per_trace" in doc:
            return "predict", predict(doc, path)
        pols = doc.get("policies")
        if isinstance(pols, dict) and pols:
            first = next(iter(pols.values()))
            if isinstance(first, dict) and "max_params" in first:
                return "train_capacity", train_capacity(doc, path)
            if isinstance(first, dict) and "rate_scale" in first and "tried" in first:
                return "serve_capacity", serve_capacity(doc, path)
    raise ReportError(
        f"{path}: not a result u3m report knows (expected the JSON of train capacity, serve "
        "capacity, predict eval or plan cost, or a trace-event timeline)")


def _sweep(sw, where, profile):
    label = field(sw, "label", str, where, optional=True)
    scen = field(sw, "scenario", dict, where)
    if label is None:  # older results: built from the scenario, as the CLI labels it
        label = (f"simulated with profile {field(scen, 'hw', str, where + '.scenario')}; "
                 "llama family; not measured")
    out = {"label": label, "max_loss": field(scen, "max_loss", float, where + ".scenario"),
           "profile": profile, "policies": {}}
    for name, p in field(sw, "policies", dict, where).items():
        pw = f"{where}.policies.{name}"
        tried = []
        for i, t in enumerate(field(p, "tried", list, pw)):
            tw = f"{pw}.tried[{i}]"
            tried.append((field(t, "params", int, tw), field(t, "fits", bool, tw),
                          field(t, "loss", float, tw)))
        out["policies"][name] = {"max_params": field(p, "max_params", int, pw),
                                 "model": field(p, "model", str, pw), "tried": sorted(tried)}
    return out


def train_capacity(doc, path):
    profile = field(field(doc, "profile", dict, path), "name", str, path + ".profile")
    sweeps = [_sweep(doc, path, profile)]
    for i, sw in enumerate(field(doc, "full_ft", list, path, optional=True, default=[])):
        sweeps.append(_sweep(sw, f"{path}.full_ft[{i}]", profile))
    return {"sweeps": sweeps}


def serve_capacity(doc, path):
    scen = field(doc, "scenario", dict, path)
    sw = path + ".scenario"
    out = {"label": field(scen, "figures", str, sw), "requests": field(scen, "requests", str, sw),
           "policies": {}}
    for name, p in field(doc, "policies", dict, path).items():
        pw = f"{path}.policies.{name}"
        scale = field(p, "rate_scale", float, pw)
        rate = field(p, "rate_rps", float, pw)
        tried = []
        for i, t in enumerate(field(p, "tried", list, pw)):
            tw = f"{pw}.tried[{i}]"
            tried.append((field(t, "rate_scale", float, tw), field(t, "met_fraction", float, tw)))
        out["policies"][name] = {"rate_scale": scale, "rate_rps": rate,
                                 "goodput_rps": field(p, "goodput_rps", float, pw),
                                 "trace_rate": rate / scale if scale > 0 else None,
                                 "tried": sorted(tried)}
    if "bound" in doc:  # Note [Serving bound]: derived; older results have none
        out["bound_rps"] = field(field(doc, "bound", dict, path), "goodput_rps", float,
                                 path + ".bound")
    return out


def _score(obj, key, where):
    """A score in [0, 1], or NaN where the CLI wrote null (nothing to score)."""
    v = field(obj, key, (int, float, type(None)), where)
    if v is None:
        return math.nan
    if isinstance(v, bool) or not 0 <= v <= 1:
        raise ReportError(f"{where}.{key}: expected a fraction in [0, 1], got {_short(v)}")
    return float(v)


def predict(doc, path):
    traces = {}
    for trace, t in field(doc, "per_trace", dict, path).items():
        tw = f"{path}.per_trace[{json.dumps(trace)}]"
        preds = {}
        for name, p in field(t, "predictors", dict, tw).items():
            pw = f"{tw}.predictors.{name}"
            jobs = {}
            for job, s in field(p, "per_job", dict, pw).items():
                jw = f"{pw}.per_job.{job}"
                jobs[job] = {"precision": _score(s, "precision", jw),
                             "recall_known": _score(s, "recall_known", jw),
                             "decisions": field(s, "decisions", int, jw)}
            preds[name] = {"precision": _score(p, "precision", pw),
                           "recall_known": _score(p, "recall_known", pw), "jobs": jobs}
        traces[trace] = preds
    return {"label": "computed from the trace(s), not simulated: " + ", ".join(traces),
            "default": field(doc, "default_predictor", str, path, optional=True, default=""),
            "traces": traces}


def timeline(doc, path):
    events = field(doc, "traceEvents", list, path)
    other = doc.get("otherData") if isinstance(doc.get("otherData"), dict) else {}
    clock = other.get("clock") if isinstance(other.get("clock"), str) else ""
    series = {}  # (pid, counter name, arg) -> [(t_s, value)]
    names = {}   # pid -> process name
    for i, e in enumerate(events):
        ew = f"{path}.traceEvents[{i}]"
        ph = field(e, "ph", str, ew)
        if ph == "M" and e.get("name") == "process_name":
            args = field(e, "args", dict, ew)
            names[e.get("pid")] = str(args.get("name", e.get("pid")))
        if ph != "C":
            continue
        ts = field(e, "ts", float, ew)
        name = field(e, "name", str, ew)
        for k, v in field(e, "args", dict, ew).items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ReportError(f"{ew}.args.{k}: a counter value must be a finite number")
            series.setdefault((e.get("pid"), name, k), []).append((ts / 1e6, v))
    for pts in series.values():
        pts.sort()
    label = clock or "the timeline does not say whether it was measured or simulated"
    return {"label": label, "series": series, "process_names": names, "events": len(events)}


def plan_cost(doc, path):
    out = {"label": field(doc, "figures", str, path), "target": field(doc, "target", str, path),
           "currency": field(doc, "currency", str, path), "configs": [],
           "cheapest": field(doc, "cheapest", (dict, type(None)), path), "design": []}
    design = field(doc, "design_bom", dict, path, optional=True)
    if design is not None:
        out["design"] = field(design, "text", str, path + ".design_bom").rstrip().splitlines()
    for i, c in enumerate(field(doc, "configs", list, path)):
        cw = f"{path}.configs[{i}]"
        out["configs"].append({"name": field(c, "name", str, cw),
                               "cost": field(c, "cost", (int, float, type(None)), cw),
                               "meets": field(c, "meets", bool, cw),
                               "kind": field(c, "kind", str, cw)})
    return out
