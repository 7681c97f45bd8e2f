"""The documentation speaks of the project alone, and its settings exist.

Pages: every Markdown file of docs/ (not the generated reference/ and _build/), README.md,
CHANGELOG.md and idle_culler/*.md. None may name a path of a build machine (this checkout's
folder or the one above it, ``/work/``, ``/root/``, a ``/tmp/`` path that is not a setting's
default, a ``../`` path that leaves the repository) or a tracker number ("issue 14"); paths a
site chooses (``/etc/jupyterhub/...``, ``/shared/home/{username}``) are fine. Every
``c.<Class>.<option>`` a page names must be a configurable option of that class. The README's
simulator examples read files that are in the repository.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
GENERATED = (DOCS / "_build", DOCS / "reference")


def _pages() -> list[Path]:
    pages = [p for p in DOCS.rglob("*.md")
             if not any(p.is_relative_to(g) for g in GENERATED)]
    pages += [REPO / "README.md", REPO / "CHANGELOG.md",
              *sorted((REPO / "idle_culler").glob("*.md"))]
    return sorted(p for p in pages if p.exists())


PAGES = _pages()

#: classes a page may configure as c.<name>.<option>: (module, class name)
CLASSES = {
    "GPUSpawner": "gpuspawner.hub.spawner",
    "DockerBackend": "gpuspawner.backends.docker_backend",
    "SlurmBackend": "gpuspawner.backends.slurm.backend",
    "GPUJobs": "gpuspawner.hub.jobs.settings",
    "GPUElastic": "gpuspawner.elastic.config",
    "CommandProvider": "gpuspawner.elastic.provider",
    "GPUUsage": "gpuspawner.usage.settings",
    "GPULDAPAuthenticator": "gpuspawner.hub.auth",
    "IdleCuller": "idle_culler.app",
    "JupyterHub": "jupyterhub.app",
    "Spawner": "jupyterhub.spawner",
    "Authenticator": "jupyterhub.auth",
    "DummyAuthenticator": "jupyterhub.auth",
    "ConfigurableHTTPProxy": "jupyterhub.proxy",
    "LDAPAuthenticator": "ldapauthenticator",
    "SchedulerApp": "jupyter_scheduler.extension",  # the Lab UI of notebook jobs (docs/jobs.md)
}

ISSUE = re.compile(r"\b(?:issue|pull request|PR)s?\s*#?\d+\b", re.IGNORECASE)
SETTING = re.compile(r"\bc\.([A-Z]\w*)\.([A-Za-z_]\w*)")
TMP = re.compile(r"(?<![\w.])/tmp/[^\s`'\")|,;]*")
UP = re.compile(r"(?<![\w./])(?:\.\./)+[^\s`'\")|,;]*")


def _trait_defaults() -> set[str]:
    """String defaults of the configurable options (a documented default may name /tmp)."""
    out = set()
    for name in ("GPUSpawner", "DockerBackend", "SlurmBackend", "GPUJobs", "IdleCuller"):
        cls = getattr(importlib.import_module(CLASSES[name]), name)
        for trait in cls.class_traits(config=True).values():
            if isinstance(trait.default_value, str):
                out.add(trait.default_value)
    return out


def _prefixes() -> set[str]:
    """This checkout's folder, the folder above it (unless that is a top-level folder such as
    /tmp or /home, which documented paths may start with), and the build machines' folders."""
    out = {str(REPO), "/work/", "/root/"}
    if len(REPO.parent.parts) > 2:
        out.add(str(REPO.parent) + "/")
    return out


def _build_machine_paths(page: Path, text: str, defaults: set[str]) -> list[str]:
    found = [prefix for prefix in _prefixes() if prefix in text]
    found += [m for m in TMP.findall(text) if m not in defaults]
    for m in UP.findall(text):
        target = (page.parent / m).resolve()
        if not target.is_relative_to(REPO):
            found.append(m)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_pages_name_no_build_machine_path_and_no_tracker_number(page):
    text = page.read_text(encoding="utf-8")
    paths = _build_machine_paths(page, text, _trait_defaults())
    assert not paths, f"{page.relative_to(REPO)} names paths outside the repository: {paths}"
    issues = ISSUE.findall(text)
    assert not issues, f"{page.relative_to(REPO)} cites tracker numbers: {issues}"


def test_the_check_finds_what_it_looks_for():
    """The rules themselves, on made-up pages."""
    page = REPO / "docs" / "x.md"
    defaults = {"/tmp/gpuspawner-%x-%j.out"}
    bad = (f"see {REPO.parent}/shared/data/x.csv, ../../shared/x, /tmp/scratch/x.lock, "
           "`/work/wt-slurm`")
    found = set(_build_machine_paths(page, bad, defaults))
    assert {"/work/", "../../shared/x", "/tmp/scratch/x.lock"} <= found, found
    assert str(REPO) in _build_machine_paths(page, f"cd {REPO}/docs", defaults)
    good = ("../README.md, ../idle_culler/README.md, `/tmp/gpuspawner-%x-%j.out`, "
            "/etc/jupyterhub/jupyterhub_config.py, /shared/home/{username}")
    assert _build_machine_paths(page, good, defaults) == []
    assert ISSUE.findall("as issue 14 item 1 says; (Issue #5)") == ["issue 14", "Issue #5"]
    assert ISSUE.findall("issues of GPU 14; the queue (5 users)") == []


def _settings() -> list[tuple[str, str, str]]:
    out = []
    for page in PAGES:
        for cls, option in SETTING.findall(page.read_text(encoding="utf-8")):
            out.append((str(page.relative_to(REPO)), cls, option))
    return out


def test_every_setting_the_pages_name_exists():
    missing = []
    traits: dict[str, set[str]] = {}
    for page, cls, option in _settings():
        if cls not in CLASSES:
            missing.append(f"{page}: c.{cls}.{option} (class unknown to this test: add it)")
            continue
        if cls not in traits:
            klass = getattr(importlib.import_module(CLASSES[cls]), cls)
            traits[cls] = set(klass.class_traits(config=True))
        if option not in traits[cls]:
            missing.append(f"{page}: c.{cls}.{option}")
    assert not missing, "settings that do not exist:\n" + "\n".join(missing)
    assert len(_settings()) > 50  # the pages do name settings: the pattern matches


def test_the_readme_simulator_examples_read_files_of_the_repository():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    folders = re.findall(r"^T=(\S+)", text, re.M)
    assert folders, "the README's simulator examples set T=<sample folder>"
    files = set(re.findall(r"\$T/(\S+\.csv)", text))
    assert files
    for folder in folders:
        for name in files:
            assert (REPO / folder / name).is_file(), f"{folder}/{name}"


#: a ``gpuspawner`` command inside code (a fenced block or a `span`): its words after it
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
COMMAND = re.compile(r"(?:^|(?<=`)|(?<=[$#] )|(?<=&& )|(?<=; ))gpuspawner((?: [a-z][a-z0-9-]*)+)",
                     re.M)


def _shown_commands() -> list[tuple[str, list[str]]]:
    out = []
    for page in PAGES:
        for code in CODE.findall(page.read_text(encoding="utf-8")):
            for m in COMMAND.finditer(code):
                if code[m.end():m.end() + 1] == ":":
                    continue  # a log line ("gpuspawner configuration error: ..."), no command
                out.append((str(page.relative_to(REPO)), m.group(1).split()))
    return out


def test_every_gpuspawner_command_the_pages_show_exists():
    """Each ``gpuspawner COMMAND [SUBCOMMAND]`` a page shows in code is a command of the CLI
    (its words are followed through the argument parser's subcommands, as ``--help`` would)."""
    import argparse

    from gpuspawner.cli import build_parser

    def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    missing, shown = [], _shown_commands()
    for page, words in shown:
        parser, path = build_parser(), []
        for word in words:
            subs = subcommands(parser)
            if not subs:
                break  # a command without subcommands: the rest are its arguments
            if word not in subs:
                missing.append(f"{page}: gpuspawner {' '.join(path + [word])}")
                break
            parser, path = subs[word], path + [word]
    assert not missing, "commands the CLI does not have:\n" + "\n".join(sorted(set(missing)))
    assert len(shown) > 20  # the pages do show commands: the pattern matches
