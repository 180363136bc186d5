"""The drop-in on a GPU (pytest -m gpu): concurrent first calls, any layout, row counts that
change every call, autocast, only the gradients asked for, fake tensors, and patched models,
each checked against the float64 reference on fresh random inputs."""

import threading

import pytest
import torch

from rmsnorm_lab import patch, reference, rms_norm, settings

pytestmark = pytest.mark.gpu

EPS = 1e-6


def ref_grads(x, w, dy, casting_mode="llama"):
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_() if w is not None else None
    y = reference.rms_norm(x64, w64, EPS, 0.0, casting_mode)
    y.backward(dy.double())
    return y.detach(), x64.grad, (w64.grad if w64 is not None else None)


def close(a, b, tol=2e-2):
    assert a is not None and not torch.isnan(a).any()
    err = (a.double() - b).norm() / b.norm().clamp_min(1e-30)
    assert err < tol, f"relative error {err:.3g}"


def test_eight_threads_first_calls_of_new_widths_forward_and_backward():
    """Eight threads at once, each on a width no call has compiled yet, forward and backward,
    through the default path: every result checked (the CuTe compiler is process-wide state)."""
    widths = [3072 + 64 * i for i in range(8)]
    start = threading.Barrier(len(widths))
    errors, results = [], {}

    def work(n):
        try:
            x = torch.randn(1000, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            dy = torch.randn(1000, n, device="cuda", dtype=torch.bfloat16)
            start.wait()
            y = rms_norm(x, w, EPS)
            y.backward(dy)
            torch.cuda.synchronize()
            results[n] = (x, w, dy, y.detach(), x.grad, w.grad)
        except BaseException as e:  # noqa: BLE001 - reported below with its width
            errors.append(f"N={n}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(n,)) for n in widths]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors, errors
    for n, (x, w, dy, y, dx, dw) in results.items():
        y64, dx64, dw64 = ref_grads(x, w, dy)
        close(y, y64)
        close(dx, dx64)
        close(dw, dw64)


@pytest.mark.parametrize("layout", ["transposed", "permuted", "row slice", "column stride"])
def test_any_layout(layout):
    make = {
        "transposed": lambda: torch.randn(4, 4096, 33, device="cuda").transpose(1, 2),
        "permuted": lambda: torch.randn(33, 4, 4096, device="cuda").permute(1, 0, 2),
        "row slice": lambda: torch.randn(129, 8192, device="cuda")[:, :4096],
        "column stride": lambda: torch.randn(129, 8192, device="cuda")[:, ::2],
    }[layout]
    x = make().to(torch.bfloat16).requires_grad_()
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(x.shape, device="cuda", dtype=torch.bfloat16)
    y = rms_norm(x, w, EPS)
    y.backward(dy)
    y64, dx64, dw64 = ref_grads(x, w, dy)
    close(y, y64)
    assert x.grad.shape == x.shape
    close(x.grad, dx64)
    close(w.grad, dw64)


def test_row_counts_that_change_every_call_stay_correct():
    """Calls whose M changes every call share one Launch (grids follow M): each result is
    still right, for M on both sides of auto's few-rows threshold."""
    buf = torch.randn(5000, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for m in (1, 7, 131, 2048, 2049, 4999, 3, 5000, 1):
        x = buf[:m].clone().requires_grad_()
        dy = torch.randn_like(x)
        w.grad = None
        y = rms_norm(x, w, EPS)
        y.backward(dy)
        y64, dx64, dw64 = ref_grads(x, w, dy)
        close(y, y64)
        close(x.grad, dx64)
        close(w.grad, dw64)


def test_autocast_as_torchs_rmsnorm():
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        theirs = torch.nn.functional.rms_norm(x, (4096,), w, EPS)
        ours = rms_norm(x, w, EPS, casting_mode="gemma")
    assert ours.dtype == theirs.dtype
    close(ours, theirs.double(), tol=1e-2)


@pytest.mark.parametrize("node", ["native", "python"])
def test_only_the_gradients_asked_for(node):
    x = torch.randn(300, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    y64, dx64, dw64 = ref_grads(x, w, dy)
    with settings.override(autograd_node=node):
        (dx,) = torch.autograd.grad(rms_norm(x, w, EPS), x, dy)
        (dw,) = torch.autograd.grad(rms_norm(x, w, EPS), w, dy)
        frozen = w.detach()
        rms_norm(x, frozen, EPS).backward(dy)
    close(dx, dx64)
    close(dw, dw64)
    close(x.grad, ref_grads(x, frozen, dy)[1])


def test_fake_cuda_tensors_that_require_grad():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(8, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.empty(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        y = rms_norm(x, w, EPS)
        assert isinstance(y, FakeTensor)
        y.sum().backward()
        assert x.grad.shape == x.shape and w.grad.shape == w.shape
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    close(rms_norm(x, w, EPS), ref_grads(x, w, torch.zeros_like(x))[0])  # real calls after


def cuda_model(family: str, layers: int):
    """A small transformers model of ``family`` with random weights, bf16 on the GPU."""
    t = pytest.importorskip("transformers")
    config, cls, extra = {
        "llama": (t.LlamaConfig, t.LlamaForCausalLM, {}),
        "qwen3": (t.Qwen3Config, t.Qwen3ForCausalLM, dict(head_dim=128)),
        "gemma3": (t.Gemma3TextConfig, t.Gemma3ForCausalLM, dict(head_dim=128)),
    }[family]
    torch.manual_seed(0)
    return cls(config(hidden_size=1024, intermediate_size=2048, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=4, vocab_size=512,
                      **extra)).to("cuda", torch.bfloat16)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_patched_models_through_the_kernels(family):
    model = cuda_model(family, layers=2)
    ids = torch.randint(0, 512, (2, 64), device="cuda")
    expected = model(ids).logits.double()
    replaced = patch(model)
    assert replaced
    ours = model(ids).logits
    close(ours, expected, tol=2e-2)
    ours.float().pow(2).mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_carried_residual_through_the_fused_add_kernels(family):
    """Every residual add in the fused add kernel: the logits of the model's own norms, the
    gradients within bf16 of the model's."""
    from rmsnorm_lab import carry_residual
    model = cuda_model(family, layers=3)
    ids = torch.randint(0, 512, (2, 64), device="cuda")
    logits = model(ids).logits
    logits.float().pow(2).mean().backward()
    expected = logits.detach().double()
    expected_grads = {n: p.grad.double() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    patch(model)
    carry_residual(model)
    ours = model(ids).logits
    close(ours, expected, tol=2e-2)
    ours.float().pow(2).mean().backward()
    for n, p in model.named_parameters():
        close(p.grad, expected_grads[n], tol=5e-2)


@pytest.mark.parametrize("backend", ["cute", "triton"])
def test_the_default_rounds_as_torchs_rmsnorm_on_the_kernels(backend):
    """The drop-in's default (``casting_mode="torch"``) rounds as torch's CUDA RMSNorm: the
    outputs torch's kernel and the lab's disagree on are the few where their fp32 sums, taken
    in another order, round y the other way; Llama's rounding differs in about a quarter."""
    from rmsnorm_lab import RMSNorm
    x = torch.randn(512, 4096, device="cuda", dtype=torch.bfloat16)
    theirs = torch.nn.RMSNorm(4096, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        theirs.weight.normal_()
        expected = theirs(x)
        ours = RMSNorm(4096, device="cuda", dtype=torch.bfloat16, backend=backend)
        ours.load_state_dict(theirs.state_dict())
        differ = (ours(x) != expected).float().mean().item()
        ours.casting_mode = "llama"
        differ_llama = (ours(x) != expected).float().mean().item()
    assert differ < 0.01 and differ_llama > 0.1, (differ, differ_llama)


def test_torchs_call_shape_is_memoized_as_the_normalised_call(monkeypatch):
    """``rms_norm(x, (N,), w, eps)`` misses the memo as written; the native path files the
    normalised call (x, w, eps, the mode the kernels see), and a repeat is served from it."""
    from rmsnorm_lab import api, dispatch
    from rmsnorm_lab.native import launch as native_launch
    x = torch.randn(7, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    first = rms_norm(x, (2048,), w, EPS)
    if dispatch.fast_call is None:
        pytest.skip("the native node is not built here")
    assert dispatch.fast_call(x, w, EPS, 0.0, "gemma") is not None
    monkeypatch.setattr(api, "validate", lambda *a: pytest.fail("the Python path ran"))
    monkeypatch.setattr(native_launch, "plan_launch", lambda *a: pytest.fail("replanned"))
    second = rms_norm(x, (2048,), w, EPS)
    monkeypatch.undo()
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    rms_norm(x, w)  # eps=None: fp32's epsilon, another key, planned here...
    monkeypatch.setattr(api, "validate", lambda *a: pytest.fail("the Python path ran"))
    third = rms_norm(x, w)  # ...and served from the memo after
    close(third, torch.nn.functional.rms_norm(x, (2048,), w).double(), tol=1e-2)


def test_float64_on_cuda_runs_on_the_torch_backend_and_is_refused_by_name_elsewhere():
    x = torch.randn(4, 64, device="cuda", dtype=torch.float64, requires_grad=True)
    y = rms_norm(x, None, backend="torch")
    assert y.dtype == torch.float64
    assert torch.autograd.gradcheck(lambda a: rms_norm(a, None, backend="torch"), (x,))
    for backend in (None, "cute", "triton"):
        with pytest.raises(TypeError, match="float64"):
            rms_norm(x, None, backend=backend)
