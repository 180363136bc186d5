"""The host benchmark's machinery on the CPU: the interleaved timer, its tasks (three
workloads per implementation, and the varying-M workload), sample sizing."""

import torch

from rmsnorm_lab import reference
from rmsnorm_workbook.bench import runner
from rmsnorm_lab.settings import settings

EPS = runner.EPS


def test_interleaved_host_timer_takes_one_sample_of_each_per_round(monkeypatch):
    """Rounds interleave the functions (so a drifting host hits all alike), each sample is n
    calls made inside the function's context, and each function gets its own quantiles."""
    import contextlib
    import gc
    import time

    from rmsnorm_workbook.bench import timing
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    order, inside = [], []

    @contextlib.contextmanager
    def context(name):
        inside.append(name)
        yield
        inside.pop()

    def make(name, seconds):
        def call():
            assert inside == [name]
            if order[2:]:  # timed calls run with the garbage collector off
                assert not gc.isenabled()
            order.append(name)
            time.sleep(seconds)
        return call

    tasks = {"fast": timing.HostTask(make("fast", 0), 3, lambda: context("fast")),
             "slow": timing.HostTask(make("slow", 2e-3), 2, lambda: context("slow"))}
    rounds = []
    q = timing.interleaved_host_time_us(tasks, repeats=4, warmup=1, on_round=rounds.append)
    assert rounds == [0, 1, 2, 3]
    timed = order[2:]  # one warm-up call each
    assert timed == (["fast"] * 3 + ["slow"] * 2) * 4
    assert q["slow"].p50 >= 2000 > q["fast"].p50 and q["fast"].p20 <= q["fast"].p80


def test_host_tasks_key_each_workload_and_name_failures(monkeypatch):
    """The benchmark's (and notebook 03's) tasks: three workloads per implementation, its
    settings held while it runs, and an implementation without autograd reported, not raised."""
    from rmsnorm_workbook.bench import host
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(host, "HOST_SHAPE", (4, 8))
    monkeypatch.setattr(host, "DTYPE", torch.float32)
    monkeypatch.setattr(torch, "randn", lambda *a, device=None, **k: torch.rand(*a, **k))

    def inference_only(x, w):
        return (x * w).detach()
    impls = {"ref": (lambda x, w: reference.rms_norm(x, w, EPS), {"nvtx": True}),
             "no.grad": (inference_only, {})}
    seen = []
    tasks, failures = host.host_tasks(impls, calls=7, on_task=lambda: seen.append(1))
    assert set(tasks) == {("fwd", "ref"), ("fwd", "ref+autograd"), ("full", "ref"),
                          ("fwd", "no.grad"), ("fwd", "no.grad+autograd")}
    assert len(failures) == 1 and failures[0].startswith("no.grad full:") and len(seen) == 6
    assert all(t.n == 7 for t in tasks.values())
    tasks, failures = host.host_tasks(impls, calls=7, forward_only=frozenset({"no.grad"}))
    assert ("fwd", "no.grad") in tasks
    assert ("full", "no.grad") not in tasks and ("fwd", "no.grad+autograd") not in tasks
    assert not failures  # a forward-only peer's missing backward is not a failure
    from rmsnorm_workbook.bench.peers import forward_only
    assert "flashinfer" in forward_only()
    assert not forward_only() & {"liger.triton", "quack", "torch.native"}
    with tasks[("fwd", "ref")].context():
        assert settings.nvtx
    assert not settings.nvtx


def test_varying_m_workload_changes_the_row_count_every_call(monkeypatch):
    """The varying-M host workload: the default path and torch's F.rms_norm get a forward and a
    forward + backward task whose calls walk one seeded sequence of row counts in 1..8192, every
    row count called once before the timing."""
    from rmsnorm_workbook.bench import host
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(host, "HOST_SHAPE", (4, 8))
    monkeypatch.setattr(host, "DTYPE", torch.float32)
    monkeypatch.setattr(host, "VARYING_M_MAX", 64)
    monkeypatch.setattr(host, "VARYING_M_CALLS", 50)
    monkeypatch.setattr(torch, "randn", lambda *a, device=None, **k: torch.rand(*a, **k))
    Ms = host.varying_m_sequence(50, 64)
    assert Ms == host.varying_m_sequence(50, 64) and min(Ms) >= 1 and max(Ms) <= 64
    assert len(set(Ms)) > 20
    seen = []

    def spy(x, w):
        seen.append(x.shape[0])
        return reference.rms_norm(x, w, EPS)
    impls = {"torch.native": (spy, {}), "other": (spy, {})}
    tasks, failures = host.host_tasks(impls, calls=3)
    assert not failures
    assert {k for k in tasks if k[1].endswith("+varying_m")} == {
        ("fwd", "torch.native+varying_m"), ("full", "torch.native+varying_m")}
    for op in ("fwd", "full"):  # one cycle of calls walks the whole sequence, in order
        seen.clear()
        for _ in range(50):
            tasks[(op, "torch.native+varying_m")].fn()
        start = Ms.index(seen[0])
        assert sorted(seen) == sorted(Ms) and seen[1] in (Ms[(start + 1) % 50], seen[0])


def test_sample_size_ignores_slow_first_calls(monkeypatch):
    """A call slow only on its first two invocations (a compile, then a lazily loaded gradient
    accumulation kernel) still gets full-size samples; one slow every time gets ~50 ms ones."""
    import time

    from rmsnorm_workbook.bench import host
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    count = [0]

    def warming():
        count[0] += 1
        if count[0] <= 2:
            time.sleep(0.01)
    assert host._calls_per_sample(warming, 200) == 200
    assert host._calls_per_sample(lambda: time.sleep(0.01), 200) in (4, 5)
