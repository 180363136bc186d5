"""Replace a model's RMSNorm modules with the lab's, keeping their parameters.

Each known norm class maps onto the casting mode that computes what its own forward computes
(``reference.py``), so a patched model's norms give the original's outputs bit for bit (checked
in bf16 on the CPU: tests/library/test_patch.py):

* ``torch.nn.RMSNorm``: statistics and the weight multiply in fp32, one cast of the output:
  ``casting_mode="torch"`` (torch's own rounding), offset 0; eps as the module's (None: torch's
  default, fp32's machine epsilon).
* transformers' ``LlamaRMSNorm``, ``MistralRMSNorm``, ``Qwen2RMSNorm``, ``Qwen3RMSNorm`` (also the
  per-head ``q_norm``/``k_norm`` of Qwen3): ``x * rstd`` rounded to the input dtype, then the
  weight multiply (transformers' ``weight * hidden_states.to(input_dtype)``): ``llama``
  casting, offset 0, eps from ``variance_epsilon``.
* transformers' ``GemmaRMSNorm``, ``Gemma2RMSNorm``, ``Gemma3RMSNorm`` (Gemma3's ``q_norm`` and
  ``k_norm`` too): all in fp32 with ``1 + w``, one cast: ``gemma`` casting, offset 1.0.

The transformers classes are recognised by module and class name, so transformers is never
imported here. The replacement holds the *same* ``weight`` parameter object, so optimizers,
tied weights and state dicts (key ``weight``) are untouched. One case keeps the original
module's own forward: a llama-family norm whose weight dtype differs from its input's, where
transformers returns the promoted dtype (fp32 for an fp32 weight on bf16 activations) and the
lab's kernels return the input's.

``patch`` is idempotent: a norm that is already the lab's stays as it is, and every call returns
all the replacements in effect in the model. ``unpatch(model)`` finds them by itself (each
replacement keeps its original) and puts the originals back.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from ..module import RMSNorm


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
_TORCH = Family("torch", 0.0, "eps")


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
        super().__init__(n, eps=None if eps is None else float(eps),  # None: torch's default
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
    """One replacement in effect: where, the module that was there, and the lab's in its place."""
    name: str
    original: nn.Module
    patched: PatchedRMSNorm


def replacements(model: nn.Module) -> List[Replaced]:
    """The replacements in effect in ``model``: every one of the lab's patched norms it holds,
    under each name it is reachable by."""
    return [Replaced(name, module.original, module)
            for name, module in model.named_modules(remove_duplicate=False)
            if isinstance(module, PatchedRMSNorm)]


def patch(model: nn.Module) -> List[Replaced]:
    """Replace every RMSNorm module of ``model`` the lab knows with the lab's, in place, each
    with the casting mode that computes what it computed (the module docstring lists them:
    ``torch.nn.RMSNorm`` -> ``"torch"``, transformers' Llama, Mistral, Qwen2 and Qwen3 norms ->
    ``"llama"``, Gemma's -> ``"gemma"`` with offset 1), so the outputs are the original's bit for
    bit. A norm the lab cannot stand in for (a multi-dimensional ``normalized_shape``) is left
    alone.

    Idempotent: norms that are already the lab's stay; a second call replaces only norms added
    since. Returns every replacement in effect (this call's and earlier ones');
    ``unpatch(model)`` undoes them all."""
    made: Dict[int, PatchedRMSNorm] = {}  # a norm reachable by two names gets one replacement
    for name, module in list(model.named_modules(remove_duplicate=False)):
        family = family_of(module)
        if family is None:
            continue
        patched = made.get(id(module))
        if patched is None:
            patched = made[id(module)] = PatchedRMSNorm(module, family)
        _set(model, name, patched)
    return replacements(model)


def unpatch(model: nn.Module, replaced: Optional[List[Replaced]] = None) -> List[Replaced]:
    """Put back the modules ``patch`` replaced in ``model``; returns what was put back.

    Without ``replaced``, every replacement in effect (the model's patched norms keep their
    originals). With it (``patch``'s list, accepted for compatibility) only those, each checked
    against the model: a replacement that is not in effect there (a list from another model, or
    one already undone) is a ValueError, and nothing is changed. Refused while the model carries
    its residual (``carry_residual``): ``uncarry_residual(model)`` first."""
    carrying = carried_modules(model)
    if carrying:
        raise ValueError(f"unpatch: the model carries its residual through the lab's norms "
                         f"({len(carrying)} modules changed by carry_residual); call "
                         "rmsnorm_lab.uncarry_residual(model) first")
    if replaced is None:
        replaced = replacements(model)
    else:
        for r in replaced:
            if not isinstance(r, Replaced):
                raise TypeError(f"unpatch takes the list patch() returned, got a "
                                f"{type(r).__name__} in it")
            try:
                there = model.get_submodule(r.name) if r.name else None
            except AttributeError:
                there = None
            if there is not r.patched:
                raise ValueError(
                    f"unpatch: {r.name!r} in this model is not the replacement in the list "
                    f"(found {type(there).__name__ if there is not None else 'nothing'}): the "
                    "list comes from another model, or was undone already. unpatch(model) "
                    "finds the model's own replacements")
    for r in replaced:
        _set(model, r.name, r.original)
    return list(replaced)


#: the attribute that marks a forward ``carry_residual`` (residual.py) installed on a module
CARRY_MARK = "_rmsnorm_lab_carry"


def marked_forward(module: nn.Module, mark: str) -> bool:
    """Whether the lab replaced this module's forward on the instance with one marked ``mark``
    (an attribute of the function: ``carry_residual``'s, ``fuse_qk_rope``'s)."""
    return getattr(module.__dict__.get("forward"), mark, None) is not None


def restore_forwards(modules, mark: str) -> None:
    """Give each of ``modules`` whose forward is marked ``mark`` its class's forward back."""
    for module in modules:
        if marked_forward(module, mark):
            del module.__dict__["forward"]


def carried(module: nn.Module) -> bool:
    """Whether ``carry_residual`` replaced this module's forward (on the instance)."""
    return marked_forward(module, CARRY_MARK)


def carried_modules(model: nn.Module) -> List[nn.Module]:
    """The modules of ``model`` whose forward ``carry_residual`` replaced (none: not carried)."""
    return [m for m in model.modules() if carried(m)]


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    if not name:
        raise ValueError("patch() replaces the norms inside a model, not the model itself")
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)
