"""The workloads of ``bench --op model``: one model step each, as a zero-argument function over
inputs made once (seeded token ids), so a timer can call it back to back.

* ``train``    forward + backward of ``batch × seq`` tokens, the loss transformers computes from
               ``labels`` (cross-entropy of the logits, in fp32); the gradients are set to None
               after the backward, so every step allocates them afresh (no optimizer). Op ``full``.
* ``prefill``  a forward of ``batch × seq`` tokens in inference mode, no cache, logits of the last
               position only (as generation asks for them). Op ``fwd``.
* ``decode``   one new token for each of ``decode_batch`` sequences, against a transformers
               ``StaticCache`` of ``cache_len`` positions at position ``decode_at`` (every step
               writes the same slot: the cache's contents need not mean anything, its size does).
               Op ``fwd``. A static cache keeps every tensor's address fixed, so the step can be
               captured in a CUDA graph (``timing.capture_graph``).

``call`` is what runs the model: the model itself, or ``torch.compile(model)``.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Callable, List, Optional, Tuple

import torch
from torch import nn

WORKLOADS: Tuple[str, ...] = ("train", "prefill", "decode")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big the models and the workloads are."""
    layers: int
    batch: int         # sequences of a train or prefill step
    seq: int           # their length
    decode_batch: int  # sequences of a decode step, one token each
    cache_len: int     # positions of the decode step's static cache
    decode_at: int     # the position every decode step writes


FULL = Sizes(layers=8, batch=8, seq=2048, decode_batch=8, cache_len=4096, decode_at=2048)
QUICK = Sizes(layers=2, batch=2, seq=1024, decode_batch=8, cache_len=4096, decode_at=2048)


@dataclasses.dataclass(frozen=True)
class Step:
    """One workload of one model, ready to be called."""
    workload: str
    op: str                     # the results' op: full (train) or fwd
    M: int                      # tokens per step
    fn: Callable[[], object]


def _ids(vocab: int, shape: Tuple[int, int], device, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=g).to(device)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def train_step(model: nn.Module, sizes: Sizes, call: Optional[Callable] = None) -> Step:
    """Sets ``model`` to training mode."""
    call = model if call is None else call  # a compiled module has no truth value
    vocab, device = model.config.vocab_size, _device(model)
    ids = _ids(vocab, (sizes.batch, sizes.seq), device, 1)
    labels = _ids(vocab, (sizes.batch, sizes.seq), device, 2)
    model.train()

    def step() -> None:
        call(input_ids=ids, labels=labels).loss.backward()
        model.zero_grad(set_to_none=True)
    return Step("train", "full", sizes.batch * sizes.seq, step)


def prefill_step(model: nn.Module, sizes: Sizes, call: Optional[Callable] = None) -> Step:
    """Sets ``model`` to evaluation mode."""
    call = model if call is None else call  # a compiled module has no truth value
    ids = _ids(model.config.vocab_size, (sizes.batch, sizes.seq), _device(model), 3)
    model.eval()

    def step() -> torch.Tensor:
        with torch.inference_mode():
            return call(input_ids=ids, use_cache=False, logits_to_keep=1).logits
    return Step("prefill", "fwd", sizes.batch * sizes.seq, step)


def static_cache(model: nn.Module, batch: int, max_len: int):
    """A transformers ``StaticCache`` for ``model``: transformers from 4.56 on allocates it on
    its first update (batch, device and dtype from the keys it is given); before, here."""
    from transformers import StaticCache

    if "max_batch_size" in inspect.signature(StaticCache.__init__).parameters:
        return StaticCache(config=model.config, max_batch_size=batch, max_cache_len=max_len,
                           device=_device(model), dtype=model.dtype)
    return StaticCache(config=model.config, max_cache_len=max_len)


def decode_step(model: nn.Module, sizes: Sizes, call: Optional[Callable] = None) -> Step:
    """Sets ``model`` to evaluation mode. Every step writes position ``decode_at``: transformers
    before 5 takes the position as ``cache_position``; from 5 on a static cache keeps its write
    position in a device counter per layer, which each call advances, so the step sets those
    counters back first (one small copy each; a step replayed thousands of times would otherwise
    write past the cache's end). Either way the position is never read back to the host, which a
    CUDA graph could not capture."""
    call = model if call is None else call  # a compiled module has no truth value
    device = _device(model)
    ids = _ids(model.config.vocab_size, (sizes.decode_batch, 1), device, 4)
    cache = static_cache(model, sizes.decode_batch, sizes.cache_len)
    position = torch.full((1,), sizes.decode_at, dtype=torch.long, device=device)
    params = inspect.signature(model.forward).parameters
    kwargs = {"cache" if "cache" in params else "past_key_values": cache,
              "position_ids": position.view(1, 1).expand(sizes.decode_batch, 1)}
    if "cache_position" in params:
        kwargs["cache_position"] = position
    model.eval()

    def step() -> torch.Tensor:
        with torch.inference_mode():
            for counter in write_positions(cache):
                counter.copy_(position[0])
            return call(input_ids=ids, use_cache=True, **kwargs).logits
    return Step("decode", "fwd", sizes.decode_batch, step)


def write_positions(cache) -> List[torch.Tensor]:
    """The per-layer write-position counters of a transformers 5 static cache (none before)."""
    return [layer.cumulative_length for layer in getattr(cache, "layers", ())
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]


MAKERS = {"train": train_step, "prefill": prefill_step, "decode": decode_step}


def make_step(workload: str, model: nn.Module, sizes: Sizes,
              call: Optional[Callable] = None) -> Step:
    if workload not in MAKERS:
        raise ValueError(f"unknown workload {workload!r}; workloads: {WORKLOADS}")
    return MAKERS[workload](model, sizes, call)
