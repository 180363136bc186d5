"""``bench --op model`` on the CPU: tiny transformers models built from configs (nothing
downloaded), every norm choice applied and checked against transformers' own, the whole
per-choice loop with the CUDA timers replaced by stand-ins (rows written and read back), the
decode step's static cache, the capture entry, and the command line without a GPU
(tests/workbook/test_model_share.py reads a capture's export)."""

import sys
import types

import pytest
import torch

transformers = pytest.importorskip("transformers")

from rmsnorm_workbook import results  # noqa: E402
from rmsnorm_workbook.bench import model as bench_model  # noqa: E402
from rmsnorm_workbook.bench import model_build as mb  # noqa: E402
from rmsnorm_workbook.bench import model_steps as steps  # noqa: E402
from rmsnorm_workbook.bench.timing import Quantiles  # noqa: E402
from rmsnorm_lab.models.patch import PatchedRMSNorm  # noqa: E402
from rmsnorm_workbook.results import provenance  # noqa: E402
from test_cli import cli  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
            vocab_size=128)
HEAD_DIM = {"llama": {}, "qwen3": {"head_dim": 16}}
#: transformers norms of a 2-layer model: two a layer and the final one; Qwen3 adds q/k norms
NORMS = {"llama": 5, "qwen3": 9}
SIZES = steps.Sizes(layers=2, batch=2, seq=16, decode_batch=3, cache_len=64, decode_at=32)


def tiny(arch):
    return {**TINY, **HEAD_DIM[arch]}


def build(arch, choice="shipped"):
    model = mb.build_model(arch, SIZES.layers, device="cpu", **tiny(arch))
    mb.apply_choice(model, choice)
    return model


@pytest.fixture
def no_liger(monkeypatch):
    """As on a machine without Liger-Kernel, wherever the tests run."""
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", None)


# --- models and norm choices -----------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tiny_models_build_in_bf16_with_the_same_weights_for_the_same_seed(arch):
    a, b = build(arch), build(arch)
    assert type(a).__name__ == {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
    assert a.config.num_hidden_layers == 2 and a.config.hidden_size == 64
    assert a.config._attn_implementation == "sdpa"
    assert {p.dtype for p in a.parameters()} == {torch.bfloat16}
    norms = mb.transformers_norms(a)
    assert len(norms) == NORMS[arch]
    assert all(not torch.all(m.weight == 1) for _, m in norms)  # spread, so choices differ
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name
    other = mb.build_model(arch, 2, device="cpu", seed=1, **tiny(arch))
    assert not torch.equal(other.lm_head.weight, a.lm_head.weight)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_torch_swap_leaves_no_transformers_norm_and_keeps_the_weights(arch):
    model = build(arch)
    before = {name: (m.weight, m.variance_epsilon) for name, m in mb.transformers_norms(model)}
    keys = list(model.state_dict())
    swapped = mb.swap_torch_norms(model)
    assert sorted(swapped) == sorted(before)
    assert mb.transformers_norms(model) == []
    for name, (weight, eps) in before.items():
        norm = model.get_submodule(name)
        assert type(norm) is torch.nn.RMSNorm
        assert norm.weight is weight and norm.eps == eps
    assert list(model.state_dict()) == keys


def test_torch_swap_refuses_a_one_plus_w_norm():
    gemma = transformers.GemmaForCausalLM(transformers.GemmaConfig(**TINY, head_dim=16,
                                                                   num_hidden_layers=1))
    with pytest.raises(ValueError, match="1 \\+ w"):
        mb.swap_torch_norms(gemma)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_every_choice_computes_what_shipped_computes(arch, no_liger):
    """On the CPU the lab's norm runs its reference math, which rounds as transformers' does:
    the same logits bit for bit, carried residual too; torch's norm rounds once where
    transformers rounds twice, so its logits differ, by far less than the limit."""
    ids = mb.check_ids(TINY["vocab_size"], "cpu", (2, 24))
    reference = mb.prefill_logits(build(arch), ids)
    diffs = {}
    for choice in ("torch", "lab", "lab+carry") + QK[arch]:
        model = mb.build_model(arch, 2, device="cpu", **tiny(arch))
        note = mb.apply_choice(model, choice)
        if choice.startswith("lab"):
            assert note.startswith(f"{NORMS[arch]} norms patched")
            patched = [m for m in model.modules() if isinstance(m, PatchedRMSNorm)]
            assert len(patched) == NORMS[arch]
        agreed = mb.agreement(mb.prefill_logits(model, ids), reference)
        assert agreed.ok, (choice, str(agreed))
        diffs[choice] = agreed.max_abs_diff
    assert diffs["lab"] == diffs["lab+carry"] == diffs.get("lab+qk", 0.0) == 0.0
    if not QK[arch]:
        with pytest.raises(mb.ChoiceSkipped, match="no attention with per-head q/k norms"):
            mb.apply_choice(build(arch), "lab+qk")
    assert diffs["torch"] > 0.0  # the check sees a rounding difference, and lets it pass
    with pytest.raises(mb.ChoiceSkipped, match="liger_kernel does not import"):
        mb.apply_choice(build(arch), "liger")


def test_the_check_fails_a_model_whose_norm_is_wrong():
    ids = mb.check_ids(TINY["vocab_size"], "cpu", (2, 24))
    reference = mb.prefill_logits(build("llama"), ids)
    model = build("llama", "torch")
    with torch.no_grad():
        for name in [n for n, m in model.named_modules() if isinstance(m, torch.nn.RMSNorm)]:
            model.get_submodule(name).weight.fill_(1.0)  # a swap that lost the weights
    agreed = mb.agreement(mb.prefill_logits(model, ids), reference)
    assert not agreed.ok and agreed.max_abs_diff > 2 * agreed.limit
    assert "shipped's" in str(agreed)
    model = build("llama", "lab")
    model.model.norm.forward = lambda x: x  # a final norm that does nothing
    assert not mb.agreement(mb.prefill_logits(model, ids), reference).ok
    nan = mb.agreement(torch.full_like(reference, float("nan")), reference)
    assert not nan.ok


def test_carry_refused_is_a_skip():
    gemma2 = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        **TINY, head_dim=16, num_hidden_layers=1))
    with pytest.raises(mb.ChoiceSkipped, match="norms around"):
        mb.apply_choice(gemma2, "lab+carry")


def _fake_liger(monkeypatch, patches_norms=True):
    """A liger_kernel whose instance patch behaves as Liger's: it rebinds the norm class in
    transformers' modeling module (for models built later), adds a name there, and binds its own
    forward to the instance's norms."""
    calls = []

    def liger_forward(self, x):
        return x * self.weight

    liger_forward.__module__ = "liger_kernel.transformers.rms_norm"

    def apply(model, **kwargs):
        calls.append(kwargs)
        modeling = sys.modules[type(model).__module__]
        modeling.LlamaRMSNorm = type("LigerRMSNorm", (torch.nn.Module,), {})
        modeling.liger_added = True
        if patches_norms:
            for _, m in mb.transformers_norms(model):
                m.forward = types.MethodType(liger_forward, m)

    package = types.ModuleType("liger_kernel")
    module = types.ModuleType("liger_kernel.transformers")
    module._apply_liger_kernel_to_instance = apply
    monkeypatch.setitem(sys.modules, "liger_kernel", package)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", module)
    return calls


def test_liger_patches_only_the_instance_and_only_its_norms(monkeypatch):
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaRMSNorm
    calls = _fake_liger(monkeypatch)
    model = build("llama")
    assert mb.apply_choice(model, "liger") == f"{NORMS['llama']} modules on Liger's forward"
    assert calls == [dict(rms_norm=True, swiglu=False, rope=False, cross_entropy=False,
                          fused_linear_cross_entropy=False)]
    assert modeling_llama.LlamaRMSNorm is original and not hasattr(modeling_llama, "liger_added")
    assert all(type(m) is original for _, m in mb.transformers_norms(build("llama")))
    _fake_liger(monkeypatch, patches_norms=False)
    with pytest.raises(RuntimeError, match="patched no module"):
        mb.apply_choice(build("llama"), "liger")


def test_impl_names_round_trip_and_bad_ones_are_refused():
    for arch in mb.ARCHS:
        for choice in mb.CHOICES:
            assert mb.parse_impl(mb.impl_name(arch, choice)) == (arch, choice, False)
        for choice in mb.COMPILE_CHOICES:
            name = mb.impl_name(arch, choice, compiled=True)
            assert name == f"{arch}.compile.{choice}"
            assert mb.parse_impl(name) == (arch, choice, True)
    for bad in ("gpt2.lab", "llama.fast", "llama.compile.shipped", "llama", "lab"):
        with pytest.raises(ValueError, match="expected <arch>.<choice>"):
            mb.parse_impl(bad)


# --- workloads -------------------------------------------------------------------------------

def test_workloads_have_their_op_and_tokens_and_train_leaves_no_gradient():
    model = build("llama", "lab")
    seen = {}
    for workload in steps.WORKLOADS:
        step = steps.make_step(workload, model, SIZES)
        out = step.fn()
        seen[workload] = (step.op, step.M, None if out is None else tuple(out.shape))
        if workload == "train":
            assert model.training and all(p.grad is None for p in model.parameters())
        else:
            assert not model.training
    assert seen == {"train": ("full", 32, None), "prefill": ("fwd", 32, (2, 1, 128)),
                    "decode": ("fwd", 3, (3, 1, 128))}
    with pytest.raises(ValueError, match="unknown workload"):
        steps.make_step("generate", model, SIZES)


class _HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every op that makes a CUDA device wait for the host or the host for the device
    (a value read back, a data-dependent shape): none may be in a step a CUDA graph captures."""
    READS = ("_local_scalar_dense", "is_nonzero", "nonzero", "masked_select", "unique")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(r in str(func) for r in self.READS):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("choice", ["shipped", "torch", "lab+carry"])
def test_decode_step_writes_one_slot_and_reads_nothing_back(choice):
    """Replayed from a CUDA graph thousands of times, the step must write the same cache slot
    every time (transformers 5's static cache advances a counter per call) and must never
    read a device value on the host (a capture would fail)."""
    model = build("llama", choice)
    step = steps.make_step("decode", model, SIZES)
    step.fn()  # allocates the cache (transformers 5: its query offset reads 0 until then)
    second = step.fn()
    for _ in range(SIZES.cache_len + 5):  # past the cache's end, were the position advancing
        out = step.fn()
    torch.testing.assert_close(out, second, rtol=0, atol=0)
    with _HostReads() as reads:
        step.fn()
    assert reads.seen == []
    cache = next(c.cell_contents for c in step.fn.__closure__
                 if type(c.cell_contents).__name__ == "StaticCache")
    for layer in cache.layers:
        written = layer.keys.abs().sum(dim=(0, 1, 3)).nonzero().flatten().tolist()
        assert written == [SIZES.decode_at]
    for counter in steps.write_positions(cache):
        assert int(counter) == SIZES.decode_at + 1


# --- the whole loop, timers stood in ---------------------------------------------------------

def _stand_in(value, seen, name):
    def timer(fn, **kwargs):
        out = fn()  # the timed function must be the model's step
        seen.append((name, None if out is None else tuple(out.shape), tuple(sorted(kwargs))))
        return Quantiles(value, value, value * 1.5)
    return timer


def _stand_in_capture(seen):
    def capture(fn, **kwargs):
        out = fn()  # the captured function must be the model's decode step
        seen.append(("capture", tuple(out.shape), tuple(sorted(kwargs))))
        return object()  # a stand-in graph: only passed back to the graph timer
    return capture


def _stand_in_graphs(seen):
    def graphs(captured, **kwargs):
        seen.append(("graphs", tuple(captured), tuple(sorted(kwargs))))
        return {impl: Quantiles(200.0, 200.0, 300.0) for impl in captured}
    return graphs


def _stand_in_hosts(seen):
    def hosts(tasks, **kwargs):
        shapes = {tuple(task.fn().shape) for task in tasks.values()}  # the decode steps
        seen.append(("hosts", tuple(tasks), tuple(sorted(kwargs))))
        assert shapes == {(3, 1, 128)} and {task.n for task in tasks.values()} == {1}
        return {impl: Quantiles(100.0, 100.0, 150.0) for impl in tasks}
    return hosts


def _stand_ins(seen):
    return bench_model.Timers(lambda: None, _stand_in(300.0, seen, "eager"),
                              _stand_in(100.0, seen, "host"), _stand_in(64.0, seen, "peak"),
                              _stand_in_capture(seen), _stand_in_graphs(seen),
                              _stand_in_hosts(seen))


TINY_BUDGET = bench_model.Budget(event_samples=1, event_min_ms=1, wall_samples=2,
                                 wall_sample_ms=1, host_ms=1, decode_rounds=2, graph_replays=1)
#: what runs of each architecture: lab+qk only where attention has per-head q/k norms (Qwen3)
QK = {"llama": (), "qwen3": ("lab+qk",)}
EAGER_IMPLS = [f"{a}.{c}" for a in mb.ARCHS
               for c in ("shipped", "torch", "lab", "lab+carry") + QK[a]]
COMPILED_IMPLS = [f"{a}.compile.{c}{k}" for a in mb.ARCHS for k in ("", "@decompose")
                  for c in ("torch", "lab") + QK[a] if (c, k) != ("torch", "@decompose")]


def _run(tmp_path, seen):
    run = bench_model._Run(SIZES, TINY_BUDGET, _stand_ins(seen), provenance.collect())
    path = tmp_path / "cpu" / "model.csv"
    bench_model.run_models(run, path, with_compile=True, device="cpu", **TINY)
    return run, path


def test_the_whole_loop_makes_valid_rows_of_every_choice_and_workload(tmp_path, monkeypatch,
                                                                       no_liger):
    monkeypatch.setattr(torch, "compile", lambda model: model)  # Inductor on a CPU: minutes
    seen = []
    run, path = _run(tmp_path, seen)
    assert run.out.failures == []
    why = {s.split(":")[0]: s for s in run.out.skipped}
    assert sorted(why) == sorted([f"{a}.liger" for a in mb.ARCHS] + [
        "llama.lab+qk", "llama.compile.lab+qk", "llama.compile.lab+qk@decompose"])
    assert all(("liger_kernel does not import here" if ".liger" in k else
                "no attention with per-head q/k norms") in v for k, v in why.items())
    written = results.write(run.out.rows, path)
    df = results.load(written)
    assert len(df) == len(run.out.rows) and set(df["dtype"]) == {"bf16"}
    assert set(df["N"]) == {TINY["hidden_size"]}
    got = {(r.impl, r.op, r.M, r.path, r.metric) for r in df.itertuples()}
    train = {("full", 32, "eager", m) for m in ("time", "wall", "peak_mem")} | {
        ("full", 32, "host", "host")}
    prefill = {("fwd", 32, "eager", "time"), ("fwd", 32, "eager", "wall"),
               ("fwd", 32, "host", "host")}
    decode = {("fwd", 3, "eager", "time"), ("fwd", 3, "eager", "wall"),
              ("fwd", 3, "host", "host"), ("fwd", 3, "graph", "time")}
    expected = {(i, *k) for i in EAGER_IMPLS for k in train | prefill | decode}
    expected |= {(i, *k) for i in COMPILED_IMPLS for k in train | prefill}
    assert got == expected
    assert len(df) == len(expected)  # one row each
    assert set(df[df["metric"] == "wall"]["unit"]) == {"us"}
    assert (df[df["metric"] == "wall"]["p50"] > 0).all()  # the real wall-clock loop ran
    peak = df[df["metric"] == "peak_mem"]
    assert set(peak["op"]) == {"full"} and set(peak["p50"]) == {64.0}
    # each stand-in timed a real step: the prefill's and decode's logits, the train step's None
    outputs = {(name, shape) for name, shape, _ in seen}
    assert ("eager", None) in outputs and ("eager", (2, 1, 128)) in outputs
    assert ("capture", (3, 1, 128)) in outputs and ("peak", None) in outputs
    assert {shape for name, shape in outputs if name == "capture"} == {(3, 1, 128)}
    # every choice's decode graph, kept until its architecture's last choice, timed together
    # once per architecture, after the architecture's other rows
    per_arch = [tuple(i for i in EAGER_IMPLS if i.startswith(f"{a}.")) for a in mb.ARCHS]
    timed = [(keys, kw) for name, keys, kw in seen if name == "graphs"]
    assert timed == [(keys, ("replays", "rounds")) for keys in per_arch]
    hosted = [(keys, kw) for name, keys, kw in seen if name == "hosts"]
    assert hosted == [(keys, ("repeats", "warmup")) for keys in per_arch]
    assert not any(name == "host" and shape == (3, 1, 128) for name, shape, _ in seen)
    graph_rows = [r for r in run.out.rows if r["path"] == "graph"]
    assert {r["p50"] for r in graph_rows} == {200.0}
    decode_host = [r for r in run.out.rows if r["path"] == "host" and r["M"] == 3]
    assert {r["p50"] for r in decode_host} == {100.0}
    # the decode rows of an architecture follow its other rows, after its last choice
    first_graph = next(i for i, r in enumerate(run.out.rows) if r["path"] == "graph")
    assert all(r["impl"].startswith("llama.") for r in run.out.rows[:first_graph])
    assert run.out.rows[first_graph - 1]["impl"] == "llama.lab+carry"
    assert {kw for name, _, kw in seen if name == "eager"} == {("rep_ms", "warmup_ms")}
    assert {kw for name, _, kw in seen if name == "host"} == {("n", "repeats", "warmup")}


def test_a_choice_that_disagrees_is_a_failure_and_a_crashing_timer_costs_only_its_row(
        tmp_path, monkeypatch, no_liger):
    monkeypatch.setattr(torch, "compile", lambda model: model)
    honest = mb.swap_torch_norms

    def broken_swap(model):  # the right modules, their weights lost
        names = honest(model)
        for name in names:
            norm = model.get_submodule(name)
            norm.weight = torch.nn.Parameter(torch.ones_like(norm.weight))
        return names

    def capture_fails(fn, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(mb, "swap_torch_norms", broken_swap)
    seen = []
    run = bench_model._Run(SIZES, TINY_BUDGET, _stand_ins(seen)._replace(capture=capture_fails),
                           provenance.collect())
    bench_model.run_models(run, tmp_path / "model.csv", with_compile=True, device="cpu", **TINY)
    impls = {r["impl"] for r in run.out.rows}
    assert impls == {f"{a}.{c}" for a in mb.ARCHS
                     for c in ("shipped", "lab", "lab+carry") + QK[a]} | {
        i for i in COMPILED_IMPLS if ".compile.torch" not in i}  # torch's disagreed,
    # eager and compiled: not timed
    disagree = [f for f in run.out.failures if "disagrees" in f]
    assert len(disagree) == 4 and all("torch" in f and "limit" in f for f in disagree)
    capture = [f for f in run.out.failures if "graph capture" in f]
    assert len(capture) == 7 and all("stream is capturing" in f for f in capture)
    assert not any(r["path"] == "graph" for r in run.out.rows)
    assert not any(name == "graphs" for name, _, _ in seen)  # nothing captured: nothing timed
    assert any(r["impl"] == "llama.lab" and r["M"] == 3 and r["path"] == "host"
               for r in run.out.rows)  # the decode step's other timers still ran
    assert len(run.out.failures) == 11  # 4 disagreements, 7 captures


def _on_the_cpu(monkeypatch):
    """The GPU-facing entry points driven on the CPU: a CUDA that "is available" but whose
    synchronize, profiler and NVTX calls are recorded, and models built tiny on the CPU."""
    prov = provenance.collect()
    events = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stand-in")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("sync"))
    monkeypatch.setattr(torch.cuda, "cudart", lambda: types.SimpleNamespace(
        cudaProfilerStart=lambda: events.append("start"),
        cudaProfilerStop=lambda: events.append("stop")))
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: events.append(f"push {name}"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: events.append("pop"))
    monkeypatch.setattr(provenance, "collect", lambda *a: prov)
    build = mb.build_model
    monkeypatch.setattr(mb, "build_model", lambda arch, layers, **kw: build(
        arch, layers, **{**kw, "device": "cpu"}, **tiny(arch)))
    monkeypatch.setattr(bench_model, "QUICK", SIZES)
    return events


def test_bench_model_writes_the_quick_file_without_the_compile_part(tmp_path, monkeypatch,
                                                                    no_liger):
    _on_the_cpu(monkeypatch)
    seen = []
    monkeypatch.setattr(bench_model, "CUDA_TIMERS", _stand_ins(seen))
    monkeypatch.setattr(bench_model, "QUICK_BUDGET", TINY_BUDGET)
    outcome = bench_model.bench_model(out=tmp_path, quick=True)
    gpu = provenance.collect()["gpu"]
    assert outcome.path == tmp_path / gpu / "model-quick.csv" and outcome.failures == []
    df = results.load(outcome.path)
    assert set(df["impl"]) == set(EAGER_IMPLS)  # quick: no compile part unless asked
    assert len(df) == len(EAGER_IMPLS) * 11


def test_capture_runs_each_step_in_its_range_with_the_gpu_drained_inside(monkeypatch):
    events = _on_the_cpu(monkeypatch)
    bench_model.capture("qwen3.lab+carry:prefill", quick=True, warmup=2, steps=3)
    captured = events[events.index("start"):]
    assert captured == ["start"] + ["push step", "sync", "pop"] * 3 + ["stop"]
    assert events[:events.index("start")] == ["sync"]  # after the warm-up, before the capture
    with pytest.raises(ValueError, match="workload one of"):
        bench_model.capture("llama.lab:generate", quick=True, warmup=0, steps=1)
    with pytest.raises(ValueError, match="expected <arch>.<choice>"):
        bench_model.capture("llama.fast:train", quick=True, warmup=0, steps=1)


# --- the command line ------------------------------------------------------------------------

def test_bench_model_without_a_gpu_exits_2_with_one_line(tmp_path):
    p = cli("bench", "--op", "model", "--out", str(tmp_path))
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0]
    assert not any(tmp_path.iterdir())


def test_bench_model_without_transformers_is_one_line_before_any_work(tmp_path, monkeypatch,
                                                                       capsys):
    from rmsnorm_workbook.__main__ import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert main(["bench", "--op", "model", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: bench --op model builds transformers")
    assert not (tmp_path / "out").exists()
    assert main(["bench", "--op", "fwd", "--no-compile"]) == 2
    assert "apply to --op model only" in capsys.readouterr().err


def test_capture_entry_without_a_gpu_says_so():
    import os
    import subprocess

    from test_cli import REPO
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "rmsnorm_workbook.bench.model", "--capture", "llama.lab:train"]
    p = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "needs a CUDA GPU" in p.stdout + p.stderr


def test_a_failing_graph_timer_costs_the_graph_rows_only(tmp_path, monkeypatch, no_liger):
    monkeypatch.setattr(torch, "compile", lambda model: model)

    def replay_fails(captured, **kwargs):
        raise RuntimeError("an illegal memory access was encountered")
    seen = []
    run = bench_model._Run(SIZES, TINY_BUDGET, _stand_ins(seen)._replace(graphs=replay_fails),
                           provenance.collect())
    bench_model.run_models(run, tmp_path / "model.csv", with_compile=False, device="cpu", **TINY)
    assert run.out.failures == ["decode graph time: RuntimeError: an illegal memory access "
                                "was encountered"] * len(mb.ARCHS)
    assert not any(r["path"] == "graph" for r in run.out.rows)
    assert {r["impl"] for r in run.out.rows} == set(EAGER_IMPLS)
    assert any(r["path"] == "host" and r["M"] == 3 for r in run.out.rows)  # the other timers ran
    assert run.decode == {}  # the steps, their graphs and the models they held, let go
