"""FlashInfer's peers without FlashInfer: absent, they are not peers; present (a stand-in module
with its call signatures), the fused add runs in place on private copies, never on the
benchmark's shared inputs."""

import sys
import types

import pytest
import torch

from rmsnorm_lab import reference
from rmsnorm_workbook.bench import fused_add, peers


@pytest.fixture
def fake_flashinfer(monkeypatch):
    calls = []

    def rmsnorm(x, w, eps=1e-6, out=None, enable_pdl=None):
        return reference.rms_norm(x, w, eps, 0.0, "gemma")

    def fused_add_rmsnorm(x, r, w, eps=1e-6, enable_pdl=None):
        calls.append((x.data_ptr(), r.data_ptr()))
        r.add_(x)
        x.copy_(reference.rms_norm(r, w, eps, 0.0, "gemma"))

    norm = types.SimpleNamespace(rmsnorm=rmsnorm, fused_add_rmsnorm=fused_add_rmsnorm)
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(norm=norm))
    monkeypatch.setitem(sys.modules, "flashinfer.norm", norm)
    return calls


def test_absent_flashinfer_is_no_peer(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    monkeypatch.setitem(sys.modules, "flashinfer.norm", None)
    assert peers.flashinfer(1e-6) is None and fused_add.flashinfer(1e-6) is None
    assert "flashinfer" not in peers.forward_peers(1e-6)


def test_fused_add_peer_leaves_the_shared_inputs_intact(fake_flashinfer):
    run = fused_add.flashinfer(1e-6)
    x, r = torch.randn(8, 64), torch.randn(8, 64)
    w = torch.rand(64) + 0.5
    x0, r0 = x.clone(), r.clone()
    y, h = run(x, r, w)
    assert torch.equal(x, x0) and torch.equal(r, r0)          # the caller's tensors untouched
    assert torch.allclose(h, x0 + r0)
    assert torch.allclose(y, reference.rms_norm(x0 + r0, w, 1e-6, 0.0, "gemma"))
    run(x, r, w)                                               # a timed call: the same copies
    assert len({c for c in fake_flashinfer}) == 1
    run(torch.randn(4, 32), torch.randn(4, 32), torch.rand(32))  # another shape: copies renewed
    assert len(run.copies) == 1


def test_flashinfer_is_a_forward_peer_only(fake_flashinfer):
    assert "flashinfer" in peers.forward_peers(1e-6)
    assert "flashinfer" not in peers.BACKWARD_PEERS and "flashinfer" in peers.forward_only()
    assert "flashinfer+add" in fused_add.FORWARD_PEERS
    assert "flashinfer+add" not in fused_add.BACKWARD_PEERS
