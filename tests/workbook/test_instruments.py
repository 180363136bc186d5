"""The host lesson's instruments on the CPU (bench/instruments.py, bench/launch_paths.py): the
context manager that sets them beside the library's settings, the launchers it installs through
``lab.forward_launcher``, the environment parsed per call, and the launchers' marshaling and
handle cache on CPU tensors with a stand-in for the compiled kernel. Their launches on a GPU:
test_gpu_launch_paths.py."""

import types

import pytest
import torch

from rmsnorm_lab import dispatch, lab, settings
from rmsnorm_workbook.bench import host, instruments, launch_paths


def test_use_sets_the_instruments_and_the_library_settings_and_restores_both():
    assert instruments.state() == instruments.DEFAULTS
    assert lab.routed_to_native("cute") == (settings.experiments.autograd_node == "native")
    with instruments.use(launch_path="cached", tensor_cache_cap=0, nvtx=True) as now:
        assert now == instruments.state() == instruments.Instruments("cached", 0, False)
        assert settings.nvtx and not lab.routed_to_native("cute")
        assert dispatch._launcher.func is launch_paths.launch_cached
        assert dispatch._launcher.keywords == {"cap": 0}
        with instruments.use(launch_path="tvm_ffi"):  # the library's own call, inside
            assert dispatch._launcher is None and instruments.state().tensor_cache_cap == 0
        with instruments.use(settings_per_call=True):  # the launch path stays
            assert dispatch._launcher.func is launch_paths.launch_cached
        with pytest.raises(RuntimeError), instruments.use(launch_path="jit"):
            assert dispatch._launcher is launch_paths.launch_jit
            raise RuntimeError
        assert instruments.state().launch_path == "cached"
    assert instruments.state() == instruments.DEFAULTS
    assert dispatch._launcher is None and not settings.nvtx


@pytest.mark.parametrize("bad", [dict(launch_path="dlpack"), dict(tensor_cache_cap="8"),
                                 dict(settings_per_call=1), dict(forward_variant="nope")])
def test_use_refuses_a_bad_value_before_changing_anything(bad):
    with pytest.raises((ValueError, AttributeError)):
        with instruments.use(**{"nvtx": True, "launch_path": "compiled", **bad}):
            pass
    assert instruments.state() == instruments.DEFAULTS
    assert dispatch._launcher is None and not settings.nvtx


def test_settings_per_call_wraps_the_timed_call(monkeypatch):
    parsed = []
    monkeypatch.setattr(instruments, "from_environ", parsed.append)

    def fn(x, w):
        return x + w
    assert instruments.timed_call(fn, {"nvtx": True}) is fn
    call = instruments.timed_call(fn, {"settings_per_call": True})
    assert call(1, 2) == 3 and call(3, 4) == 7 and len(parsed) == 2


def test_the_benchmark_names_every_instrument_as_host_csv_does():
    impls = host.host_impls()
    for path in instruments.LAUNCH_PATHS:
        assert impls[f"cute.auto@{path}"][1] == {"launch_path": path}
    assert impls["cute.auto@tvm_ffi+settings_per_call"][1] == {"settings_per_call": True}


@pytest.fixture
def stand_in(monkeypatch):
    """A launch of a bf16 vector plan, the CPU's 'stream', and a compiled kernel that records
    its calls (no GPU: the handles are real, the launch is not)."""
    class Launch:  # the attributes of a ForwardLaunch that the launchers read
        arch = "sm_90a"
        plan = types.SimpleNamespace(vec=8, x_dtype=torch.bfloat16, variant="row")
    launch = Launch()
    calls = []
    monkeypatch.setattr(launch_paths, "stream_of", lambda t: "stream")
    launch_paths.clear_caches()
    launch_paths._COMPILED[launch] = lambda *args: calls.append(args)
    yield launch, calls
    launch_paths.clear_caches()


def rows(M=4, N=64):
    return (torch.zeros(M, N, dtype=torch.bfloat16), torch.ones(N, dtype=torch.bfloat16),
            torch.empty(M, N, dtype=torch.bfloat16), torch.empty(M))


def test_compiled_path_marshals_every_tensor_every_call(stand_in):
    launch, calls = stand_in
    x, w, y, rstd = rows()
    for _ in range(2):
        launch_paths.launch_compiled(launch, x, w, y, rstd, 3, 1e-6, 0.0)
    assert len(calls) == 2 and calls[0][4:] == (3, 1e-6, 0.0, "stream")
    handles = calls[0][:4]
    assert [tuple(h.shape) for h in handles] == [(4, 64), (64,), (4, 64), (4,)]
    assert all(a is not b for a, b in zip(calls[0][:4], calls[1][:4]))  # new handles each call
    assert not launch_paths._HANDLES


def test_cached_path_keeps_at_most_cap_handles(stand_in):
    launch, calls = stand_in
    x, w, y, rstd = rows()
    launch_paths.launch_cached(launch, x, w, y, rstd, 3, 1e-6, 0.0, cap=8)
    launch_paths.launch_cached(launch, x, w, y, rstd, 3, 1e-6, 0.0, cap=8)
    assert len(launch_paths._HANDLES) == 4
    assert all(a is b for a, b in zip(calls[0][:4], calls[1][:4]))  # hits: the same handles
    launch_paths.launch_cached(launch, *rows(), 3, 1e-6, 0.0, cap=6)
    assert len(launch_paths._HANDLES) == 6


def test_jit_path_calls_a_new_kernel_object_under_the_compile_lock(stand_in, monkeypatch):
    launch, _ = stand_in
    made = []

    class Kernel:
        def __init__(self, plan):
            made.append(self)
            self.plan = plan

        def __call__(self, *args):
            assert lab.COMPILE_LOCK._is_owned()  # it may compile: under the lock
            self.args = args
    monkeypatch.setattr(launch_paths, "forward_kernel_object", Kernel)
    for _ in range(2):
        launch_paths.launch_jit(launch, *rows(), 5, 1e-5, 1.0)
    assert len(made) == 2 and made[0].plan is launch.plan
    assert made[1].args[4:] == (5, 1e-5, 1.0, "stream")
