"""The per-run context every command receives: parsed args, config, streams, seams."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from xaf_hub.cli.options import Common, build
from xaf_hub.config.load import Config, load_config
from xaf_hub.core.text import dumps, redact, terminal_safe

if TYPE_CHECKING:  # the scanner pulls in httpx; --help must stay light
    from xaf_hub.fleet.scan import TransportFactory
    from xaf_hub.ops.context import OpsContext
    from xaf_hub.store.backends import Stores

T = TypeVar("T")


@dataclass
class Context:
    """Built once from argv; commands read it, never mutate global state. A command reads its
    options as a typed record (``ctx.options(Options)``), never the namespace itself."""

    args: argparse.Namespace
    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    cwd: Path = field(default_factory=Path.cwd)
    transport_factory: TransportFactory | None = None
    _config: Config | None = None
    common: Common = field(init=False)
    _stores: Stores | None = field(default=None, init=False, repr=False)
    _every: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.common = build(Common, self.args)

    @classmethod
    def of(cls, common: Common, **seams: Any) -> Context:
        """A context for a face with no command line (the MCP server): ``common`` stands for
        the options every command has; each option of its own comes as a typed record."""
        return cls(args=argparse.Namespace(**dataclasses.asdict(common)), **seams)

    def options(self, cls: type[T]) -> T:
        """This command's options as the typed record ``cls`` (see ``cli/options.py``)."""
        return build(cls, self.args)

    @property
    def whole(self) -> Config:
        """The validated configuration (loaded on first use) seen as ``--project``'s project;
        with several projects and no ``--project``, as none."""
        if self._config is None:
            cfg = load_config(self.common.config, env=self.env, cwd=self.cwd)
            self._config = cfg.choose(self.common.project) if self.common.project else cfg
        return self._config

    @property
    def config(self) -> Config:
        """The configuration seen as its one chosen project (UsageError naming the projects
        when there are several and none is chosen, unless a view sees every project)."""
        return self.whole if self._every else self.whole.one_project()

    def see_every_project(self) -> None:
        """A view's: with several projects and no ``--project``, show them all (sessions of
        every project are the project's, each record names its own)."""
        self._every = True

    def choose(self, project: str | None) -> Config:
        """Go on as ``project`` (None: as ``--project``, else the config's one project)."""
        if project is not None and project != self.whole.project_name:
            self.use(self.whole.choose(project))
        return self.config

    def use(self, cfg: Config) -> None:
        """Go on with ``cfg`` (a command that runs on read its config again): its secrets are
        redacted from now on; the stores stay open on their backends (``config.watch``)."""
        self._config = cfg
        if self._stores is not None:
            self._stores.cfg = cfg

    @property
    def stores(self) -> Stores:
        """This run's stores (``store.backends.Stores``), closed with the run (``close``)."""
        if self._stores is None:
            from xaf_hub.store.backends import Stores  # deferred: start-up, docs/performance.md

            self._stores = Stores(self.whole)  # the stores are every project's
        return self._stores

    def ops(self, **seams: Any) -> OpsContext:
        """The operations context for this run: config, env, the transport seam and its
        stores (``seams``: a log sink, a stop probe)."""
        from xaf_hub.ops.context import OpsContext  # deferred: start-up, docs/performance.md

        return OpsContext(self.config, env=self.env, transport_factory=self.transport_factory,
                          shared=self.stores, **seams)

    def audit(self, command: str, **fields: Any) -> None:
        """Append one audit line for a write this run made (``store.audit.append``'s fields),
        with its caller from the environment and no secret it knows."""
        from xaf_hub.store import audit  # deferred: start-up, docs/performance.md

        audit.append(self.whole.state_dir, command=command, env=self.env,
                     secrets=self.secrets(), **fields)

    def close(self) -> None:
        """Close what this run opened (its stores' Redis client); the command has ended."""
        if self._stores is not None:
            self._stores.close()

    @property
    def json(self) -> bool:
        """True when the user asked for JSON output."""
        return self.common.json

    def secrets(self) -> tuple[str, ...]:
        """Every secret this run knows: the config's (once loaded) and the environment's."""
        from_env = tuple(v for k, v in self.env.items()
                         if v and (k.startswith("XAF_HUB_PW_") or k == "XAF_HUB_VIEWER_PASSWORD"))
        return (self._config.secrets() if self._config is not None else ()) + from_env

    def every_secret(self) -> tuple[str, ...]:
        """``secrets``, the config loaded first when it loads: an error raised before the
        command loaded it must not carry a configured password either."""
        with contextlib.suppress(Exception):  # a broken config has no secrets to learn
            _ = self.whole  # loading it is the point
        return self.secrets()

    def redact(self, text: str) -> str:
        """``text`` without any secret this run knows (see ``core.text.redact``)."""
        return redact(text, self.secrets())

    def out(self, *lines: str, flush: bool = False) -> None:
        """Print lines of normal output (control characters neutralised unless --json);
        ``flush``: at once (a line a reader waits for)."""
        # JSON already escapes every C0 control; text may carry server-supplied titles.
        for text in map(self.redact, lines):
            print(text if self.json else terminal_safe(text), file=self.stdout, flush=flush)

    def named(self, doc: Any) -> Any:
        """A command's record (or each row of a list of them) naming the project it was read
        as (``"project"``; null: every project), unless it names one or the run read no config."""
        if self._config is None:
            return doc
        if isinstance(doc, list):
            return [self.named(row) for row in doc]
        if isinstance(doc, dict) and "project" not in doc:
            return {**doc, "project": self._config.project_name or None}
        return doc

    def answer(self, doc: Any, *lines: str, code: int = 0) -> int:
        """Print a command's answer: ``doc`` (``named``) as JSON with --json, else ``lines``
        for a person; return the exit ``code``."""
        self.out(*([dumps(self.named(doc))] if self.json else lines))
        return code

    def table(self, rows: Sequence[Sequence[Any]], headers: Sequence[str], **how: Any) -> None:
        """Print a table: fitted to the terminal and coloured on a TTY (see termfit), as is on a
        pipe or with --wide. ``how``: termfit.render's flexible / keep_end / colors."""
        from xaf_hub.cli.termfit import Screen, render  # deferred: start-up, docs/performance.md

        screen = Screen.of(self.stdout, self.env, wide=self.common.wide)
        # The headers, then each row's cells.
        text = [list(headers), *(["" if v is None else str(v) for v in row] for row in rows)]
        # Secrets leave each cell before the table is laid out ("***" is narrower than a
        # secret). Most tables hold none: the whole table is searched once, cells only then.
        secrets = self.secrets()
        joined = "\n".join("\t".join(r) for r in text)
        if redact(joined, secrets) != joined:
            text = [[redact(v, secrets) for v in row] for row in text]
        heads, *safe = [[terminal_safe(v) for v in row] for row in text]
        print(render(safe, heads, screen, **how), file=self.stdout)

    def columns(
        self, items: Iterable[T], columns: Mapping[str, Callable[[T], Any]], **how: Any
    ) -> None:
        """Print ``items`` as a ``table``: one column per header, its cell of an item beside."""
        self.table([[cell(i) for cell in columns.values()] for i in items], list(columns), **how)

    def warn(self, text: str) -> None:
        """Print a warning line to stderr."""
        print(f"warning: {terminal_safe(self.redact(text))}", file=self.stderr)

    def info(self, text: str) -> None:
        """Print progress to stderr (keeps stdout clean for --json)."""
        print(terminal_safe(self.redact(text)), file=self.stderr)
