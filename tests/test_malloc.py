"""The local runner's glibc malloc settings (grail.launch.local.MALLOC) are ones glibc's
mallopt(3) accepts (an int each: a value glibc refuses is ignored without a word)."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

import pytest

from grail.launch.local import MALLOC

# mallopt's parameters (glibc's malloc.h)
PARAMETERS = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_TOP_PAD_": -2, "MALLOC_MMAP_THRESHOLD_": -3}

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="mallopt's rules are glibc's; this libc is not"
)


def mallopt(name: str, value: int) -> int:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    return libc.mallopt(PARAMETERS[name], ctypes.c_int(value))


@pytest.mark.parametrize("name", sorted(MALLOC))
def test_glibc_accepts_each_setting(name):
    assert mallopt(name, int(MALLOC[name])) == 1
