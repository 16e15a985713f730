"""setuptools' script for `pip install client/python` (pyproject.toml has the rest): the version
is the repository's VERSION file, the one the daemon and libgraphd are built with. An sdist made
from the tree carries it in PKG-INFO."""
import os

from setuptools import setup

_HERE = os.path.dirname(os.path.abspath(__file__))


def _version():
    try:
        with open(os.path.join(_HERE, "..", "..", "VERSION")) as f:
            return f.read().strip()
    except OSError:
        pass
    try:
        with open(os.path.join(_HERE, "PKG-INFO")) as f:
            for line in f:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    raise RuntimeError("graphd: no VERSION file two levels up from %s (build the package from "
                       "the graphd repository)" % _HERE)


setup(version=_version())
