"""``attention_backend="auto"`` on the CPU: the compiled kernel where it builds, else the reference, said once."""

from __future__ import annotations

import pytest

import minfer.ops.backends as backends
import minfer.ops.cpp_paged_attention as cpp
from minfer.ops.backends import resolve_backend


@pytest.fixture
def fresh(monkeypatch):
    backends.unready.cache_clear()
    yield monkeypatch
    backends.unready.cache_clear()


def test_without_a_compiler_auto_falls_back_with_one_line(fresh, capsys):
    fresh.setattr(backends, "have_compiler", lambda: False)
    assert resolve_backend("auto", "cpu").name == "torch"
    notice = capsys.readouterr().err
    assert notice.count("\n") == 1 and "no C++ compiler" in notice and "'cpp'" in notice


def test_a_failed_build_falls_back_too(fresh, capsys):
    def broken():
        raise RuntimeError("could not build the CPU paged-attention kernel (exit 1)")

    fresh.setattr(backends, "have_compiler", lambda: True)
    fresh.setattr(cpp, "kernel", broken)
    assert resolve_backend("auto", "cpu").name == "torch"
    assert "could not build" in capsys.readouterr().err


def test_with_a_kernel_auto_picks_it(fresh):
    fresh.setattr(backends, "have_compiler", lambda: True)
    fresh.setattr(cpp, "kernel", lambda: object())
    assert resolve_backend("auto", "cpu").name == "cpp"
    assert resolve_backend("auto", "cuda").name == "triton" and resolve_backend("torch", "cpu").name == "torch"
