"""The client settings, read by libgraphd through one table for C and Python alike: defaults,
normalization, one error per invalid value (the same from graphd._lib.setting and from
graphd.Client), the README's table; and one version (VERSION) for the daemon, libgraphd and the
package."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import graphd
from graphd import _lib

REPO = Path(__file__).resolve().parents[2]
NAMES = ["GRAPHD_ADDRESS", "GRAPHD_TIMEOUT_MS", "GRAPHD_SPIN_US", "GRAPHD_DIRECT",
         "GRAPHD_REPLAY_RING", "GRAPHD_TLS_CA", "GRAPHD_REPLAY_ORDER", "GRAPHD_COPY_PARAM_GRADS",
         "GRAPHD_ZE_LOADER",
         "GRAPHD_REPLAY_PROFILE",
         "GRAPHD_SLOW_CAPTURE_S", "GRAPHD_TRACE_CACHE", "GRAPHD_TRACE_CACHE_DIR"]


@pytest.fixture
def clean_env(monkeypatch):
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_names_and_defaults(clean_env):
    assert _lib.setting_names() == NAMES
    assert _lib.setting("GRAPHD_ADDRESS") == graphd.DEFAULT_ADDRESS
    assert _lib.setting("GRAPHD_TIMEOUT_MS") == "60000"
    assert _lib.setting("GRAPHD_SPIN_US") == ("200" if os.cpu_count() >= 4 else "0")
    assert _lib.setting("GRAPHD_DIRECT") == "1"
    assert _lib.setting("GRAPHD_TLS_CA") == ""
    assert _lib.setting("GRAPHD_REPLAY_ORDER") == "posted"
    assert _lib.setting("GRAPHD_COPY_PARAM_GRADS") == "0"
    assert _lib.setting("GRAPHD_ZE_LOADER") == "libze_loader.so.1"
    assert _lib.setting("GRAPHD_TRACE_CACHE") == "disk"
    assert _lib.setting("GRAPHD_TRACE_CACHE_DIR") == ""
    clean_env.setenv("GRAPHD_REPLAY_ORDER", "")  # empty reads as unset
    assert _lib.setting("GRAPHD_REPLAY_ORDER") == "posted"
    with pytest.raises(graphd.NotFound) as e:
        _lib.setting("GRAPHD_NOPE")
    assert e.value.message == "GRAPHD_NOPE is not a graphd client setting"


def test_values_are_read_now_and_normalized(clean_env, daemon):
    for order in ("posted", "events", "sync"):
        clean_env.setenv("GRAPHD_REPLAY_ORDER", order)
        assert _lib.setting("GRAPHD_REPLAY_ORDER") == order
    clean_env.setenv("GRAPHD_COPY_PARAM_GRADS", "1")
    assert _lib.setting("GRAPHD_COPY_PARAM_GRADS") == "1"
    clean_env.setenv("GRAPHD_TIMEOUT_MS", "0250")
    assert _lib.setting("GRAPHD_TIMEOUT_MS") == "250"
    # The address: libgraphd's GRAPHD_ADDRESS, a bare path taken as unix:PATH.
    path = daemon.address[len("unix:"):]
    clean_env.setenv("GRAPHD_ADDRESS", path)
    assert _lib.setting("GRAPHD_ADDRESS") == daemon.address
    with graphd.Client() as c:
        assert c.address == daemon.address
        assert c.status()["daemon"]["pid"] == daemon.proc.pid


@pytest.mark.parametrize("name,bad,message", [
    ("GRAPHD_TIMEOUT_MS", "0",
     "GRAPHD_TIMEOUT_MS=0 is not valid: expected an integer from 1 to 86400000"),
    ("GRAPHD_TIMEOUT_MS", "1s", "GRAPHD_TIMEOUT_MS=1s is not valid: expected an integer from 1 "
     "to 86400000"),
    ("GRAPHD_SPIN_US", "-1",
     "GRAPHD_SPIN_US=-1 is not valid: expected an integer from 0 to 100000"),
    ("GRAPHD_REPLAY_ORDER", "fast",
     "GRAPHD_REPLAY_ORDER=fast is not valid: expected one of posted, events, sync"),
    ("GRAPHD_COPY_PARAM_GRADS", "yes",
     "GRAPHD_COPY_PARAM_GRADS=yes is not valid: expected 0 or 1"),
    ("GRAPHD_TRACE_CACHE", "yes",
     "GRAPHD_TRACE_CACHE=yes is not valid: expected one of disk, memory, off"),
])
def test_invalid_values_give_one_error(clean_env, name, bad, message):
    clean_env.setenv(name, bad)
    with pytest.raises(graphd.InvalidArgument) as e:
        _lib.setting(name)
    assert e.value.message == message and e.value.errno == -3
    if name not in ("GRAPHD_COPY_PARAM_GRADS", "GRAPHD_TRACE_CACHE"):  # the package's alone
        with pytest.raises(graphd.InvalidArgument) as e:
            graphd.Client()
        assert e.value.message == message


def test_readme_documents_every_setting_in_one_table():
    text = (REPO / "client" / "python" / "README.md").read_text()
    section = text.split("## Settings (environment)", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(GRAPHD_[A-Z_]+)` \|", section, flags=re.M)
    assert rows == NAMES + ["GRAPHD_LIB", "GRAPHD_BUILD"]
    assert text.count("## Settings (environment)") == 1
    header = (REPO / "client" / "c" / "graphd.h").read_text()
    assert 'client/python/README.md, "Settings (environment)"' in header


def test_one_version(client):
    """VERSION is the version of the daemon (Hello and Status), of libgraphd and of the Python
    package, in the source tree and as pip builds it (setup.py)."""
    version = (REPO / "VERSION").read_text().strip()
    assert version
    assert _lib.version() == version
    assert graphd.__version__ == version
    assert client.status()["daemon"]["version"] == version
    client.alloc_region(16).free()  # opens the session: Hello returns daemon_version
    assert _lib.text(_lib.lib().graphd_daemon_version(client._h)) == version
    out = subprocess.run([sys.executable, "setup.py", "--version"], capture_output=True,
                         text=True, cwd=REPO / "client" / "python", timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == version
