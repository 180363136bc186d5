"""Carry each decoder layer's residual into the next norm, as vLLM's Llama does, so that every
residual add of a Llama-family model runs inside a fused add + RMSNorm kernel.

A transformers decoder layer adds twice and normalises twice::

    h = x + attn(norm_in(x))          # the attention's residual add
    x' = h + mlp(norm_post(h))        # the MLP's residual add

Patched, the first add fuses with ``norm_post``, and the second is deferred: the layer returns
its MLP output and keeps ``h`` aside; the next layer's ``norm_in`` (or the model's final norm)
adds it back in its own fused kernel. Each add then costs no separate pass over the activations:
two reads and one write fewer per add, which is the point of the fused kernel.

``carry_residual(model)`` needs the model's norms to be the lab's (``patch(model)`` first),
keeps modules, parameters and state dict keys as they are (it replaces the layers' and the final
norm's ``forward`` on the instances), and returns what it changed; ``uncarry_residual(model)``
gives them their own forward back (as ``unpatch(model)`` does the norms; the object
``carry_residual`` returned is accepted too). ``unpatch`` is refused while the residual is
carried: uncarry first. Carrying twice is carrying once (the second call starts afresh).
Supported: decoder layers with exactly ``input_layernorm``, ``self_attn``,
``post_attention_layernorm`` and ``mlp`` (Llama, Mistral, Qwen2, Qwen3); Gemma2 and Gemma3, with
their extra norms around the MLP, are refused. While patched, a layer's output is its MLP output
before the add, so ``output_hidden_states`` reports those, and gradient checkpointing (which
re-runs a layer out of order) is refused.
"""

from __future__ import annotations

import dataclasses
import types
from typing import List, Optional, Tuple, Union

import torch
from torch import nn

from .patch import CARRY_MARK, PatchedRMSNorm, carried_modules, restore_forwards

#: what a decoder layer must hold, and nothing more in the way of norms
LAYER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")


class _Carry:
    """The residual one layer hands to the next, within one forward of the model."""
    residual: Optional[torch.Tensor] = None


@dataclasses.dataclass(repr=False)
class Carried:
    """What ``carry_residual`` changed: the decoder layers and the final norm."""
    layers: List[nn.Module]
    final_norm: nn.Module
    carry: _Carry

    def __repr__(self) -> str:
        kind = type(self.layers[0]).__name__ if self.layers else "layers"
        return (f"Carried({len(self.layers)} x {kind} and the final "
                f"{type(self.final_norm).__name__})")


def add_norm(norm: PatchedRMSNorm, x: torch.Tensor, residual: torch.Tensor
             ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(norm(x + residual), x + residual)`` in one fused kernel; where the norm keeps the
    original module's forward (a weight in another dtype than x), the add and the norm apart."""
    if norm.keeps_original(x):
        h = x + residual
        return norm.original(h), h
    return norm.forward_with_residual(x, residual)


def _decoder_stack(model: nn.Module) -> Tuple[nn.ModuleList, nn.Module]:
    """The model's decoder layers and the norm after them."""
    for module in model.modules():
        layers, norm = getattr(module, "layers", None), getattr(module, "norm", None)
        if isinstance(layers, nn.ModuleList) and len(layers) and isinstance(norm, nn.Module):
            return layers, norm
    raise ValueError("carry_residual: no decoder stack found (a module with `layers` and `norm`)")


def _check_layer(i: int, layer: nn.Module) -> None:
    missing = [p for p in LAYER_PARTS if not hasattr(layer, p)]
    if missing:
        raise ValueError(f"carry_residual: layer {i} ({type(layer).__name__}) has no "
                         f"{', '.join(missing)}")
    extra = sorted(n for n, m in layer.named_children()
                   if n.endswith("layernorm") and n not in LAYER_PARTS)
    if extra:
        raise ValueError(f"carry_residual: layer {i} ({type(layer).__name__}) has norms around "
                         f"its MLP too ({', '.join(extra)}); only Llama-family layers are "
                         "supported")
    for part in ("input_layernorm", "post_attention_layernorm"):
        if not isinstance(getattr(layer, part), PatchedRMSNorm):
            raise ValueError(f"carry_residual: layer {i}'s {part} is not the lab's; call "
                             "rmsnorm_lab.patch(model) first")


def _layer_forward(layer: nn.Module, first: bool, carry: _Carry):
    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if args:
            raise TypeError("a carried decoder layer takes its arguments after hidden_states by "
                            "keyword, as transformers' models pass them")
        if getattr(self, "gradient_checkpointing", False) and self.training:
            raise RuntimeError("carry_residual does not support gradient checkpointing")
        if first:  # the embeddings are the residual stream
            residual = hidden_states
            x = self.input_layernorm(hidden_states)
        else:  # the previous layer's MLP output joins the residual here
            x, residual = add_norm(self.input_layernorm, hidden_states, carry.residual)
        attn = self.self_attn(hidden_states=x, **kwargs)[0]
        x, carry.residual = add_norm(self.post_attention_layernorm, attn, residual)
        return self.mlp(x)  # its residual add waits for the next norm
    setattr(forward, CARRY_MARK, carry)
    return types.MethodType(forward, layer)


def _final_forward(norm: PatchedRMSNorm, carry: _Carry):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        residual, carry.residual = carry.residual, None
        if residual is None:
            raise RuntimeError("the final norm ran before the decoder layers handed it their "
                               "residual")
        return add_norm(self, hidden_states, residual)[0]
    setattr(forward, CARRY_MARK, carry)
    return types.MethodType(forward, norm)


def carry_residual(model: nn.Module) -> Carried:
    """Fuse every residual add of ``model``'s decoder stack into the next RMSNorm (see the module
    docstring); ``patch(model)`` must have run. Returns what it changed;
    ``uncarry_residual(model)`` undoes it."""
    checkpointing = getattr(model, "is_activation_checkpointing", None)
    if checkpointing is None:  # transformers before its rename
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    if checkpointing:
        raise ValueError("carry_residual does not support gradient checkpointing")
    layers, final_norm = _decoder_stack(model)
    for i, layer in enumerate(layers):
        _check_layer(i, layer)
    if not isinstance(final_norm, PatchedRMSNorm):
        raise ValueError("carry_residual: the final norm is not the lab's; call "
                         "rmsnorm_lab.patch(model) first")
    carry = _Carry()
    for i, layer in enumerate(layers):
        layer.forward = _layer_forward(layer, i == 0, carry)
    final_norm.forward = _final_forward(final_norm, carry)
    return Carried(list(layers), final_norm, carry)


def uncarry_residual(model: Union[nn.Module, Carried]) -> None:
    """Give the decoder layers and the final norm of ``model`` their own forward back (every
    module ``carry_residual`` changed; nothing when the model does not carry its residual). The
    ``Carried`` that ``carry_residual`` returned is accepted in the model's place."""
    if isinstance(model, Carried):
        modules = model.layers + [model.final_norm]
    elif isinstance(model, nn.Module):
        modules = carried_modules(model)
    else:
        raise TypeError(f"uncarry_residual takes the model (or what carry_residual returned), "
                        f"got {type(model).__name__}")
    restore_forwards(modules, CARRY_MARK)
