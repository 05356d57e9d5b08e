"""Environment variables: typed readers, aliases, and a clear error for a value they do not accept."""
import pytest

from hearth import envs


@pytest.mark.parametrize("value, want", [("", True), ("1", True), ("on", True), ("TRUE", True), ("0", False),
                                         ("off", False), (" no ", False)])
def test_flags_accept_the_usual_spellings(monkeypatch, value, want):
    for name, reader in (("HEARTH_PANELS", envs.panels_enabled), ("HEARTH_INT4_TILES", envs.int4_tiles),
                         ("HEARTH_Q6_TILES", envs.q6_tiles), ("HEARTH_KEEP_FREED_MEMORY", envs.keep_freed_memory),
                         ("HEARTH_BF16_DOT", envs.bf16_dot), ("HEARTH_KERNELS", envs.kernels_enabled),
                         ("HEARTH_DECODE_PROGRAM", envs.decode_program), ("HEARTH_HUGEPAGES", envs.hugepages)):
        monkeypatch.setenv(name, value)
        assert reader() is want, name


def test_a_flag_typo_is_an_error_not_the_default(monkeypatch):
    monkeypatch.setenv("HEARTH_Q6_TILES", "of")
    with pytest.raises(ValueError, match="HEARTH_Q6_TILES must be 1 or 0"):
        envs.q6_tiles()


def test_kernels_isa(monkeypatch):
    monkeypatch.delenv("HEARTH_KERNELS_ISA", raising=False)
    assert envs.kernels_isa() is None
    for value, want in (("auto", None), ("AVX2", "avx2"), (" avx512 ", "avx512")):
        monkeypatch.setenv("HEARTH_KERNELS_ISA", value)
        assert envs.kernels_isa() == want
    monkeypatch.setenv("HEARTH_KERNELS_ISA", "sse4")
    with pytest.raises(ValueError, match="HEARTH_KERNELS_ISA must be auto, avx2 or avx512"):
        envs.kernels_isa()


def test_quant_modes(monkeypatch):
    monkeypatch.delenv("HEARTH_QUANT_ACT", raising=False)
    monkeypatch.delenv("HEARTH_QUANT_GEMM", raising=False)
    assert envs.quant_activations() == "auto" and envs.quant_gemm() == "auto"
    for value, want in (("AUTO", "auto"), ("x2", "int8x2"), ("INT8", "int8"), ("fp32", "float")):
        monkeypatch.setenv("HEARTH_QUANT_ACT", value)
        assert envs.quant_activations() == want
    for value, want in (("Auto", "auto"), ("1", "on"), ("off", "off")):
        monkeypatch.setenv("HEARTH_QUANT_GEMM", value)
        assert envs.quant_gemm() == want
    monkeypatch.setenv("HEARTH_QUANT_ACT", "int4")
    with pytest.raises(ValueError, match="HEARTH_QUANT_ACT must be auto, int8x2, int8 or float, got 'int4'"):
        envs.quant_activations()
    monkeypatch.setenv("HEARTH_QUANT_GEMM", "2")
    with pytest.raises(ValueError, match="HEARTH_QUANT_GEMM must be auto, 1 or 0"):
        envs.quant_gemm()
