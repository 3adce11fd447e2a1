"""Figures (matplotlib, PNG embedded as base64) and the HTML page around them."""
import base64
import html
import io
import os


def _mpl():
    import matplotlib
    matplotlib.use("Agg")  # no display: the report is written, never shown
    import matplotlib.pyplot as plt
    return plt


def _png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    _mpl().close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(title, label):
    plt = _mpl()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.set_title(title, fontsize=11)
    # Every figure says how its numbers were obtained, inside the image too.
    fig.text(0.01, -0.02, label, fontsize=7.5, ha="left", va="top", wrap=True)
    ax.grid(True, alpha=0.3)
    return fig, ax


def train_figures(d):
    out = []
    for sw in d["sweeps"]:
        fig, ax = _figure("Training capacity: throughput loss against model size, per policy",
                          sw["label"])
        for name, p in sw["policies"].items():
            fits = [(n / 1e9, 100 * loss) for n, ok, loss in p["tried"] if ok]
            if fits:
                ax.plot(*zip(*fits), marker="o", ms=3, label=name)
            over = [n / 1e9 for n, ok, _ in p["tried"] if not ok]
            if over:
                ax.plot(over, [100] * len(over), "x", color=ax.lines[-1].get_color()
                        if fits else None)
        ax.axhline(100 * sw["max_loss"], color="k", ls="--", lw=1,
                   label=f"bound {100 * sw['max_loss']:.0f}%")
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("model parameters (billions)")
        ax.set_ylabel("throughput loss vs infinite HBM, % (x: does not fit)")
        ax.legend(fontsize=8)
        out.append(("Training capacity", sw["label"], _png(fig)))
    return out


def serve_figures(d):
    fig, ax = _figure("Serving: goodput against offered request rate, per KV policy", d["label"])
    for name, p in d["policies"].items():
        base = p["trace_rate"]
        if not base:
            continue
        # goodput = met / span and span scales with 1/rate: met fraction x offered rate (a
        # lower bound where the probe stopped early, Note [Capacity search]).
        pts = [(base * s, base * s * m) for s, m in p["tried"]]
        line, = ax.plot(*zip(*pts), marker="o", ms=3, label=name)
        ax.plot([p["rate_rps"]], [p["goodput_rps"]], "*", ms=12, color=line.get_color())
    lim = ax.get_xlim()
    ax.plot(lim, lim, color="0.6", lw=0.8, ls=":", label="goodput = offered")
    ax.set_xlabel("offered rate, requests/s")
    ax.set_ylabel("goodput under SLO, requests/s")
    ax.legend(fontsize=8)
    note = d["label"] + f"; requests: {d['requests']}; star: each policy's capacity run"
    return [("Serving goodput", note, _png(fig))]


def predict_figures(d):
    out = []
    for trace, preds in d["traces"].items():
        jobs = sorted({j for p in preds.values() for j in p["jobs"]})
        if not jobs:
            continue
        label = f"computed from the trace {trace}, not simulated; byte-weighted"
        fig, ax = _figure("Access prediction per job: precision (bar) and recall of known "
                          "tensors (dot)", label)
        names = list(preds)
        width = 0.8 / max(1, len(names))
        for k, name in enumerate(names):
            xs = [i + k * width for i in range(len(jobs))]
            prec = [100 * preds[name]["jobs"].get(j, {}).get("precision", 0) for j in jobs]
            rec = [100 * preds[name]["jobs"].get(j, {}).get("recall_known", 0) for j in jobs]
            bars = ax.bar(xs, prec, width, label=name)
            ax.plot(xs, rec, "o", color="k", ms=3)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(jobs))])
        ax.set_xticklabels(jobs, rotation=20, fontsize=8)
        ax.set_ylim(0, 105)
        ax.set_ylabel("%")
        ax.legend(fontsize=7, ncol=3)
        out.append((f"Prediction accuracy per job: {os.path.basename(trace)}", label, _png(fig)))
    return out


def timeline_figures(d):
    if not d["series"]:
        return []
    fig, ax = _figure("Tier occupancy over time", d["label"])
    for (pid, name, arg), pts in sorted(d["series"].items(), key=lambda kv: str(kv[0])):
        who = d["process_names"].get(pid, f"pid {pid}")
        t, v = zip(*pts)
        scale, unit = (2 ** 30, "GiB") if arg == "bytes" else (1, arg)
        ax.step(t, [x / scale for x in v], where="post",
                label=f"{who}: {name}" + ("" if arg == "bytes" else f" ({arg})"))
    ax.set_xlabel("time, s")
    ax.set_ylabel("GiB" if all(k[2] == "bytes" for k in d["series"]) else "value")
    ax.legend(fontsize=7)
    return [("Tier occupancy", d["label"], _png(fig))]


def plan_figures(d):
    rows = [c for c in d["configs"] if c["cost"] is not None]
    if not rows:
        return []
    fig, ax = _figure(f"Cost of each configuration for {d['target']}", d["label"])
    colours = ["tab:green" if c["meets"] else "0.7" for c in rows]
    ax.barh([c["name"] for c in rows], [c["cost"] / 1e6 for c in rows], color=colours)
    ax.set_xlabel(f"million {d['currency']} (green: meets the target)")
    ax.tick_params(axis="y", labelsize=7)
    ax.invert_yaxis()
    return [("Cost", d["label"], _png(fig))]


FIGURES = {"train_capacity": train_figures, "serve_capacity": serve_figures,
           "predict": predict_figures, "timeline": timeline_figures, "plan_cost": plan_figures}


def summary(kind, d):
    """A few lines per result, for `make demo`; each says how it was obtained."""
    if kind == "train_capacity":
        lines = []
        for sw in d["sweeps"]:
            best = {n: p["max_params"] / 1e9 for n, p in sw["policies"].items()}
            base = best.get("hbm-only") or 0
            cells = ", ".join(f"{n} {v:.1f}B" + (f" ({v / base:.2f}x)" if base else "")
                              for n, v in best.items())
            lines.append(f"training capacity [{sw['label']}]: {cells}")
        return lines
    if kind == "serve_capacity":
        base = d["policies"].get("hbm-only", {}).get("goodput_rps") or 0
        cells = ", ".join(f"{n} {p['goodput_rps']:.2f}/s" +
                          (f" ({p['goodput_rps'] / base:.2f}x)" if base else "")
                          for n, p in d["policies"].items())
        if d.get("bound_rps"):
            cells += (f"; no KV policy can exceed {d['bound_rps']:.2f}/s"
                      + (f" ({d['bound_rps'] / base:.2f}x)" if base else "") + " (derived bound)")
        return [f"serving goodput at capacity [{d['label']}; {d['requests']}]: {cells}"]
    if kind == "predict":
        lines = []
        for trace, preds in d["traces"].items():
            p = preds.get(d["default"]) or next(iter(preds.values()))
            name = d["default"] if d["default"] in preds else next(iter(preds))
            lines.append(f"prediction [computed from {trace}]: {name} precision "
                         f"{100 * p['precision']:.1f}%, recall of known tensors "
                         f"{100 * p['recall_known']:.1f}% over {len(p['jobs'])} job(s)")
        return lines
    if kind == "timeline":
        n = len(d["series"])
        return [f"timeline [{d['label']}]: {d['events']} events, {n} counter track(s)" +
                ("" if n else " (no tier occupancy recorded: nothing to plot)")]
    if kind == "plan_cost":
        c = d["cheapest"]
        if not c:
            what = "none meets it"
        elif c.get("cost") is None:
            what = f"{c['name']} (unpriced: the card's price was not found)"
        else:
            what = f"{c['name']} at {c['cost'] / 1e6:.2f} M {d['currency']}"
        return [f"cost plan for {d['target']} [{d['label']}]: cheapest {what}"] + d["design"]
    return []


def page(sections, sources):
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>u3m report</title>",
             "<style>body{font-family:sans-serif;max-width:980px;margin:2em auto;color:#222}"
             "figure{margin:1.5em 0}img{max-width:100%;border:1px solid #ddd}"
             "figcaption{font-size:0.85em;color:#555}</style></head><body>",
             "<h1>u3m report</h1><p>From: " +
             ", ".join(f"<code>{html.escape(s)}</code>" for s in sources) + "</p>"]
    for title, label, png in sections:
        parts.append(f"<figure><h2>{html.escape(title)}</h2>"
                     f"<img alt='{html.escape(title)}' src='data:image/png;base64,{png}'>"
                     f"<figcaption>{html.escape(label)}</figcaption></figure>")
    parts.append("</body></html>\n")
    return "".join(parts)
