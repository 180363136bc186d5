"""``rmsnorm_lab.qk_norm_rope`` on the CPU (the reference backend): the op's results and
gradients, its custom op under torch.library's checks, torch.compile(fullgraph=True) and fake
tensors, and the arguments it refuses."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from rmsnorm_lab import qk_norm_rope, reference as R
from rmsnorm_lab.autograd import qk_norm_rope_op
from test_qk_rope_reference import inputs, qwen3_prologue

EPS = 1e-6


def test_equals_transformers_arithmetic_on_the_cpu():
    q, k, wq, wk, cos, sin = inputs(D=128)
    got = qk_norm_rope(q, k, wq, wk, cos, sin, EPS)
    expect = qwen3_prologue(q, k, wq, wk, cos, sin, EPS)
    assert torch.equal(got[0], expect[0]) and torch.equal(got[1], expect[1])


def test_gradients_in_float64():
    """The op's backward against autograd through the reference, float64; no gradient to cos
    and sin, and dW summed over tokens and heads."""
    q, k, wq, wk, cos, sin = (t.double() for t in inputs())
    leaves = [t.clone().requires_grad_() for t in (q, k, wq, wk)]
    out = qk_norm_rope(*leaves, cos, sin, EPS, casting_mode="gemma")
    g = [torch.randn_like(t) for t in out]
    got = torch.autograd.grad(out, leaves, g)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, wq, wk)]
    expect = torch.autograd.grad(R.qk_norm_rope(*ref_leaves, cos, sin, EPS, "gemma"),
                                 ref_leaves, g)
    for a, e in zip(got, expect):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda a, b, c, d: qk_norm_rope(a, b, c, d, cos[:1, :2], sin[:1, :2], EPS,
                                        casting_mode="gemma"),
        tuple(t[:1, :2].detach().clone().requires_grad_() if t.dim() > 1 else
              t.detach().clone().requires_grad_() for t in (q, k, wq, wk)))


def test_only_q_needs_a_gradient():
    q, k, wq, wk, cos, sin = inputs(dtype=torch.float32)
    q = q.requires_grad_()
    q_out, k_out = qk_norm_rope(q, k, wq, wk, cos, sin, EPS)
    (q_out.sum() * 2).backward()
    assert q.grad is not None and q.grad.shape == q.shape
    assert k.grad is None and wq.grad is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_opcheck(dtype):
    q, k, wq, wk, cos, sin = inputs(B=1, S=3, Hq=2, Hk=1, D=16, dtype=dtype)
    for t in (q, k, wq, wk):
        t.requires_grad_()
    torch.library.opcheck(qk_norm_rope_op, (q, k, wq, wk, cos, sin, EPS, "llama", "torch"))


@pytest.mark.parametrize("compile_backend", ["eager", "aot_eager"])
@pytest.mark.usefixtures("kernels_under_compile")
def test_compile_fullgraph(compile_backend):
    torch._dynamo.reset()
    q, k, wq, wk, cos, sin = inputs(dtype=torch.float32)

    def prologue(a, b):
        qo, ko = qk_norm_rope(a, b, wq, wk, cos, sin, EPS)
        return (qo.transpose(1, 2) * 2).sum() + ko.sum()

    a, b = q.clone().requires_grad_(), k.clone().requires_grad_()
    got = torch.compile(prologue, fullgraph=True, backend=compile_backend)(a, b)
    got.backward()
    a2, b2 = q.clone().requires_grad_(), k.clone().requires_grad_()
    expect = prologue(a2, b2)
    expect.backward()
    assert torch.equal(got, expect) and torch.equal(a.grad, a2.grad)


def test_fake_tensors_get_shapes_and_dtypes():
    q, k, wq, wk, cos, sin = inputs(B=2, S=5, Hq=4, Hk=2, D=64)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in (q, k, wq, wk, cos, sin)]
        qo, ko = qk_norm_rope(*fake, EPS)
    assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == q.dtype


@pytest.mark.parametrize("change, error, match", [
    (dict(k=lambda t: t[..., :32]), ValueError, "same tokens and head_dim"),
    (dict(cos=lambda t: t[:, :2]), ValueError, "one row a token"),
    (dict(q_weight=lambda t: t[:32]), ValueError, r"shape \(64,\)"),
    (dict(k=lambda t: t.half()), TypeError, "q's dtype"),
    (dict(q=lambda t: t.to(torch.int32)), TypeError, "must be"),
    (dict(backend="cuda"), ValueError, "backend must be one of"),
    (dict(backend="triton"), ValueError, "needs CUDA tensors"),
    (dict(q=lambda t: t[0, 0], k=lambda t: t[0, 0]), ValueError, "at least 3-D"),
])
def test_refusals(change, error, match):
    q, k, wq, wk, cos, sin = inputs(D=64)
    args = dict(q=q, k=k, q_weight=wq, k_weight=wk, cos=cos, sin=sin)
    kw = {}
    for name, fn in change.items():
        if name == "backend":
            kw["backend"] = fn
        else:
            args[name] = fn(args[name])
    with pytest.raises(error, match=match):
        qk_norm_rope(**args, eps=EPS, **kw)


def test_an_odd_head_dim_is_refused():
    q, k, wq, wk, cos, sin = inputs(D=64)
    with pytest.raises(ValueError, match="head_dim must be even"):
        qk_norm_rope(q[..., :63], k[..., :63], wq[:63], wk[:63], cos[..., :63], sin[..., :63])


def test_no_double_backward():
    """backward(create_graph=True) is refused where it runs, with the op's own message."""
    q, k, wq, wk, cos, sin = (t.double() for t in inputs())
    q = q.requires_grad_()
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.grad(qk_norm_rope(q, k, wq, wk, cos, sin, EPS)[0].square().sum(), q,
                            create_graph=True)


def test_under_compile_it_decomposes_by_default():
    """The default ``settings.under_compile`` hands Dynamo the reference's math (Qwen3's own
    ops, which Inductor fuses with the attention's): no lab op in the graph, the outputs the
    reference's and the gradients torch's autograd of it."""
    torch._dynamo.reset()
    q, k, wq, wk, cos, sin = inputs(dtype=torch.float32)
    ops = []

    def keep(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    def prologue(a, b):
        qo, ko = qk_norm_rope(a, b, wq, wk, cos, sin, EPS)
        return qo.square().sum() + ko.sum()

    a, b = q.clone().requires_grad_(), k.clone().requires_grad_()
    got = torch.compile(prologue, fullgraph=True, backend=keep)(a, b)
    got.backward()
    assert ops and not any("rmsnorm_lab" in op for op in ops), ops
    a2, b2 = q.clone().requires_grad_(), k.clone().requires_grad_()
    qo, ko = R.qk_norm_rope(a2, b2, wq, wk, cos, sin, EPS)
    expect = qo.square().sum() + ko.sum()
    expect.backward()
    assert torch.equal(got, expect) and torch.equal(a.grad, a2.grad)
    torch._dynamo.reset()


def test_eager_calls_take_no_custom_op_and_transforms_the_reference(monkeypatch):
    """Eager: a training call records ``QkNormRopeFunction`` (not the custom op's node), an
    inference call no node; vmap and forward-mode AD run the reference math; a dispatch mode
    (fake tensors) still sees the op."""
    from rmsnorm_lab import autograd

    def refuse(*args):
        raise AssertionError("the custom op ran on an eager call")

    q, k, wq, wk, cos, sin = inputs(dtype=torch.float32)
    with monkeypatch.context() as m:
        m.setattr(autograd, "qk_norm_rope_op", refuse)
        q_out, _ = qk_norm_rope(q.clone().requires_grad_(), k, wq, wk, cos, sin, EPS)
        assert type(q_out.grad_fn).__name__ == "QkNormRopeFunctionBackward"
        with torch.no_grad():
            out = qk_norm_rope(q, k, wq, wk, cos, sin, EPS)
        assert out[0].grad_fn is None
        assert torch.equal(out[0], R.qk_norm_rope(q, k, wq, wk, cos, sin, EPS)[0])
        batched = torch.func.vmap(lambda a: qk_norm_rope(a, k, wq, wk, cos, sin, EPS)[0])(
            torch.stack([q, 2 * q]))
        torch.testing.assert_close(batched[1], qk_norm_rope(2 * q, k, wq, wk, cos, sin, EPS)[0])
        tangent = torch.randn_like(q)
        _, jvp = torch.func.jvp(lambda a: qk_norm_rope(a, k, wq, wk, cos, sin, EPS)[0], (q,),
                                (tangent,))
        _, expect = torch.func.jvp(lambda a: R.qk_norm_rope(a, k, wq, wk, cos, sin, EPS)[0],
                                   (q,), (tangent,))
        torch.testing.assert_close(jvp, expect)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in (q, k, wq, wk, cos, sin)]
        assert qk_norm_rope(*fake, EPS)[0].shape == q.shape
