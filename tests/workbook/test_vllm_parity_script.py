"""The fp8 parity script's CPU parts (scripts/vllm_fp8_parity/parity.py): the vLLM version it
names, the sources it builds; the build and the comparison itself need a GPU and nvcc (the steps
it counts are ``reference.fp8_order``'s, tested in tests/library/test_fp8.py)."""

from script_module import ROOT, load_script

SCRIPT = ROOT / "scripts" / "vllm_fp8_parity"


def load_parity():
    return load_script("scripts/vllm_fp8_parity/parity.py")


def test_names_the_sdists_version_and_commit(tmp_path):
    parity = load_parity()
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "_version.py").write_text(
        "__version__ = version = '0.34.0'\n__version_tuple__ = version_tuple = (0, 34, 0)\n"
        "__commit_id__ = commit_id = 'g62d4bc3c7'\n")
    assert parity.vllm_version(str(tmp_path)) == "0.34.0 g62d4bc3c7"
    assert parity.vllm_version(str(tmp_path / "absent")) == "unknown"


def test_binds_each_op_it_declares():
    """Every op the script calls is declared, defined by the schema and implemented in
    bindings.cpp, from the two sources it compiles."""
    parity = load_parity()
    text = (SCRIPT / "bindings.cpp").read_text()
    source = (SCRIPT / "parity.py").read_text()
    for op in ("rms_norm_static_fp8_quant", "fused_add_rms_norm_static_fp8_quant",
               "rms_norm_dynamic_per_token_quant"):
        assert f"void {op}(" in text and f'"{op}(Tensor! result' in text
        assert f'm.impl("{op}"' in text and f"ops.{op}(" in source
    assert all(s.endswith(".cu") and s in text for s in parity.SOURCES)
