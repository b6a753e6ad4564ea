"""The CPU allocator tuning that `dmlkit` applies at start-up."""

from __future__ import annotations

import platform

import torch

from dmlkit.cli import main as cli_main
from dmlkit.engine.allocator import tune_cpu_allocator


def test_applies_on_glibc_linux_and_is_idempotent():
    expected = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert tune_cpu_allocator() is expected
    assert tune_cpu_allocator() is expected
    big = torch.ones(4096, 1024)  # 16 MiB: below the raised mmap threshold, served from the heap
    assert float(big.sum()) == 4096 * 1024


def test_the_command_line_tunes_the_allocator_before_running_a_verb(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(cli_main, "tune_cpu_allocator", lambda: calls.append("tuned") or True)
    assert cli_main.main(["presets"]) == 0
    assert calls == ["tuned"]
    assert capsys.readouterr().out.strip()
