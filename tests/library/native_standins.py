"""Stand-in kernels for the native node's CPU tests: Python functions behind TVM-FFI's C ABI
with the CuTe kernels' signatures, computing with the reference formulas."""

import ctypes

import torch
import tvm_ffi

from rmsnorm_lab.cute.launch.args import Arg
from rmsnorm_lab.cute.plan.forward import RowsRule
from rmsnorm_lab.native.launch import BackwardSpec, LaunchSpec, StepSpec, ffi_handle

DY, X, W, RSTD, DX, PARTIALS, NO_PARTIALS, DW, DH, COUNT, OFFSET = (
    Arg.DY, Arg.X, Arg.W, Arg.RSTD, Arg.DX, Arg.PARTIALS, Arg.NO_PARTIALS, Arg.DW, Arg.DH,
    Arg.COUNT, Arg.OFFSET)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
EPS = 1e-6


def as_torch(t) -> torch.Tensor:
    """A torch view of a CPU tensor a kernel received (a non-owning TVM-FFI tensor)."""
    dtype = DTYPES[str(t.dtype)]
    shape, strides = tuple(t.shape), tuple(t.strides)
    if 0 in shape:
        return torch.empty(shape, dtype=dtype)
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    size = torch.empty((), dtype=dtype).element_size()
    buf = (ctypes.c_char * (span * size)).from_address(t.data_ptr())
    return torch.frombuffer(buf, dtype=dtype, count=span).as_strided(shape, strides)


def described(t) -> dict:
    """What a kernel saw of a tensor argument (the argument itself dies with the call)."""
    return dict(shape=tuple(t.shape), strides=tuple(t.strides), ptr=t.data_ptr(),
                dtype=str(t.dtype))


class StandIns:
    """Stand-in kernels with the CuTe kernels' signatures; every call is logged."""

    def __init__(self):
        self.log = []

    def forward(self, x, w, y, rstd, grid, eps, offset):
        self.log.append(("forward", dict(x=described(x), grid=grid, eps=eps, offset=offset,
                                         rstd_rows=rstd.shape[0])))
        X, Y, R = as_torch(x).double(), as_torch(y), as_torch(rstd)
        r = torch.rsqrt(X.pow(2).mean(-1) + eps)
        out = X * r[:, None]
        if w.shape[0]:
            out = out * (as_torch(w).double() + offset)
        if rstd.shape[0]:  # an inference launch passes a zero-length stand-in
            R.copy_(r)
        Y.copy_(out)

    def forward_add(self, x, r, w, y, h, rstd, grid, eps, offset):
        """The fused add's forward: h = x + r (in x's dtype), y its norm."""
        self.log.append(("forward_add", dict(x=described(x), r=described(r), grid=grid)))
        as_torch(h).copy_(as_torch(x) + as_torch(r))
        self.forward(h, w, y, rstd, grid, eps, offset)

    def backward_dh(self, dy, x, w, rstd, dx, dh, part, count, offset):
        """The fused add's dx kernels: the norm's dx plus h's own gradient."""
        self.log.append(("backward_dh", dict(dh=described(dh))))
        self.backward(dy, x, w, rstd, dx, part, count, offset)
        as_torch(dx).add_(as_torch(dh))

    def backward(self, dy, x, w, rstd, dx, part, count, offset):
        """Fused: dx and the strip partials of dW (``count`` strips); split: dx only."""
        self.log.append(("backward", dict(dy=described(dy), count=count, part_rows=part.shape[0])))
        DY, X, R = as_torch(dy).double(), as_torch(x).double(), as_torch(rstd).double()
        wt = (as_torch(w).double() + offset) if w.shape[0] else torch.ones(X.shape[1]).double()
        xhat = X * R[:, None]
        g = DY * wt
        as_torch(dx).copy_(R[:, None] * (g - xhat * (g * xhat).mean(-1, keepdim=True)))
        if w.shape[0] and part.shape[0] == count:  # fused with a weight: one partial per strip
            self._partials(DY * xhat, as_torch(part), count)

    def dw(self, dy, x, rstd, part):
        self.log.append(("dw", dict(part_rows=part.shape[0])))
        xhat = as_torch(x).double() * as_torch(rstd).double()[:, None]
        self._partials(as_torch(dy).double() * xhat, as_torch(part), part.shape[0])

    def reduce(self, part, dw):
        self.log.append(("reduce", dict(part_rows=part.shape[0])))
        as_torch(dw).copy_(as_torch(part).sum(0))

    @staticmethod
    def _partials(contrib, part, rows):
        for i, strip in enumerate(torch.tensor_split(contrib, rows)):
            part[i].copy_(strip.sum(0))

    def calls(self, name):
        return [args for n, args in self.log if n == name]


def functions(k: StandIns) -> dict:
    return {name: tvm_ffi.convert(getattr(k, name)) for name in ("forward", "backward", "dw",
                                                                  "reduce", "forward_add",
                                                                  "backward_dh")}


def make_launch(native, fns, x, with_weight, split=False, aligned=True, grid=3, count=2,
                eps=EPS, offset=0.0, backward=None, training=True, spec_only=False,
                residual=False):
    """A Launch for contiguous ``x`` (rows of its last dimension) with the stand-in kernels, its
    three backwards (dx and dW, dx alone, dW alone) as ``BackwardLaunch.steps`` orders
    them; ``grid`` and ``count`` are the forward grid and the strips or row groups (capped at
    M); an inference launch (no backwards) with ``training=False``; its LaunchSpec with
    ``spec_only``; the fused add's with ``residual``."""
    n = x.shape[-1]
    back = backward or fns["backward_dh" if residual else "backward"]
    dh = (DH,) if residual else ()
    groups = RowsRule(1, count)
    dx_alone = (_step(back, (DY, X, W, RSTD, DX) + dh + (NO_PARTIALS, COUNT, OFFSET),
                      RowsRule(), "split"),)
    reduce = _step(fns["reduce"], (PARTIALS, DW), None, "split" if split else "fused",
                   stage="reduce", on_partials=True)
    dw_alone = (_step(fns["dw"], (DY, X, RSTD, PARTIALS), None, "split"), reduce)
    if split:
        both = dx_alone + dw_alone if with_weight else dx_alone
    else:
        both = (_step(back, (DY, X, W, RSTD, DX) + dh
                      + (PARTIALS if with_weight else NO_PARTIALS, COUNT, OFFSET), groups,
                      "fused"),) + ((reduce,) if with_weight else ())
    backwards = ()
    if training:
        rows = groups if with_weight else None
        backwards = (BackwardSpec(both, rows), BackwardSpec(dx_alone, None),
                     BackwardSpec(dw_alone if with_weight else dx_alone, rows))
    spec = LaunchSpec(
        forward=ffi_handle(fns["forward_add" if residual else "forward"]), forward_name="row",
        forward_argb=0xFF0000FF,
        forward_grid=RowsRule(1, grid), row_stride=n, weighted=with_weight, eps=eps,
        offset=offset, nvtx=False, no_weight=torch.empty(0, dtype=x.dtype),
        no_rstd=torch.empty(0), no_partials=torch.empty(1, 1), aligned=aligned,
        backward=backwards, residual=residual)
    return spec if spec_only else native.Launch(spec)


def _step(fn, args, count, name, stage="launch", on_partials=False):
    return StepSpec(ffi_handle(fn), args, count, stage, name, 0xFFFFFFFF, on_partials)


def file_launch(memo, x, w, eps, offset, mode, launch, code, r=None) -> bool:
    """Run a call through ``memo`` with a planner that returns ``launch`` under the settings
    ``code`` (the route a new call takes); True when the memo filed it under the call's key."""
    before = len(memo)
    if r is None:
        memo.call(x, w, eps, offset, mode, lambda: (launch, code))
    else:
        memo.call_add(x, r, w, eps, offset, mode, lambda: (launch, code))
    found = memo.find(x, w, eps, offset, mode) if r is None else memo.find(x, w, eps, offset,
                                                                          mode, r)
    return len(memo) > before or found is launch
