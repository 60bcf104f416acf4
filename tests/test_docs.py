"""The docs as a product: the README's and the user guide's Python blocks run (in order, one
namespace per page, in a scratch directory), every public class carries a doctest example (the
examples run with the docstrings: ``--doctest-modules``), relative links in the docs resolve, and
the API reference builds."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", "docs/guide.md"]
#: the public modules: their __all__ (else their public names) is the API
PUBLIC = ["simsearch", "simsearch.aio", "simsearch.lsh", "simsearch.quant", "simsearch.graph",
          "simsearch.pyramid", "simsearch.strings", "simsearch.service.client",
          "simsearch.service.embedded", "simsearch.integrations.langchain",
          "simsearch.integrations.llamaindex"]


#: what ``make docs`` documents (the Makefile names the same modules)
API_MODULES = [*PUBLIC, "simsearch.service.errors"]  # simsearch.errors: with simsearch


def python_blocks(page: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (ROOT / page).read_text(), re.M | re.S)


@pytest.mark.parametrize("page", PAGES)
def test_the_pages_code_runs(page, tmp_path, monkeypatch):
    blocks = python_blocks(page)
    assert blocks, f"{page} has no python block"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"{page} block {i + 1}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{page}, python block {i + 1} failed: {exc!r}\n{block}") \
                from exc


def public_classes() -> list[tuple[str, type]]:
    out = []
    for name in PUBLIC:
        mod = importlib.import_module(name)
        for attr in getattr(mod, "__all__", [a for a in dir(mod) if not a.startswith("_")]):
            obj = getattr(mod, attr, None)
            if inspect.isclass(obj) and obj.__module__.startswith("simsearch") and \
                    not issubclass(obj, BaseException):  # errors: simsearch.errors' example
                out.append((f"{name}.{attr}", obj))
    return out


def test_every_public_class_has_an_example():
    missing = [name for name, cls in public_classes() if ">>>" not in (cls.__doc__ or "")]
    assert not missing, f"public classes without a doctest example: {missing}"
    assert len(public_classes()) >= 20


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file."""
    out = set()
    for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_relative_links_resolve():
    """Every relative link in README.md and docs/ names a file that exists, and an anchor
    its headings make."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http(s):, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_api_reference_builds(tmp_path):
    import pdoc

    pdoc.pdoc(*API_MODULES, output_directory=tmp_path)
    html = (tmp_path / "simsearch.html").read_text()
    for name in ("HNSWIndex", "SearchResult", "connect"):
        assert name in html
    for name, _ in public_classes():  # every public class has its page's entry
        module, _, cls = name.rpartition(".")
        page = tmp_path / (module.replace(".", "/") + ".html")
        assert f'id="{cls}"' in page.read_text(), name
