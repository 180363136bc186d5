"""``rmsnorm_lab.patch``: tiny Hugging Face models built from configs with random weights
(nothing downloaded) give the same logits and gradients with the lab's norms as with their own,
through the reference math on the CPU (tests/library/test_gpu_dropin.py runs the kernels)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from rmsnorm_lab import patch, unpatch  # noqa: E402
from rmsnorm_lab.models.patch import PatchedRMSNorm  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128)


def build(family: str):
    """(model, norms it holds): a *ForCausalLM of ``family`` with random weights; the Gemma
    models' zero-initialised norm weights are perturbed so ``1 + w`` is exercised."""
    t = transformers
    makers = {
        "llama": (t.LlamaConfig, t.LlamaForCausalLM, {}, 5),
        "mistral": (t.MistralConfig, t.MistralForCausalLM, {}, 5),
        "qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM, {}, 5),
        "qwen3": (t.Qwen3Config, t.Qwen3ForCausalLM, dict(head_dim=16), 9),  # + q/k norms
        "gemma": (t.GemmaConfig, t.GemmaForCausalLM, dict(head_dim=16), 5),
        "gemma2": (t.Gemma2Config, t.Gemma2ForCausalLM, dict(head_dim=16), 9),
        "gemma3": (t.Gemma3TextConfig, t.Gemma3ForCausalLM, dict(head_dim=16), 13),
    }
    config, model_class, extra, norms = makers[family]
    torch.manual_seed(0)
    model = model_class(config(**TINY, **extra))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model, norms


def step(model, ids):
    model.zero_grad()
    logits = model(ids).logits
    logits.float().pow(2).mean().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2",
                                    "gemma3"])
def test_patched_model_matches_its_own_norms(family):
    model, norms = build(family)
    ids = torch.randint(0, TINY["vocab_size"], (2, 8))
    keys = list(model.state_dict())
    expected_logits, expected_grads = step(model, ids)
    replaced = patch(model)
    assert len(replaced) == norms
    assert all(isinstance(model.get_submodule(r.name), PatchedRMSNorm) for r in replaced)
    assert list(model.state_dict()) == keys  # same keys, same parameter objects
    for r in replaced:
        assert r.patched.weight is r.original.weight
    logits, grads = step(model, ids)
    torch.testing.assert_close(logits, expected_logits, rtol=1e-5, atol=1e-5)
    for name, g in expected_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=name)
    unpatch(model, replaced)
    assert not any(isinstance(m, PatchedRMSNorm) for m in model.modules())
    torch.testing.assert_close(step(model, ids)[0], expected_logits, rtol=0, atol=0)


def test_casting_follows_the_family_in_bf16():
    """In bf16 the families round differently; each patched norm rounds as its original."""
    for family in ("llama", "gemma"):
        model, _ = build(family)
        model.to(torch.bfloat16)
        x = torch.randn(3, 64, dtype=torch.bfloat16)
        norm = model.model.norm
        expected = norm(x)
        patch(model)
        torch.testing.assert_close(model.model.norm(x), expected, rtol=0, atol=0)


def test_torch_rmsnorm_is_patched_and_a_promoting_llama_norm_keeps_its_forward():
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.RMSNorm(8),
                              torch.nn.Unflatten(1, (2, 4)), torch.nn.RMSNorm((2, 4)))
    x = torch.randn(3, 8)
    expected = net(x)
    replaced = patch(net)
    assert [r.name for r in replaced] == ["1"]  # a 2-D normalized_shape is left alone
    torch.testing.assert_close(net(x), expected)
    model, _ = build("llama")  # fp32 weights
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    before = model.model.norm(x)
    patch(model)
    after = model.model.norm(x)
    assert after.dtype == before.dtype == torch.float32  # transformers' promotion, kept
    torch.testing.assert_close(after, before, rtol=0, atol=0)


# --- the residual carried into the next norm ------------------------------------------------

from rmsnorm_lab import carry_residual, uncarry_residual  # noqa: E402


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_carried_residual_gives_the_models_own_logits_and_gradients(family, dtype):
    model, _ = build(family)
    model = model.to(dtype)
    ids = torch.randint(0, TINY["vocab_size"], (2, 8))
    expected_logits, expected_grads = step(model, ids)
    keys = list(model.state_dict())
    replaced = patch(model)
    carried = carry_residual(model)
    assert len(carried.layers) == TINY["num_hidden_layers"]
    assert list(model.state_dict()) == keys
    logits, grads = step(model, ids)
    # the forward rounds as the model does, add by add: the same logits, bit for bit
    torch.testing.assert_close(logits, expected_logits, rtol=0, atol=0)
    # the backward adds h's gradient to the norm's in fp32, before one rounding (the model: in
    # the activations' dtype, after the norm's gradient was rounded)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    for name, g in expected_grads.items():
        torch.testing.assert_close(grads[name].float(), g.float(), **tol, msg=name)
    assert carried.carry.residual is None  # the final norm took it
    uncarry_residual(carried)
    assert all("forward" not in m.__dict__ for m in carried.layers + [carried.final_norm])
    unpatch(model, replaced)
    torch.testing.assert_close(step(model, ids)[0], expected_logits)


def test_carrying_the_residual_moves_no_add_out_of_the_norms():
    """Each layer's two adds run inside the lab's fused norm: the model's own adds are gone."""
    model, _ = build("llama")
    patch(model)
    carry_residual(model)
    calls = []
    import rmsnorm_lab.module as module_module
    real = module_module.rms_norm

    def counting(*args, **kwargs):  # the norms' calls that carry a residual
        if kwargs.get("residual") is not None:
            calls.append(True)
        return real(*args, **kwargs)
    module_module.rms_norm = counting
    try:
        model(torch.randint(0, TINY["vocab_size"], (1, 4)))
    finally:
        module_module.rms_norm = real
    layers = TINY["num_hidden_layers"]
    # every layer's post-attention norm, every layer but the first's input norm, the final norm
    assert calls == [True] * (2 * layers)


def test_carrying_refuses_what_it_cannot_carry():
    model, _ = build("llama")
    with pytest.raises(ValueError, match="patch"):
        carry_residual(model)  # the norms are still transformers'
    gemma2, _ = build("gemma2")
    patch(gemma2)
    with pytest.raises(ValueError, match="norms around"):
        carry_residual(gemma2)
    patch(model)
    enable = getattr(model, "activation_checkpointing_enable", None) \
        or model.gradient_checkpointing_enable
    enable()
    with pytest.raises(ValueError, match="checkpointing"):
        carry_residual(model)
