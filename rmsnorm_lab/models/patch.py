"""Replace a model's RMSNorm modules with the lab's, keeping their parameters.

Each known norm class maps onto the lab's casting contract (``reference.py``):

* ``torch.nn.RMSNorm``: statistics and the weight multiply in fp32, one cast of the output:
  ``gemma`` casting, offset 0; ``eps=None`` is fp32's machine epsilon, as torch computes it.
* transformers' ``LlamaRMSNorm``, ``MistralRMSNorm``, ``Qwen2RMSNorm``, ``Qwen3RMSNorm`` (also the
  per-head ``q_norm``/``k_norm`` of Qwen3): ``x * rstd`` rounded to the input dtype, then the
  weight multiply: ``llama`` casting, offset 0, eps from ``variance_epsilon``.
* transformers' ``GemmaRMSNorm``, ``Gemma2RMSNorm``, ``Gemma3RMSNorm`` (Gemma3's ``q_norm`` and
  ``k_norm`` too): all in fp32 with ``1 + w``, one cast: ``gemma`` casting, offset 1.0.

The transformers classes are recognised by module and class name, so transformers is never
imported here. The replacement holds the *same* ``weight`` parameter object, so optimizers,
tied weights and state dicts (key ``weight``) are untouched. One case keeps the original
module's own forward: a llama-family norm whose weight dtype differs from its input's, where
transformers returns the promoted dtype (fp32 for an fp32 weight on bf16 activations) and the
lab's kernels return the input's.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from ..module import DEFAULT_EPS, RMSNorm


@dataclasses.dataclass(frozen=True)
class Family:
    """How one norm class maps onto the lab: its casting mode, offset and eps attribute."""
    casting_mode: str
    offset: float
    eps_attr: str


_LLAMA = Family("llama", 0.0, "variance_epsilon")
_GEMMA = Family("gemma", 1.0, "eps")
#: transformers classes by (module, class name)
TRANSFORMERS: Dict[Tuple[str, str], Family] = {
    ("transformers.models.llama.modeling_llama", "LlamaRMSNorm"): _LLAMA,
    ("transformers.models.mistral.modeling_mistral", "MistralRMSNorm"): _LLAMA,
    ("transformers.models.qwen2.modeling_qwen2", "Qwen2RMSNorm"): _LLAMA,
    ("transformers.models.qwen3.modeling_qwen3", "Qwen3RMSNorm"): _LLAMA,
    ("transformers.models.gemma.modeling_gemma", "GemmaRMSNorm"): _GEMMA,
    ("transformers.models.gemma2.modeling_gemma2", "Gemma2RMSNorm"): _GEMMA,
    ("transformers.models.gemma3.modeling_gemma3", "Gemma3RMSNorm"): _GEMMA,
}
_TORCH = Family("gemma", 0.0, "eps")


def family_of(module: nn.Module) -> Optional[Family]:
    """The family of a norm module the lab can stand in for, or None."""
    if type(module) is nn.RMSNorm:
        return _TORCH if len(module.normalized_shape) == 1 else None
    return TRANSFORMERS.get((type(module).__module__, type(module).__name__))


class PatchedRMSNorm(RMSNorm):
    """The lab's ``RMSNorm`` in place of ``original``, sharing its weight parameter."""

    def __init__(self, original: nn.Module, family: Family):
        weight = getattr(original, "weight", None)
        n = weight.shape[0] if weight is not None else original.normalized_shape[0]
        eps = getattr(original, family.eps_attr)
        super().__init__(n, eps=DEFAULT_EPS if eps is None else float(eps),
                         elementwise_affine=False, offset=family.offset,
                         casting_mode=family.casting_mode)
        self.weight = weight  # the same Parameter: state dict, optimizer and ties unchanged
        self.elementwise_affine = weight is not None
        object.__setattr__(self, "original", original)  # not a submodule: no second weight key

    def keeps_original(self, x: torch.Tensor) -> bool:
        """A llama-family norm whose weight dtype differs from x's: transformers returns the
        promoted dtype there, the lab's kernels x's, so the original module computes it."""
        return (self.casting_mode == "llama" and self.weight is not None
                and self.weight.dtype != x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.keeps_original(x):
            return self.original(x)
        return super().forward(x)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, replacing {type(self.original).__name__}"


@dataclasses.dataclass(frozen=True)
class Replaced:
    """One replacement ``patch`` made: where, and the module that was there."""
    name: str
    original: nn.Module
    patched: PatchedRMSNorm


def patch(model: nn.Module) -> List[Replaced]:
    """Replace every RMSNorm module of ``model`` the lab knows (see the module's docstring) with
    the lab's, in place; returns what was replaced (``unpatch`` takes it back). A norm the lab
    cannot stand in for (a multi-dimensional ``normalized_shape``) is left alone."""
    replaced = []
    for name, module in list(model.named_modules()):
        family = family_of(module)
        if family is None:
            continue
        patched = PatchedRMSNorm(module, family)
        _set(model, name, patched)
        replaced.append(Replaced(name, module, patched))
    return replaced


def unpatch(model: nn.Module, replaced: List[Replaced]) -> None:
    """Put back what ``patch`` replaced."""
    for r in replaced:
        _set(model, r.name, r.original)


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    if not name:
        raise ValueError("patch() replaces the norms inside a model, not the model itself")
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)
