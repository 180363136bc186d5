"""``rmsnorm_lab.fuse_qk_rope``: a tiny Qwen3 (random weights, nothing downloaded) gives the same
logits and gradients with its attention prologue as one ``qk_norm_rope`` call as with its own
norms and ``apply_rotary_pos_emb``, through the reference math on the CPU; it composes with
``patch``, undoes, and refuses what it cannot fuse."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from rmsnorm_lab import fuse_qk_rope, patch, unfuse_qk_rope, unpatch  # noqa: E402
from rmsnorm_lab.models.attention import fused  # noqa: E402
from test_patch import TINY, assert_same_step, build, step  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("patched_first", [False, True])
def test_the_models_own_logits_and_gradients(dtype, patched_first):
    model, _ = build("qwen3")
    model = model.to(dtype)
    ids = torch.randint(0, TINY["vocab_size"], (2, 8))
    expected_logits, expected_grads = step(model, ids)
    keys = list(model.state_dict())
    replaced = patch(model) if patched_first else None
    done = fuse_qk_rope(model)
    assert len(done.attentions) == TINY["num_hidden_layers"]
    assert list(model.state_dict()) == keys
    # the backward runs rope's transpose in fp32 (the model: each op's gradient in its dtype)
    assert_same_step(model, ids, expected_logits, expected_grads, dtype)
    unfuse_qk_rope(model)
    assert not any(fused(m) for m in model.modules())
    if replaced is not None:
        unpatch(model)
    torch.testing.assert_close(step(model, ids)[0], expected_logits, rtol=0, atol=0)


def test_generation_with_a_cache_is_the_models():
    model, _ = build("qwen3")
    ids = torch.randint(0, TINY["vocab_size"], (1, 5))
    expected = model.generate(ids, max_new_tokens=6, do_sample=False)
    fuse_qk_rope(model)
    assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), expected)


def test_fusing_twice_is_fusing_once_and_unfuse_takes_what_fuse_returned():
    model, _ = build("qwen3")
    first = fuse_qk_rope(model)
    second = fuse_qk_rope(model)
    assert [id(a) for a in first.attentions] == [id(a) for a in second.attentions]
    unfuse_qk_rope(second)
    assert not any(fused(m) for m in model.modules())
    with pytest.raises(TypeError, match="fuse_qk_rope returned"):
        unfuse_qk_rope("model")


def test_models_without_per_head_norms_or_with_gemmas_are_refused():
    llama, _ = build("llama")
    with pytest.raises(ValueError, match="no attention with per-head q/k norms"):
        fuse_qk_rope(llama)
    gemma3, _ = build("gemma3")
    with pytest.raises(ValueError, match="not an attention whose forward and rotary layout"):
        fuse_qk_rope(gemma3)
    qwen3, _ = build("qwen3")
    torch.nn.init.zeros_(qwen3.model.layers[0].self_attn.q_norm.weight)
    qwen3.model.layers[0].self_attn.q_norm = torch.nn.LayerNorm(16)
    with pytest.raises(ValueError, match="not a norm that rounds as Qwen3RMSNorm"):
        fuse_qk_rope(qwen3)


def test_norms_of_different_eps_and_other_attention_classes_are_refused():
    qwen3, _ = build("qwen3")
    qwen3.model.layers[1].self_attn.k_norm.variance_epsilon = 0.5
    with pytest.raises(ValueError, match="different eps"):
        fuse_qk_rope(qwen3)
    moe = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        **TINY, head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2))
    with pytest.raises(ValueError, match="Qwen3MoeAttention .* is not an attention whose"):
        fuse_qk_rope(moe)


def _forward_before_5_2x(self, hidden_states, position_embeddings, attention_mask,
                         past_key_values=None, **kwargs):
    """Qwen3Attention.forward as transformers 5.1x writes it: the cache is ``past_key_values``
    and its ``update`` takes no kwargs (this transformers' layers pass it as ``cache``)."""
    mod = transformers.models.qwen3.modeling_qwen3
    past_key_values = kwargs.pop("cache", past_key_values)
    hidden_shape = (*hidden_states.shape[:-1], -1, self.head_dim)
    q = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
    k = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
    v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    q, k = mod.apply_rotary_pos_emb(q, k, *position_embeddings)
    if past_key_values is not None:
        k, v = past_key_values.update(k, v, self.layer_idx)
    attention = mod.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                          mod.eager_attention_forward)
    out, weights = attention(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling,
                             sliding_window=self.sliding_window, **kwargs)
    return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights


def test_the_forward_before_transformers_5_2x_is_mirrored_too(monkeypatch):
    attention = transformers.models.qwen3.modeling_qwen3.Qwen3Attention
    monkeypatch.setattr(attention, "forward", _forward_before_5_2x)
    model, _ = build("qwen3")
    ids = torch.randint(0, TINY["vocab_size"], (1, 5))
    expected = model.generate(ids, max_new_tokens=6, do_sample=False)
    update = transformers.cache_utils.Cache.update
    monkeypatch.setattr(transformers.cache_utils.Cache, "update",
                        lambda cache, k, v, layer_idx: update(cache, k, v, layer_idx))
    fuse_qk_rope(model)
    assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), expected)


def test_a_forward_of_another_signature_is_refused(monkeypatch):
    attention = transformers.models.qwen3.modeling_qwen3.Qwen3Attention
    monkeypatch.setattr(attention, "forward", lambda self, hidden_states, **kwargs: None)
    model, _ = build("qwen3")
    with pytest.raises(ValueError, match="forward takes .*'hidden_states', 'kwargs'"):
        fuse_qk_rope(model)
