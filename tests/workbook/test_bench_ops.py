"""The backward ops of the benchmark (``bwd``, ``full``), their lab implementations, peers and
plots, on the CPU. Results are synthetic and live under tmp_path only."""

import sys
import types

import pytest
import torch

from rmsnorm_lab import reference
from rmsnorm_workbook import results
from rmsnorm_workbook.bench import impls as lab
from rmsnorm_workbook.analysis import tables
from rmsnorm_workbook.viz import sweeps as plots
from rmsnorm_lab import autograd as lab_autograd
from rmsnorm_workbook.bench import peers, runner
from rmsnorm_lab.settings import settings
from test_cli import cli
from test_results import SYNTHETIC_GPU, row

EPS = runner.EPS


def bwd_inputs(M=64, N=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, N, generator=g).to(torch.bfloat16).requires_grad_()
    w = (1 + 0.1 * torch.randn(N, generator=g)).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(M, N, generator=g).to(torch.bfloat16)
    return x, w, dy


def ref_impl(x, w):
    return reference.rms_norm(x, w, EPS)  # differentiable through torch's autograd


# --- the ops -------------------------------------------------------------------------------

def test_ops_and_sweeps():
    assert set(runner.OPS) == {"fwd", "bwd", "full", "fwd-add", "bwd-add", "fwd-fp8",
                               "fwd-fp8-static", "fwd-qk-rope", "bwd-qk-rope"}
    assert [runner.OPS[k].name for k in ("fwd-add", "bwd-add")] == ["fwd", "bwd"]
    assert (128, 4096) not in runner.OPS["fwd-add"].sweep
    assert (262144, 128) in runner.OPS["fwd-add"].sweep  # per-head rows
    for name in ("bwd", "full"):
        op = runner.OPS[name]
        assert op.name == name
        assert list(op.sweep) == runner.BWD_SWEEP
        assert list(op.quick_sweep) == runner.QUICK_FWD_SWEEP
        assert op.peers is peers.BACKWARD_PEERS
    assert runner.OPS["bwd"].prepare is not None and runner.OPS["full"].prepare is None
    assert runner.FWD.prepare is None


def test_cli_accepts_the_backward_ops(tmp_path):
    for op in ("bwd", "full"):
        p = cli("bench", "--op", op, "--out", str(tmp_path))
        assert p.returncode == 2 and "needs a CUDA GPU" in p.stderr, p.stderr
    assert not any(tmp_path.iterdir())


def test_bytes_moved():
    M, N = 64, 256
    inputs = bwd_inputs(M, N)
    assert runner.BWD.bytes_moved(inputs) == 3 * M * N * 2 + M * 4 + 2 * N * 2
    assert runner.FULL_OP.bytes_moved(inputs) == (2 * M * N * 2 + N * 2) + (3 * M * N * 2 + M * 4
                                                                            + 2 * N * 2)
    meta = (torch.empty(16384, 4096, dtype=torch.bfloat16, device="meta"),
            torch.empty(4096, dtype=torch.bfloat16, device="meta"))
    assert runner.BWD.bytes_moved(meta) == 3 * 16384 * 4096 * 2 + 16384 * 4 + 2 * 4096 * 2


def test_bwd_reference_is_dx_dw():
    x, w, dy = bwd_inputs()
    dx, dw = runner.BWD.reference((x, w, dy))
    assert dx.shape == x.shape and dx.dtype == torch.bfloat16 and not dx.requires_grad
    assert dw.shape == w.shape and dw.dtype == torch.bfloat16
    # against float64 autograd of the formula
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * w64
    gx, gw = torch.autograd.grad(y64, (x64, w64), dy.double())
    assert runner.rel_error((dx, dw), (gx.to(dx.dtype), gw.to(dw.dtype))) < 1e-2


def counting_ref_impl(calls: list):
    """``ref_impl`` that appends to ``calls`` each time it runs."""
    def counted(x, w):
        calls.append(1)
        return ref_impl(x, w)
    return counted


def test_bwd_prepare_runs_the_forward_once_and_run_repeats():
    calls = []
    counted = counting_ref_impl(calls)
    inputs = bwd_inputs()
    bound = runner.BWD.bind(counted, inputs)
    assert len(calls) == 1 and bound[1] is inputs[0] and bound[3] is inputs[2]
    a = runner.BWD.run(counted, bound)
    b = runner.BWD.run(counted, bound)  # the graph was retained
    assert len(calls) == 1
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert inputs[0].grad is None and inputs[1].grad is None  # autograd.grad, no accumulation


def test_full_runs_forward_and_backward_each_call():
    calls = []
    counted = counting_ref_impl(calls)
    inputs = bwd_inputs()
    runner.FULL_OP.run(counted, runner.FULL_OP.bind(counted, inputs))
    runner.FULL_OP.run(counted, runner.FULL_OP.bind(counted, inputs))
    assert len(calls) == 2


def refuse(x, w):
    raise NotImplementedError("N too wide for the fused kernel")


def wrong_dw(x, w):
    return ref_impl(x, w.detach() * 2).detach() * 0 + ref_impl(x, w.detach())  # dw None


def scaled(x, w):
    return 1.5 * ref_impl(x, w)  # gradients 1.5x too large


@pytest.mark.parametrize("opname", ["bwd", "full"])
@pytest.mark.parametrize("impl, status, why", [
    (ref_impl, "ok", ""),
    (lambda x, w: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, EPS), "ok", ""),
    (lambda x, w: reference.rms_norm(x, w, EPS).detach(), "fail", "no differentiable"),
    (scaled, "fail", "relative error"),
    (refuse, "skip", "NotImplementedError: N too wide"),
    (lambda x, w: x.detach().clone(), "fail", "no differentiable"),
])
def test_check_of_the_backward_ops(opname, impl, status, why):
    op = runner.OPS[opname]
    inputs = bwd_inputs()
    got, reason = runner.check(op, impl, inputs, op.reference(inputs))
    assert got == status, reason
    assert why in reason


def test_check_fails_a_backward_that_drops_dw():
    inputs = bwd_inputs()
    got, reason = runner.check(runner.BWD, wrong_dw, inputs, runner.BWD.reference(inputs))
    assert got == "fail"  # autograd.grad raises: w was not used in the graph


def test_backward_peers_available_here_pass_the_check():
    # built as the runner builds an op's peers (an uninstalled one's factory gives None)
    available = {name: make(EPS) for name, make in peers.BACKWARD_PEERS.items()}
    assert available["torch.native"] is not None and available["torch.compile"] is not None
    for name in ("torch.native", "torch.compile"):
        inputs = bwd_inputs()
        assert runner.check(runner.BWD, available[name], inputs,
                            runner.BWD.reference(inputs)) == ("ok", ""), name


@pytest.mark.parametrize("module, factory", [
    ("liger_kernel.ops.rms_norm", peers.liger_triton_bwd),
    ("liger_kernel.ops.cutedsl.ops.rms_norm", peers.liger_cutedsl_bwd),
])
def test_liger_backward_peers_do_not_overwrite_dy(monkeypatch, module, factory):
    seen = []

    class FakeFunction:
        @staticmethod
        def apply(*args):
            seen.append(args)
            return args[0]

    fake = types.ModuleType(module)
    fake.LigerRMSNormFunction = FakeFunction
    monkeypatch.setitem(sys.modules, module, fake)
    fn = factory(EPS)
    fn("x", "w")
    assert seen == [("x", "w", EPS, 0.0, "llama", False)]  # in_place=False


# --- lab implementations -------------------------------------------------------------------

def test_lab_impl_names():
    for op in ("bwd", "full"):
        assert list(lab.lab_impls(op)) == ["cute.fused", "cute.split", "cute.cluster",
                                           "cute.staged", "cute.auto", "cute.auto-pdl",
                                           "triton.split"]
        impls, problem = runner.lab_implementations(op)
        assert problem is None and set(impls) == set(lab.lab_impls(op))
    assert list(lab.lab_impls("fwd")) == ["cute.row", "cute.persistent", "cute.warp",
                                          "cute.cluster", "cute.staged", "cute.auto",
                                          "cute.auto-pdl", "triton.row"]
    assert list(lab.lab_impls("fwd-add")) == ["cute.auto+add", "triton.row+add"]
    assert list(lab.lab_impls("bwd-add")) == ["cute.auto+add", "triton.row+add", "cute.fused+add",
                                              "cute.split+add", "cute.cluster+add",
                                              "cute.staged+add"]
    with pytest.raises(ValueError, match="sideways"):
        lab.lab_impls("sideways")


def _snap_of(args, kwargs, at: int):
    """The settings snapshot an ``autograd`` forward_impl/backward_impl call received."""
    return kwargs["snap"] if "snap" in kwargs else args[at]


def test_pinned_toggles_hold_for_the_forward_and_the_backward(monkeypatch):
    seen = []
    real_fwd, real_bwd = lab_autograd.forward_impl, lab_autograd.backward_impl

    def spy(real, step):
        def call(*args, **kwargs):
            snap = _snap_of(args, kwargs, 6)
            seen.append((step, snap.backward, snap.pdl))
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(lab_autograd, "forward_impl", spy(real_fwd, "fwd"))
    monkeypatch.setattr(lab_autograd, "backward_impl", spy(real_bwd, "bwd"))
    assert settings.pdl
    fn = lab.pinned_backward("split", backend="torch", pdl=False)
    inputs = bwd_inputs()
    assert runner.check(runner.BWD, fn, inputs, runner.BWD.reference(inputs)) == ("ok", "")
    assert seen == [("fwd", "split", False), ("bwd", "split", False)]
    assert settings.pdl


@pytest.mark.parametrize("mode", ["fused", "split", "auto"])
def test_pinned_backward_mode_reaches_the_backward(monkeypatch, mode):
    seen = []
    real = lab_autograd.backward_impl

    def spy(*args, **kwargs):
        seen.append(_snap_of(args, kwargs, 10).backward)
        return real(*args, **kwargs)

    monkeypatch.setattr(lab_autograd, "backward_impl", spy)
    before = settings.backward
    fn = lab.pinned_backward(mode, backend="torch")  # the reference backend on the CPU
    inputs = bwd_inputs()
    assert runner.check(runner.BWD, fn, inputs, runner.BWD.reference(inputs)) == ("ok", "")
    assert seen == [mode] and settings.backward == before
    with torch.no_grad():  # no tape: the plain forward
        y = fn(inputs[0], inputs[1])
    assert y.grad_fn is None and torch.equal(y, reference.rms_norm(inputs[0].detach(),
                                                                   inputs[1].detach(), EPS,
                                                                   0.0, "llama"))


@pytest.mark.parametrize("mode", ["fused", "split"])
def test_pinned_backward_on_the_native_node_pins_at_the_forward(monkeypatch, mode):
    """Where the library would tape the call on the native node (which fixes its backward when
    the forward runs), the pinned function runs the forward under the override instead of
    swapping in a Python node."""
    from rmsnorm_lab import dispatch
    seen = []
    monkeypatch.setattr(dispatch, "native_node", lambda: object())

    def fake_rms_norm(x, w, eps=1e-6, *, backend=None, **kw):
        seen.append((settings.backward, backend, settings.pdl))
        return reference.rms_norm(x, w, eps)
    monkeypatch.setattr(lab, "rms_norm", fake_rms_norm)
    before = settings.backward
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, requires_grad=True)
    y = lab.pinned_backward(mode)(x, w)
    assert seen == [(mode, "cute", True)] and settings.backward == before
    lab.pinned_backward(mode, pdl=False)(x, w)
    assert seen[-1] == (mode, "cute", False) and settings.pdl
    assert y.grad_fn is not None and "RMSNormFunction" not in y.grad_fn.name()


def test_impl_stream_is_a_no_op_for_ops_without_prepare():
    with runner._impl_stream(runner.FWD) as s:
        assert s is None


# --- plots ---------------------------------------------------------------------------------

def bwd_rows():
    """Synthetic bwd/full/fwd rows: fused 1.2x faster than split, except one shape where fused
    was not measured."""
    rows = []
    shapes = [(1024, 4096), (16384, 4096), (16384, 1024), (16384, 16384)]
    base = {"cute.fused": 1.0, "cute.split": 1.2, "torch.native": 1.5}
    for op, scale in (("fwd", 0.4), ("bwd", 0.6), ("full", 1.1)):
        for impl, slow in base.items():
            for M, N in shapes:
                if impl == "cute.fused" and N == 16384:
                    continue
                t = scale * slow * M * N / 1e6 + 2
                gbps = 5 * M * N * 2 / t / 1e3
                for metric, unit, v in (("time", "us", t), ("bandwidth", "GBps", gbps)):
                    rows.append(row(op=op, impl=impl, path="graph", M=M, N=N, metric=metric,
                                    unit=unit, p20=0.95 * v, p50=v, p80=1.05 * v))
    for name, gbps in (("copy", 4000.0), ("copy2r1w", 4200.0)):
        rows.append(row(op="bwd", impl=name, path="graph", M=131072, N=4096, metric="bandwidth",
                        unit="GBps", p20=gbps - 10, p50=gbps, p80=gbps + 10))
    return rows


@pytest.fixture
def bwd_df(tmp_path):
    rs = bwd_rows()
    for op in ("fwd", "bwd", "full"):
        results.write([r for r in rs if r["op"] == op], tmp_path / SYNTHETIC_GPU / f"{op}.csv")
    return results.load_all(tmp_path)


def test_bandwidth_plots_for_bwd_draw_the_2r1w_ceiling(bwd_df):
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    plots.plot_bandwidth_vs_M(bwd_df, "bwd", N=4096, ax=ax)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "copy ceiling (read 2, write 1), measured" in labels and "cute.fused" in labels
    ax = Figure().subplots()
    plots.plot_bandwidth_vs_N(bwd_df, "full", M=16384, ax=ax)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert not any("measured" in t for t in labels)  # full: no ceiling
    table = tables.bandwidth_table(bwd_df, "bwd")
    assert "% of copy2r1w" in table.columns.get_level_values(0)
    assert table["% of copy2r1w"].notna().any().any()


def test_time_ratio_and_its_plot(bwd_df):
    from matplotlib.figure import Figure

    r = tables.time_ratio(bwd_df, "bwd")
    assert list(r.index) == [(16384, 1024), (1024, 4096), (16384, 4096)]  # not N=16384
    assert r["ratio"].round(6).tolist() == pytest.approx(
        [(0.6 * 1.2 * M * N / 1e6 + 2) / (0.6 * M * N / 1e6 + 2) for M, N in r.index])
    assert (r["lo"] < r["ratio"]).all() and (r["hi"] > r["ratio"]).all()
    ax = plots.plot_time_ratio(bwd_df, ax=Figure().subplots())
    assert len(ax.patches) == 3
    empty = tables.time_ratio(bwd_df, "bwd", slower="nobody")
    assert empty.empty
    plots.plot_time_ratio(bwd_df, ax=Figure().subplots(), slower="nobody")


def test_report_renders_backward_figures(tmp_path):
    res, out = tmp_path / "results", tmp_path / "report"
    rs = bwd_rows()
    for op in ("bwd", "full"):
        results.write([r for r in rs if r["op"] == op], res / SYNTHETIC_GPU / f"{op}.csv")
    p = cli("report", "--no-bench", "--results", str(res), "--out", str(out))
    assert p.returncode == 0, p.stderr
    names = {f.name for f in out.glob("*.png")}
    assert {f"{SYNTHETIC_GPU}-bwd-bandwidth-vs-M.png", f"{SYNTHETIC_GPU}-full-bandwidth-vs-N.png"} \
        <= names
    assert "% of copy2r1w" in (out / "report.md").read_text()


# --- the sweep's control flow, with the CUDA timers replaced by CPU stand-ins ---------------

class _Bar:
    def __init__(self):
        self.lines = []

    def write(self, text):
        self.lines.append(text)

    def set_postfix_str(self, text):
        pass

    def update(self, n=1):
        pass


@pytest.fixture
def cpu_sweep(monkeypatch):
    """A ``_Sweep`` whose timers call the function a few times on the CPU and return fixed
    quantiles; ``graph_fails`` lists implementations whose 'capture' raises."""
    import contextlib

    from rmsnorm_workbook.bench import timing

    calls = {"graph": [], "streams": []}
    graph_fails = set()

    def fake_eager(fn, rep_ms):
        fn()
        fn()
        return timing.Quantiles(9.0, 10.0, 11.0)

    def fake_graph(stream, fn, replays, calls_multiple):
        calls["streams"].append(stream)
        out = fn()
        if getattr(fn, "impl_name", None) in graph_fails:
            raise RuntimeError("operation not permitted when stream is capturing")
        calls["graph"].append(out)
        return timing.Quantiles(4.0, 5.0, 6.0)

    def fake_mem(fn):
        fn()
        return timing.Quantiles(1.0, 1.0, 1.0)

    def fake_host(fn, repeats):
        fn()
        return timing.Quantiles(20.0, 21.0, 22.0)

    @contextlib.contextmanager
    def fake_stream(op):
        yield ("side-stream" if op.prepare is not None else None)

    monkeypatch.setattr(runner, "eager_time_us", fake_eager)
    monkeypatch.setattr(runner, "peak_mem_mib", fake_mem)
    monkeypatch.setattr(runner, "host_time_us", fake_host)
    monkeypatch.setattr(runner, "_impl_stream", fake_stream)
    monkeypatch.setattr(runner, "_recover", lambda: None)

    def make(opname, impls):
        op = runner.OPS[opname]
        op = runner.dataclasses.replace(op, make_inputs=lambda M, N, dtype: bwd_inputs(M, N))
        sweep = runner._Sweep.__new__(runner._Sweep)
        sweep.op, sweep.impls, sweep.budget = op, impls, runner.QUICK
        sweep.prov = {c: row()[c] for c in results.PROVENANCE_COLUMNS}
        sweep.bar, sweep.out, sweep.l2_bytes = _Bar(), runner.Outcome(), 1  # one input set

        def graph(fn, *, replays, calls_multiple, stream=None):
            return fake_graph(stream, fn, replays, calls_multiple)
        monkeypatch.setattr(runner, "graph_time_us", graph)
        return sweep
    return make, calls, graph_fails


def test_sweep_bwd_records_rows_failures_and_skips(cpu_sweep, tmp_path):
    make, calls, graph_fails = cpu_sweep
    impls = {"torch.native": lambda x, w: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, EPS),
             "cute.fused": refuse, "cute.split": scaled,
             "triton.split": lambda x, w: reference.rms_norm(x, w, EPS).detach()}
    sweep = make("bwd", impls)
    sweep.shape(64, 256)
    sweep.host(32, 256)
    out = sweep.out
    # the impl's graph timer got its stream; the same-shape ceiling's, the current one
    assert calls["streams"] == ["side-stream", None]
    dx, dw = calls["graph"][0]  # what was 'captured' is the backward: (dx, dw)
    assert dx.shape == (64, 256) and dw.shape == (256,)
    got = {(r["impl"], r["path"], r["metric"]) for r in out.rows}
    assert got == {("torch.native", p, m) for p, m in (("eager", "time"), ("eager", "bandwidth"),
                                                      ("graph", "time"), ("graph", "bandwidth"),
                                                      ("eager", "peak_mem"), ("host", "host"))
                   } | {("copy2r1w.shape", "graph", m) for m in ("time", "bandwidth")}
    assert {r["op"] for r in out.rows} == {"bwd"}
    bw = next(r for r in out.rows if r["path"] == "graph" and r["metric"] == "bandwidth"
              and r["impl"] == "torch.native")
    assert bw["p50"] == pytest.approx((3 * 64 * 256 * 2 + 64 * 4 + 2 * 256 * 2) / 5.0 / 1e3)
    ceiling = next(r for r in out.rows if r["impl"] == "copy2r1w.shape"
                   and r["metric"] == "bandwidth")
    assert (ceiling["M"], ceiling["N"]) == (64, 256)  # read two, write one, at the swept shape
    assert ceiling["p50"] == pytest.approx(3 * 64 * 256 * 2 / 5.0 / 1e3)
    assert any("cute.fused at 64x256: NotImplementedError" in s for s in out.skipped)
    assert any("cute.split at 64x256 not timed: relative error" in f for f in out.failures)
    assert any("triton.split at 64x256 not timed: wrong output" in f
               or "no differentiable" in f for f in out.failures)
    results.write(out.rows, tmp_path / "bwd.csv")  # valid results rows


def test_sweep_keeps_eager_time_when_the_graph_capture_fails(cpu_sweep):
    make, calls, graph_fails = cpu_sweep
    native = lambda x, w: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, EPS)  # noqa: E731

    sweep = make("full", {"torch.native": native})
    real_rotating = runner.rotating

    def tagging_rotating(call, sets):
        f = real_rotating(call, sets)
        f.impl_name = "torch.native"
        return f
    import unittest.mock as mock
    graph_fails.add("torch.native")
    with mock.patch.object(runner, "rotating", tagging_rotating):
        sweep.shape(64, 256)
    paths = {(r["path"], r["metric"]) for r in sweep.out.rows}
    assert ("eager", "time") in paths and ("eager", "peak_mem") in paths
    assert not any(p == "graph" for p, _ in paths)
    assert any("CUDA-graph capture/replay raised RuntimeError" in f for f in sweep.out.failures)
    assert calls["streams"] == [None]  # full: no prepare, the standard timers


def test_checkpoint_writes_rows_so_far(tmp_path):
    prov = {c: row()[c] for c in results.PROVENANCE_COLUMNS}
    from rmsnorm_workbook.bench import timing
    rows = [runner.make_row(prov, "bwd", "cute.fused", "graph", 8, 16, torch.bfloat16, "time",
                            timing.Quantiles(1.0, 2.0, 3.0))]
    path = tmp_path / "h200" / "bwd.csv"
    runner._checkpoint([], path)
    assert not path.exists()
    runner._checkpoint(rows, path)
    assert len(results.load(path)) == 1
