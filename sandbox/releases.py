"""Where the opencode releases of the release matrix live, and how to find one's binary.

``scripts/opencode-releases.sh VERSION...`` installs each release into
``.opencode-releases/<VERSION>/`` (npm ``opencode-ai@VERSION``); the pinned default release
stays in ``.opencode/``. The tests and the probe (``python -m bench.releases``) ask this module
for a release's binary and then start it like any other (``sandbox.fleet``), with the
same isolated HOME and offline flags.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from sandbox.fleet import SandboxError, _default_repo_root, binary_candidates

RELEASES_DIR = ".opencode-releases"
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")


def release_root(version: str, repo_root: Path | None = None) -> Path:
    """The folder a release is installed in (``.opencode`` for the pinned one if it is there)."""
    if not _VERSION_RE.match(version):
        raise SandboxError(f"{version!r} is not a release number like 1.14.41")
    root = repo_root if repo_root is not None else _default_repo_root()
    return root / RELEASES_DIR / version


def installed_version(install_dir: Path) -> str:
    """The ``opencode-ai`` version npm installed under ``install_dir`` ("" when none)."""
    pkg = install_dir / "node_modules" / "opencode-ai" / "package.json"
    try:
        return str(json.loads(pkg.read_text("utf-8")).get("version") or "")
    except (OSError, ValueError, AttributeError):
        return ""


def release_binary(version: str, repo_root: Path | None = None) -> Path:
    """The opencode binary of ``version``; SandboxError naming the install command if absent.

    Looks in ``.opencode-releases/<version>/``, then in ``.opencode/`` when the pinned install
    there is that version.
    """
    root = repo_root if repo_root is not None else _default_repo_root()
    for folder in (release_root(version, root), root / ".opencode"):
        if installed_version(folder) != version:
            continue
        for cand in _candidates(folder):
            if cand.is_file() and os.access(cand, os.X_OK):
                return cand
    raise SandboxError(
        f"opencode {version} is not installed in {release_root(version, root)}; install it "
        f"with: scripts/opencode-releases.sh {version}"
    )


def _candidates(folder: Path) -> list[Path]:
    """The binary locations inside one release folder, best first (as ``binary_candidates``)."""
    dot = folder / ".opencode"
    return [folder / c.relative_to(dot) for c in binary_candidates(folder)]
