"""The lab in models: ``patch(model)`` swaps the RMSNorm modules of a model (``torch.nn.RMSNorm``
and Hugging Face transformers' Llama, Mistral, Qwen2/Qwen3 and Gemma families) for the lab's, in
place, each rounding as the module it replaces, and ``unpatch(model)`` puts them back;
``carry_residual(model)`` then fuses every residual add of a Llama-family decoder stack into the
next norm, and ``uncarry_residual(model)`` undoes it (before ``unpatch``);
``fuse_qk_rope(model)`` runs the per-head q/k norms and RoPE of Qwen3-style attention as one op,
``unfuse_qk_rope(model)`` undoes it."""

from .attention import Fused, fuse_qk_rope, unfuse_qk_rope
from .patch import Replaced, patch, unpatch
from .residual import Carried, carry_residual, uncarry_residual

__all__ = ["Replaced", "patch", "unpatch", "Carried", "carry_residual", "uncarry_residual",
           "Fused", "fuse_qk_rope", "unfuse_qk_rope"]
