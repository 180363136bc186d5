"""The fused-vs-split agreement table the workbook records (rmsnorm_workbook.bench.agreement),
on a GPU: every column present, each error within the backward's tolerance."""

import pytest
import torch

pytestmark = pytest.mark.gpu

DX_REL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
DW_REL = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def test_agreement_table_row_is_complete_and_within_tolerance():
    from rmsnorm_workbook.bench.agreement import COLUMNS, compare
    row = compare(131, 4096, torch.bfloat16)
    assert set(COLUMNS) <= set(row)
    assert 0.0 <= row["dx_bitwise_equal"] <= 1.0 and 0.0 <= row["dw_bitwise_equal"] <= 1.0
    for key in ("dx_rel_err_fused", "dx_rel_err_split"):
        assert row[key] <= DX_REL[torch.bfloat16], (key, row[key])
    for key in ("dw_rel_err_fused", "dw_rel_err_split"):
        assert row[key] <= DW_REL[torch.bfloat16], (key, row[key])
