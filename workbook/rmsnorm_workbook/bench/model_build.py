"""The models of ``bench --op model``: Hugging Face transformers models built from configs with
random weights (nothing downloaded), and the norm each one runs.

Two architectures at one size (``SIZES``): ``llama`` and ``qwen3`` (the same sizes, head_dim 128,
plus a per-head ``q_norm``/``k_norm`` in every attention). Every norm choice is applied to a
freshly built model of the same seed, so all choices of one architecture hold the same weights:

* ``shipped``   transformers' own Python RMSNorm, as built (several elementwise kernels a norm);
* ``torch``     every transformers RMSNorm swapped for ``torch.nn.RMSNorm`` holding the same
                weight and eps (``swap_torch_norms``): torch's fused kernel, the strong baseline;
* ``lab``       ``rmsnorm_lab.patch(model)``;
* ``lab+carry`` ``patch``, then ``carry_residual``: every residual add inside the next norm's
                fused kernel (skipped where ``carry_residual`` refuses the architecture);
* ``lab+qk``    ``patch``, then ``fuse_qk_rope``: each attention's q/k norms and RoPE as one op
                (Qwen3; skipped where ``fuse_qk_rope`` refuses the architecture);
* ``liger``     Liger-Kernel's patch of the instance, its norms only (skipped where
                ``liger_kernel`` does not import).

``prefill_logits`` and ``agreement`` check that a choice computes what ``shipped`` computes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import sys
from typing import Dict, List, Tuple, Union

import torch
from torch import nn

from rmsnorm_lab import carry_residual, fuse_qk_rope, patch, settings
from rmsnorm_lab.lab import TRANSFORMERS

CHOICES: Tuple[str, ...] = ("shipped", "torch", "lab", "lab+carry", "lab+qk", "liger")
#: the choices timed under torch.compile: ``lab`` and ``lab+qk`` with the lab's ops as graph
#: nodes of their own (torch.library custom ops, ``settings.under_compile="kernel"``), and
#: ``@decompose`` with the ops handing Inductor their math (``"decompose"``, the library's
#: default), so each way is named whatever the default
COMPILE_CHOICES: Tuple[str, ...] = ("torch", "lab", "lab+qk", "lab@decompose",
                                    "lab+qk@decompose")
DECOMPOSE_SUFFIX = "@decompose"
#: transformers config class and what differs from ``SIZES``, per architecture
ARCHS: Dict[str, Tuple[str, dict]] = {
    "llama": ("LlamaConfig", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 128}),
}
SIZES = dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
             num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096)
DTYPE = torch.bfloat16
SEED = 0
#: a choice agrees with ``shipped`` when no logit differs by more than this fraction of the
#: largest |logit|. In an 8-layer bf16 model (hidden 512-1024, on the CPU), torch's norm, which
#: rounds once where transformers' rounds twice, moves them by 1-2 % of it; norms that lost
#: their weights, by 30 %. On the H200 at hidden 4096 torch's norm moved them by 4.4 %.
AGREE_REL = 0.05
#: the same for a model under torch.compile, which fuses its norms with their neighbours in
#: fp32 and rounds less often: 5.0 % on the H200 with torch's norms
COMPILED_AGREE_REL = 0.08
CHECK_SHAPE = (1, 512)


class ChoiceSkipped(Exception):
    """A norm choice that does not apply here (its package is missing, the model refuses it)."""


def model_config(arch: str, layers: int, **overrides):
    """The transformers config of ``arch`` with ``layers`` decoder layers (``overrides`` replace
    the sizes: the tests build tiny models)."""
    import transformers

    config_class, extra = ARCHS[arch]
    return getattr(transformers, config_class)(
        **{**SIZES, **extra, "num_hidden_layers": layers, **overrides})


def _dtype_keyword() -> str:
    """``from_config``'s dtype keyword: ``dtype`` from transformers 4.56 on (``torch_dtype`` is
    deprecated there), ``torch_dtype`` before."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


def build_model(arch: str, layers: int, device: str = "cuda", dtype: torch.dtype = DTYPE,
                seed: int = SEED, **overrides) -> nn.Module:
    """A ``*ForCausalLM`` of ``arch`` with random weights of seed ``seed``, made directly on
    ``device`` in ``dtype``, attention by torch's SDPA. Norm weights are drawn around 1 too
    (transformers starts them at exactly 1, where a norm that rounds once and one that rounds
    twice give the same bits, and the check against ``shipped`` would see no difference)."""
    from transformers import AutoModelForCausalLM

    config = model_config(arch, layers, **overrides)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                 **{_dtype_keyword(): dtype})
        with torch.no_grad():
            for _, norm in transformers_norms(model):
                norm.weight.normal_(1.0, 0.1)
    return model


def transformers_norms(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """``(name, module)`` of every transformers RMSNorm of ``model`` (the classes ``patch``
    knows)."""
    return [(name, m) for name, m in model.named_modules()
            if (type(m).__module__, type(m).__name__) in TRANSFORMERS]


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def swap_torch_norms(model: nn.Module) -> List[str]:
    """Replace every transformers RMSNorm of ``model`` with ``torch.nn.RMSNorm`` holding the same
    weight parameter and eps, in place; returns the names replaced. Only the ``w * x̂`` families
    (Llama, Mistral, Qwen): torch's norm has no ``1 + w`` form for Gemma's."""
    swapped = []
    for name, module in transformers_norms(model):
        family = TRANSFORMERS[(type(module).__module__, type(module).__name__)]
        if family.offset != 0.0:
            raise ValueError(f"{name} ({type(module).__name__}) scales by {family.offset:g} + w; "
                             "torch.nn.RMSNorm has no such form")
        weight = module.weight
        norm = nn.RMSNorm(weight.shape[0], eps=float(getattr(module, family.eps_attr)),
                          device="meta")
        norm.weight = weight  # the same Parameter: nothing copied, state dict unchanged
        _set(model, name, norm)
        swapped.append(name)
    return swapped


def apply_liger(model: nn.Module) -> int:
    """Liger-Kernel's patch of this instance, norms only; returns how many modules now run a
    Liger forward. Liger's per-model functions also rebind names in transformers' modeling module
    (its norm class, for models built later); those are put back, so only this instance changes.
    ``ChoiceSkipped`` where liger_kernel does not import."""
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
    except ImportError as e:
        raise ChoiceSkipped(f"liger_kernel does not import here ({e})") from None
    modeling = sys.modules[type(model).__module__]
    before = dict(vars(modeling))
    try:
        _apply_liger_kernel_to_instance(model=model, rms_norm=True, swiglu=False, rope=False,
                                        cross_entropy=False, fused_linear_cross_entropy=False)
    finally:
        for name in [n for n in vars(modeling) if n not in before]:
            delattr(modeling, name)
        for name, value in before.items():
            if vars(modeling).get(name) is not value:
                setattr(modeling, name, value)
    patched = sum(1 for m in model.modules()
                  if str(getattr(m.forward, "__module__", "")).startswith("liger_kernel"))
    if not patched:
        raise RuntimeError(f"liger_kernel patched no module of {type(model).__name__}")
    return patched


def under_compile(choice: str):
    """The settings a compiled ``choice`` runs under (its compile, its checks, its timing):
    ``under_compile`` ``"decompose"`` for the ``@decompose`` choices, ``"kernel"`` for the other
    lab choices; ``torch`` has no lab op."""
    if not choice.startswith("lab"):
        return contextlib.nullcontext()
    mode = "decompose" if choice.endswith(DECOMPOSE_SUFFIX) else "kernel"
    return settings.override(under_compile=mode)


def apply_choice(model: nn.Module, choice: str) -> str:
    """Make ``model`` run the norm of ``choice`` (see the module docstring), in place; returns
    what changed, in words. ``ChoiceSkipped`` where the choice does not apply. A compiled
    choice's ``@decompose`` is the setting it runs under (``under_compile``), not a change here."""
    choice = choice.removesuffix(DECOMPOSE_SUFFIX)
    if choice == "shipped":
        return f"{len(transformers_norms(model))} transformers norms, as built"
    if choice == "torch":
        return f"{len(swap_torch_norms(model))} norms swapped for torch.nn.RMSNorm"
    if choice in ("lab", "lab+carry", "lab+qk"):
        replaced = patch(model)
        if choice == "lab":
            return f"{len(replaced)} norms patched"
        try:
            done = carry_residual(model) if choice == "lab+carry" else fuse_qk_rope(model)
        except ValueError as e:
            raise ChoiceSkipped(str(e)) from None
        if choice == "lab+carry":
            return (f"{len(replaced)} norms patched, residual carried through "
                    f"{len(done.layers)} layers")
        return (f"{len(replaced)} norms patched, q/k norms and RoPE as one op in "
                f"{len(done.attentions)} attentions")
    if choice == "liger":
        return f"{apply_liger(model)} modules on Liger's forward"
    raise ValueError(f"unknown norm choice {choice!r}; choices: {CHOICES}")


def check_ids(vocab_size: int, device: Union[str, torch.device],
              shape: Tuple[int, int] = CHECK_SHAPE) -> torch.Tensor:
    """The token ids every choice is checked on (seeded: the same in every run)."""
    g = torch.Generator().manual_seed(SEED)
    return torch.randint(0, vocab_size, shape, generator=g).to(device)


def prefill_logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The logits of one forward over ``ids`` without a cache, in inference mode."""
    with torch.inference_mode():
        return model(input_ids=ids, use_cache=False).logits.clone()


@dataclasses.dataclass(frozen=True)
class Agreement:
    """How far one choice's logits are from ``against``'s, and how far they may be."""
    max_abs_diff: float
    limit: float
    against: str

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.limit  # False for a NaN

    def __str__(self) -> str:
        return (f"max |logits - {self.against}'s| = {self.max_abs_diff:.3g} "
                f"(limit {self.limit:.3g})")


def agreement(logits: torch.Tensor, reference: torch.Tensor, against: str = "shipped",
              rel: float = AGREE_REL) -> Agreement:
    """How far ``logits`` are from ``reference`` (``against``'s), against ``rel`` of the
    largest |reference| logit."""
    diff = (logits.float() - reference.float()).abs().max().item()
    return Agreement(diff, rel * reference.float().abs().max().item(), against)


def free() -> None:
    """Collect what the caller dropped (a model, its steps) and give the cached GPU memory
    back, so the next model's peak memory is its own."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def impl_name(arch: str, choice: str, compiled: bool = False) -> str:
    """The results' ``impl``: ``llama.lab``, ``qwen3.lab+carry``, ``llama.compile.torch``."""
    return f"{arch}.compile.{choice}" if compiled else f"{arch}.{choice}"


def parse_impl(name: str) -> Tuple[str, str, bool]:
    """``(arch, choice, compiled)`` of an ``impl_name``; ValueError naming the valid forms."""
    arch, _, rest = name.partition(".")
    compiled = rest.startswith("compile.")
    choice = rest[len("compile."):] if compiled else rest
    if arch not in ARCHS or choice not in (COMPILE_CHOICES if compiled else CHOICES):
        raise ValueError(
            f"{name!r}: expected <arch>.<choice> or <arch>.compile.<choice>, arch one of "
            f"{sorted(ARCHS)}, choice one of {CHOICES} (compiled: {COMPILE_CHOICES})")
    return arch, choice, compiled

