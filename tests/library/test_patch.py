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


def assert_same_step(model, ids, expected_logits, expected_grads, dtype):
    """A step of ``model`` gives the expected logits bit for bit (the forward rounds as the
    model does) and its gradients within the tolerance of a backward that sums in fp32 where
    the model rounds each op's gradient to ``dtype``."""
    logits, grads = step(model, ids)
    torch.testing.assert_close(logits, expected_logits, rtol=0, atol=0)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    for name, g in expected_grads.items():
        torch.testing.assert_close(grads[name].float(), g.float(), **tol, msg=name)


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


FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3"]
#: the casting mode ``patch`` picks for each source module (its docstring's table)
MODES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama",
         "gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma"}


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
@pytest.mark.parametrize("family", FAMILIES + ["torch"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("weights", ["x's dtype", "fp32"])
def test_every_patched_norm_rounds_as_its_source_module_bit_for_bit(family, dtype, weights):
    """In bf16 and fp16 the families round differently (one ulp in about a quarter of the
    outputs); every patched norm, q/k norms included, gives its source module's outputs bit for
    bit: torch's nn.RMSNorm with torch's rounding, transformers' Llama family with Llama's,
    Gemma's with offset 1 in fp32."""
    if family == "torch":
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.RMSNorm(64), torch.nn.RMSNorm(64, eps=1e-5))
        with torch.no_grad():
            for p in model.parameters():
                p.normal_()
        mode = "torch"
    else:
        model, _ = build(family)
        mode = MODES[family]
    if weights != "fp32":
        model.to(dtype)
    replaced = patch(model)
    assert replaced and {r.patched.casting_mode for r in replaced} == {mode}
    assert {r.patched.offset for r in replaced} == {1.0 if mode == "gemma" else 0.0}
    torch.manual_seed(1)
    for r in replaced:
        x = (3 * torch.randn(5, 7, r.patched.normalized_shape[0])).to(dtype)
        with torch.no_grad():
            ours, theirs = r.patched(x), r.original(x)
        assert ours.dtype == theirs.dtype, r.name
        assert torch.equal(ours, theirs), r.name


def test_the_families_round_differently_so_the_mode_matters():
    """The test above would pass vacuously if every mode gave the same bits: they do not."""
    model, _ = build("llama")
    model.to(torch.bfloat16)
    norm = patch(model)[0].patched
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        llama = norm(x)
        norm.casting_mode = "torch"
        assert not torch.equal(norm(x), llama)


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
    # the forward rounds as the model does, add by add; the backward adds h's gradient to the
    # norm's in fp32, before one rounding (the model: in the activations' dtype)
    assert_same_step(model, ids, expected_logits, expected_grads, dtype)
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


# --- patch and unpatch: what a user can get wrong --------------------------------------------

def test_unpatch_finds_what_patch_replaced_and_patching_twice_is_patching_once():
    model, norms = build("qwen3")
    ids = torch.randint(0, TINY["vocab_size"], (1, 6))
    expected = model(ids).logits
    originals = {n: m for n, m in model.named_modules() if "norm" in n}
    first = patch(model)
    second = patch(model)  # idempotent: the same replacements, still in effect
    assert len(first) == len(second) == norms
    assert [(r.name, r.patched) for r in first] == [(r.name, r.patched) for r in second]
    undone = unpatch(model)
    assert len(undone) == norms
    assert not any(isinstance(m, PatchedRMSNorm) for m in model.modules())
    assert all(model.get_submodule(n) is m for n, m in originals.items())
    torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    assert unpatch(model) == []  # nothing left to undo
    unpatch(model, patch(model))  # the list, as before: checked, then undone
    assert not any(isinstance(m, PatchedRMSNorm) for m in model.modules())


def test_unpatch_refuses_a_list_from_another_model_and_changes_nothing():
    a, _ = build("llama")
    b, _ = build("llama")
    replaced_a = patch(a)
    patch(b)
    with pytest.raises(ValueError, match="another model"):
        unpatch(b, replaced_a)
    assert all(isinstance(b.get_submodule(r.name), PatchedRMSNorm) for r in replaced_a)
    unpatch(a, replaced_a)
    with pytest.raises(ValueError, match="undone already"):
        unpatch(a, replaced_a)
    with pytest.raises(TypeError, match="the list patch"):
        unpatch(b, ["model.norm"])


def test_a_norm_reachable_by_two_names_is_replaced_under_both():
    shared = torch.nn.RMSNorm(8)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), shared, torch.nn.Linear(8, 8), shared)
    replaced = patch(net)
    assert [r.name for r in replaced] == ["1", "3"] and net[1] is net[3]
    unpatch(net)
    assert net[1] is shared and net[3] is shared


def test_unpatch_while_carried_is_refused_and_uncarry_takes_the_model():
    model, _ = build("llama")
    ids = torch.randint(0, TINY["vocab_size"], (2, 8))
    expected = model(ids).logits
    patch(model)
    carried = carry_residual(model)
    text = repr(carried)
    assert len(text) < 120 and "LlamaDecoderLayer" in text and "\n" not in text
    with pytest.raises(ValueError, match=r"uncarry_residual\(model\) first"):
        unpatch(model)
    torch.testing.assert_close(model(ids).logits, expected)  # still whole after the refusal
    uncarry_residual(model)
    assert all("forward" not in m.__dict__ for m in model.modules())
    uncarry_residual(model)  # nothing carried: nothing to do
    unpatch(model)
    torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    patch(model)
    carry_residual(model)
    carried = carry_residual(model)  # carrying twice is carrying once
    torch.testing.assert_close(model(ids).logits, expected)
    uncarry_residual(carried)  # what carry_residual returned is still taken
    assert all("forward" not in m.__dict__ for m in model.modules())
    with pytest.raises(TypeError, match="takes the model"):
        uncarry_residual([carried])
