"""What the CPU offers a half-precision model (_host/cpu.py), read from /proc/cpuinfo: known
answers for processors with and without bfloat16 matrix units, the warning a load gives where a
half-precision model would run element by element, and ``layerwise info`` with no argument."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from layerwise._encoder.loading import warn_slow_dtype
from layerwise._host import cpu

SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16
"""
GENOA = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9654 96-Core Processor
flags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16
"""
ROME = """vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse2 avx avx2 fma
"""
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes sha1 asimdhp sve bf16 i8mm
CPU implementer\t: 0x41
"""


@pytest.fixture
def cpuinfo(monkeypatch):
    def use(text: str, machine: str = "x86_64") -> None:
        monkeypatch.setattr(cpu, "_cpuinfo", lambda: tuple(text.splitlines()))
        monkeypatch.setattr(cpu.platform, "machine", lambda: machine)

    return use


@pytest.mark.parametrize(
    ("text", "machine", "name", "vendor", "vector", "bf16", "fp16"),
    [
        (SAPPHIRE_RAPIDS, "x86_64", "Intel(R) Xeon(R) Platinum 8480+", "GenuineIntel", "AVX-512", "AMX",
         "AVX-512 FP16"),
        (GENOA, "x86_64", "AMD EPYC 9654 96-Core Processor", "AuthenticAMD", "AVX-512", "AVX-512 BF16", None),
        (ROME, "x86_64", "AMD EPYC 7B12", "AuthenticAMD", "AVX2", None, None),
        (GRAVITON3, "aarch64", None, None, "SVE", "Arm BF16", "Arm FP16"),
    ],
)  # fmt: skip
def test_units_are_read_from_cpuinfo(cpuinfo, text, machine, name, vendor, vector, bf16, fp16):
    cpuinfo(text, machine)
    assert (cpu.cpu_vendor(), cpu.vector_units(), cpu.bf16_units(), cpu.fp16_units()) == (
        vendor,
        vector,
        bf16,
        fp16,
    )
    assert cpu.matrix_units("bfloat16") == bf16 and cpu.matrix_units("float32") == vector
    if name is not None:
        assert cpu.cpu_name() == name


def test_a_bf16_flag_on_an_x86_machine_is_not_arms(cpuinfo):
    cpuinfo("flags\t: avx2 bf16\n")  # no such x86 flag today; never mistaken for Arm's instructions
    assert cpu.bf16_units() is None


def test_no_cpuinfo_gives_no_units(cpuinfo):
    cpuinfo("")
    assert (cpu.cpu_flags(), cpu.bf16_units(), cpu.vector_units()) == (frozenset(), None, None)


@pytest.mark.parametrize(
    ("text", "dtype", "device", "warned"),
    [
        (ROME, "bfloat16", "cpu", True),
        (ROME, "float16", "cpu", True),
        (ROME, "float32", "cpu", False),
        (SAPPHIRE_RAPIDS, "bfloat16", "cpu", False),
        (GENOA, "float16", "cpu", True),  # AVX-512 BF16, but no float16 units
        (ROME, "bfloat16", "cuda", False),  # the GPU runs it, not this CPU
        ("", "bfloat16", "cpu", False),  # no /proc/cpuinfo (macOS, Windows): unknown, nothing said
    ],
)
def test_a_half_precision_model_without_its_units_is_warned_about(
    cpuinfo, caplog, text, dtype, device, warned
):
    cpuinfo(text)
    with caplog.at_level(logging.WARNING, logger="layerwise"):
        warn_slow_dtype(dtype, torch.device(device))
    said = " ".join(r.getMessage() for r in caplog.records)
    assert bool(said) is warned
    if warned:
        assert (
            f"model_dtype={dtype!r}" in said and "model_dtype='float32'" in said and "layerwise info" in said
        )


def test_info_without_an_argument_describes_this_machine():
    from typer.testing import CliRunner

    from layerwise._model.forward.cpu_gemm import onednn_usable
    from layerwise.cli import app

    result = CliRunner().invoke(app, ["info", "--json"])
    assert result.exit_code == 0, result.output
    said = json.loads(result.output)
    assert said["cpu"] == cpu.cpu_name() and said["cores"] == cpu.usable_cores()
    assert said["torch_threads"] == torch.get_num_threads() and said["torch"] == torch.__version__
    units = cpu.bf16_units()
    assert (
        said["bf16_units"] == units
        if units
        else said["bf16_units"].startswith("none: model_dtype='bfloat16'")
    )
    assert said["cpu_dtype"].startswith("bfloat16" if units else "float32 (the default)")
    assert said["cpu_linear"] == ("oneDNN, weights prepacked" if onednn_usable() else "MKL (F.linear)")
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    assert said["gpus"] == (", ".join(gpus) or "none")


def test_info_says_unknown_where_the_units_cannot_be_read(cpuinfo):
    from layerwise._model.what_runs import describe_machine

    cpuinfo("")
    said = describe_machine()
    assert said["bf16_units"].startswith("unknown") and said["fp16_units"].startswith("unknown")
    assert said["vector_units"] == "unknown" and said["cpu_dtype"] == "float32 (the default)"
    cpuinfo(ROME)
    assert describe_machine()["bf16_units"].startswith("none: model_dtype='bfloat16'")
