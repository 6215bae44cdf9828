"""mkdocs hooks: the site's pages that live elsewhere in the repository are
generated at build time, never copied into ``docs/``.

- each ``## `` section of ``README.md`` becomes a page under ``guide/`` (the
  text before the first section is the home page);
- ``spec/lease-protocol.md`` becomes ``spec.md``, ``CHANGELOG.md`` ``changelog.md``;
- one API reference page per subpackage (mkdocstrings ``:::`` blocks);
- the navigation is built from them, so a README section added or renamed
  shows up without editing ``mkdocs.yml``;
- the images the pages show (``benchmarks/*.png``) are added to the site.

Links are rewritten for the site, in the generated pages and in ``docs/``'s own
pages alike (those are written with links that work on GitHub: ``../spec/...``,
``../README.md#configuration``): a link to a page of the site points at it (a
README section's anchor at that section's page), a link to an image the site
holds points at its copy, and a link to any other file of the repository points
at the repository.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
REPO = "https://github.com/leaseproto/leaseproto/blob/main/"

#: API reference: page -> (title, modules documented on it).
API: dict[str, tuple[str, tuple[str, ...]]] = {
    "api/index.md": ("leaseproto", ("leaseproto",)),
    "api/core.md": (
        "leaseproto.core",
        (
            "leaseproto.core.config",
            "leaseproto.core.table",
            "leaseproto.core.tracker",
            "leaseproto.core.clock",
            "leaseproto.core.push",
            "leaseproto.core.wire",
            "leaseproto.core.wire_ids",
            "leaseproto.core.peer",
            "leaseproto.core.events",
            "leaseproto.core.errors",
            "leaseproto.core.state",
            "leaseproto.core.rules",
        ),
    ),
    "api/workers.md": (
        "leaseproto.workers",
        (
            "leaseproto.workers.messages",
            "leaseproto.workers.plane",
            "leaseproto.workers.metrics",
        ),
    ),
    "api/harness.md": (
        "leaseproto.harness",
        ("leaseproto.harness.cluster", "leaseproto.harness.client"),
    ),
    "api/sim.md": ("leaseproto.sim", ("leaseproto.sim",)),
    "api/scenarios.md": (
        "leaseproto.scenarios",
        ("leaseproto.scenarios.format", "leaseproto.scenarios.replay"),
    ),
    # the connector classes by their modules: the package loads them only on first access
    # (its __getattr__), which the reference's static reading of the source never makes
    "api/vllm.md": (
        "leaseproto.integrations.vllm",
        (
            "leaseproto.integrations.vllm",
            "leaseproto.integrations.vllm.connector",
            "leaseproto.integrations.vllm.scheduler",
            "leaseproto.integrations.vllm.worker",
            "leaseproto.integrations.vllm.push_scheduler",
            "leaseproto.integrations.vllm.push_worker",
            "leaseproto.integrations.vllm.push",
            "leaseproto.integrations.vllm.config",
        ),
    ),
}

#: Pages of ``docs/`` itself, in the order the navigation lists them after the specification.
DOCS_PAGES = (
    ("vLLM", "vllm.md"),
    ("Metrics", "metrics.md"),
    ("Performance", "performance.md"),
    ("Verification", "verification.md"),
    ("Mutation run", "mutation.md"),
)

#: Images the pages show, added to the site under ``assets/``.
IMAGES = ("benchmarks/sim-both.png",)

_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower().replace("`", "")).strip("-")


def readme_sections() -> tuple[str, list[tuple[str, str]]]:
    """README's text before the first section, and its sections (title, text)."""
    head: list[str] = []
    sections: list[tuple[str, list[str]]] = []
    fenced = False
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            sections.append((line[3:].strip(), []))
            continue
        (sections[-1][1] if sections else head).append(line)
    return "\n".join(head), [(t, "\n".join(body)) for t, body in sections]


def _pages() -> dict[str, tuple[str, str]]:
    """Every generated page: its path under the site -> (its source in the repo, text)."""
    head, sections = readme_sections()
    pages = {"index.md": ("README.md", head)}
    for title, body in sections:
        pages[f"guide/{_slug(title)}.md"] = ("README.md", f"# {title}\n{body}")
    pages["spec.md"] = ("spec/lease-protocol.md", _read("spec/lease-protocol.md"))
    pages["changelog.md"] = ("CHANGELOG.md", _read("CHANGELOG.md"))
    for page, (title, modules) in API.items():
        blocks = "\n\n".join(f"::: {m}" for m in modules)
        pages[page] = ("", f"# {title}\n\n{blocks}\n")
    return pages


def _unfenced(text: str) -> str:
    """``text`` without its fenced code blocks (a ``# comment`` there is no heading)."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return "\n".join(out)


def _read(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def _rewrite(text: str, source: str, page: str, anchors: dict[str, str]) -> str:
    """Links of ``text`` (from repository file ``source``) as seen from ``page``;
    ``anchors``: README's section anchors and the pages they became."""
    here = posixpath.dirname(page)
    src_dir = posixpath.dirname(source)

    def target(link: str) -> str:
        if re.match(r"[a-z]+:", link):
            return link
        path, _, anchor = link.partition("#")
        if not path:  # an anchor on the same source file
            moved = anchors.get(anchor) if source == "README.md" else None
            if moved is None or moved.partition("#")[0] == page:
                return link
            return _relative(moved, here)
        repo_path = posixpath.normpath(posixpath.join(src_dir, path))
        if repo_path == "README.md" and anchor in anchors:
            return _relative(anchors[anchor], here)
        site = {
            "spec/lease-protocol.md": "spec.md",
            "CHANGELOG.md": "changelog.md",
            "README.md": "index.md",
        }.get(repo_path)
        if site is None and repo_path in IMAGES:
            site = "assets/" + posixpath.basename(repo_path)
        if site is None and repo_path.startswith("docs/") and repo_path.endswith(".md"):
            site = repo_path.removeprefix("docs/")
        if site is None:
            return REPO + repo_path + (f"#{anchor}" if anchor else "")
        return posixpath.relpath(site, here) + (f"#{anchor}" if anchor else "")

    return _LINK.sub(lambda m: f"]({target(m.group(1))})", text)


def on_config(config: Any) -> Any:
    _, sections = readme_sections()
    config["nav"] = [
        {"Home": "index.md"},
        {"Guide": [{t.replace("`", ""): f"guide/{_slug(t)}.md"} for t, _ in sections]},
        {"Specification": "spec.md"},
        *({title: page} for title, page in DOCS_PAGES),
        {"API reference": [{title: page} for page, (title, _) in API.items()]},
        {"Changelog": "changelog.md"},
    ]
    return config


def _readme_anchors() -> dict[str, str]:
    """README's anchors -> where they are on the site: a section's (``#running-workers``)
    is the page it became, a heading's inside a section (``#trace-validation``) is on
    that page (``guide/model-checking.md#trace-validation``)."""
    anchors: dict[str, str] = {}
    for t, body in readme_sections()[1]:
        page = f"guide/{_slug(t)}.md"
        anchors[_slug(t)] = page
        for sub in re.findall(r"^#{3,6} (.+)$", _unfenced(body), flags=re.M):
            anchors.setdefault(_slug(sub), f"{page}#{_slug(sub)}")
    return anchors


def _relative(target: str, here: str) -> str:
    """``target`` (a page, maybe with ``#anchor``) as a link from the folder ``here``."""
    page, _, inner = target.partition("#")
    return posixpath.relpath(page, here) + (f"#{inner}" if inner else "")


def on_files(files: Files, config: Any) -> Files:
    pages = _pages()
    anchors = _readme_anchors()
    for name in [f.src_uri for f in files if f.src_uri.startswith("_")]:
        files.remove(files.get_file_from_path(name))  # type: ignore[arg-type]
    for page, (source, text) in pages.items():
        content = _rewrite(text, source, page, anchors)
        files.append(File.generated(config, page, content=content))
    for image in IMAGES:
        site = "assets/" + posixpath.basename(image)
        files.append(File.generated(config, site, abs_src_path=str(ROOT / image)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """``docs/``'s own pages: their repository links (``../spec/...``) as seen on the site."""
    uri = page.file.src_uri
    if uri in _pages():
        return markdown  # generated pages were rewritten in on_files
    return _rewrite(markdown, f"docs/{uri}", uri, _readme_anchors())
