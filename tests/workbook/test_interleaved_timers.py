"""The interleaved timers on the CPU: ``timing.interleaved_graph_time_us`` with stand-in graphs
and events, ``bench.model.interleaved_wall_time_us`` with stand-in steps."""

import time

import torch

from rmsnorm_workbook.bench import model as bench_model
from rmsnorm_workbook.bench import timing


class _Clock:
    """A stand-in ``torch.cuda.Event``: the host's clock at ``record``."""

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3  # ms, as CUDA events give it


class _Graph:
    def __init__(self, name, seconds, order):
        self.name, self.seconds, self.order = name, seconds, order

    def replay(self):
        self.order.append(self.name)
        time.sleep(self.seconds)


def test_rounds_interleave_the_graphs_and_leave_each_rounds_first_replay_untimed(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing=False: _Clock())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    order = []
    graphs = {"slow": timing.CapturedGraph(_Graph("slow", 2e-3, order), calls=2),
              "fast": timing.CapturedGraph(_Graph("fast", 0.0, order), calls=1)}
    q = timing.interleaved_graph_time_us(graphs, rounds=3, replays=2)
    # each round: one untimed replay, then two timed ones, graph by graph
    assert order == (["slow"] * 3 + ["fast"] * 3) * 3
    # µs per call: a replay of "slow" holds two calls
    assert 1000 <= q["slow"].p20 <= q["slow"].p50 <= q["slow"].p80 < q["slow"].p50 * 5
    assert q["fast"].p80 < 1000 <= q["slow"].p20


def test_interleaved_wall_clock_takes_one_sample_of_each_loop_per_round():
    order = []

    def step(name):
        return lambda: order.append(name)
    q = bench_model.interleaved_wall_time_us({"a": (step("a"), 3), "b": (step("b"), 2)},
                                            rounds=2, sync=lambda: order.append("sync"))
    sample = lambda name, steps: ["sync"] + [name] * steps + ["sync"]  # noqa: E731
    assert order == (sample("a", 3) + sample("b", 2)) * 2
    assert set(q) == {"a", "b"} and all(v.p20 <= v.p50 <= v.p80 for v in q.values())
