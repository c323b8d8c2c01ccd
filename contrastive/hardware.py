"""What this machine is, and the precision a run should train in on it.

bf16 autocast pays only where the hardware computes in bf16: on a CPU with native bf16
instructions it is about 2x faster than fp32 (benchmarks/results/train.md), elsewhere oneDNN
emulates it and a training step is several times SLOWER than fp32 (11x for ``moco_cifar``'s
demo setup on an AMD EPYC Zen 3, AVX2 only). ``--mixed-precision auto`` therefore asks
:func:`resolve_precision`, which picks, in this order:

1. an explicit ``no | bf16 | fp16`` (the command line);
2. a precision set in accelerate's configuration (``accelerate config`` read by
   ``accelerate launch``, or ``ACCELERATE_MIXED_PRECISION``);
3. the precision recorded by the run being resumed (a resume never switches silently);
4. the hardware: bf16 on CUDA devices that support it and on CPUs with native bf16, fp32
   ("no") elsewhere.

:func:`cpu_kind` describes the CPU (family/model, torch's kernel capability, the AVX-512 and
bf16 flags) for every figure a benchmark or the demo records: "AMD EPYC" names both kinds.

Imports torch only (accelerate's configuration file is read as text), so evaluation and
benchmarks use it as well as the engine.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
from pathlib import Path
from typing import Any

import torch

__all__ = ["PRECISIONS", "cpu_kind", "native_bf16_cpu", "cuda_bf16", "cpu_kind_line", "accelerate_precision",
           "resolve_precision", "warn_if_emulated_bf16"]

logger = logging.getLogger(__name__)

#: the values ``--mixed-precision`` takes; "auto" is resolved to one of the others
PRECISIONS = ("auto", "no", "bf16", "fp16")
_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86: instructions that compute in bf16


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # one processor is enough: the others are the same kind
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _cpu_flags() -> set[str]:
    """CPU feature flags: torch's own query where it has one, else /proc/cpuinfo.

    torch names them like the kernel (``avx512_bf16``, ``amx_bf16``) except ``avx512_f``; both
    spellings are kept. On ARM the kernel's ``Features`` line holds ``bf16``.
    """
    flags: set[str] = set()
    caps = getattr(torch.cpu, "get_capabilities", None)
    if caps is not None:
        try:
            flags |= {k for k, v in caps().items() if v is True}
        except Exception:  # noqa: BLE001 - an old or odd torch build: fall back to /proc
            pass
    info = _cpuinfo()
    flags |= set(info.get("flags", "").split()) | set(info.get("Features", "").split())
    if "avx512_f" in flags:
        flags.add("avx512f")
    return flags


def _mkldnn_bf16() -> bool:
    """oneDNN's own answer; True on AVX-512 CPUs WITHOUT bf16 too (emulated, slow)."""
    query = getattr(getattr(torch.ops, "mkldnn", None), "_is_mkldnn_bf16_supported", None)
    try:
        return bool(query()) if query is not None else False
    except Exception:  # noqa: BLE001 - a build without oneDNN
        return False


@functools.lru_cache(maxsize=1)
def native_bf16_cpu() -> tuple[bool, str]:
    """Whether this CPU computes bf16 natively, and why (one line for the log).

    Native means a bf16 instruction set (x86: ``avx512_bf16`` or ``amx_bf16``; ARM: ``bf16``)
    AND oneDNN using bf16 kernels (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``; it is
    False when oneDNN is capped, e.g. ``ONEDNN_MAX_CPU_ISA=AVX2``).
    """
    flags = _cpu_flags()
    have = [f for f in (*_BF16_FLAGS, "bf16") if f in flags]
    onednn = _mkldnn_bf16()
    capability = torch.backends.cpu.get_cpu_capability()
    if have and onednn:
        return True, f"the CPU has native bf16 ({', '.join(have)}; oneDNN bf16 kernels)"
    if not have:
        return False, (f"the CPU has no native bf16 ({capability}: no avx512_bf16 / amx_bf16), "
                       "so bf16 would be emulated")
    return False, (f"oneDNN does not use the CPU's bf16 ({', '.join(have)}; kernels capped at "
                   f"{capability}), so bf16 would be emulated")


def cuda_bf16() -> bool:
    """Whether the current CUDA device computes bf16 (Ampere and newer)."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def cpu_kind() -> dict[str, Any]:
    """The CPU a figure was measured on: name, family/model, torch's kernel capability, the
    flags that decide bf16 speed, and whether bf16 is native (see :func:`native_bf16_cpu`)."""
    info = _cpuinfo()
    flags = _cpu_flags()
    native, _ = native_bf16_cpu()
    return {
        "name": info.get("model name") or platform.processor() or platform.machine(),
        "family": info.get("cpu family"),
        "model": info.get("model"),
        "machine": platform.machine(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "avx512f": "avx512f" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "mkldnn_bf16": _mkldnn_bf16(),
        "native_bf16": native,
        "cores": os.cpu_count(),
    }


def cpu_kind_line(kind: dict[str, Any] | None = None) -> str:
    """:func:`cpu_kind` in one line, e.g. "AMD EPYC (family 25 model 1), AVX2, no native bf16"."""
    k = kind or cpu_kind()
    fam = f" (family {k['family']} model {k['model']})" if k.get("family") else ""
    bf16 = "native bf16" if k["native_bf16"] else "no native bf16"
    flags = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if k.get(f)]
    return f"{k['name']}{fam}, {k['capability']}{', ' + ' '.join(flags) if flags else ''}, {bf16}"


def _accelerate_config_precision() -> str | None:
    """``mixed_precision`` of accelerate's default configuration file, if one sets it."""
    home = os.environ.get("HF_HOME", os.path.join(os.environ.get(
        "XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")), "huggingface"))
    folder = Path(os.environ.get("ACCELERATE_CONFIG_DIR", Path(home) / "accelerate"))
    for name in ("default_config.yaml", "default_config.json"):
        try:
            text = (folder / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.strip().strip(",").partition(":")
            if key.strip().strip('"') == "mixed_precision":
                value = value.strip().strip("'\"").lower()
                return value if value in ("no", "bf16", "fp16", "fp8") else None
    return None


def accelerate_precision() -> str | None:
    """The precision accelerate's configuration asks for, or None when it asks for none.

    ``accelerate launch`` exports ``ACCELERATE_MIXED_PRECISION`` from ``accelerate config`` and
    its own flags; it writes "no" also when nothing is configured, so "no" counts only when a
    configuration file sets it (``--mixed_precision no`` given to the launcher alone cannot be
    told apart from nothing: pass ``--mixed-precision no`` to the recipe instead).
    """
    value = os.environ.get("ACCELERATE_MIXED_PRECISION", "").strip().lower()
    if not value:
        return None
    if value != "no":
        return value
    return "no" if _accelerate_config_precision() is not None else None


def resolve_precision(requested: str, *, on_cpu: bool, recorded: str | None = None
                      ) -> tuple[str, str]:
    """``(precision, reason)``: what a run asking for ``requested`` trains in, and why.

    ``requested`` is one of :data:`PRECISIONS`; ``on_cpu`` says where the run computes;
    ``recorded`` is the precision of the run being resumed (None for a new run). The order of
    precedence is the module docstring's.
    """
    if requested not in PRECISIONS:
        raise ValueError(f"--mixed-precision {requested!r}: expected one of "
                         f"{', '.join(PRECISIONS)}")
    if requested != "auto":
        precision, reason = requested, "--mixed-precision"
    elif (configured := accelerate_precision()) is not None:
        precision, reason = configured, "auto: accelerate's configuration"
    elif recorded in ("no", "bf16", "fp16"):
        precision, reason = recorded, "auto: the precision recorded by the run being resumed"
    else:
        precision, reason = _hardware_precision(on_cpu)
    if precision == "fp16" and on_cpu:
        hint = "auto (bf16 where the CPU has native bf16, else fp32), " if requested != "auto" else ""
        raise ValueError(f"fp16 on the CPU ({reason}): accelerate would silently run fp32. "
                         f"Pass --mixed-precision {hint}bf16 or no")
    return precision, reason


def _hardware_precision(on_cpu: bool) -> tuple[str, str]:
    """bf16 where the device computes it natively, fp32 ("no") elsewhere."""
    if not on_cpu:
        if cuda_bf16():
            return "bf16", "auto: the CUDA device supports bf16"
        return "no", "auto: the CUDA device has no bf16 (fp16 needs loss scaling: ask for it)"
    native, why = native_bf16_cpu()
    return ("bf16" if native else "no"), f"auto: {why}"


@functools.lru_cache(maxsize=1)
def warn_if_emulated_bf16() -> None:
    """Warn once per process that bf16 on this CPU is emulated (it still works)."""
    native, why = native_bf16_cpu()
    if not native:
        logger.warning("bf16 on this CPU: %s, expected to be several times slower than fp32 "
                       "(pass --mixed-precision no for fp32)", why)
