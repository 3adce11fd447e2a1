"""Tests of python/u3m_capture: the model, the recorder and the trace files it writes.

Run: PYTHONPATH=python /usr/bin/python3 -m unittest discover -s tests/python -v
With U3M_BIN set to a built `u3m`, the traces are also imported by the C++ side.
"""
import collections
import contextlib
import gzip
import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch

from u3m_capture.__main__ import main as capture_main
from u3m_capture.jsonl import TraceFormatError, read_trace
from u3m_capture.model import Decoder, ModelConfig, generate, lm_loss

SMALL = ["--layers", "2", "--d-model", "64", "--heads", "4", "--kv-heads", "2", "--ffn-hidden", "96",
         "--vocab", "256", "--quiet"]


def capture(workload, out, *extra):
    rc = capture_main([workload, "-o", out, *SMALL, *extra])
    if rc != 0:
        raise AssertionError(f"capture {workload} exited {rc}")
    return read_trace(out)


def accesses(tr, job, iteration, kinds=("alloc", "read", "write")):
    """The (op, phase, tensor name, kind) sequence of one iteration of one job."""
    out = []
    for e in tr.events:
        op = tr.ops[e["op"]]
        if op["job"] == job and op["iteration"] == iteration and e["kind"] in kinds:
            out.append((op["name"], op["phase"], tr.tensors[e["tensor"]]["name"], e["kind"]))
    return out


class ModelTest(unittest.TestCase):
    def test_training_loss_decreases_on_a_fixed_batch(self):
        torch.manual_seed(0)
        cfg = ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=96,
                          max_seq_len=64)
        model = Decoder(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        tokens = torch.randint(cfg.vocab_size, (4, 33))
        losses = []
        for _ in range(6):
            loss = lm_loss(model, tokens)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        self.assertLess(losses[-1], losses[0] * 0.9, losses)
        self.assertTrue(all(b < a for a, b in zip(losses, losses[1:])), losses)

    def test_kv_cache_generation_matches_full_recompute(self):
        for kv_heads in (1, 2, 4):  # MQA, GQA, plain multi-head
            with self.subTest(kv_heads=kv_heads):
                torch.manual_seed(1)
                cfg = ModelConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=kv_heads,
                                  ffn_hidden=96, max_seq_len=32)
                model = Decoder(cfg).eval()
                prompts = torch.randint(cfg.vocab_size, (3, 7))
                seq, step_logits = generate(model, prompts, 6, temperature=0, return_logits=True)
                self.assertEqual(tuple(seq.shape), (3, 13))
                self.assertTrue(torch.equal(seq[:, :7], prompts))
                with torch.no_grad():
                    for i, cached in enumerate(step_logits):
                        full = model(seq[:, : 7 + i])[:, -1]
                        self.assertLess((full - cached).abs().max().item(), 1e-4, f"step {i}")
                        # Greedy decoding took the argmax of exactly these logits.
                        self.assertTrue(torch.equal(seq[:, 7 + i], full.argmax(-1)))

    def test_bad_config_names_the_field(self):
        with self.assertRaisesRegex(ValueError, "n_heads"):
            ModelConfig(d_model=130, n_heads=4)
        with self.assertRaisesRegex(ValueError, "n_kv_heads"):
            ModelConfig(n_heads=4, n_kv_heads=3)


class CaptureTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        cls.paths = {w: os.path.join(d, f"{w}.jsonl") for w in ("train", "generate", "rlhf")}
        cls.train = capture("train", cls.paths["train"], "--steps", "3", "--batch", "2", "--seq-len", "32")
        cls.gen = capture("generate", cls.paths["generate"], "--rounds", "2", "--batch", "3",
                          "--prompt-len", "8", "--new-tokens", "12", "--kv-block", "4")
        cls.rlhf = capture("rlhf", cls.paths["rlhf"], "--rounds", "2", "--train-steps", "2", "--batch", "2",
                           "--prompt-len", "8", "--new-tokens", "8", "--kv-block", "4")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def traces(self):
        return {"train": self.train, "generate": self.gen, "rlhf": self.rlhf}

    def test_traces_are_well_formed_with_consistent_lifetimes(self):
        for name, tr in self.traces().items():
            with self.subTest(trace=name):
                self.assertGreater(len(tr.events), 1000)
                self.assertEqual(tr.meta_value("truncated"), "false")
                # No storage of this model outlives the tensors the recorder saw: every free is final.
                self.assertEqual(tr.meta_value("withdrawn_frees"), "0")
                self.assertTrue(tr.meta_value("time_model").startswith("measured wall clock, CPU, torch"))
                times = [e["t"] for e in tr.events]
                self.assertEqual(times, sorted(times), "event times go backwards")
                names = [t["name"] for t in tr.tensors]
                self.assertEqual(len(names), len(set(names)), "a tensor name is declared twice")
                # Lifetimes: no access to a freed tensor before it is allocated again,
                # no second allocation without a free in between.
                live = {}
                for i, e in enumerate(tr.events):
                    t, kind = e["tensor"], e["kind"]
                    state = live.get(t)
                    if kind == "alloc":
                        self.assertNotEqual(state, True, f"event {i}: {names[t]} allocated twice")
                        live[t] = True
                    elif kind == "free":
                        self.assertEqual(state, True, f"event {i}: {names[t]} freed while not live")
                        live[t] = False
                    else:
                        self.assertNotEqual(state, False, f"event {i}: {kind} of freed {names[t]}")

    def test_validator_rejects_bad_lines(self):
        bad = os.path.join(self.tmp.name, "bad.jsonl")
        cases = {
            '{"u3m_trace":1}\n{"event":{"t":0,"op":0,"tensor":0,"kind":"read"}}\n': "field 'op'",
            '{"u3m_trace":1}\n{"job":"a"}\n{"tensor":{"name":"x","bytes":-1}}\n': "field 'bytes'",
            '{"u3m_trace":2}\n': "first line",
            '{"u3m_trace":1}\n{"op":{"name":"aten::mm","phase":"sideways"}}\n': "field 'phase'",
        }
        for text, message in cases.items():
            with open(bad, "w") as f:
                f.write(text)
            with self.assertRaisesRegex(TraceFormatError, f"bad.jsonl:\\d+: .*{message}"):
                read_trace(bad)

    def test_training_step_1_equals_step_2(self):
        tr = self.train
        s1, s2 = accesses(tr, 0, 1), accesses(tr, 0, 2)
        self.assertGreater(len(s1), 1000)
        self.assertEqual({p for _, p, _, _ in s1}, {"forward", "backward", "optimizer"})
        self.assertEqual(s1, s2)
        f1 = collections.Counter(accesses(tr, 0, 1, ("free",)))
        f2 = collections.Counter(accesses(tr, 0, 2, ("free",)))
        self.assertGreater(sum(f1.values()), 100)
        self.assertEqual(f1, f2)

    def test_activation_names_follow_the_module_tree(self):
        names = {t["name"]: t for t in self.train.tensors}
        q = names.get("train-0.fwd.layers.1.attn.q_proj.aten::mm#0.out0")
        self.assertIsNotNone(q, "q_proj's forward matmul output is missing")
        self.assertEqual((q["role"], q["layer"], q["job"]), ("activation", 1, 0))
        self.assertEqual(q["bytes"], 2 * 32 * 64 * 4)  # batch 2 x 32 tokens x d_model 64, f32
        self.assertTrue(any(n.startswith("train-0.bwd.layers.0.") for n in names), "no backward activations")

    def test_parameters_read_in_forward_and_backward_written_by_optimizer(self):
        tr = self.train
        use = collections.defaultdict(set)
        for e in tr.events:
            op = tr.ops[e["op"]]
            if op["iteration"] == 1:
                use[e["tensor"]].add((op["phase"], e["kind"]))
        params = [i for i, t in enumerate(tr.tensors) if t["role"] == "param"]
        self.assertEqual(len(params), 2 * 9 + 3)  # per layer: 2 norms + 7 linears; embed, norm, lm_head
        for i in params:
            name = tr.tensors[i]["name"]
            got = use[i]
            self.assertIn(("forward", "read"), got, name)
            self.assertIn(("optimizer", "write"), got, name)
            self.assertNotIn(("forward", "write"), got, name)
            self.assertNotIn(("backward", "write"), got, name)
            if "embed" not in name:  # the embedding's gradient needs only the token ids
                self.assertIn(("backward", "read"), got, name)
            stem = name.replace("train-0.param.", "")
            for role, suffix in (("grad", f"train-0.grad.{stem}"), ("optim_m", f"train-0.optim.{stem}.exp_avg"),
                                 ("optim_v", f"train-0.optim.{stem}.exp_avg_sq")):
                j = next((k for k, t in enumerate(tr.tensors) if t["name"] == suffix), None)
                self.assertIsNotNone(j, suffix)
                self.assertEqual(tr.tensors[j]["role"], role)
                self.assertEqual(tr.tensors[j]["bytes"], tr.tensors[i]["bytes"])
                self.assertIn(("optimizer", "read"), use[j], suffix)
            grad = next(k for k, t in enumerate(tr.tensors) if t["name"] == f"train-0.grad.{stem}")
            self.assertIn(("backward", "write"), use[grad])

    def test_kv_cache_grows_during_decode_and_is_freed(self):
        tr = self.gen
        self.assertEqual(tr.jobs, ["infer-0"])
        kv = {i for i, t in enumerate(tr.tensors) if t["role"] == "kv"}
        # 3 slots x 2 layers x {k,v} x ceil(20 / 4) blocks
        self.assertEqual(len(kv), 3 * 2 * 2 * 5)
        live, per_iter = set(), collections.Counter()  # iteration -> most KV blocks live at once
        for e in tr.events:
            if e["tensor"] in kv:
                if e["kind"] == "alloc":
                    live.add(e["tensor"])
                elif e["kind"] == "free":
                    live.discard(e["tensor"])
            it = tr.ops[e["op"]]["iteration"]
            per_iter[it] = max(per_iter[it], len(live))
        first = [per_iter[i] for i in range(12)]  # batch 1: prefill + 11 decode steps
        self.assertEqual(first[0], 3 * 2 * 2 * 2)  # 8 prompt positions = 2 blocks
        self.assertEqual(first[1], 3 * 2 * 2 * 3)  # the 9th position opens block 3
        self.assertEqual(first, sorted(first))
        self.assertEqual(first[-1], 3 * 2 * 2 * 5)
        self.assertEqual(len(live), 0, "KV blocks still live after generation ended")
        classes = collections.Counter((tr.ops[i]["phase"], tr.ops[i].get("class")) for i in range(len(tr.ops)))
        self.assertEqual(classes[("prefill", "attn_prefill")], 2 * 2 * 3)  # 2 batches x 2 layers x QK, softmax, PV
        self.assertEqual(classes[("decode", "attn_decode")], 2 * 11 * 2 * 3)

    def test_generation_batches_reproduce_each_other(self):
        # Batch 2 starts at infer iteration 12; its steps name the same tensors as batch 1's.
        for a, b in ((0, 12), (1, 13), (11, 23)):
            s1, s2 = accesses(self.gen, 0, a), accesses(self.gen, 0, b)
            self.assertGreater(len(s1), 100)
            self.assertEqual(s1, s2, f"iterations {a} and {b}")

    def test_rlhf_interleaves_two_jobs_sharing_parameters(self):
        tr = self.rlhf
        self.assertEqual(tr.jobs, ["train-0", "infer-0"])
        job_order = []
        for op in tr.ops:
            if not job_order or job_order[-1] != op["job"]:
                job_order.append(op["job"])
        self.assertEqual(job_order, [1, 0, 1, 0])  # rollouts, training, rollouts, training
        self.assertFalse(any(t["name"].startswith("infer-0.param.") for t in tr.tensors))
        infer_reads = {tr.tensors[e["tensor"]]["name"] for e in tr.events
                       if tr.ops[e["op"]]["job"] == 1 and e["kind"] == "read"}
        self.assertIn("train-0.param.layers.0.attn.q_proj.weight", infer_reads)
        self.assertTrue(any(tr.tensors[i]["role"] == "kv" and tr.tensors[i]["job"] == 1
                            for i in range(len(tr.tensors))))
        # Second round's training steps reproduce the first round's second step.
        self.assertEqual(accesses(tr, 0, 1), accesses(tr, 0, 3))
        self.assertEqual(accesses(tr, 0, 1), accesses(tr, 0, 2))

    def test_event_limit_bounds_the_capture(self):
        out = os.path.join(self.tmp.name, "cut.jsonl")
        tr = capture("train", out, "--steps", "2", "--seq-len", "16", "--max-events", "500")
        self.assertEqual(tr.meta_value("truncated"), "true")
        self.assertGreaterEqual(len(tr.events), 500)
        self.assertLess(len(tr.events), 600)

    def test_help_lists_every_option_with_its_default(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        for workload, options in (("train", ["--steps", "--seq-len", "--lr", "--max-events", "--kv-heads"]),
                                  ("generate", ["--new-tokens", "--kv-block", "--temperature", "--rounds"]),
                                  ("rlhf", ["--train-steps", "--rounds", "--new-tokens", "--lr"])):
            res = subprocess.run([sys.executable, "-m", "u3m_capture", workload, "--help"], env=env,
                                 capture_output=True, text=True, check=True)
            for opt in options:
                self.assertIn(opt, res.stdout, f"{workload} --help")
            self.assertIn("(default: 4)", res.stdout)
        bad = subprocess.run([sys.executable, "-m", "u3m_capture", "train", "-o", os.devnull, "--d-model", "130"],
                             env=env, capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("d_model", bad.stderr)
        for value in ("nan", "-1", "inf"):
            bad = subprocess.run([sys.executable, "-m", "u3m_capture", "rlhf", "-o", os.devnull,
                                  "--temperature", value], env=env, capture_output=True, text=True)
            self.assertEqual(bad.returncode, 2, value)
            self.assertIn("--temperature", bad.stderr)

    def test_u3m_imports_the_traces(self):
        u3m = os.environ.get("U3M_BIN", "")
        if not (u3m and os.access(u3m, os.X_OK)):
            self.skipTest("U3M_BIN is not set to a built u3m binary")
        for name, tr in self.traces().items():
            with self.subTest(trace=name):
                binary = os.path.join(self.tmp.name, f"{name}.u3mt")
                imp = subprocess.run([u3m, "trace", "import", self.paths[name], "-o", binary],
                                     capture_output=True, text=True)
                self.assertEqual(imp.returncode, 0, imp.stderr)
                st = subprocess.run([u3m, "trace", "stats", binary, "--json"], capture_output=True, text=True)
                self.assertEqual(st.returncode, 0, st.stderr)
                stats = json.loads(st.stdout)
                self.assertEqual(stats["events"], len(tr.events))
                self.assertEqual(stats["ops"], len(tr.ops))
                self.assertEqual(stats["tensors"], len(tr.tensors))
                kinds = collections.Counter(e["kind"] for e in tr.events)
                for kind, n in kinds.items():
                    self.assertEqual(stats["event_kinds"][kind], n, kind)
                self.assertEqual(sorted(stats["jobs"]), sorted(tr.jobs))
                if name != "generate":
                    self.assertGreater(stats["phases"]["backward"], 0)
                    self.assertGreater(stats["op_classes"]["optimizer"], 0)
                if name != "train":
                    self.assertGreater(stats["op_classes"]["attn_decode"], 0)
                self.assertGreater(stats["op_classes"]["matmul"], 0)


class CorpusTest(unittest.TestCase):
    """The issue-17 corpus tools: zoo models, both observers, the chakra layout."""

    def test_every_zoo_model_trains_and_the_lms_generate(self):
        from u3m_capture import zoo
        torch.manual_seed(0)
        for name, cls in zoo.ZOO.items():
            with self.subTest(model=name):
                m = cls()
                if name == "cnn":
                    batch = (torch.randn(2, 3, 8, 8), torch.randint(10, (2,)))
                    loss = m.loss(batch)
                else:
                    vocab = getattr(m, "vocab", None) or m.cfg.vocab_size
                    loss = m.loss(torch.randint(vocab, (2, 9)))
                loss.backward()
                self.assertTrue(torch.isfinite(loss).item(), name)
                if m.lm:
                    m.eval()
                    kinds = []

                    @contextlib.contextmanager
                    def step(kind):
                        kinds.append(kind)
                        yield
                    out = m.generate(torch.randint(16, (2, 4)), 3, step=step)
                    self.assertEqual(out.shape[1], (4 if name != "seq2seq" else 1) + 3, name)
                    self.assertEqual(kinds[0], "prefill")
                    self.assertTrue(all(k == "decode" for k in kinds[1:]), kinds)

    def test_both_observers_and_the_chakra_layout(self):
        from dataclasses import replace
        from u3m_capture import corpus
        from u3m_capture.et_chakra import to_chakra
        base = {p.name: p for p in corpus.PROGRAMS}["lstm-rlhf"]
        prog = replace(base, name="tiny-rlhf", steps=2, train_per_round=1, new_tokens=3, seq=8)
        with tempfile.TemporaryDirectory() as d:
            et = os.path.join(d, "t.et.json.gz")
            info = corpus.capture_et(prog, et)
            self.assertEqual(info["schema"], "1.0.1")
            with gzip.open(et, "rt") as f:
                doc = json.load(f)
            ch = to_chakra(doc)
            self.assertEqual(ch["schema"], "1.1.0-chakra.0.0.4")
            self.assertEqual(len(ch["nodes"]), len(doc["nodes"]))
            n = next(x for x in ch["nodes"] if x["name"] == "aten::addmm")
            self.assertEqual(set(n), {"id", "name", "ctrl_deps", "inputs", "outputs", "attrs"})
            self.assertEqual({a["name"] for a in n["attrs"]} >= {"op_schema", "seq_id", "tid"}, True)
            rec = os.path.join(d, "t.u3m.jsonl")
            counts = corpus.capture_recorder(prog, rec)
            self.assertEqual(counts["jobs"], 2)
            u3m = os.environ.get("U3M_BIN", "")
            if not u3m or not os.access(u3m, os.X_OK):
                return
            for path in (et, rec):
                out = os.path.join(d, "x.u3mt")
                imp = subprocess.run([u3m, "trace", "import", path, "-o", out], capture_output=True, text=True)
                self.assertEqual(imp.returncode, 0, imp.stderr)
                st = json.loads(subprocess.run([u3m, "trace", "stats", out, "--json"], capture_output=True,
                                               text=True).stdout)
                self.assertEqual(sorted(st["jobs"]), ["infer-0", "train-0"], path)

    def test_generation_only_et_is_one_inference_job(self):
        # No backward, no optimizer: inference, one iteration per model call.
        u3m = os.environ.get("U3M_BIN", "")
        if not u3m or not os.access(u3m, os.X_OK):
            self.skipTest("U3M_BIN is not set to a built u3m binary")
        from torch.profiler import ExecutionGraphObserver
        from u3m_capture import zoo
        torch.manual_seed(0)
        m = zoo.GPT2().eval()
        with tempfile.TemporaryDirectory() as d:
            path, out = os.path.join(d, "gen.json"), os.path.join(d, "gen.u3mt")
            eg = ExecutionGraphObserver()
            eg.register_callback(path)
            eg.start()
            for _ in range(2):
                m.generate(torch.randint(256, (2, 4)), 4)
            eg.stop()
            eg.unregister_callback()
            imp = subprocess.run([u3m, "trace", "import", path, "-o", out], capture_output=True, text=True)
            self.assertEqual(imp.returncode, 0, imp.stderr)
            st = json.loads(subprocess.run([u3m, "trace", "stats", out, "--json"], capture_output=True,
                                           text=True).stdout)
            self.assertEqual(list(st["jobs"]), ["infer-0"])
            self.assertEqual(st["jobs"]["infer-0"]["iterations"], 8)  # 2 x (a prefill + 3 decode steps)
            self.assertGreater(st["phases"]["decode"], 0)


if __name__ == "__main__":
    unittest.main()
