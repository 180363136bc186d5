"""The lab in models: ``patch`` swaps the RMSNorm modules of a model (``torch.nn.RMSNorm`` and
Hugging Face transformers' Llama, Mistral, Qwen2/Qwen3 and Gemma families) for the lab's, in
place, and ``unpatch`` puts them back."""

from .patch import Replaced, patch, unpatch

__all__ = ["Replaced", "patch", "unpatch"]
