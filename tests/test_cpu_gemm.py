"""The packed forward's oneDNN linear layers (model/cpu_gemm.py) against torch's F.linear."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from layerwise._model.forward import cpu_gemm
from layerwise._model.forward.cpu_gemm import PrepackedLinears, onednn_usable, onednn_wanted


@pytest.fixture
def recheck(monkeypatch):
    """Forget the process's one-time decision (so LAYERWISE_ONEDNN is read again), and afterwards."""
    monkeypatch.setattr(cpu_gemm, "_checked", None)
    yield
    cpu_gemm._checked = None


@pytest.fixture
def onednn(recheck, monkeypatch):
    """oneDNN forced on, whatever this machine's default (on Intel processors it is off)."""
    monkeypatch.setenv("LAYERWISE_ONEDNN", "1")
    if not onednn_usable():
        pytest.skip("this torch build has no usable oneDNN linear")


@pytest.mark.parametrize(
    ("rows", "width_in", "width_out"), [(1, 384, 1152), (191, 384, 1536), (700, 1536, 384)]
)
def test_prepacked_equals_f_linear(onednn, rows, width_in, width_out):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, width_in, generator=generator)
    weight = torch.randn(width_out, width_in, generator=generator) / width_in**0.5
    bias = torch.randn(width_out, generator=generator)
    linear = PrepackedLinears()
    with torch.inference_mode():
        fast, want = linear(x, weight, bias), F.linear(x, weight, bias)
    assert len(linear._packed) == 1  # it did take the oneDNN path
    torch.testing.assert_close(fast, want, rtol=1e-5, atol=1e-5)
    assert not torch.equal(fast, torch.zeros_like(fast))


def test_weight_edited_in_place_is_repacked(onednn):
    weight, bias = torch.randn(8, 16), torch.zeros(8)
    x = torch.randn(3, 16)
    linear = PrepackedLinears()
    with torch.inference_mode():
        before = linear(x, weight, bias)
    with torch.no_grad():
        weight.mul_(2)  # a user edits the model after loading
    with torch.inference_mode():
        after = linear(x, weight, bias)
    torch.testing.assert_close(after, 2 * before, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(after, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_other_inputs_use_f_linear(onednn):
    linear = PrepackedLinears()
    weight = torch.randn(4, 6, requires_grad=True)
    x = torch.randn(5, 6)
    out = linear(x, weight, None)  # autograd: F.linear, so that backward works
    out.sum().backward()
    torch.testing.assert_close(weight.grad, x.sum(0).expand(4, 6))
    with torch.inference_mode():
        linear(x.double(), weight.detach().double(), None)  # float64
        linear(x[None], weight.detach(), None)  # 3-D
    assert linear._packed == {}


def test_switched_off_by_environment(recheck, monkeypatch):
    monkeypatch.setenv("LAYERWISE_ONEDNN", "0")
    assert not onednn_usable()
    linear = PrepackedLinears()
    x, weight = torch.randn(3, 8), torch.randn(4, 8)
    with torch.inference_mode():
        assert torch.equal(linear(x, weight, None), F.linear(x, weight, None))
    assert linear._packed == {}


@pytest.mark.parametrize(
    ("vendor", "setting", "wanted"),
    [
        ("AuthenticAMD", None, True),  # MKL runs its AVX2 code on AMD: oneDNN is 2x faster there
        ("GenuineIntel", None, False),  # level with MKL, and MKL compiles nothing per shape
        (None, None, False),  # not x86 (or unknown): F.linear as torch does it
        ("GenuineIntel", "1", True),
        ("AuthenticAMD", "off", False),
        ("AuthenticAMD", "auto", True),
    ],
)
def test_default_follows_the_processor_vendor(recheck, monkeypatch, vendor, setting, wanted):
    monkeypatch.setattr(cpu_gemm, "cpu_vendor", lambda: vendor)
    if setting is None:
        monkeypatch.delenv("LAYERWISE_ONEDNN", raising=False)
    else:
        monkeypatch.setenv("LAYERWISE_ONEDNN", setting)
    assert onednn_wanted() is wanted
    if not wanted:
        assert not onednn_usable()


def test_memory_stays_bounded_over_many_batch_shapes(onednn):
    """oneDNN caches a compiled primitive per shape: unbounded, 300 row counts x 3 weights held
    about 600 MiB. layerwise bounds its caches on import (a fresh process, as a server starts)."""
    import subprocess
    import sys

    script = """
import torch, layerwise._model.forward.cpu_gemm as g
def rss(): return int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]) // 1024
linear = g.PrepackedLinears()
weights = [torch.randn(1536, 384), torch.randn(384, 1536), torch.randn(1152, 384)]
with torch.inference_mode():
    linear(torch.randn(8, 384), weights[0], None)
    start = rss()
    for rows in range(100, 400):
        for w in weights:
            linear(torch.randn(rows, w.shape[1]), w, None)
print(rss() - start, len(linear._packed))
"""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    } | {"LAYERWISE_ONEDNN": "1"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    growth, packed = map(int, out.stdout.split())
    assert packed == 3  # the oneDNN path ran
    assert growth < 150, f"RSS grew by {growth} MiB over 300 batch shapes"
