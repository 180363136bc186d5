"""Concurrent first calls: CuTe DSL's compiler holds process-wide MLIR state, so two threads
compiling at once can raise or abort the process. Every compilation of the lab takes
``cute.compile.COMPILE_LOCK``; here eight threads compile different kernels at the same moment,
in a child process so that an abort is a failed test rather than a dead test run."""

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import os, threading, torch
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from rmsnorm_lab.cute.launch import backward as backward_runner
    from rmsnorm_lab.cute.launch import forward as runner
    from rmsnorm_lab.cute.plan.backward import plan_backward
    from rmsnorm_lab.cute.plan.forward import plan_forward

    BF16 = torch.bfloat16
    jobs = [(runner.compile_forward, plan_forward("row", n, BF16, BF16, "llama", False, True,
                                                  arch="sm_90a"))
            for n in (3072, 5120, 6144, 2048)]
    jobs += [(runner.compile_forward, plan_forward("warp", 1024, BF16, None, "gemma", True,
                                                   True, arch="sm_90a"))] * 2  # one kernel twice
    jobs += [(backward_runner.compile_backward, plan_backward(kind, 4096, BF16, BF16, "llama",
                                                              True))
             for kind in ("fused", "dx")]
    start = threading.Barrier(len(jobs))
    done, errors = {}, []

    def work(i, compile_fn, plan):
        start.wait()
        try:
            done[i] = compile_fn(plan, "sm_90a")
        except BaseException as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i, *job)) for i, job in enumerate(jobs)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors, errors
    assert len(done) == len(jobs) and done[4] is done[5]  # the second waiter found the first's
    print("compiled", len(done))
""")


def test_concurrent_first_compiles_neither_raise_nor_abort():
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "compiled 8" in r.stdout


def test_a_free_threaded_interpreter_is_refused_with_what_to_do(tmp_path):
    """Without the GIL the caches and the call memo would race: the import says so and how to run
    instead (a stand-in for a free-threaded build: sys._is_gil_enabled returning False)."""
    import subprocess
    import sys
    code = ("import sys; sys._is_gil_enabled = lambda: False\n"
            "try:\n    import rmsnorm_lab\nexcept ImportError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert "rmsnorm_lab needs the GIL" in done.stdout and "PYTHON_GIL=1" in done.stdout
