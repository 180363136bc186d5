"""Which run a table or figure reads: the host benchmark's run past newer sweep rows, a
ceiling from its op's own sweep, the fused residual add's sweeps against their same-shape
copies."""

import pandas as pd

def test_the_host_figures_read_the_host_benchmark_run_past_newer_sweep_rows():
    """A sweep run after the host benchmark times the peers' host rows again (same keys,
    newer): the figures still draw the host benchmark's run, not whatever is newest."""
    import matplotlib
    matplotlib.use("Agg")
    from rmsnorm_workbook.viz import host as plots_host
    bench, sweep = "2026-01-01T00:00:00+00:00", "2026-01-02T00:00:00+00:00"
    rows = [dict(gpu="h200", timestamp=t, op=op, impl=i, path="host", M=128, N=4096,
                 dtype="bf16", metric="host", p20=v, p50=v, p80=v, commit="c")
            for t, op, i, v in ((bench, "fwd", "cute.auto@tvm_ffi", 7.0),
                                (bench, "fwd", "torch.native", 10.0),
                                (bench, "full", "cute.auto@tvm_ffi", 100.0),
                                (bench, "full", "torch.native", 105.0),
                                (sweep, "fwd", "torch.native", 13.0))]
    ax = plots_host.plot_host(pd.DataFrame(rows), gpu="h200")
    drawn = {c.get_label(): sorted(c.lines[0].get_xdata()) for c in ax.containers}
    assert drawn["fwd"] == [7.0, 10.0] and drawn["full"] == [100.0, 105.0]


def test_the_fused_add_table_times_every_add_against_its_same_shape_copy():
    from rmsnorm_workbook.analysis.tables import fused_add_table
    base = dict(gpu="h200", timestamp="2026-01-01T00:00:00+00:00", op="bwd", path="graph",
                M=16384, N=4096, dtype="bf16", metric="time", p20=1.0, p80=1.0)
    rows = [dict(base, impl=i, p50=v) for i, v in (("cute.auto+add", 160.0),
                                                   ("torch.compile+add", 165.0),
                                                   ("liger.triton+add", 245.0),
                                                   ("copy3r1w.shape", 121.0),
                                                   ("cute.auto", 100.0))]  # not the add's
    t = fused_add_table(pd.DataFrame(rows), "bwd")
    assert list(t.columns) == ["cute.auto+add", "liger.triton+add", "torch.compile+add",
                               "copy3r1w.shape", "lab / best peer"]
    assert t.loc[(16384, 4096), "lab / best peer"] == 160.0 / 165.0
    assert fused_add_table(pd.DataFrame(rows), "fwd").empty


def test_host_rows_come_from_the_newest_host_benchmark_run_not_the_sweeps():
    """A sweep times host rows too (newer, other code path for the lab's variants): the host
    tables keep the host benchmark's run, where every implementation was timed together."""
    from rmsnorm_workbook.analysis import host as H
    from rmsnorm_workbook.analysis.tables import host_table
    bench, sweep = "2026-01-01T00:00:00+00:00", "2026-01-02T00:00:00+00:00"
    rows = [dict(gpu="h200", timestamp=t, op="full", impl=i, path="host", M=128, N=4096,
                 dtype="bf16", metric="host", p20=v, p50=v, p80=v)
            for t, i, v in ((bench, "cute.auto@tvm_ffi", 100.0), (bench, "torch.native", 105.0),
                            (sweep, "torch.native", 136.0), (sweep, "cute.row", 24.0))]
    df = pd.DataFrame(rows)
    t = host_table(df, "full")
    assert t.loc[("torch.native", 128, 4096), "p50"] == 105.0
    assert "cute.row" not in t.index.get_level_values("impl")
    h = H.host_rows(df)
    assert set(h["impl"]) == {"cute.auto@tvm_ffi", "torch.native"}
    assert float(h.loc[h["impl"] == "torch.native", "p50"].iloc[0]) == 105.0


def test_the_ceiling_comes_from_the_sweep_run_not_a_newer_tagged_run():
    from rmsnorm_workbook.analysis.tables import ceiling_gbps
    sweep, tagged = "2026-01-01T00:00:00+00:00", "2026-01-02T00:00:00+00:00"
    base = dict(gpu="h200", op="fwd", path="graph", N=4096, dtype="bf16", metric="bandwidth",
                p20=1.0, p80=1.0)
    rows = [dict(base, timestamp=sweep, impl="cute.auto", M=m, p50=4000.0) for m in (1, 2, 3)]
    rows += [dict(base, timestamp=sweep, impl="copy", M=131072, p50=4290.0),
             dict(base, timestamp=tagged, impl="cute.auto", M=65536, p50=4100.0),
             dict(base, timestamp=tagged, impl="copy", M=131072, p50=4300.0)]
    assert ceiling_gbps(pd.DataFrame(rows), "fwd") == 4290.0


def test_the_backward_host_table_keeps_the_labs_default_rows():
    """The host benchmark times no backward: the backward's host table is the sweeps' own
    rows, and there the lab is its default (``cute.auto``, the fused add's ``cute.auto+add``),
    not dropped with its pinned variants. The forward keeps the host benchmark's run."""
    from rmsnorm_workbook.analysis.tables import host_benchmark_covers, host_table
    bench, sweep, add = ("2026-01-01T00:00:00+00:00", "2026-01-02T00:00:00+00:00",
                         "2026-01-03T00:00:00+00:00")
    rows = [dict(gpu="h200", timestamp=t, op=op, impl=i, path="host", M=128, N=4096,
                 dtype="bf16", metric="host", p20=v, p50=v, p80=v, commit=c)
            for t, c, op, i, v in (
                (bench, "b", "fwd", "cute.auto@tvm_ffi", 7.0),
                (bench, "b", "fwd", "torch.native", 10.0),
                (sweep, "s", "fwd", "cute.auto", 23.0),
                (sweep, "s", "bwd", "cute.auto", 113.0),
                (sweep, "s", "bwd", "cute.fused", 94.0),
                (sweep, "s", "bwd", "cute.auto-pdl", 123.0),
                (sweep, "s", "bwd", "torch.native", 120.0),
                (add, "a", "bwd", "cute.auto+add", 166.0),
                (add, "a", "bwd", "cute.fused+add", 150.0),
                (add, "a", "bwd", "torch.native+add", 132.0),
                (add, "a", "bwd", "teach.fused", 1.0))]
    df = pd.DataFrame(rows)
    assert host_benchmark_covers(df, "fwd") and not host_benchmark_covers(df, "bwd")
    bwd = host_table(df, "bwd", with_commit=True)
    assert list(bwd.index.get_level_values("impl")) == [
        "cute.auto", "torch.native", "cute.auto+add", "torch.native+add"]
    assert bwd.loc[("cute.auto", 128, 4096), "p50"] == 113.0
    assert bwd.loc[("cute.auto+add", 128, 4096), "commit"] == "a"
    fwd = host_table(df, "fwd")
    assert list(fwd.index.get_level_values("impl")) == ["torch.native", "cute.auto@tvm_ffi"]
    assert list(fwd.columns) == ["p20", "p50", "p80"]


def test_percent_of_copy_holds_each_row_against_its_own_runs_copy():
    """The sweep and a tagged run of other shapes each measured their copy: each cell is divided
    by its own run's; a run that measured none (stopped before its ceilings) falls back to the
    sweep's, and ``ceiling_per_run`` says so."""
    from rmsnorm_workbook.analysis.tables import bandwidth_table, ceiling_per_run
    sweep, wide, cut = ("2026-01-01T00:00:00+00:00", "2026-01-02T00:00:00+00:00",
                        "2026-01-03T00:00:00+00:00")
    base = dict(gpu="h200", op="fwd", path="graph", dtype="bf16", metric="bandwidth",
                p20=1.0, p80=1.0)
    rows = [dict(base, timestamp=sweep, commit="s", impl="cute.auto", M=m, N=4096, p50=4000.0)
            for m in (1024, 2048, 4096)]
    rows += [dict(base, timestamp=sweep, commit="s", impl="copy", M=131072, N=4096, p50=4290.0),
             dict(base, timestamp=wide, commit="w", impl="cute.auto", M=4096, N=32768,
                  p50=4200.0),
             dict(base, timestamp=wide, commit="w", impl="copy", M=131072, N=4096, p50=4200.0),
             dict(base, timestamp=cut, commit="c", impl="cute.auto", M=4096, N=65536,
                  p50=3900.0)]
    df = pd.DataFrame(rows)
    pct = bandwidth_table(df, "fwd")["% of copy"]["cute.auto"]
    assert pct[(2048, 4096)] == 100 * 4000.0 / 4290.0
    assert pct[(4096, 32768)] == 100.0  # its own run's copy, not the sweep's
    assert pct[(4096, 65536)] == 100 * 3900.0 / 4290.0
    runs = ceiling_per_run(df, "fwd")
    assert list(runs["commit"]) == ["s", "w", "c"] and list(runs["cells"]) == [3, 1, 1]
    assert list(runs["GB/s"]) == [4290.0, 4200.0, 4290.0]
    assert list(runs["own"]) == [True, True, False]
    assert ceiling_per_run(df.assign(op="full"), "full").empty


def test_every_recorded_run_names_a_commit_in_this_history():
    """A result's provenance is its commit, or the code that was measured cannot be read back:
    each commit a results table names must be reachable from HEAD; one a log names (a probe on a
    branch) from HEAD or a branch."""
    import csv
    import re
    import shutil
    import subprocess
    from pathlib import Path
    import pytest
    root = Path(__file__).resolve().parents[2]
    git = shutil.which("git")
    if git is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")

    def run(*args):
        return subprocess.run([git, *args], cwd=root, capture_output=True, text=True)

    if run("rev-parse", "--is-shallow-repository").stdout.strip() != "false":
        pytest.skip("a shallow clone holds only part of the history")

    def in_head(commit):
        return run("merge-base", "--is-ancestor", commit, "HEAD").returncode == 0

    def on_a_branch(commit):
        return run("for-each-ref", "--count=1", f"--contains={commit}", "refs/heads",
                   "refs/remotes").stdout.strip() != ""

    hex_word = r"\b(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"
    tables, words = {}, {}
    for path in sorted((root / "results").rglob("*")):
        if path.suffix == ".csv" and "reported" not in path.parts:
            with path.open(newline="") as f:
                for row in csv.DictReader(f):
                    c = (row.get("commit") or "").removesuffix("+dirty")
                    if c:
                        tables.setdefault(c, path.relative_to(root))
        elif path.suffix in (".txt", ".json") and "logs" in path.parts:
            for word in re.findall(hex_word, path.read_text()):
                words.setdefault(word, path.relative_to(root))
    # a log names its commits in prose: every hex word git knows as a commit counts
    logs = {w: p for w, p in words.items()
            if run("rev-parse", "-q", "--verify", f"{w}^{{commit}}").returncode == 0}
    assert tables and logs
    missing = {c: str(p) for c, p in tables.items() if not in_head(c)}
    # a single-branch clone holds the branches' commits without their names: it checks the tables
    fetch = run("config", "--get-all", "remote.origin.fetch").stdout.split()
    if not fetch or any("*" in refspec for refspec in fetch):
        missing.update({c: str(p) for c, p in logs.items() if not (in_head(c) or on_a_branch(c))})
    assert not missing, f"results naming commits outside the history: {missing}"
