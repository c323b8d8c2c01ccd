"""``--mixed-precision auto``: bf16 only where the hardware computes it natively, accelerate's
configuration and the resumed run's record first; the CPU kind every figure is labelled with.

The capability queries are mocked to play each kind of CPU; the real ones are called once too.
"""

from __future__ import annotations

import pytest
import torch

from contrastive import hardware


@pytest.fixture
def cpu(monkeypatch, tmp_path):
    """Play a CPU: ``cpu(flags, onednn)`` sets what the capability queries answer. accelerate's
    configuration is cleared (no environment variable, an empty configuration folder)."""
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("ACCELERATE_CONFIG_DIR", raising=False)

    def play(flags: set[str], onednn: bool) -> None:
        monkeypatch.setattr(hardware, "_cpu_flags", lambda: set(flags))
        monkeypatch.setattr(hardware, "_mkldnn_bf16", lambda: onednn)
        hardware.native_bf16_cpu.cache_clear()

    yield play
    hardware.native_bf16_cpu.cache_clear()


AVX2 = {"avx2", "fma3"}  # AMD EPYC Zen 3: the project's AVX2 kind
AVX512_NO_BF16 = AVX2 | {"avx512f", "avx512_bw"}  # Skylake to Ice Lake: oneDNN says True
SAPPHIRE_RAPIDS = AVX512_NO_BF16 | {"avx512_bf16", "amx_bf16"}


@pytest.mark.parametrize(("flags", "onednn", "expected"), [
    (AVX2, False, "no"),
    (AVX512_NO_BF16, True, "no"),  # oneDNN's query alone would say bf16: it is emulated there
    (SAPPHIRE_RAPIDS, True, "bf16"),
    (SAPPHIRE_RAPIDS, False, "no"),  # oneDNN capped (ONEDNN_MAX_CPU_ISA=AVX2): emulated
    ({"asimd", "bf16"}, True, "bf16"),  # ARM with the bf16 extension
])
def test_auto_picks_bf16_only_with_native_bf16(cpu, flags, onednn, expected):
    cpu(flags, onednn)
    precision, reason = hardware.resolve_precision("auto", on_cpu=True)
    assert precision == expected
    assert reason.startswith("auto: ") and ("emulated" in reason) == (expected == "no")


def test_an_explicit_precision_wins_and_emulated_bf16_warns_once(cpu, caplog):
    cpu(AVX2, False)
    assert hardware.resolve_precision("bf16", on_cpu=True) == ("bf16", "--mixed-precision")
    assert hardware.resolve_precision("no", on_cpu=True)[0] == "no"
    hardware.warn_if_emulated_bf16.cache_clear()
    hardware.warn_if_emulated_bf16()
    hardware.warn_if_emulated_bf16()
    warnings = [r for r in caplog.records if "several times slower" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    hardware.warn_if_emulated_bf16.cache_clear()


def test_auto_defers_to_accelerates_configuration(cpu, monkeypatch, tmp_path):
    cpu(AVX2, False)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # `accelerate config`: bf16
    assert hardware.resolve_precision("auto", on_cpu=True)[0] == "bf16"
    assert hardware.resolve_precision("no", on_cpu=True)[0] == "no"  # the command line wins
    cpu(SAPPHIRE_RAPIDS, True)
    # `accelerate launch` writes "no" even when nothing is configured: then the hardware decides
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert hardware.resolve_precision("auto", on_cpu=True)[0] == "bf16"
    # ... but a configuration file that says "no" is a choice, and wins
    config = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("compute_environment: LOCAL_MACHINE\nmixed_precision: 'no'\nnum_processes: 1\n")
    precision, reason = hardware.resolve_precision("auto", on_cpu=True)
    assert (precision, reason) == ("no", "auto: accelerate's configuration")


def test_a_resume_keeps_the_recorded_precision(cpu, monkeypatch):
    cpu(AVX2, False)
    assert hardware.resolve_precision("auto", on_cpu=True, recorded="bf16")[0] == "bf16"
    cpu(SAPPHIRE_RAPIDS, True)
    assert hardware.resolve_precision("auto", on_cpu=True, recorded="no")[0] == "no"
    assert hardware.resolve_precision("bf16", on_cpu=True, recorded="no")[0] == "bf16"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert hardware.resolve_precision("auto", on_cpu=True, recorded="no")[0] == "bf16"


def test_fp16_on_the_cpu_and_unknown_values_are_refused(cpu, monkeypatch):
    cpu(AVX2, False)
    with pytest.raises(ValueError, match="fp16 on the CPU.*--mixed-precision auto"):
        hardware.resolve_precision("fp16", on_cpu=True)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    with pytest.raises(ValueError, match="accelerate's configuration"):
        hardware.resolve_precision("auto", on_cpu=True)
    with pytest.raises(ValueError, match="expected one of auto, no, bf16, fp16"):
        hardware.resolve_precision("float16", on_cpu=True)


def test_the_cuda_device_decides_on_a_gpu(cpu, monkeypatch):
    cpu(AVX2, False)
    for supported, expected in ((True, "bf16"), (False, "no")):
        monkeypatch.setattr(hardware, "cuda_bf16", lambda s=supported: s)
        assert hardware.resolve_precision("auto", on_cpu=False)[0] == expected


def test_the_real_queries_agree_with_torch(monkeypatch):
    """Unmocked: native bf16 needs oneDNN's bf16 AND a bf16 flag; cpu_kind names the kind."""
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    hardware.native_bf16_cpu.cache_clear()
    native, reason = hardware.native_bf16_cpu()
    kind = hardware.cpu_kind()
    assert kind["capability"] == torch.backends.cpu.get_cpu_capability()
    assert kind["mkldnn_bf16"] == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert native == (kind["mkldnn_bf16"] and (kind["avx512_bf16"] or kind["amx_bf16"]
                                               or "bf16" in hardware._cpu_flags()))
    assert kind["native_bf16"] == native and reason
    line = hardware.cpu_kind_line(kind)
    assert kind["capability"] in line and ("no native bf16" in line) == (not native)
    assert hardware.resolve_precision("auto", on_cpu=True)[0] in ("no", "bf16")
