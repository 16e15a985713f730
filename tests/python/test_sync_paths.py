"""No device-wide synchronisation in the daemon, the executor or graph_runtime (issue 18).

A device-wide wait (cudaDeviceSynchronize, torch's device_synchronize, cudaFree, which waits for
every stream of the process, emptyCache, which calls it) in an executor waits for every stream
there, including a posted replay's stream that waits for another client's counters: one session
then holds up every other session's capture or replay. The runtime waits only for streams of its
own, through the family's counted helpers (docs/ARCHITECTURE.md, "Synchronisation");
tests/unit/test_sync.c checks the counts at run time, and this test checks the sources for a
call that would bypass them. It reads source files only, so it runs everywhere."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    [p for d in ("graph_runtime", "daemon", "pool_manager")
     for p in (REPO / d).iterdir() if p.suffix in (".c", ".cpp", ".h")])

# Calls that wait for (or implicitly synchronise) the whole device.
DEVICE_WIDE = re.compile(
    r"\b(cudaDeviceSynchronize|cuCtxSynchronize|device_synchronize|cudaThreadSynchronize"
    r"|emptyCache|empty_cache|cudaDeviceReset|cudaFree|cuMemFree(_v2)?|syncStreamsOnDevice"
    r"|(torch|at)::(cuda|xpu)::synchronize)\s*\(")
# In the CUDA family every host wait is a counted one: sync_stream, or DeferredFrees' event
# waits. A stream's own synchronize() method bypasses the count.
UNCOUNTED = re.compile(r"(\.|->)synchronize\s*\(\s*\)|\bcudaStreamSynchronize\s*\(")
ALLOW = "sync-ok:"  # a marked line, with the reason it waits for nothing (DeferredFrees)


TOKENS = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def strip_comments(text):
    """The text with C and C++ comments and string literals blanked (line numbers kept)."""
    return TOKENS.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def offending(path, pattern, allow_counted=False):
    raw = path.read_text().splitlines()
    code = strip_comments(path.read_text()).splitlines()
    found = []
    for no, (line, orig) in enumerate(zip(code, raw), 1):
        if not pattern.search(line) or ALLOW in orig:
            continue
        if allow_counted and "note_sync(" in "".join(code[max(0, no - 3):no]):
            continue  # the wait right after its count
        found.append("%s:%d: %s" % (path.relative_to(REPO), no, orig.strip()))
    return found


def test_the_scan_sees_the_sources():
    names = {p.name for p in SOURCES}
    assert {"family_cuda.cpp", "engine.cpp", "executor.c", "capture.c"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_device_wide_synchronisation(path):
    found = offending(path, DEVICE_WIDE)
    assert not found, (
        "device-wide synchronisation on a daemon or executor path (it waits for every session's "
        "streams, some of which wait for another client's counters); wait for the stream that "
        "did the work (family_cuda.cpp's sync_stream), or defer a free (DeferredFrees):\n"
        + "\n".join(found))


def test_cuda_family_waits_are_counted():
    path = REPO / "graph_runtime" / "family_cuda.cpp"
    found = offending(path, UNCOUNTED, allow_counted=True)
    assert not found, (
        "a host wait in the CUDA family that gr_sync_stats does not count; use sync_stream(), "
        "which counts it as a stream wait:\n" + "\n".join(found))


def test_the_scan_catches_what_it_looks_for():
    text = ("void f() {\n    c10::cuda::device_synchronize(); // as torch does\n"
            "    /* cudaFree(p) in a comment is fine */\n    cudaFree(p);\n"
            "    stream->synchronize();\n    cudaStreamSynchronize(s);\n"
            "    c10::xpu::syncStreamsOnDevice(dev);\n    torch::cuda::synchronize();\n}\n")
    code = strip_comments(text).splitlines()
    assert [no for no, line in enumerate(code, 1) if DEVICE_WIDE.search(line)] == [2, 4, 7, 8]
    assert [no for no, line in enumerate(code, 1) if UNCOUNTED.search(line)] == [5, 6]
