"""Tests of the extension u3m._core and of u3m.torch (docs/pytorch.md).

Run (after building u3m_python): PYTHONPATH=build/release/python /usr/bin/python3 -m unittest \
    discover -s tests/python -p test_torch.py -v
"""
import os
import tempfile
import unittest

import torch

import u3m
import u3m.torch as ut
from u3m_capture.model import Decoder, ModelConfig, lm_loss

CFG = dict(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=96, max_seq_len=32)


def make_run(seed=0, batch=4, seq=32, steps=4):
    """A model, its AdamW and the fixed batches of one run (same seed = same bytes)."""
    torch.manual_seed(seed)
    model = Decoder(ModelConfig(**CFG))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed + 1)
    batches = [torch.randint(CFG["vocab_size"], (batch, seq + 1), generator=gen) for _ in range(steps)]
    return model, opt, batches


def train(model, opt, batches):
    losses = []
    for tokens in batches:
        loss = lm_loss(model, tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train_until_error(model, opt, batches, before_step=lambda k: None):
    """train(), step by step, until an engine error stops it: (losses so far, the error
    text or None). Autograd rewraps an error raised in backward as a RuntimeError."""
    losses = []
    try:
        for k, tokens in enumerate(batches):
            before_step(k)
            losses += train(model, opt, [tokens])
    except (u3m.EngineError, RuntimeError) as e:
        return losses, str(e)
    return losses, None


class OffloadTest(unittest.TestCase):
    def test_training_under_half_the_footprint_matches_untiered_bitwise(self):
        model, opt, batches = make_run()
        ref_losses = train(model, opt, batches)
        ref_params = {n: p.detach().clone() for n, p in model.named_parameters()}

        model, opt, batches = make_run()
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        off = ut.offload(model, opt, budget_fraction=0.5)
        losses = train(model, opt, batches)
        st = off.stats()
        off.close()

        # AdamW: the footprint is params + grads + exp_avg + exp_avg_sq, and the
        # budget half of it (budget <= 0.5 x footprint held by definition; this
        # catches a footprint missing the grads or a state, or the wrong base).
        self.assertEqual(off.footprint_bytes, 4 * param_bytes)
        self.assertEqual(off.budget_bytes, off.footprint_bytes // 2)
        self.assertEqual(losses, ref_losses)  # bitwise: the same ops on the same bytes
        for n, p in model.named_parameters():
            self.assertTrue(torch.equal(p.detach(), ref_params[n]), n)
        # The budget held, and it bound: data really moved out of the device tier.
        self.assertGreater(st["peak_device_bytes"], 0)
        self.assertLessEqual(st["peak_device_bytes"], off.budget_bytes)
        self.assertGreater(st["evictions"], 0)
        self.assertGreater(st["saved_activation_bytes"], 0)
        # The default policy decided from step 2 on: it issued prefetches, and some were used.
        self.assertEqual(st["policy"]["policy"], ut.DEFAULT_POLICY)
        self.assertGreater(st["prefetches"], 0)
        self.assertGreater(st["prefetch_hits"], 0)

    def test_each_tiering_policy_decides_and_training_stays_bitwise(self):
        model, opt, batches = make_run()
        ref_losses = train(model, opt, batches)
        for policy in ("u3m", "design-seed", "lookahead", "belady", "lru"):
            with self.subTest(policy=policy):
                model, opt, batches = make_run()
                off = ut.offload(model, opt, budget_fraction=0.3, policy=policy)
                losses = train(model, opt, batches)
                st = off.stats()
                off.close()
                self.assertEqual(losses, ref_losses)
                p = st["policy"]
                self.assertEqual(p["policy"], policy)
                self.assertTrue(p["deciding"])
                # Each step makes the same accesses: the policy ran on every access after step
                # 1 (which recorded, under LRU), and no step left the trace it was made for.
                self.assertEqual(p["diverged"], 0)
                self.assertEqual(p["policies"], 1)
                self.assertEqual(p["accesses"] % len(batches), 0)
                self.assertEqual(p["policy_steps"], p["accesses"] // len(batches) * (len(batches) - 1))
                self.assertLessEqual(st["peak_device_bytes"], off.budget_bytes)
                if policy == "lru":  # demand fetches only: every prefetch is a policy's
                    self.assertEqual(st["prefetches"], 0)
                else:
                    self.assertGreater(st["prefetches"], 0)
                    self.assertGreater(st["prefetch_hits"], 0)

    def test_the_optimizer_step_on_the_host_under_a_host_optimizer_policy(self):
        model, opt, batches = make_run()
        ref_losses = train(model, opt, batches)
        model, opt, batches = make_run()
        off = ut.offload(model, opt, budget_fraction=0.3, policy="u3m", host_optimizer=True)
        losses = train(model, opt, batches)
        st = off.stats()
        off.close()
        self.assertEqual(losses, ref_losses)
        self.assertTrue(st["policy"]["deciding"])
        self.assertEqual(st["policy"]["diverged"], 0)
        self.assertLessEqual(st["peak_device_bytes"], off.budget_bytes)
        # The optimizer's state lives on the host from step 2: less reached the device than
        # with the step there (same run otherwise).
        model, opt, batches = make_run()
        dev = ut.offload(model, opt, budget_fraction=0.3, policy="u3m")
        train(model, opt, batches)
        on_device = dev.stats()["engine"]["links"]["h2d"]["bytes"]
        dev.close()
        self.assertLess(st["engine"]["links"]["h2d"]["bytes"], on_device)

    def test_a_step_that_leaves_the_policys_trace_is_recorded_again(self):
        model, opt, batches = make_run(steps=5)
        ref_losses = train(model, opt, batches[:2])
        with torch.no_grad():  # an evaluation forward: gathers, saves nothing
            ref_eval = lm_loss(model, batches[2]).item()
        ref_losses += train(model, opt, batches[3:])
        model, opt, batches = make_run(steps=5)
        off = ut.offload(model, opt, budget_fraction=0.5)
        losses = train(model, opt, batches[:2])
        with torch.no_grad():
            evaluated = lm_loss(model, batches[2]).item()
        losses += train(model, opt, batches[3:])
        st = off.stats()["policy"]
        off.close()
        self.assertEqual(losses, ref_losses)
        self.assertEqual(evaluated, ref_eval)
        # Step 3 (eval forward + training step) left the trace; its recording made a new policy.
        self.assertGreaterEqual(st["diverged"], 1)
        self.assertGreaterEqual(st["policies"], 2)
        self.assertTrue(st["deciding"])

    def test_an_unknown_policy_is_refused_naming_the_choices(self):
        model, opt, _ = make_run()
        with self.assertRaises(u3m.InputError) as cm:
            ut.offload(model, opt, budget_fraction=0.5, policy="nope")
        self.assertIn("nope", str(cm.exception))
        self.assertIn("lookahead", str(cm.exception))

    def test_ssd_faults_under_offload_lose_nothing_and_are_caught(self):
        """Issue 14: every I/O fault class but the misdirected write (which can hit another
        tensor's copy at rest, below) injected under the SSD tier of an offloaded run whose
        host tier is too small for its state: the losses are still the untiered run's,
        bitwise, and the store's checks caught what was injected."""
        model, opt, batches = make_run(steps=3)
        ref_losses = train(model, opt, batches)
        model, opt, batches = make_run(steps=3)
        faults = ("eio_on_write=0.05,enospc_on_write=0.05,short_write=0.05,bit_flip_on_read=0.05,"
                  "eio_on_read=0.05,lost_write=0.05,torn_write=0.05,seed=5")
        with tempfile.TemporaryDirectory() as d:
            off = ut.offload(model, opt, budget_fraction=0.5, host_bytes=1 << 20, ssd_dir=d,
                             ssd_bytes=64 << 20, ssd_faults=faults)
            losses = train(model, opt, batches)
            st = off.rt.stats()
            off.close()
        self.assertEqual(losses, ref_losses)
        injected = sum(v for k, v in st["ssd"]["faults_injected"].items() if k != "at_rest")
        self.assertGreater(st["links"]["h2s"]["bytes"], 0, "nothing went to the SSD tier")
        self.assertGreater(injected, 0)
        caught = st["ssd"]["write_verify_failures"] + st["ssd"]["checksum_failures"] + st["ssd"]["io_errors"]
        self.assertGreater(caught, 0)
        self.assertEqual(st["lost_tensors"], 0)

    def test_misdirected_writes_under_offload_are_never_trained_on(self):
        """A misdirected write is caught by its own read-back, but may land on another
        tensor's only SSD copy: the run then stops with an error naming a corrupt tensor, or
        goes on with the untiered losses. Never a wrong loss."""
        model, opt, batches = make_run(steps=4)
        ref_losses = train(model, opt, batches)
        model, opt, batches = make_run(steps=4)
        with tempfile.TemporaryDirectory() as d:
            off = ut.offload(model, opt, budget_fraction=0.5, host_bytes=256 << 10, ssd_dir=d,
                             ssd_bytes=64 << 20, ssd_faults="misdirected_write=0.2,seed=8")
            losses, stopped = train_until_error(model, opt, batches)
            st = off.rt.stats()
            try:
                off.close()
            except u3m.EngineError as e:
                # A step that stopped midway still holds leases, or a parameter's only SSD
                # copy was hit after the last step (whether one is depends on when the
                # background write-backs ran): then writing it back must say it is corrupt.
                if stopped is None:
                    self.assertRegex(str(e), "corrupt")
        self.assertGreater(st["ssd"]["faults_injected"]["misdirected_write"], 0)
        self.assertGreater(st["ssd"]["write_verify_failures"], 0)
        self.assertEqual(losses, ref_losses[:len(losses)])
        if stopped is not None:
            self.assertRegex(stopped, "corrupt")
        else:
            self.assertEqual(len(losses), len(ref_losses))

    def test_corruption_at_rest_under_offload_is_never_trained_on(self):
        """A bit flipped in the SSD copy of a tensor that has no other copy, between steps:
        the run stops with an error naming the corrupt tensor (the losses until then are the
        untiered run's); it never trains on the corrupt bytes."""
        model, opt, batches = make_run(steps=4)
        ref_losses = train(model, opt, batches)
        model, opt, batches = make_run(steps=4)
        with tempfile.TemporaryDirectory() as d:
            off = ut.offload(model, opt, budget_fraction=0.5, host_bytes=256 << 10, ssd_dir=d,
                             ssd_bytes=64 << 20, ssd_faults="eio_on_read=0.001,seed=2")
            hit = 0

            def corrupt_only_copies(k):
                nonlocal hit
                if k != 2:
                    return
                off.rt.drain()  # then corrupt every tensor whose only copy is on the SSD tier
                for tid in sorted(off._live):
                    eid = off.drv.engine_id(tid)  # the Runtime's id of it
                    if (off.rt.residency(eid) or {}).get("valid") == ["ssd"]:
                        hit += off.rt.corrupt_ssd_copy(eid, seed=tid & 0xFFFF)

            losses, stopped = train_until_error(model, opt, batches, corrupt_only_copies)
            st = off.rt.stats()
            try:
                off.close()  # writes the parameters back: a lost one cannot be
            except u3m.EngineError as e:
                self.assertIsNotNone(stopped, str(e))
        self.assertGreater(hit, 0, "no tensor had its only copy on the SSD tier")
        self.assertEqual(losses, ref_losses[:len(losses)])
        self.assertIsNotNone(stopped, "trained on past a corrupt only copy")
        self.assertRegex(stopped, "corrupt")
        self.assertEqual(len(losses), 2)
        self.assertGreater(st["lost_tensors"], 0)
        self.assertGreater(st["ssd"]["checksum_failures"], 0)

    def test_gradient_accumulation_matches_untiered_bitwise(self):
        def accumulate(model, opt, batches):
            losses = []
            opt.zero_grad(set_to_none=True)
            for i, tokens in enumerate(batches):
                loss = lm_loss(model, tokens) / 2
                loss.backward()  # the second micro-batch adds to the first's gradients
                losses.append(loss.item())
                if i % 2 == 1:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            return losses

        model, opt, batches = make_run(steps=4, seq=16)
        ref = accumulate(model, opt, batches)
        model, opt, batches = make_run(steps=4, seq=16)
        off = ut.offload(model, opt, budget_fraction=0.4)
        got = accumulate(model, opt, batches)
        peak = off.stats()["peak_device_bytes"]
        off.close()
        self.assertEqual(got, ref)
        self.assertLessEqual(peak, off.budget_bytes)

    def test_a_parameter_outside_its_modules_forward_is_faulted_in_not_stale(self):
        # Issue 16: a use outside the parameter's unit is caught and served its real bytes
        # (it used to read a NaN placeholder).
        model, opt, _ = make_run()
        want = model.lm_head.weight.detach().clone()
        off = ut.offload(model, opt, budget_fraction=0.5)
        self.assertTrue(torch.equal(model.lm_head.weight, want))
        off.close()
        self.assertTrue(torch.equal(model.lm_head.weight, want))

    def test_bad_budgets_are_refused_with_the_reason(self):
        model, opt, _ = make_run()
        with self.assertRaisesRegex(ValueError, "budget_fraction must be in"):
            ut.offload(model, opt, budget_fraction=1.5)
        with self.assertRaisesRegex(ValueError, "largest parameter"):
            ut.offload(model, opt, budget_bytes=1024)
        with self.assertRaisesRegex(ValueError, "exactly one"):
            ut.offload(model, opt)


class CaptureTest(unittest.TestCase):
    def test_names_are_stable_across_steps_and_follow_module_paths(self):
        model, opt, batches = make_run(steps=2, seq=16)
        with ut.capture(model, opt) as cap:
            for tokens in batches:
                with cap.step():
                    loss = lm_loss(model, tokens)
                    cap.backward(loss)
                    cap.optimizer_step()
                    # A loss still held when the next step makes its own gets a double-buffer
                    # name (`~1`; Note [Stable names] in tracer.py): let it go, as a loop would.
                    del loss
        tr = cap.trace()
        counts = cap.counts()
        self.assertEqual(tr.num_events, counts["events"])
        ops = tr.ops()
        names = {0: set(), 1: set()}
        for _, op, tensor, kind in tr.events():
            if kind in ("read", "write"):
                names[ops[op]["iteration"]].add(tr.tensor(tensor)["name"])
        self.assertTrue(names[0])
        self.assertEqual(names[0], names[1])
        self.assertIn("train-0.param.layers.1.mlp.down_proj.weight", names[0])
        self.assertIn("train-0.optim.layers.0.attn.q_proj.weight.exp_avg_sq", names[0])
        self.assertTrue(any(n.startswith("train-0.fwd.layers.0.attn.q_proj.") for n in names[0]), names[0])
        self.assertTrue(any(n.startswith("train-0.bwd.layers.1.") for n in names[0]))
        for i in range(tr.num_tensors):
            t = tr.tensor(i)
            self.assertEqual(t["id"], u3m.stable_id(t["name"]))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.u3mt")
            cap.save(path)
            back = u3m.load_trace(path)
            self.assertEqual((back.num_tensors, back.num_events), (tr.num_tensors, tr.num_events))
            self.assertEqual(back.stats()["events"], tr.num_events)
        # The trace feeds the C++ predictors.
        res = u3m.evaluate_predictor(tr, "u3m", horizons=[8, 64])
        self.assertEqual(res["predictor"], "u3m")
        # Training steps repeat exactly, so after the warm-up iteration the sequence
        # predictor must do far better than chance on a captured trace.
        self.assertGreater(res["precision"], 0.5, res)


class BindingsTest(unittest.TestCase):
    def test_runtime_moves_bytes_between_tiers_intact(self):
        rt = u3m.Runtime(device_budget=3 << 20, host_budget=64 << 20)
        data = {}
        for tid in (1, 2, 3):  # 3 x 1 MiB through a 3 MiB device tier with a 90% watermark
            rt.add(tid, 1 << 20)
            lease = rt.acquire(tid, "device", "write")
            t = torch.frombuffer(lease, dtype=torch.int32)
            t.copy_(torch.arange(t.numel(), dtype=torch.int32) * tid)
            data[tid] = t.clone()
            del t
            rt.release(lease)
        rt.drain()  # pressure may already be moving tensor 1 (evict would say busy)
        rt.evict(1, "device")
        rt.drain()
        self.assertEqual(rt.residency(1)["valid"], ["host"])
        for tid in (1, 2, 3):
            lease = rt.acquire(tid, "device", "read")
            got = torch.frombuffer(bytearray(memoryview(lease)), dtype=torch.int32)
            self.assertTrue(torch.equal(got, data[tid]), tid)
            rt.release(lease)
        st = rt.stats()
        self.assertLessEqual(st["peak"]["device"], 3 << 20)
        self.assertGreater(st["links"]["h2d"]["bytes"], 0)
        self.assertIsNone(rt.residency(99))
        self.assertEqual(rt.monitor("device")["capacity"], 3 << 20)

    def test_runtime_spills_to_the_ssd_tier_and_reads_back(self):
        with tempfile.TemporaryDirectory() as d:
            rt = u3m.Runtime(device_budget=2 << 20, host_budget=3 << 20, ssd_dir=d, ssd_capacity=64 << 20)
            self.assertTrue(rt.has_ssd)
            ref = {}
            for tid in range(1, 7):  # 6 MiB through 2 MiB of device and 3 MiB of host
                rt.add(tid, 1 << 20)
                lease = rt.acquire(tid, "device", "write")
                t = torch.frombuffer(lease, dtype=torch.int64)
                t.fill_(tid * 1000003)
                ref[tid] = t.clone()
                del t
                rt.release(lease)
            rt.drain()
            self.assertIn(["ssd"], [rt.residency(t)["valid"] for t in ref])
            for tid in ref:
                lease = rt.acquire(tid, "host", "read")
                got = torch.frombuffer(bytearray(memoryview(lease)), dtype=torch.int64)
                self.assertTrue(torch.equal(got, ref[tid]), tid)
                rt.release(lease)
            self.assertGreater(rt.stats()["links"]["s2h"]["bytes"], 0)

    def test_errors_become_python_exceptions_with_the_message(self):
        with self.assertRaisesRegex(u3m.InputError, "device_budget must be > 0"):
            u3m.Runtime(device_budget=0)
        self.assertTrue(issubclass(u3m.InputError, ValueError))
        self.assertTrue(issubclass(u3m.EngineError, RuntimeError))
        rt = u3m.Runtime(device_budget=1 << 20)
        with self.assertRaisesRegex(u3m.EngineError, r"acquire\(tensor 42\): not found"):
            rt.acquire(42)
        with self.assertRaisesRegex(u3m.EngineError, r"add\(tensor 1\): invalid argument"):
            rt.add(1, 0)
        with self.assertRaisesRegex(u3m.InputError, "tier: expected device or host, got 'gpu'"):
            rt.acquire(1, "gpu")
        rt.add(1, 4096)
        lease = rt.acquire(1, "device", "write")
        rt.release(lease)
        with self.assertRaisesRegex(BufferError, "lease of tensor 1 was released"):
            memoryview(lease)
        with self.assertRaisesRegex(u3m.EngineError, "already released"):
            rt.release(lease)
        with self.assertRaisesRegex(u3m.InputError, "nope"):
            u3m.evaluate_predictor(u3m.Trace(), "nope")
        with self.assertRaisesRegex(u3m.InputError, "no-such-model"):
            u3m.simulate_training(model="no-such-model")
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "bad.jsonl")
            with open(bad, "w") as f:
                f.write('{"u3m_trace":1}\n{"tensor": {"name": "x", "bytes": -3}}\n')
            with self.assertRaisesRegex(u3m.InputError, "bad.jsonl:2"):
                u3m.load_trace(bad)

    def test_policy_driver_records_a_step_and_then_the_policy_prefetches(self):
        # 4 tensors of 64 KiB through room for 2: step 1 records under LRU; from step 2 the
        # lookahead policy (1 op ahead) prefetches the next access's tensor while this one is
        # leased, so those acquires find it there (prefetch hits), which LRU alone never does.
        rt = u3m.Runtime(device_budget=160 << 10, host_budget=16 << 20)
        drv = u3m._core.PolicyDriver(rt, "lookahead", lookahead=1)
        ids = [u3m.stable_id(f"param.w{i}") for i in range(4)]
        for i, tid in enumerate(ids):
            drv.add(tid, 64 << 10, f"param.w{i}", "param")
            rt.release(drv.acquire(tid, "write", "forward"))
        drv.end_step()  # the writes above are a step of their own: their recording is the trace
        self.assertEqual(drv.stats()["policies"], 1)
        for step in range(3):
            for tid in ids:
                lease = drv.acquire(tid, "read", "forward")
                rt.drain()  # let the prefetch the policy issued land before the next acquire
                rt.release(lease)
            drv.end_step()
        st, es = drv.stats(), rt.stats()
        self.assertEqual(st["policy"], "lookahead")
        # The trace's ops name tensors (not read or write): every read was its next op.
        self.assertEqual(st["accesses"], 16)
        self.assertEqual(st["policy_steps"], 12)
        self.assertEqual(st["diverged"], 0)
        self.assertGreater(es["prefetches"], 0)
        self.assertGreater(es["prefetch_hits"], 0)
        self.assertLessEqual(es["peak"]["device"], 160 << 10)
        # A different order leaves the trace: counted, and the next step's policy is new.
        for tid in reversed(ids):
            rt.release(drv.acquire(tid, "read", "forward"))
        drv.end_step()
        self.assertEqual(drv.stats()["diverged"], 1)
        self.assertEqual(drv.stats()["policies"], 2)
        # The Runtime knows the tensors by the driver's ids.
        self.assertEqual(rt.residency(drv.engine_id(ids[0]))["in_flight"], False)
        with self.assertRaisesRegex(u3m.EngineError, r"acquire\(tensor 7\): not found"):
            drv.acquire(7, "read", "forward")
        with self.assertRaisesRegex(u3m.InputError, "role: unknown tensor role 'weights'"):
            drv.add(8, 64, "x", "weights")
        with self.assertRaisesRegex(u3m.InputError, "phase: expected forward"):
            drv.acquire(ids[0], "read", "fwd")
        with self.assertRaisesRegex(u3m.InputError, "unknown policy 'nope'"):
            u3m._core.PolicyDriver(rt, "nope")

    def test_an_acquire_that_can_never_succeed_raises_at_once(self):
        # Issue 14's hang, from Python: the caller holds tensor 1 on the device, tensor 2
        # needs its room, and the host tier is too small to take 1 even if it were let go.
        # (A hang would fail this test by the test's timeout: no timed assertion here.)
        rt = u3m.Runtime(device_budget=96 << 10, host_budget=16 << 10)
        rt.add(1, 64 << 10)
        rt.add(2, 64 << 10)
        held = rt.acquire(1, "device", "write")
        with self.assertRaisesRegex(u3m.EngineError,
                                    r"acquire\(tensor 2\): out of memory: .*no progress is possible"):
            rt.acquire(2, "device", "write")
        rt.release(held)  # the refusal changed nothing: the held tensor is still whole
        self.assertEqual(rt.residency(1)["valid"], ["device"])
        self.assertEqual(rt.stats()["oom"], 1)

    def test_simulator_entry_point_returns_labelled_figures(self):
        r = u3m.simulate_training(model="tiny", hw="ascend-910b-32g", cards=1, seq_len=128, steps=2)
        # One schema: `u3m train sim --json`'s, with the label first.
        self.assertEqual(set(r), {"label", "scenario", "profile", "result"})
        self.assertIn("simulated", r["label"])
        self.assertEqual(r["scenario"]["policy"], "u3m")
        res = r["result"]
        self.assertTrue(res["fits"], res["why"])
        self.assertGreater(res["step_s"], 0)
        self.assertGreater(res["tokens_per_s"], 0)
        self.assertEqual(set(res["peak_bytes"]), {"device", "host", "ssd"})
        self.assertIn("u3m", u3m.train_policy_names())
        # Two identical cards simulated together: a figure per card, and (nothing shared is
        # contended) the same step as the symmetric model's one card of two.
        kw = dict(model="tiny", cards=2, seq_len=128, steps=2, policy="lru")
        sep = u3m.simulate_training(card_model="separate", **kw)["result"]
        sym = u3m.simulate_training(card_model="symmetric", **kw)["result"]
        self.assertEqual(sep["card_model"], "separate")
        self.assertEqual([c["card"] for c in sep["cards"]], [0, 1])
        self.assertEqual(len(sym["cards"]), 1)  # symmetric: the one card simulated
        self.assertAlmostEqual(sep["step_s"], sym["step_s"], delta=1e-9 * sym["step_s"])
        with self.assertRaisesRegex(u3m.InputError, "card_model"):
            u3m.simulate_training(model="tiny", card_model="both")

    def test_serving_simulator_entry_point(self):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        sample = os.path.join(root, "data/requests/samples/mooncake_conversation_head20.jsonl")
        r = u3m.simulate_serving(sample, model="llama3-8b", policy="hbm-only")
        self.assertIn("simulated", r["label"])
        self.assertEqual(r["finished"] + r["too_large"], r["requests"])
        self.assertGreater(r["ttft_ms"]["p50"], 0)
        self.assertLessEqual(r["ttft_ms"]["p50"], r["ttft_ms"]["p99"])
        self.assertIn("hbm-only", u3m.serve_policy_names())
        with self.assertRaisesRegex(u3m.InputError, "no-such-policy"):
            u3m.simulate_serving(sample, policy="no-such-policy")


if __name__ == "__main__":
    unittest.main()
