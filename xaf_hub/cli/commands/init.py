"""Write a starter config.json: from --instance NAME=URL and --root DIR, or the bundled example.

The file is validated before it is written, written in one step, and never overwrites an
existing config unless --force is given. Passwords are not asked for: the next command to run
names the environment variable each instance reads its password from. A first root that is a
git checkout with an ``origin`` remote gives ``project.repository`` (where the hub verifies
the agents' work), without the user name or token an https URL may hold: those stay with git.
``--add-project NAME --root DIR`` adds a project to the existing config instead (a one-project
config becomes ``projects``), checked as a whole before the one write.
"""

from __future__ import annotations

import copy
import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from xaf_hub.cli.commands._common import ADD_MCP, FORCE
from xaf_hub.cli.context import Context
from xaf_hub.cli.options import opt
from xaf_hub.config.credentials import pw_env_name
from xaf_hub.config.load import parse_config
from xaf_hub.config.reader import load_json_file
from xaf_hub.errors import UsageError
from xaf_hub.store.repository import origin_of
from xaf_hub.store.statefile import write_text_atomic

EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.json"  # xaf_hub/config.example.json
DEFAULT_URL = "http://127.0.0.1:4096"  # where `opencode serve` listens by default

EXAMPLES = """\
examples:
  xaf-hub init                                             # the bundled example (demo fleet)
  xaf-hub init --root ~/src/shop                           # one local instance on port 4096
  xaf-hub init -i dev=http://127.0.0.1:4096 -i build=http://127.0.0.1:4097 --root /srv/shop
  xaf-hub init -i dev=http://127.0.0.1:4096 -i live=http://prod-box:4096 --prod live
  xaf-hub --config ~/.xaf_hub/config.json init --root ~/src/shop --force
  xaf-hub init --add-project blog --root /srv/blog         # one more project in config.json
"""


def _instance(spec: str) -> tuple[str, str]:
    name, sep, url = spec.partition("=")
    name, url = name.strip(), url.strip()
    if not sep or not name or not url:
        raise UsageError(f"--instance {spec!r}: expected NAME=URL, e.g. dev={DEFAULT_URL}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--instance {spec!r}: the URL must start with http:// or https://")
    return name, url.rstrip("/")


def starter(
    instances: Sequence[str], roots: Sequence[str], project: str | None, cwd: Path,
    prod: Sequence[str] = (), repository: str = "",
) -> Any:
    """The config document for the given flags (None: use the bundled example).

    An instance named in ``prod`` is production: ``danger`` and ``readonly_default``;
    ``repository`` is ``project.repository`` ("" leaves it out)."""
    if not instances and not roots:
        if prod:
            raise UsageError(f"--prod {prod[0]!r}: name an instance with -i NAME=URL")
        return None
    pairs = [_instance(s) for s in instances] or [("local", DEFAULT_URL)]
    names = [n for n, _ in pairs]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise UsageError(f"--instance: the name {dup!r} is given twice")
    unknown = next((n for n in prod if n not in names), None)
    if unknown is not None:
        raise UsageError(f"--prod {unknown!r}: no such instance (given: {', '.join(names)})")
    dirs = _folders(cwd, roots)
    entries = [{"name": name, "url": url,
                **({"roots": dirs, "default_directory": dirs[0]} if dirs else {}),
                **({"danger": True, "readonly_default": True} if name in prod else {})}
               for name, url in pairs]
    name = project or (Path(dirs[0]).name if dirs else "project")
    return {"project": {"name": name, **_project(repository)}, "concurrency_limit": 2,
            "instances": entries}


def _folders(cwd: Path, roots: Sequence[str]) -> list[str]:
    """The absolute folders ``--root`` names (relative ones to ``cwd``)."""
    return [str((cwd / Path(r).expanduser()).resolve()) for r in roots]


def _project(repository: str, **more: Any) -> dict[str, Any]:
    """A new project's entry: its repository ("" leaves it out) and ``more``."""
    # Each task in a worktree and branch of its own (docs/worktrees.md).
    return {**({"repository": repository} if repository else {}), "isolation": "worktree", **more}


def with_project(doc: Any, name: str, dirs: Sequence[str], repository: str = "") -> Any:
    """``doc`` with project ``name`` added (pure): a one-project config first becomes
    ``projects`` (its project, and each instance's roots and default folder, moved under its
    name), then the new project takes ``dirs`` on every instance."""
    if not isinstance(doc, dict) or not isinstance(doc.get("instances"), list):
        raise UsageError("--add-project: the config has no instances to add a project to")
    doc = copy.deepcopy(doc)
    names = [str(i.get("name")) for i in doc["instances"] if isinstance(i, dict)]
    if "projects" not in doc:
        old = dict(doc.pop("project", None) or {})
        entry: dict[str, Any] = {k: v for k, v in old.items() if k != "name"}
        for key in ("roots", "default_directory"):
            entry[key] = {i["name"]: i.pop(key) for i in doc["instances"]
                          if isinstance(i, dict) and key in i}
        doc["projects"] = {str(old.get("name") or "project"): entry}
    if not isinstance(doc["projects"], dict) or name in doc["projects"]:
        raise UsageError(f"--add-project {name!r}: the config already has that project")
    doc["projects"][name] = _project(repository, roots={n: list(dirs) for n in names},
                                     default_directory={n: dirs[0] for n in names})
    return doc


def _add_project(ctx: Context, opts: Options, dest: Path) -> int:
    """Add ``--add-project`` to the config at ``dest``: validated whole, written in one step."""
    assert opts.add_project is not None
    if not opts.root or opts.instance or opts.prod or opts.force:
        raise UsageError("--add-project takes --root DIR (repeatable) and no other init option")
    dirs = _folders(ctx.cwd, opts.root)
    origin, had_credentials = origin_of(Path(dirs[0]))
    doc = with_project(load_json_file(dest), opts.add_project, dirs, origin)
    cfg = parse_config(doc, path=dest, env=ctx.env)  # the whole config must still load
    write_text_atomic(dest, json.dumps(doc, indent=2, ensure_ascii=False) + "\n", private=False)
    ctx.out(f"added project {opts.add_project} to {dest} (projects: {cfg.project_names()})",
            _repository_said(Path(dirs[0]), origin, had_credentials))
    return 0


def _repository_said(root: Path, origin: str, had_credentials: bool) -> str:
    """What init made of the first root's git remote."""
    if not origin:
        return (f"project.repository: not set ({root} is no git checkout with an 'origin' "
                "remote): without it no task is verified done, only 'finished, not verified'; "
                "set it to the remote the agents push to")
    said = (f"project.repository: {origin} (the 'origin' remote of {root}): the hub verifies "
            "each task's commits there")
    if had_credentials:
        said += ("; the user name and token in that remote's URL were left out of the config: "
                 "the hub's git asks git's own credential store for them (a credential helper)")
    return said


def _next_step(doc: Any, dest: Path, cwd: Path) -> str:
    flag = "" if dest == cwd / "config.json" else f" --config {dest}"
    if doc is None:
        return ("next: the example points at the demo fleet, which runs from a checkout of "
                "xaf-hub: `bash scripts/setup.sh && .venv/bin/python -m sandbox.demo --keep`, "
                "then run `xaf-hub" + flag + " doctor`")
    exports = " ".join(f"{pw_env_name(i['name'])}=..." for i in doc["instances"])
    return f"next: export {exports} (each server's password), then run `xaf-hub{flag} doctor`"


@dataclass(frozen=True, kw_only=True)
class Options:
    """The options of `init` (``project``: the common --project)."""

    instance: tuple[str, ...] = opt(
        "-i", "--instance", append=True, default=(), metavar="NAME=URL",
        help=f"an opencode server (repeatable; with only --root: local={DEFAULT_URL})")
    root: tuple[str, ...] = opt("--root", append=True, default=(), metavar="DIR",
                                help="a folder of the project on the servers (repeatable; "
                                "relative to here if relative)")
    prod: tuple[str, ...] = opt("--prod", append=True, default=(), metavar="NAME",
                                help="mark instance NAME as production: danger and read-only by "
                                "default, so every write to it needs --allow-prod (repeatable)")
    force: bool = FORCE.field(help="overwrite an existing config file")
    add_project: str | None = opt("--add-project", metavar="NAME", help="add project NAME, "
                                  "its folders given by --root, to the existing config")
    project: str | None = None


def run(ctx: Context) -> int:
    """Build, validate and write the config; print the next command."""
    opts = ctx.options(Options)
    explicit = ctx.common.config or ctx.env.get("XAF_HUB_CONFIG")
    dest = ctx.cwd / Path(explicit or "config.json").expanduser()  # an absolute path stays
    if opts.add_project is not None:
        return _add_project(ctx, opts, dest)
    first = Path(_folders(ctx.cwd, opts.root)[0]) if opts.root else None
    origin, had_credentials = origin_of(first) if first is not None else ("", False)
    doc = starter(opts.instance, opts.root, opts.project, ctx.cwd, opts.prod, origin)
    text = EXAMPLE.read_text("utf-8") if doc is None else json.dumps(doc, indent=2) + "\n"
    parse_config(json.loads(text), path=dest, env=ctx.env)  # a starter must load
    if dest.is_dir():
        raise UsageError(f"{dest} is a folder: pass --config FILE")
    if dest.exists() and not opts.force:
        raise UsageError(f"{dest} already exists: pass --force to overwrite it")
    write_text_atomic(dest, text, private=False)
    what = "the bundled example" if doc is None else f"{len(doc['instances'])} instance(s)"
    said = [] if first is None else [_repository_said(first, origin, had_credentials)]
    ctx.out(f"wrote {dest} ({what})", *said, _next_step(doc, dest, ctx.cwd), *mcp_lines(dest))
    return 0


def hub_command() -> list[str]:
    """The words that start this very xaf-hub: its script when run as `xaf-hub`, else this
    Python with ``-m xaf_hub`` (an agent's MCP client may not have the script on its PATH)."""

    script = Path(sys.argv[0])
    if script.name in ("xaf-hub", "xaf-hub.exe") and script.is_file():
        return [str(script.absolute())]
    return [sys.executable, "-m", "xaf_hub"]


def mcp_lines(config: Path) -> list[str]:
    """What to paste so an agent drives the hub over MCP: opencode's `mcp` config key and Claude
    Code's command. The config's absolute path is in both: the client starts the server in a
    folder of its own (opencode: the session's), where no config is found."""

    words = [*hub_command(), "--config", str(config), "mcp"]
    opencode = {"mcp": {"xafhub": {"type": "local", "command": words}}}
    return [
        f"drive the hub from an agent over MCP (needs the [mcp] extra: {ADD_MCP}):",
        "  opencode, in opencode.json:",
        f"    {json.dumps(opencode, ensure_ascii=False)}",
        "  Claude Code:",
        f"    claude mcp add xafhub -- {shlex.join(words)}",
    ]
