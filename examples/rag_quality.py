#!/usr/bin/python3
"""The quality cost of CacheBlend-style KV fusion (python/u3m/blend.py), measured on a real,
trained model: answer accuracy and KL(full || blend) of the answer logits, full prefill
against blending at several recompute fractions (docs/blend-quality.md).

    PYTHONPATH=python /usr/bin/python3 examples/rag_quality.py            # evaluate (< 60 s)
    PYTHONPATH=python /usr/bin/python3 examples/rag_quality.py --json
    PYTHONPATH=python /usr/bin/python3 examples/rag_quality.py --train    # retrain, save, evaluate

The task (synthetic retrieval, nothing downloaded): a prompt is a fixed "system" segment,
then --passages passages in random order, each a DOC marker and filler tokens holding
FACTS_PER_PASSAGE facts, then the question "QRY key". A fact is one token that states
"key -> value" (`fact_token`; keys distinct within a prompt); the answer is the value of the
asked key, and the fact may sit in any passage. In half the prompts (UPDATE_P) a later
passage restates the asked key with another value and the later one is the answer, so the
answer depends on the other passages and their order. The model is the repo's LLaMA-shaped Decoder
(python/u3m_capture/model.py), trained from scratch on CPU with one thread on fresh random
prompts (cross entropy on the answer tokens only; each training sequence asks
TRAIN_QUESTIONS questions in a row, drawn with replacement, the first one in the eval shape).

Why one token per fact and not a "key value" token pair: with pairs, the lookup needs an
induction circuit (a previous-token head, then a matching head), and the small models that
fit this machine's budget (2-3 layers, d_model 32-64, 1.1k-2.4k steps, 5-6 minutes with one
thread on a loaded 2-core machine) stayed on the plateau at about 25% accuracy (chance among
the prompt's values); see docs/blend-quality.md, "What was tried". A fact token is learned in
a few hundred steps.

Evaluation runs on held-out prompts (a different seed from training and from the test's):
for each prompt the full prefill of the whole prompt is the reference; blend reuses each
segment's KV as computed alone from position 0 (as a cache holds it), the first segment
exactly, re-rotates the passages' keys to their positions, recomputes round(fraction x
passage tokens) tokens chosen by layer-1 KV deviation, and computes the question. Reported
per mode (fractions 0, 0.05, 0.15, 0.30, and 0.15 with random instead of deviation-selected
tokens): accuracy (argmax == answer), the same on the updated prompts, agreement with the
full prefill's argmax, mean and max KL(full || blend) of the answer-position distribution,
and the token-layer computations done relative to a full prefill. Every figure is labelled
with the machine it was measured on.

The shipped weights python/u3m/data/rag_tiny.pt (state_dict + config + task seed + training
record) were made by exactly:

    PYTHONPATH=python /usr/bin/python3 examples/rag_quality.py --train

(defaults: --seed 0, --passages 4, --steps 800, --batch 32, --lr 5e-3, one torch thread). Training is
deterministic given the seed on one thread; its wall time depends on the machine.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from u3m_capture.model import Decoder, ModelConfig
from u3m_capture.tracer import machine_description

HERE = os.path.dirname(os.path.realpath(__file__))
WEIGHTS = os.path.join(HERE, "..", "python", "u3m", "data", "rag_tiny.pt")


def load_blend():
    """u3m.blend where the u3m package imports (extension built); else the same file loaded
    standalone: blend.py needs only torch and u3m_capture."""
    try:
        from u3m import blend  # noqa: F401
        return blend
    except ImportError:
        pass
    name = "u3m_blend_standalone"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "..", "python", "u3m", "blend.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the file runs
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------
# The task

PAD, SYS, DOC, QRY = 0, 1, 2, 3
N_KEYS, N_VALUES, N_FILLER = 12, 12, 8
KEY0 = 8
VAL0 = KEY0 + N_KEYS
FIL0 = VAL0 + N_VALUES
FACT0 = FIL0 + N_FILLER  # fact tokens: one per (key, value)
VOCAB = FACT0 + N_KEYS * N_VALUES  # 184
SYSTEM_LEN = 4
PASSAGE_LEN = 8
FACTS_PER_PASSAGE = 2
TRAIN_QUESTIONS = 6
UPDATE_P = 0.5
FRACTIONS = (0.0, 0.05, 0.15, 0.30)
EVAL_SEED_OFFSET = 1_000_003  # held-out prompts: a seed far from training's
TEST_SEED_OFFSET = 2_000_003  # the unit test's held-out prompts


@dataclass
class Prompt:
    segments: List[torch.Tensor]  # system, passage 1..k
    query: torch.Tensor  # [QRY, key]
    answer: int
    fact_passage: int  # 1-based index of the passage holding the asked fact
    updated: bool = False  # the asked key is stated twice; the later passage's value holds

    @property
    def tokens(self) -> torch.Tensor:
        return torch.cat([*self.segments, self.query])


def fact_token(key: int, value: int) -> int:
    """The one token that states "key -> value" inside a passage."""
    return FACT0 + (key - KEY0) * N_VALUES + (value - VAL0)


def system_segment(task_seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(task_seed)
    return torch.cat([torch.tensor([SYS]), FIL0 + torch.randint(0, N_FILLER, (SYSTEM_LEN - 1,), generator=g)])


def make_passages(g: torch.Generator, passages: int
                  ) -> Tuple[List[torch.Tensor], List[Tuple[int, int, int]], Optional[int]]:
    """passages of PASSAGE_LEN tokens; the answers as (key, value, passage index 1..); the
    updated key or None. With probability UPDATE_P a later passage restates a key of an earlier
    one with another value: the later fact holds (a document superseding an older one)."""
    n_facts = passages * FACTS_PER_PASSAGE
    keys = (KEY0 + torch.randperm(N_KEYS, generator=g)[:n_facts]).tolist()
    values = (VAL0 + torch.randint(0, N_VALUES, (n_facts,), generator=g)).tolist()
    updated = None
    if passages > 1 and float(torch.rand((), generator=g)) < UPDATE_P:
        a = int(torch.randint(0, n_facts - FACTS_PER_PASSAGE, (), generator=g))
        later = (a // FACTS_PER_PASSAGE + 1) * FACTS_PER_PASSAGE
        b = later + int(torch.randint(0, n_facts - later, (), generator=g))
        keys[b] = keys[a]
        values[b] = VAL0 + (values[a] - VAL0 + 1 + int(torch.randint(0, N_VALUES - 1, (), generator=g))) % N_VALUES
        updated = keys[a]
    out, answer = [], {}
    for p in range(passages):
        body = FIL0 + torch.randint(0, N_FILLER, (PASSAGE_LEN - 1,), generator=g)
        slots = torch.randperm(PASSAGE_LEN - 1, generator=g)[:FACTS_PER_PASSAGE].sort().values
        for j, s in enumerate(slots.tolist()):
            f = p * FACTS_PER_PASSAGE + j
            body[s] = fact_token(keys[f], values[f])
            answer[keys[f]] = (keys[f], values[f], p + 1)  # a later passage overwrites
        out.append(torch.cat([torch.tensor([DOC]), body]))
    return out, list(answer.values()), updated


def make_prompt(task_seed: int, index_seed: int, passages: int) -> Prompt:
    """One held-out prompt; where a key was updated, the question asks it."""
    g = torch.Generator().manual_seed(index_seed)
    segs, facts, updated = make_passages(g, passages)
    if updated is not None:
        key, value, where = next(f for f in facts if f[0] == updated)
    else:
        key, value, where = facts[int(torch.randint(0, len(facts), (1,), generator=g))]
    return Prompt([system_segment(task_seed), *segs], torch.tensor([QRY, key]), value, where, updated is not None)


def train_batch(task_seed: int, g: torch.Generator, batch: int, passages: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """tokens [B, T] and targets [B, T] (-100 except after each question's key)."""
    sys_seg = system_segment(task_seed)
    rows, tgts = [], []
    for _ in range(batch):
        segs, facts, updated = make_passages(g, passages)
        # with replacement (no answer by elimination); an updated key is asked first
        asked = [facts[i] for i in torch.randint(0, len(facts), (TRAIN_QUESTIONS,), generator=g).tolist()]
        if updated is not None:
            asked[0] = next(f for f in facts if f[0] == updated)
        qa = []
        for key, value, _ in asked:
            qa += [QRY, key, value]
        row = torch.cat([sys_seg, *segs, torch.tensor(qa)])
        tgt = torch.full_like(row, -100)
        prompt_len = SYSTEM_LEN + passages * PASSAGE_LEN
        for q in range(len(asked)):
            at = prompt_len + 3 * q + 1  # the key's position predicts the value
            tgt[at] = row[at + 1]
        rows.append(row)
        tgts.append(tgt)
    return torch.stack(rows), torch.stack(tgts)


def model_config(passages: int) -> ModelConfig:
    seq = SYSTEM_LEN + passages * PASSAGE_LEN + 3 * TRAIN_QUESTIONS
    return ModelConfig(vocab_size=VOCAB, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, ffn_hidden=128,
                       max_seq_len=seq)


@torch.no_grad()
def full_accuracy(model: Decoder, prompts: List[Prompt]) -> float:
    toks = torch.stack([p.tokens for p in prompts])
    pred = model(toks)[:, -1].argmax(-1)
    return float((pred == torch.tensor([p.answer for p in prompts])).float().mean())


def train(args) -> Dict:
    torch.manual_seed(args.seed)
    cfg = model_config(args.passages)
    model = Decoder(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    g = torch.Generator().manual_seed(args.seed)
    val = [make_prompt(args.seed, args.seed + 500_000 + i, args.passages) for i in range(256)]
    warmup = 200
    t0 = time.time()
    log, steps_done, val_acc = [], 0, 0.0
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        toks, tgt = train_batch(args.seed, g, args.batch, args.passages)
        logits = model(toks[:, :-1])
        # logits[t] predict token t+1, which tgt[t] already holds
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt[:, :-1].reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        steps_done = step + 1
        if steps_done % 100 == 0 or steps_done == args.steps:
            model.eval()
            val_acc = full_accuracy(model, val)
            model.train()
            log.append({"step": steps_done, "loss": round(float(loss), 4), "val_accuracy": val_acc,
                        "wall_s": round(time.time() - t0, 1)})
            if not args.json:
                print(f"step {steps_done:5d}  loss {float(loss):.4f}  val acc {val_acc:.3f}  "
                      f"{time.time() - t0:6.1f} s", file=sys.stderr, flush=True)
            if val_acc >= args.target_accuracy:
                break
            if time.time() - t0 > args.time_budget_s:
                break
    wall = time.time() - t0
    model.eval()
    record = {"steps": steps_done, "wall_s": round(wall, 1), "final_val_accuracy": val_acc,
              "batch": args.batch, "lr": args.lr, "log": log, "machine": machine_description(),
              "torch": torch.__version__, "threads": torch.get_num_threads()}
    os.makedirs(os.path.dirname(os.path.realpath(args.weights)), exist_ok=True)
    torch.save({"state_dict": model.state_dict(), "config": cfg.to_dict(), "task_seed": args.seed,
                "passages": args.passages, "training": record}, args.weights)
    return record


def load_model(path: str) -> Tuple[Decoder, Dict]:
    blob = torch.load(path, map_location="cpu")
    model = Decoder(ModelConfig(**blob["config"]))
    model.load_state_dict(blob["state_dict"])
    model.eval()
    return model, blob


def evaluate(model: Decoder, prompts: List[Prompt], fractions=FRACTIONS, random_at: Optional[float] = 0.15) -> Dict:
    """Full prefill vs blend per fraction: accuracy, mean KL(full || blend), max KL, work.
    With random_at, also blend at that fraction recomputing randomly chosen tokens (as many),
    the baseline for CacheBlend's deviation-based selection."""
    blend = load_blend()
    n = len(prompts)
    rows: Dict[str, Dict] = {}
    full_correct, full_layers = 0, 0
    modes = [(f"blend@{f:.2f}", f, "deviation") for f in fractions]
    if random_at is not None:
        modes.append((f"random@{random_at:.2f}", random_at, "random"))
    gen = torch.Generator().manual_seed(12345)
    n_upd = sum(p.updated for p in prompts)
    full_upd = 0
    agg = {m: {"correct_updated": 0, "correct": 0, "kl": 0.0, "kl_max": 0.0, "token_layers": 0,
               "recomputed": 0, "agree": 0,
               "k_err": [0.0] * model.cfg.n_layers, "v_err": [0.0] * model.cfg.n_layers}
           for m, _, _ in modes}
    with torch.no_grad():
        for p in prompts:
            full_cache, full_logits = blend.full_prefill(model, p.tokens)
            lo, hi = len(p.segments[0]), p.tokens.shape[0] - p.query.shape[0]  # the passages
            full_lp = F.log_softmax(full_logits.double(), -1)
            full_pred = int(full_logits.argmax())
            full_correct += full_pred == p.answer
            full_upd += p.updated and full_pred == p.answer
            full_layers += p.tokens.shape[0] * model.cfg.n_layers
            cached = [blend.segment_kv(model, s) for s in p.segments]
            for m, f, how in modes:
                r = blend.blend_prefill(model, p.segments, f, query=p.query, cached=cached,
                                        selection=how, generator=gen)
                lp = F.log_softmax(r.logits.double(), -1)
                kl = float((full_lp.exp() * (full_lp - lp)).sum())
                a = agg[m]
                pred = int(r.logits.argmax())
                a["correct"] += pred == p.answer
                a["correct_updated"] += p.updated and pred == p.answer
                a["agree"] += pred == full_pred
                a["kl"] += kl
                a["kl_max"] = max(a["kl_max"], kl)
                a["token_layers"] += r.stats.token_layers
                for layer in range(model.cfg.n_layers):  # relative L2 error of the passages' KV
                    for key, ours, ref in (("k_err", r.cache.k, full_cache.k), ("v_err", r.cache.v, full_cache.v)):
                        want = ref[layer][0, lo:hi]
                        a[key][layer] += float((ours[layer][0, lo:hi] - want).norm() / want.norm())
                a["recomputed"] += r.stats.recomputed_tokens
    rows["full"] = {"accuracy": full_correct / n, "accuracy_updated": full_upd / max(n_upd, 1),
                    "kl_mean": 0.0, "kl_max": 0.0, "agree_with_full": 1.0,
                    "compute_vs_full": 1.0, "recomputed_tokens_mean": None}
    for m, _, _ in modes:
        a = agg[m]
        rows[m] = {"accuracy": a["correct"] / n, "accuracy_updated": a["correct_updated"] / max(n_upd, 1),
                   "kl_mean": a["kl"] / n, "kl_max": a["kl_max"],
                                  "agree_with_full": a["agree"] / n,
                                  "compute_vs_full": a["token_layers"] / full_layers,
                                  "recomputed_tokens_mean": a["recomputed"] / n,
                                  "passage_k_rel_err": [e / n for e in a["k_err"]],
                                  "passage_v_rel_err": [e / n for e in a["v_err"]]}
    return rows


def heldout(task_seed: int, passages: int, n: int, offset: int = EVAL_SEED_OFFSET) -> List[Prompt]:
    return [make_prompt(task_seed, task_seed + offset + i, passages) for i in range(n)]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, as the rest of the CLI
        print(f"rag_quality.py: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def parse_args(argv=None):
    p = _Parser(prog="rag_quality.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", action="store_true", help="train from scratch and save the weights (see above)")
    p.add_argument("--weights", default=WEIGHTS, help="weights file to load (or, with --train, to write)")
    p.add_argument("--prompts", type=int, default=500, help="held-out prompts evaluated (default 500)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--seed", type=int, default=0, help="task and training seed, with --train (default 0)")
    p.add_argument("--passages", type=int, default=4, help="passages per prompt, with --train (default 4)")
    p.add_argument("--steps", type=int, default=800, help="training steps, with --train (default 800)")
    p.add_argument("--batch", type=int, default=32, help="training batch, with --train")
    p.add_argument("--lr", type=float, default=5e-3, help="peak learning rate, with --train")
    p.add_argument("--target-accuracy", type=float, default=1.0,
                   help="stop training early once validation accuracy reaches this (default 1.0)")
    p.add_argument("--time-budget-s", type=float, default=600.0,
                   help="stop training after this wall time (default 600)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = p.parse_args(argv)
    for name in ("prompts", "passages", "steps", "batch", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not args.lr > 0:
        p.error(f"--lr must be > 0, got {args.lr}")
    if not args.train and not os.path.exists(args.weights):
        p.error(f"--weights {args.weights}: no such file (run with --train to make it)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    machine = machine_description()
    record = None
    if args.train:
        record = train(args)
    model, blob = load_model(args.weights)
    task_seed, passages = blob["task_seed"], blob["passages"]
    t0 = time.time()
    rows = evaluate(model, heldout(task_seed, passages, args.prompts))
    eval_s = time.time() - t0
    training = record or blob.get("training", {})
    report = {"measured_on": machine, "weights": os.path.relpath(os.path.realpath(args.weights)),
              "config": blob["config"], "task_seed": task_seed, "passages": passages,
              "prompt_tokens": SYSTEM_LEN + passages * PASSAGE_LEN + 2, "prompts": args.prompts,
              "eval_wall_s": round(eval_s, 1), "training": {k: v for k, v in training.items() if k != "log"},
              "modes": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    cfg = blob["config"]
    print(f"RAG answer quality, full prefill vs KV blend (CacheBlend-style), {args.prompts} held-out prompts")
    print(f"model: Decoder {cfg['n_layers']} layers, d_model {cfg['d_model']}, {cfg['n_heads']} heads "
          f"({cfg['n_kv_heads']} KV), vocab {cfg['vocab_size']}; prompt = system {SYSTEM_LEN} + "
          f"{passages} x {PASSAGE_LEN} passage + 2 question tokens")
    if training:
        print(f"training: {training.get('steps')} steps, {training.get('wall_s')} s wall "
              f"(measured on {training.get('machine', '?')})")
    print(f"all figures measured on {machine}")
    print(f"{'mode':<12} {'accuracy':>9} {'updated':>8} {'agree':>7} {'KL mean':>10} {'KL max':>10} "
          f"{'recomputed':>11} {'compute':>8}")
    for name, r in rows.items():
        rec = "-" if r["recomputed_tokens_mean"] is None else f"{r['recomputed_tokens_mean']:.1f}"
        print(f"{name:<12} {r['accuracy']:>9.3f} {r['accuracy_updated']:>8.3f} {r['agree_with_full']:>7.3f} "
              f"{r['kl_mean']:>10.2e} "
              f"{r['kl_max']:>10.2e} {rec:>11} {r['compute_vs_full']:>8.3f}")
    print("accuracy: argmax == answer; updated: the same on the prompts whose key a later passage "
          "restates; agree: argmax == full prefill's; KL: KL(full || blend) of the "
          "answer-position distribution, nats; recomputed: passage tokens recomputed per prompt; "
          "compute: token-layers computed / a full prefill's")
    print("passage KV against the full prefill's, relative L2 error per layer (K / V):")
    for name, r in rows.items():
        if "passage_k_rel_err" in r:
            print(f"  {name:<12} " + "  ".join(f"L{i} {k:.3f}/{v:.3f}" for i, (k, v) in
                                              enumerate(zip(r["passage_k_rel_err"], r["passage_v_rel_err"]))))
    print(f"evaluation wall {eval_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
