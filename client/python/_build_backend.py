"""PEP 517 backend for `pip install client/python`: setuptools' own, taken from the system.

pip builds in an isolated environment and would download the build requirements it is given;
graphd lists none (pyproject.toml: requires = []) so that an offline machine installs the package
with the distribution's setuptools (Debian: python3-setuptools, python3-wheel). When setuptools is
not importable in that environment, this adds the interpreter's site directories back.
"""
try:
    import setuptools.build_meta as _meta
except ImportError:
    import site
    import sys

    for _d in site.getsitepackages() + [site.getusersitepackages()]:
        if _d not in sys.path:
            sys.path.append(_d)
    import setuptools.build_meta as _meta

from setuptools.build_meta import *  # noqa: E402,F401,F403  (the hooks pip calls)


def _nothing(config_settings=None):
    """setuptools asks for "wheel": the system's serves when there is one, never a download."""
    try:
        import wheel  # noqa: F401
    except ImportError:
        return ["wheel"]
    return []


get_requires_for_build_wheel = get_requires_for_build_sdist = _nothing
if hasattr(_meta, "get_requires_for_build_editable"):
    get_requires_for_build_editable = _nothing
