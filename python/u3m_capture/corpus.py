"""The prediction corpus: real PyTorch programs captured two ways.

Each program is a model of the zoo (zoo.py: PyTorch's own modules and
well-known architectures) driven by a schedule: training steps, RLHF-style
rounds (generate rollouts, then train on them) or random time-sharing of
training steps and inference requests. Every program is captured

- with torch's own `torch.profiler.ExecutionGraphObserver` (the PyTorch
  Execution Trace users have; schema 1.0.1 in torch 1.13), marked the way the
  program says (`marks`): user `record_function` ranges, `torch.profiler`
  steps (`ProfilerStep#N`), or nothing at all; and
- with u3m's recorder (tracer.Recorder, a TorchDispatchMode), told the jobs,
  iterations and phases.

The program, its seeds and its schedule are the same in both captures; only
the observer differs. `python -m u3m_capture.corpus OUTDIR` writes the corpus;
docs/capture.md ("The prediction corpus") lists it and says which half is for
tuning and which is held out.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional

import torch

from . import zoo
from .et_chakra import to_chakra
from .tracer import Recorder


@dataclass(frozen=True)
class Program:
    name: str
    model: str                 # a key of zoo.ZOO
    schedule: str              # train | rlhf | timeshare
    half: str                  # tuning | heldout (the one split, docs/capture.md)
    steps: int = 6             # training steps (train), rounds (rlhf), schedule items (timeshare)
    train_per_round: int = 2   # rlhf: training steps after each rollout
    batch: int = 4
    seq: int = 24              # training sequence length (tokens), or image side
    vary_seq: bool = False     # draw each step's length from [seq/2, seq]
    grad_accum: int = 1
    checkpointing: bool = False
    optimizer: str = "adamw"   # adamw | adam | adam-amsgrad | adamw-foreach | sgd
    set_to_none: bool = True
    prompt: int = 8
    new_tokens: int = 6
    marks: str = "ranges"      # ranges | profiler | none (what the ET capture shows)
    chakra: bool = False       # also rewrite the ET in the 1.1.0-chakra layout (et_chakra.py)
    backward_thread: bool = False  # ET capture: run backward on a second thread, as CUDA does
    seed: int = 0
    kwargs: Dict[str, int] = field(default_factory=dict)


# The corpus. `half` was assigned once, when the corpus was first written, by
# alternating over the programs in this order within each model family so that
# both halves hold every kind of schedule; it is never changed to suit a result.
PROGRAMS: List[Program] = [
    Program("gpt2-train", "gpt2", "train", "tuning", steps=6, grad_accum=2, optimizer="adamw-foreach",
            chakra=True, backward_thread=True, marks="profiler"),
    Program("gpt2-rlhf", "gpt2", "rlhf", "heldout", steps=3, marks="ranges"),
    Program("gpt2-timeshare", "gpt2", "timeshare", "tuning", steps=16, marks="none", seed=3),
    Program("llama-train", "llama", "train", "heldout", steps=6, vary_seq=True, marks="none"),
    Program("llama-rlhf", "llama", "rlhf", "tuning", steps=3, marks="profiler", checkpointing=True),
    Program("llama-timeshare", "llama", "timeshare", "heldout", steps=16, marks="ranges", seed=5),
    Program("seq2seq-train", "seq2seq", "train", "tuning", steps=6, optimizer="adam", marks="ranges",
            set_to_none=False),
    Program("seq2seq-timeshare", "seq2seq", "timeshare", "heldout", steps=14, optimizer="adam", marks="profiler",
            seed=7),
    Program("bert-mlm-train", "bert", "train", "heldout", steps=6, optimizer="adam", marks="profiler"),
    Program("bert-timeshare", "bert", "timeshare", "tuning", steps=16, optimizer="adam", marks="ranges", seed=11),
    Program("lstm-train", "lstm", "train", "tuning", steps=6, vary_seq=True, optimizer="adam-amsgrad",
            marks="ranges"),
    Program("lstm-rlhf", "lstm", "rlhf", "heldout", steps=3, optimizer="sgd", marks="none"),
    Program("cnn-train", "cnn", "train", "heldout", steps=6, seq=16, optimizer="sgd", set_to_none=False,
            marks="ranges"),
    Program("cnn-timeshare", "cnn", "timeshare", "tuning", steps=16, seq=16, optimizer="sgd", marks="profiler",
            seed=13),
    Program("moe-train", "moe", "train", "tuning", steps=6, grad_accum=2, checkpointing=True, marks="ranges"),
    Program("moe-rlhf", "moe", "rlhf", "heldout", steps=3, marks="profiler"),
]


def make_optimizer(kind: str, params):
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    if kind == "adamw-foreach":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=True)
    if kind == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    if kind == "adam-amsgrad":
        return torch.optim.Adam(params, lr=1e-3, amsgrad=True)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=1e-2, momentum=0.9)
    raise ValueError(f"unknown optimizer {kind!r}")


# ----------------------------------------------------------------------------- what each observer sees

class EtTap:
    """The ET capture: only the program's own marks (record_function, profiler steps) show."""

    def __init__(self, marks: str, backward_thread: bool = False):
        self.marks, self.backward_thread = marks, backward_thread
        self.steps = 0

    def _range(self, kind):
        if self.marks == "ranges":
            return torch.profiler.record_function("## train ##" if kind == "train" else "## generate ##")
        if self.marks == "profiler":
            # What torch.profiler.profile.step() opens at each step. (torch 1.13's
            # profiler does not show its own step ranges to the ET observer.)
            self.steps += 1
            return torch.profiler.record_function(f"ProfilerStep#{self.steps}")
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def item(self, kind: str):
        """One schedule item (a training step, a rollout, a request)."""
        with self._range(kind):
            yield

    def phase(self, name):
        return contextlib.nullcontext()

    def infer_call(self, kind):
        return contextlib.nullcontext()

    def backward(self, loss):
        if not self.backward_thread:
            loss.backward()
            return
        err = []

        def run():
            try:
                loss.backward()
            except BaseException as e:  # re-raised on the caller's thread
                err.append(e)
        t = threading.Thread(target=run)
        t.start()
        t.join()
        if err:
            raise err[0]

    def after_backward(self, model, opt):
        pass

    def after_step(self, model, opt):
        pass


class RecorderTap:
    """The u3m recorder: told jobs, iterations and phases."""

    def __init__(self, rec: Recorder, train_job: Optional[int], infer_job: Optional[int]):
        self.rec, self.train_job, self.infer_job = rec, train_job, infer_job
        self.train_iter = self.infer_iter = 0

    @contextlib.contextmanager
    def item(self, kind: str):
        if kind != "train":
            # What a request does before its first model call (drawing its
            # prompt) is the request's: it opens the iteration of that call,
            # not the tail of whatever iteration ran last.
            with self.rec.iteration(self.infer_job, self.infer_iter):
                yield
            return
        with self.rec.iteration(self.train_job, self.train_iter):
            yield
        self.train_iter += 1

    def phase(self, name):
        return self.rec.phase(name)

    @contextlib.contextmanager
    def infer_call(self, kind):
        with self.rec.iteration(self.infer_job, self.infer_iter), self.rec.phase(kind):
            yield
        self.infer_iter += 1

    def backward(self, loss):
        loss.backward()

    def after_backward(self, model, opt):
        self.rec.bind_grads(model, self.train_job)

    def after_step(self, model, opt):
        self.rec.bind_optimizer(opt, model, self.train_job)


# ----------------------------------------------------------------------------- the programs

class Runner:
    def __init__(self, p: Program):
        self.p = p
        torch.manual_seed(p.seed)
        kwargs = dict(p.kwargs)
        self.model = zoo.ZOO[p.model](**kwargs)
        if p.checkpointing:
            zoo.enable_checkpointing(self.model)
        self.opt = make_optimizer(p.optimizer, self.model.parameters())
        self.gen = torch.Generator().manual_seed(p.seed + 1)
        self.rng = random.Random(p.seed + 2)
        self.lm = getattr(self.model, "lm", False)

    def batch(self, length: Optional[int] = None):
        p = self.p
        if p.model == "cnn":
            return (torch.randn(p.batch, 3, p.seq, p.seq, generator=self.gen),
                    torch.randint(10, (p.batch,), generator=self.gen))
        length = length or p.seq
        return torch.randint(self.model_vocab(), (p.batch, length + 1), generator=self.gen)

    def model_vocab(self) -> int:
        m = self.model
        return getattr(m, "vocab", None) or m.cfg.vocab_size

    def loss(self, batch):
        if self.p.model in ("bert", "cnn"):
            return self.model.loss(batch, self.gen)
        return self.model.loss(batch)

    def train_step(self, tap, data=None) -> None:
        p = self.p
        with tap.item("train"):
            for _ in range(p.grad_accum):
                length = self.rng.randint(p.seq // 2, p.seq) if p.vary_seq else p.seq
                with tap.phase("forward"):
                    batch = data if data is not None else self.batch(length)
                    loss = self.loss(batch) / p.grad_accum
                with tap.phase("backward"):
                    tap.backward(loss)
                del loss, batch
            tap.after_backward(self.model, self.opt)
            with tap.phase("optimizer"):
                self.opt.step()
                tap.after_step(self.model, self.opt)
                self.opt.zero_grad(set_to_none=p.set_to_none)

    def infer(self, tap, new_tokens: int):
        """One request or rollout; returns what training on it would read (LMs: the sequences)."""
        p = self.p
        with tap.item("infer"):
            self.model.eval()
            try:
                if self.lm:
                    prompts = torch.randint(self.model_vocab(), (p.batch, p.prompt), generator=self.gen)
                    return self.model.generate(prompts, new_tokens, step=tap.infer_call, gen=self.gen)
                self.model.infer(self.batch(), step=tap.infer_call)
                return None
            finally:
                self.model.train()

    def run(self, tap) -> None:
        p = self.p
        if p.schedule == "train":
            for _ in range(p.steps):
                self.train_step(tap)
        elif p.schedule == "rlhf":
            for _ in range(p.steps):
                seq = self.infer(tap, p.new_tokens)
                for _ in range(p.train_per_round):
                    self.train_step(tap, seq)
        elif p.schedule == "timeshare":
            # A random mix (fixed seed): each item is a training step or an inference
            # request with a random number of new tokens; at least one of each.
            kinds = ["train", "infer"] + [self.rng.choice(("train", "infer")) for _ in range(p.steps - 2)]
            self.rng.shuffle(kinds)
            for k in kinds:
                if k == "train":
                    self.train_step(tap)
                else:
                    self.infer(tap, self.rng.randint(2, p.new_tokens))
        else:
            raise ValueError(f"unknown schedule {p.schedule!r}")


def capture_et(p: Program, path: str) -> dict:
    """Captures `p` with torch's ExecutionGraphObserver; writes `path` (.json.gz)."""
    from torch.profiler import ExecutionGraphObserver
    torch.set_num_threads(1)
    r = Runner(p)
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "et.json")
        eg = ExecutionGraphObserver()
        eg.register_callback(raw)
        t0 = time.perf_counter()
        eg.start()
        r.run(EtTap(p.marks, p.backward_thread))
        eg.stop()
        eg.unregister_callback()
        wall = time.perf_counter() - t0
        with open(raw) as f:
            doc = json.load(f)
    if p.chakra:
        doc = to_chakra(doc)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
    return {"nodes": len(doc["nodes"]), "schema": doc["schema"], "capture_wall_s": round(wall, 2)}


def capture_recorder(p: Program, path: str) -> dict:
    """Captures `p` with u3m's recorder; writes `path` (.jsonl)."""
    torch.set_num_threads(1)
    r = Runner(p)
    rec = Recorder()
    rec.add_meta("source", f"python/u3m_capture.corpus {p.name}")
    rec.add_meta("time_model", f"measured wall clock, CPU, torch {torch.__version__}")
    rec.add_meta("program", json.dumps(p.__dict__, sort_keys=True))
    trains = p.schedule in ("train", "rlhf", "timeshare")
    infers = p.schedule in ("rlhf", "timeshare")
    train_job = rec.add_job("train-0") if trains else None
    infer_job = rec.add_job("infer-0") if infers else None
    hooks = rec.attach(r.model)
    rec.register_model(r.model, train_job if trains else infer_job)
    t0 = time.perf_counter()
    try:
        with rec.recording():
            r.run(RecorderTap(rec, train_job, infer_job))
    finally:
        for h in hooks:
            h.remove()
    rec.add_meta("capture_wall_s", f"{time.perf_counter() - t0:.2f} (measured, this machine)")
    counts = rec.write_jsonl(path)
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m u3m_capture.corpus", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", help="folder to write <program>.et.json.gz and <program>.u3m.jsonl.gz into")
    ap.add_argument("--only", default="", help="comma-separated program names (default: all)")
    ap.add_argument("--observer", choices=("both", "et", "recorder"), default="both")
    ap.add_argument("--list", action="store_true", help="list the programs and their halves, then exit")
    args = ap.parse_args(argv)
    progs = PROGRAMS
    if args.list:
        for p in progs:
            print(f"{p.name:18} {p.half:8} {p.model:8} {p.schedule:10} marks={p.marks}")
        return 0
    if args.only:
        want = args.only.split(",")
        unknown = [w for w in want if w not in {p.name for p in PROGRAMS}]
        if unknown:
            print(f"u3m_capture.corpus: error: --only: unknown program(s) {', '.join(unknown)}", file=sys.stderr)
            return 2
        progs = [p for p in PROGRAMS if p.name in want]
    os.makedirs(args.outdir, exist_ok=True)
    for p in progs:
        if args.observer in ("both", "et"):
            info = capture_et(p, os.path.join(args.outdir, f"{p.name}.et.json.gz"))
            print(f"{p.name}: ET {info}", file=sys.stderr)
        if args.observer in ("both", "recorder"):
            tmp = os.path.join(args.outdir, f"{p.name}.u3m.jsonl")
            info = capture_recorder(p, tmp)
            with open(tmp, "rb") as src, gzip.open(tmp + ".gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.remove(tmp)
            print(f"{p.name}: recorder {info}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
