"""The local runner's glibc malloc settings (grail.launch.local.MALLOC) are ones glibc's
mallopt(3) accepts: an int each (a value glibc refuses is ignored without a word)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from grail.launch.local import MALLOC

# mallopt's parameters (glibc's malloc.h)
PARAMETERS = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_TOP_PAD_": -2, "MALLOC_MMAP_THRESHOLD_": -3}

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="mallopt's rules are glibc's; this libc is not"
)


def mallopt(parameter: int, value: int) -> int:
    """glibc's answer to mallopt(parameter, value), asked in a process of its own (the
    setting would otherwise stay with the test session's)."""
    code = (
        "import ctypes, ctypes.util, sys; "
        "libc = ctypes.CDLL(ctypes.util.find_library('c')); "
        "print(libc.mallopt(int(sys.argv[1]), ctypes.c_int(int(sys.argv[2]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(parameter), str(value)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(done.stdout)


@pytest.mark.parametrize("name", sorted(MALLOC))
def test_glibc_accepts_each_setting(name):
    value = int(MALLOC[name])
    assert 0 < value < 2**31  # mallopt takes an int: a larger value would wrap
    assert mallopt(PARAMETERS[name], value) == 1
