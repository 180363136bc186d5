"""The native call memo (``CallMemo`` in csrc/native_node.cpp) and the fast gate in front of it
(``dispatch.fast_call``, tried first by ``api.rms_norm``), on the CPU with stand-in kernels.

The memo hands a repeated call its planned Launch (training or inference) without entering
Python, so the tests check what must *not* hit (any change of what a plan depends on), that a
hit is the same call the Python path makes, and that every toggle routing calls elsewhere
closes the gate.
"""

import pytest
import torch

pytest.importorskip("tvm_ffi")

from native_standins import EPS, StandIns, file_launch, functions, make_launch  # noqa: E402
from rmsnorm_lab import api, dispatch, lab, settings  # noqa: E402
from rmsnorm_lab.cute.plan.auto import AUTO_FEW_ROWS_MAX, AUTO_FEWEST_ROWS_MAX  # noqa: E402
from rmsnorm_lab.native import build as native_node  # noqa: E402
from rmsnorm_lab.native import launch as native_launch  # noqa: E402


@pytest.fixture(scope="module")
def native():
    return native_node.load()


@pytest.fixture
def memo(native):
    m = native.CallMemo(16, 2048, 511)
    m.settings = 7
    return m


def planned(native, memo, x, w, eps=EPS, offset=0.0, mode="llama", k=None):
    """File a stand-in Launch for this call, as a new call does (the call runs once, and its
    log is then cleared); returns the stand-ins' log holder and the launch."""
    k = k or StandIns()
    launch = make_launch(native, functions(k), x, w is not None, eps=eps, offset=offset)
    assert file_launch(memo, x, w, eps, offset, mode, launch, memo.settings)
    k.log.clear()
    return k, launch


def test_a_hit_is_the_planned_launch_and_records_the_node(native, memo):
    x = torch.randn(6, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    assert memo.call(x, w, EPS, 0.0, "llama") is None  # unknown: Python takes it
    k, launch = planned(native, memo, x, w)
    assert memo.find(x, w, EPS, 0.0, "llama") is launch
    y = memo.call(x, w, EPS, 0.0, "llama")
    assert y.grad_fn.name() == "RMSNormNativeBackward" and len(k.calls("forward")) == 1
    y.backward(torch.ones(6, 8))
    assert len(k.calls("backward")) == 1 and x.grad is not None and w.grad is not None
    expected = native.apply(x, w, launch)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_every_input_of_a_plan_is_in_the_key(native, memo):
    x = torch.randn(6, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    planned(native, memo, x, w)
    storage = torch.randn(6 * 8 + 1)
    others = {
        "width": (torch.randn(3, 16, requires_grad=True), w),
        "row stride": (torch.randn(6, 16)[:, :8].requires_grad_(), w),
        "many rows": (torch.randn(2049, 8, requires_grad=True), w),  # auto's one M threshold
        "dtype": (x.detach().double().requires_grad_(), w),
        "weight dtype": (x, w.detach().half().requires_grad_()),
        "no weight": (x, None),
        "weight shape": (x, torch.randn(1, 8, requires_grad=True)),
        "alignment": (storage[1:].view(6, 8).requires_grad_(), w),
    }
    for what, (xo, wo) in others.items():
        assert memo.find(xo, wo, EPS, 0.0, "llama") is None, what
    assert memo.find(x, w, 1e-5, 0.0, "llama") is None
    assert memo.find(x, w, EPS, 0.5, "llama") is None
    assert memo.find(x, w, EPS, 0.0, "gemma") is None
    memo.settings = 8
    assert memo.find(x, w, EPS, 0.0, "llama") is None
    memo.settings = 7
    assert memo.find(x, w, EPS, 0.0, "llama") is not None
    assert memo.find(x.detach().clone().requires_grad_(), w.detach().clone(), EPS, 0,
                     "llama") is not None  # other tensors of the same key, eps as an int
    assert memo.find(x.detach(), w.detach(), EPS, 0.0, "llama") is None  # not a training call
    with torch.no_grad():
        assert memo.find(x, w, EPS, 0.0, "llama") is None


def test_a_single_row_keys_its_row_stride(native, memo):
    """torch ignores a size-1 dimension's stride when it decides contiguity, so (1, 8193)[:, :4096]
    is "contiguous" with a row stride of 8193 elements. The planner reads that stride (it makes
    the rows unaligned), so the key must too: an ordinary aligned call of the same width and row
    class must not find the odd view's launch."""
    w = torch.randn(4096, dtype=torch.bfloat16, requires_grad=True)
    odd = torch.randn(1, 8193, dtype=torch.bfloat16)[:, :4096].requires_grad_()
    assert odd.is_contiguous() and odd.stride(0) == 8193
    planned(native, memo, odd, w)
    ordinary = torch.randn(300, 4096, dtype=torch.bfloat16, requires_grad=True)
    assert memo.find(ordinary, w, EPS, 0.0, "llama") is None
    assert memo.find(torch.randn(1, 4096, dtype=torch.bfloat16, requires_grad=True), w, EPS,
                     0.0, "llama") is None


def _layouts(n=64):
    """Tensors of width n laid out every way the memo may see: contiguous, row-strided views,
    size-1 dimensions with odd strides, offset pointers, 3-D views, transposed leading dims."""
    base = torch.randn(4 * 3 * (2 * n + 8) + 16)
    out = {
        "contiguous": torch.randn(6, n),
        "one row": torch.randn(1, n),
        "one row, odd stride": torch.randn(1, 2 * n + 1)[:, :n],
        "one row, aligned stride": torch.randn(1, 2 * n)[:, :n],
        "one row of 3-D, odd strides": torch.randn(1, 1, 2 * n + 1)[..., :n],
        "rows, aligned stride": torch.randn(6, 2 * n)[:, :n],
        "rows, odd stride": torch.randn(6, 2 * n + 1)[:, :n],
        "offset pointer": base[1:1 + 6 * n].view(6, n),
        "offset one row": base[2:2 + n].view(1, n),
        "3-D": torch.randn(2, 3, n),
        "3-D, size-1 middle, odd stride": torch.randn(3, 1, n).as_strided((3, 1, n), (n, 5, 1)),
        "3-D row-strided": torch.randn(2, 3, 2 * n)[..., :n],
        "3-D transposed": torch.randn(3, 2, n).transpose(0, 1),
    }
    return {k: v.requires_grad_() for k, v in out.items()}


def _python_plans(x, w):
    """What Python plans for a training call of x (forward and backward), as the native planner
    asks for them (native/launch.py plan_launch); None where Python refuses the layout."""
    from rmsnorm_lab.common.rows import as_rows
    from rmsnorm_lab.cute.launch.backward import backward_launch
    from rmsnorm_lab.cute.launch.forward import forward_launch
    try:
        x2 = as_rows(x)
    except ValueError:
        return None
    snap = settings.snapshot()
    fwd = forward_launch(x2, w, "llama", True, snap, 132).plan
    bwd = backward_launch(x2, x2, w, "llama", "auto", True)
    return fwd, bwd.mode, bwd.fused, bwd.dx, bwd.dw


def test_calls_of_one_key_are_planned_alike(native):
    """The key holds every input a plan reads: any two calls the memo files under one key are
    planned identically by Python (size-1 dimensions' strides and offset pointers included)."""
    w = torch.randn(64, requires_grad=True)
    layouts = _layouts()
    plans = {k: _python_plans(x, w) for k, x in layouts.items()}
    shared = 0
    for a, xa in layouts.items():
        if plans[a] is None:
            continue
        memo = native.CallMemo(16, AUTO_FEW_ROWS_MAX, AUTO_FEWEST_ROWS_MAX)  # the planner's
        if not file_launch(memo, xa, w, EPS, 0.0, "llama",
                           make_launch(native, functions(StandIns()), xa, True), 0):
            continue
        for b, xb in layouts.items():
            if memo.find(xb, w, EPS, 0.0, "llama") is not None:
                assert plans[b] == plans[a], (a, b)
                shared += a != b
    assert shared > 0  # the check compared distinct calls of one key, not only each with itself


def test_the_row_count_is_not_in_the_key(native, memo):
    """A Launch serves every M of the same row class (this memo is built with the thresholds
    511 and 2048): calls whose leading shape changes every call (packed batches, serving) stay
    in C++; a row count of another class is planned apart."""
    w = torch.randn(8, requires_grad=True)
    k, _ = planned(native, memo, torch.randn(600, 8, requires_grad=True), w)
    for shape in ((512, 8), (1000, 8), (2, 300, 8), (2048, 8)):
        x = torch.randn(shape, requires_grad=True)
        y = memo.call(x, w, EPS, 0.0, "llama")
        assert y is not None and y.shape == x.shape, shape
        y.backward(torch.ones_like(y))
        y64, dx64, _ = _reference(x, w)
        torch.testing.assert_close(y.double(), y64, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x.grad.double(), dx64, rtol=1e-5, atol=1e-5)
    rows = [c["x"]["shape"][0] for c in k.calls("forward")]
    assert rows == [512, 1000, 600, 2048]
    assert [c["count"] for c in k.calls("backward")] == [2, 2, 2, 2]  # strips: min(2, M)
    for m in (1, 511, 2049):  # the fewest rows, many rows: other classes
        assert memo.call(torch.randn(m, 8, requires_grad=True), w, EPS, 0.0, "llama") is None
    few, _ = planned(native, memo, torch.randn(300, 8, requires_grad=True), w)
    memo.call(torch.randn(1, 8, requires_grad=True), w, EPS, 0.0, "llama").sum().backward()
    assert [c["count"] for c in few.calls("backward")] == [1]
    sliced = torch.randn(6, 16)[:, :8]  # a 2-D row-strided view: its row stride is in the key
    planned(native, memo, sliced.requires_grad_(), w)
    assert memo.find(torch.randn(40, 16)[:, :8].requires_grad_(), w, EPS, 0.0, "llama")


def _reference(x, w):
    x64 = x.detach().double().requires_grad_()
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * w.detach().double()
    y.backward(torch.ones_like(y))
    return y.detach(), x64.grad, None


def test_tensors_and_modes_torch_must_see_are_not_served(native, memo):
    """Fake and meta tensors, forward-mode duals, functorch's wrapped tensors, an active
    dispatch mode and autocast all need torch's dispatcher: the memo leaves them to Python."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.autograd import forward_ad
    from torch.utils._python_dispatch import TorchDispatchMode

    x = torch.randn(6, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    planned(native, memo, x, w)
    assert memo.find(x, w, EPS, 0.0, "llama") is not None
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(x)
        assert memo.find(fx, w, EPS, 0.0, "llama") is None
    assert memo.find(torch.empty(6, 8, device="meta", requires_grad=True), w, EPS, 0.0,
                     "llama") is None
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x.detach(), torch.randn(6, 8)).requires_grad_()
        assert memo.find(dual, w, EPS, 0.0, "llama") is None

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    with Passthrough():
        assert memo.find(x, w, EPS, 0.0, "llama") is None
    with torch.autocast("cpu"):
        assert memo.find(x, w, EPS, 0.0, "llama") is None
    seen = []
    torch.func.vmap(lambda row: seen.append(memo.find(row, w, EPS, 0.0, "llama")) or row)(x)
    assert seen == [None]
    assert memo.find(x, w, EPS, 0.0, "llama") is not None


def test_calls_it_does_not_serve_go_back_to_python(native, memo):
    x = torch.randn(6, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    planned(native, memo, x, w)
    assert memo.call(x.detach(), w.detach(), EPS, 0.0, "llama") is None  # nothing needs grad
    with torch.no_grad():
        assert memo.call(x, w, EPS, 0.0, "llama") is None
    with torch.inference_mode():
        assert memo.call(x, w, EPS, 0.0, "llama") is None
    for bad in ([x, w, "1e-6", 0.0, "llama"], [x, w, EPS, None, "llama"],
                [x, w, EPS, 0.0, 3], [x.tolist(), w, EPS, 0.0, "llama"],
                [x, "w", EPS, 0.0, "llama"], [x, w, EPS, 10 ** 400, "llama"]):
        assert memo.call(*bad) is None  # never an exception: Python validates and says why
    assert memo.call(torch.randn([1] * 9), None, EPS, 0.0, "llama") is None  # > 8 dims
    assert len(memo) == 1  # the planned call's alone


def test_a_call_the_memo_does_not_serve_is_planned_and_not_filed(native, memo):
    """A call whose key the memo cannot form (here: under autocast) still runs through the
    planner it is given, once per call, and nothing is filed."""
    x, w = torch.randn(6, 8), torch.randn(8)
    k = StandIns()
    launch = make_launch(native, functions(k), x, True, training=False)
    asked = []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(2):
            y = memo.call(x, w, EPS, 0.0, "llama", lambda: asked.append(1) or (launch, 0))
            assert y.shape == x.shape
    assert len(asked) == 2 and len(memo) == 0 and len(k.calls("forward")) == 2


def test_a_new_call_computes_its_key_once_and_files_under_the_planned_settings(native, memo):
    """On a miss the planner is asked once and the launch is filed under the code of the
    settings the planner used, which a hit then needs to match."""
    x, w = torch.randn(6, 8), torch.randn(8)
    launch = make_launch(native, functions(StandIns()), x, True, training=False)
    memo.call(x, w, EPS, 0.0, "llama", lambda: (launch, 11))  # planned under settings 11
    assert memo.find(x, w, EPS, 0.0, "llama") is None  # 7 in force: not this launch
    memo.settings = 11
    assert memo.find(x, w, EPS, 0.0, "llama") is launch
    assert memo.call(x, w, EPS, 0.0, "llama", lambda: pytest.fail("planned twice")) is not None


def test_inference_calls_have_launches_of_their_own(native, memo):
    x, w = torch.randn(6, 8), torch.randn(8)
    k = StandIns()
    launch = make_launch(native, functions(k), x, True, training=False)
    assert file_launch(memo, x, w, EPS, 0.0, "llama", launch, memo.settings)
    k.log.clear()
    y = memo.call(x, w, EPS, 0.0, "llama")
    assert y.grad_fn is None and k.calls("forward")[0]["rstd_rows"] == 0
    with torch.no_grad():  # grad mode off: an inference call even with inputs requiring grad
        assert memo.call(x.requires_grad_(), w, EPS, 0.0, "llama") is not None
    assert memo.call(x, w, EPS, 0.0, "llama") is None  # a training call: not this launch
    assert len(k.calls("forward")) == 2


def test_bounded(native, memo):
    for n in range(1, 18):
        planned(native, memo, torch.randn(2, n), None)
    assert len(memo) == 1  # the 17th insert found 16 and started over


def test_the_gate_follows_the_toggles(native):
    assert dispatch.native_node() is not None
    assert dispatch.fast_call is not None
    for toggle in (dict(backend="triton"), dict(autograd_node="python")):
        with settings.override(**toggle):
            assert dispatch.fast_call is None, toggle
        assert dispatch.fast_call is not None
    with lab.forward_launcher(lambda *args: None):  # the host lesson's launch paths
        assert dispatch.fast_call is None and not dispatch.routed_to_native("cute")
    assert dispatch.fast_call is not None


def test_settings_a_plan_reads_change_the_memo_code(native):
    m = native_launch.memo(native)
    before = m.settings
    for toggle in (dict(forward_variant="row"), dict(backward="split"), dict(fused_strips=3),
                   dict(nvtx=True)):
        with settings.override(**toggle):
            assert m.settings != before, toggle
        assert m.settings == before


def test_api_takes_the_gate_first_and_only_where_it_may(native, memo, monkeypatch):
    """With a CPU Launch in the memo behind the gate, a training call with the default or the
    CuTe backend is served by it; the calls the gate must not take (another backend, in_place,
    another key) are not: with the default backend those run torch's math on the CPU, with
    ``backend="cute"`` they are refused (CuTe needs CUDA tensors). The default casting mode,
    ``"torch"``, is asked of the memo as the mode it names, ``"gemma"``."""
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    k, _ = planned(native, memo, x, w, mode="gemma")
    monkeypatch.setattr(dispatch, "fast_call", memo.call)
    for backend in (None, "cute"):
        y = api.rms_norm(x, w, EPS, backend=backend)
        assert y.grad_fn.name() == "RMSNormNativeBackward"
    assert len(k.calls("forward")) == 2
    y = api.rms_norm(x, w, EPS, backend="torch")
    assert y.grad_fn.name() != "RMSNormNativeBackward"
    for kw in (dict(in_place=True), dict(casting_mode="llama"), dict(offset=1.0)):
        with pytest.raises(ValueError, match="needs CUDA tensors"):  # not in the memo
            api.rms_norm(x, w, EPS, backend="cute", **kw)
        y = api.rms_norm(x, w, EPS, **kw)  # the default backend off CUDA: the reference
        assert "Native" not in y.grad_fn.name()
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        api.rms_norm(x.detach(), w.detach(), EPS, backend="cute")
    assert len(k.calls("forward")) == 2


def test_torchs_call_shape_eps_none_and_the_torch_mode_are_served_by_the_memo(native, memo,
                                                                               monkeypatch):
    """The memo keys one spelling of a call: eps a number, the mode the kernels see. ``eps=None``
    and ``casting_mode="torch"`` are resolved before it is asked; torch's call shape
    ``rms_norm(x, (N,), w, eps)`` misses it as written (a tuple where the weight goes) and is
    asked again once normalised, so none of these repeated calls reaches validation or a plan."""
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    k, _ = planned(native, memo, x, w, eps=api.FP32_EPS, mode="gemma")
    planned(native, memo, x, w, eps=EPS, mode="gemma", k=k)
    monkeypatch.setattr(dispatch, "fast_call", memo.call)
    monkeypatch.setattr(api, "validate", lambda *a: pytest.fail("the Python path ran"))
    calls = [lambda: api.rms_norm(x, w),
             lambda: api.rms_norm(x, w, None, casting_mode="torch"),
             lambda: api.rms_norm(x, w, casting_mode="gemma", backend="cute"),
             lambda: api.rms_norm(x, (8,), w),
             lambda: api.rms_norm(x, [8], w, EPS),
             lambda: api.rms_norm(x, torch.Size([8]), w, None),
             lambda: api.rms_norm(x, 8, w, EPS),
             lambda: api.rms_norm(x, normalized_shape=(8,), weight=w, eps=EPS)]
    for i, call in enumerate(calls):
        assert call().grad_fn.name() == "RMSNormNativeBackward", i
    assert len(k.calls("forward")) == len(calls)
    assert {c["eps"] for _, c in k.log if _ == "forward"} == {api.FP32_EPS, EPS}
