"""NVFP4 on Blackwell, modelled: its bytes and time from the H200's calibration of the bf16
forward, labelled as modelled."""

import numpy as np
import pytest

from rmsnorm_workbook import results
from rmsnorm_workbook.analysis import model


def test_bytes_of_nvfp4_against_bf16():
    M, N = 16384, 4096
    assert model.nvfp4_bytes(M, N) == pytest.approx(M * N * (2 + 0.5 + 1 / 16) + 2 * N)
    assert model.nvfp4_bytes(M, N) / model.bytes_moved("fwd", M, N) == pytest.approx(
        2.5625 / 4, rel=1e-3)


def test_the_table_is_modelled_from_the_recorded_calibration():
    table = model.nvfp4_table(results.load_all())
    modelled = [c for c in table.columns if c.endswith("_us (b200, modelled)")]
    assert len(modelled) == 2
    nv, bf = table[modelled[0]].to_numpy(), table[modelled[1]].to_numpy()
    assert np.isfinite(nv).all() and (nv < bf).all()
    # past the fixed cost the time follows the bytes: 2.5625 against 4 bytes an element
    assert nv[-1] / bf[-1] == pytest.approx(2.5625 / 4, rel=0.05)
