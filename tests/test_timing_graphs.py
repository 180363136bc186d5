"""``timing.interleaved_graph_time_us`` on the CPU: stand-in graphs and events."""

import time

import torch

from rmsnorm_lab.bench import timing


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
