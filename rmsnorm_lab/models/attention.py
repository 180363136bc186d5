"""Qwen3's attention prologue through one op: ``fuse_qk_rope(model)`` has every attention with
per-head q/k norms (``q_norm``, ``k_norm``) normalize and rotate q and k in one call of
``qk_norm_rope`` instead of two norms and transformers' ``apply_rotary_pos_emb``.

It replaces each such attention's ``forward`` on the instance (modules, parameters and state dict
keys stay as they are) with one that is transformers' own (``Qwen3Attention.forward``, the
signature ``(hidden_states, position_embeddings, attention_mask, cache, **kwargs)``, or
``past_key_values`` for ``cache`` as before transformers 5.2x) but for the
prologue: the projections, then ``qk_norm_rope`` on the (batch, tokens, heads, head_dim) views
with the norms' weights and the model's cos and sin, then the heads moved ahead of the tokens,
the cache update, the model's attention function and ``o_proj`` as before. The norms' rounding is
``llama`` (Qwen3RMSNorm's), so the outputs are the model's bit for bit where the sums of squares
agree. Either norm may be the lab's
(``patch(model)`` before or after). ``unfuse_qk_rope(model)`` gives the attentions their own
forward back; fusing twice is fusing once.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
from typing import List, Optional, Union

from torch import nn

from ..api import qk_norm_rope
from .patch import PatchedRMSNorm, family_of, marked_forward, restore_forwards

#: an attention this applies to holds these
ATTENTION_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
#: the attention classes whose forward it mirrors, by (module, class name): their RoPE is
#: ``apply_rotary_pos_emb``'s half rotation (a family that rotates interleaved pairs is refused)
ATTENTIONS = {("transformers.models.qwen3.modeling_qwen3", "Qwen3Attention")}
#: the signatures of the forward it mirrors (transformers' Qwen3Attention.forward): the cache
#: argument is ``cache`` from transformers 5.2x (whose ``update`` takes the call's kwargs),
#: ``past_key_values`` before
FORWARD_PARAMS = {
    ("self", "hidden_states", "position_embeddings", "attention_mask", "cache", "kwargs"),
    ("self", "hidden_states", "position_embeddings", "attention_mask", "past_key_values",
     "kwargs"),
}
FUSE_MARK = "_rmsnorm_lab_qk_rope"


@dataclasses.dataclass(repr=False)
class Fused:
    """What ``fuse_qk_rope`` changed: the attention modules."""
    attentions: List[nn.Module]

    def __repr__(self) -> str:
        kind = type(self.attentions[0]).__name__ if self.attentions else "attentions"
        return f"Fused({len(self.attentions)} x {kind})"


def _llama_eps(norm: nn.Module) -> Optional[float]:
    """eps of a norm that rounds as Qwen3RMSNorm (``llama``, no offset), or None."""
    if isinstance(norm, PatchedRMSNorm):
        ok = norm.casting_mode == "llama" and norm.offset == 0.0 and norm.weight is not None
        return norm.eps if ok else None
    family = family_of(norm)
    if family is None or family.casting_mode != "llama":
        return None
    return float(getattr(norm, family.eps_attr))


def _attentions(model: nn.Module) -> List[nn.Module]:
    found = [m for m in model.modules() if all(hasattr(m, p) for p in ATTENTION_PARTS)]
    if not found:
        raise ValueError("fuse_qk_rope: no attention with per-head q/k norms found (a module "
                         f"with {', '.join(ATTENTION_PARTS)}, as Qwen3's)")
    for attn in found:
        kind = (type(attn).__module__, type(attn).__name__)
        if kind not in ATTENTIONS:
            raise ValueError(f"fuse_qk_rope: {kind[1]} ({kind[0]}) is not an attention whose "
                             f"forward and rotary layout it mirrors: "
                             f"{', '.join(sorted(n for _, n in ATTENTIONS))}")
        for part in ("q_norm", "k_norm"):
            if _llama_eps(getattr(attn, part)) is None:
                raise ValueError(f"fuse_qk_rope: {type(attn).__name__}.{part} is a "
                                 f"{type(getattr(attn, part)).__name__}, not a norm that rounds "
                                 "as Qwen3RMSNorm (llama rounding, no offset)")
        if _llama_eps(attn.q_norm) != _llama_eps(attn.k_norm):
            raise ValueError(f"fuse_qk_rope: {type(attn).__name__}'s q_norm and k_norm have "
                             f"different eps ({_llama_eps(attn.q_norm)}, "
                             f"{_llama_eps(attn.k_norm)}); the fused op takes one")
        original = type(attn).forward
        params = tuple(inspect.signature(original).parameters)
        if params not in FORWARD_PARAMS:
            raise ValueError(f"fuse_qk_rope: {type(attn).__name__}.forward takes {params}; the "
                             f"fused forward mirrors transformers' Qwen3Attention.forward "
                             f"{' or '.join(map(str, sorted(FORWARD_PARAMS)))}")
    return found


def _fused_forward(attn: nn.Module):
    family = sys.modules[type(attn).__module__]  # the model's own attention functions
    cache_takes_kwargs = "cache" in inspect.signature(type(attn).forward).parameters

    def forward(self, hidden_states, position_embeddings, attention_mask, cache=None,
                **kwargs):
        if cache is None:  # the name transformers still accepts for it (its only one before 5.2x)
            cache = kwargs.pop("past_key_values", None)
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(hidden_shape)
        k = self.k_proj(hidden_states).view(hidden_shape)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = qk_norm_rope(q, k, self.q_norm.weight, self.k_norm.weight, cos, sin,
                            _llama_eps(self.q_norm))
        query_states, key_states = q.transpose(1, 2), k.transpose(1, 2)
        if cache is not None:
            extra = {"kwargs": kwargs} if cache_takes_kwargs else {}
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx,
                                                    **extra)
        attention_interface = family.ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, family.eager_attention_forward)
        attn_output, attn_weights = attention_interface(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling, sliding_window=self.sliding_window, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights

    setattr(forward, FUSE_MARK, True)
    return types.MethodType(forward, attn)


def fused(module: nn.Module) -> bool:
    """Whether ``fuse_qk_rope`` replaced this module's forward."""
    return marked_forward(module, FUSE_MARK)


def fuse_qk_rope(model: nn.Module) -> Fused:
    """Run the q/k norms and RoPE of every attention of ``model`` with per-head norms as one
    ``qk_norm_rope`` call (see the module docstring); returns what it changed.
    ``unfuse_qk_rope(model)`` undoes it."""
    attentions = _attentions(model)
    for attn in attentions:
        attn.forward = _fused_forward(attn)
    return Fused(attentions)


def unfuse_qk_rope(model: Union[nn.Module, Fused]) -> None:
    """Give every attention ``fuse_qk_rope`` changed its own forward back (nothing where none
    was); the ``Fused`` it returned is accepted in the model's place."""
    if isinstance(model, Fused):
        modules = model.attentions
    elif isinstance(model, nn.Module):
        modules = model.modules()
    else:
        raise TypeError(f"unfuse_qk_rope takes the model (or what fuse_qk_rope returned), got "
                        f"{type(model).__name__}")
    restore_forwards(modules, FUSE_MARK)
