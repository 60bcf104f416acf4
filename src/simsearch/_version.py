"""The package's version, from its installed metadata (pyproject.toml's one ``version``): the
one source, at the bottom layer, so that no module imports the package root for it."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("simsearch")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
