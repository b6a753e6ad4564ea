"""The CPU allocator tuning that `dmlkit` applies at start-up."""

from __future__ import annotations

import platform
import subprocess
import sys

from dmlkit.cli import main as cli_main
from dmlkit.engine import allocator
from dmlkit.engine.allocator import tune_cpu_allocator

#: Run in a fresh interpreter: malloc 16 MiB and print how many bytes glibc served with mmap (mallinfo2().hblkhd).
PROBE = """
import ctypes, ctypes.util, sys
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
if sys.argv[1] == "tuned":
    from dmlkit.engine.allocator import tune_cpu_allocator
    assert tune_cpu_allocator()
before = libc.mallinfo2().hblkhd
block = libc.malloc(16 << 20)
print(libc.mallinfo2().hblkhd - before)
"""


def _mmapped_bytes_of_a_16_mib_block(mode: str) -> int:
    proc = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(proc.stdout.strip())


def test_applies_on_glibc_linux_and_is_idempotent():
    expected = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert tune_cpu_allocator() is expected
    assert tune_cpu_allocator() is expected


def test_a_16_mib_block_comes_from_the_heap_after_tuning_and_from_mmap_before():
    assert platform.libc_ver()[0] == "glibc"  # the machine this suite runs on
    assert _mmapped_bytes_of_a_16_mib_block("plain") >= 16 << 20  # glibc's default threshold: mmap
    assert _mmapped_bytes_of_a_16_mib_block("tuned") == 0  # below the raised threshold: the heap


def test_the_command_line_tunes_the_allocator_before_running_a_verb(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(allocator, "tune_cpu_allocator", lambda: calls.append("tuned") or True)  # read at the call
    assert cli_main.main(["presets"]) == 0
    assert calls == ["tuned"]
    assert capsys.readouterr().out.strip()
