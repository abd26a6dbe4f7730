"""Command line entry point: argparse, and the ONE place that maps errors to exit codes."""

from __future__ import annotations

import argparse
import atexit
import codecs
import contextlib
import gc
import importlib
import io
import os
import re
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from xaf_hub import __version__
from xaf_hub.cli.options import add_record, common_parser
from xaf_hub.core.text import redact, terminal_safe
from xaf_hub.errors import ExitCode, HubError, UsageError

# httpx's package imports its own command-line tool (click and rich; docs/performance.md) whenever
# both are installed, as they are beside the mcp extra; the hub never runs it. Marked absent, that
# import fails at once, which httpx provides for (its unused `main` then says what to install).
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

if TYPE_CHECKING:  # --help stays light: the context (and the config) load with a command
    from xaf_hub.cli.context import Context

# Subcommand modules under xaf_hub.commands and their one-line help, in --help order.
# A module is imported only when its command runs, so `xaf-hub --help` stays light.
COMMANDS: dict[str, str] = {
    "init": "write a starter config.json (from --instance/--root, or the bundled example)",
    "instances": "health and totals of every instance",
    "sessions": "the project's sessions (table, JSON, CSV or HTML export)",
    "status": "load and spend today per instance, and whether it can take new work",
    "dispatch": "send a task to a related, named or new session",
    "show": "one session: state, model, cost, last prompt and answer, how to open it",
    "confirm": "say whether one session really runs (retrying? failed? why); --fix heals it",
    "cleanup": "preview (or --execute) deletion of stale project sessions",
    "interrupt": "abort a session's run",
    "waiting": "list what runs wait on: permission requests and questions for a person",
    "approve": "approve a permission request a run waits on (--always: its patterns too)",
    "deny": "deny a permission request (or reject a question) a run waits on",
    "answer": "answer a question a run waits on (option labels, or --text)",
    "watch": "print changes in the fleet as they happen",
    "serve": "serve the overview page (and its JSON) to colleagues' browsers, read-only",
    "models": "the chains' models: which rest, until when and why; clear or start a rest",
    "doctor": "check config, credentials, instances, state, blackouts, patrol; say how to fix",
    "patrol": "run the patrol (heal, resume, sync design tasks, fill slots); pause/resume/status",
    "backlog": "list, add, show or change tasks in the patrol's task pool",
    "land": "land a task's verified branch on the base branch, send it back, or drop it",
    "notify": "send a test message to the team's chat webhooks (the patrol sends events)",
    "mcp": "serve the hub to a lead agent over MCP (stdio, or Streamable HTTP with a token)",
    "completion": "print a shell completion script (bash, zsh or fish)",
}

# A command whose module lives beside the face it starts, not in cli/commands/: `mcp` starts the
# MCP server (cli/mcp.py), whose tools call the commands' functions.
MODULES: dict[str, str] = {"mcp": "xaf_hub.cli.mcp_command"}


def command_module(name: str) -> str:
    """The module of command ``name``."""
    return MODULES.get(name, f"xaf_hub.cli.commands.{name}")


DESCRIPTION = """\
Run a fleet of opencode servers as one: find the project's sessions on every instance,
send work to the right session or instance without exceeding any instance's limit,
clean up, watch, and keep the fleet busy with the patrol.

exit codes: 0 ok, 1 internal error, 2 instance unreachable, 3 concurrency limit or lock
timeout, 4 bad argument/config or production not allowed, 5 not a project session.
"""


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors exit 4 (USAGE), not argparse's 2, and suggest the
    command or option a typo was probably meant to be; ``records`` are the options records its
    options come from (``options.add_record``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.records: list[type[Any]] = []

    def error(self, message: str) -> NoReturn:

        where = self.prog.removeprefix("xaf-hub").strip()  # the subcommand, if any
        hint = self._did_you_mean(message)
        unknown = re.match(r"argument COMMAND: invalid choice: ('[^']*')", message)
        if unknown:  # argparse's text lists every command; a suggestion is enough
            message = f"unknown command {unknown.group(1)}"
            hint = hint or f"; the commands are: {', '.join(COMMANDS)}"
        text = f"{where}: {message}" if where else message
        raise UsageError(f"{text}{hint} (see {self.prog} --help)")

    def _parse_known_args(self, arg_strings: list[str], *rest: Any, **more: Any) -> Any:
        # The words this parser read, kept for the "did you mean" of an error that names no
        # word (a required option missing because its name was mistyped: `dispatch --txt`).
        self._words = list(arg_strings)
        return super()._parse_known_args(arg_strings, *rest, **more)

    def _did_you_mean(self, message: str) -> str:
        import difflib  # deferred: start-up, docs/performance.md

        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            known = re.findall(r"'?([^',\s]+)'?", choice.group(2))
            close = difflib.get_close_matches(choice.group(1), known, n=1, cutoff=0.6)
            return f"; did you mean '{close[0]}'?" if close else ""
        needs = re.match(r"argument (\S+): expected one argument", message)
        if needs:  # `--text --fix-it`: the value is there, it only starts with a dash
            flags = needs.group(1).split("/")
            words = getattr(self, "_words", [])
            pairs = zip(words, words[1:], strict=False)  # each word and the one after it
            if any(w in flags and nxt.startswith("-") for w, nxt in pairs):
                return f"; a value that starts with '-' is given as {flags[-1]}=VALUE"
            return ""
        return self._mistyped(getattr(self, "_words", []))

    def _mistyped(self, words: Sequence[str]) -> str:
        """The suggestion for the first word that looks like an option neither this parser nor
        its commands know (nor abbreviate), whatever the error said."""
        import difflib  # deferred: start-up, docs/performance.md

        options = set(self._option_string_actions)
        for action in self._subparsers._group_actions if self._subparsers else ():
            for sub in (getattr(action, "choices", None) or {}).values():
                options.update(getattr(sub, "_option_string_actions", {}))
        known = sorted(o for o in options if o.startswith("--"))
        for word in words:
            name = word.split("=")[0]
            if word == "--":
                break
            if not name.startswith("--") or any(o.startswith(name) for o in known):
                continue
            close = difflib.get_close_matches(name, known, n=1)
            if close:
                return f"; did you mean {close[0]}?"
        return ""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written, fitted to the terminal when a line is too wide
    (``termfit.fit_help``); argparse already wraps the options' help."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        from xaf_hub.cli.termfit import fit_help  # deferred: start-up, docs/performance.md

        fitted = fit_help(text, width - len(indent))
        return "".join(indent + line for line in fitted.splitlines(keepends=True)) + "\n"


def build_parser(argv: Sequence[str] | None = None) -> Parser:
    """The parser; only the commands named in ``argv`` (all when None) get their options."""
    parser = Parser(prog="xaf-hub", description=DESCRIPTION, formatter_class=HelpFormatter,
                    parents=[common_parser()])

    parser.add_argument("--version", action="version", version=f"xaf-hub {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    # On subcommands the defaults are SUPPRESS so `xaf-hub --config X status` keeps X. A parent
    # lends its options only: any parser class will do (typeshed asks for the subparsers' own).
    common: Any = common_parser(suppress=True)
    wanted = set(COMMANDS) if argv is None else set(argv) & set(COMMANDS)
    for name, help_text in COMMANDS.items():
        if name not in wanted:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        module = importlib.import_module(command_module(name))
        p = sub.add_parser(name, help=help_text, description=module.__doc__,
                           epilog=getattr(module, "EXAMPLES", None),
                           formatter_class=HelpFormatter, parents=[common])
        if hasattr(module, "add_arguments"):  # a command with actions of its own (backlog)
            module.add_arguments(p)
        else:
            add_record(p, module.Options)
        p.set_defaults(func=module.run)
    return parser


# A command builds thousands of small records and keeps them to its end: CPython's default
# collector (a pass every 700 new objects) went over them about 110 times in one `status` of
# 3,000 sessions (docs/performance.md). A process run from the command line passes less often.
GC_THRESHOLD = (10_000, 10, 10)


def main(argv: Sequence[str] | None = None, **context: Any) -> int:
    """Run one command; return its exit code (tests call this directly)."""
    if argv is None:  # the process's own command line: ours alone
        gc.set_threshold(*GC_THRESHOLD)
    args: argparse.Namespace | None = None
    ctx: Context | None = None
    stderr: TextIO = context.get("stderr") or sys.stderr
    for stream in (context.get("stdout") or sys.stdout, stderr):
        _replace_unencodable(stream)
    try:
        # deferred: inside the try, a Ctrl+C while it loads (a slow machine) is "interrupted",
        # not a traceback; see docs/performance.md
        from xaf_hub.cli.context import Context

        words = list(sys.argv[1:] if argv is None else argv)
        _utf8_words(words)
        parser = build_parser(words)
        args = parser.parse_args(words)
        if not getattr(args, "command", None):
            parser.print_help(context.get("stdout", sys.stdout))
            return int(ExitCode.USAGE)
        ctx = Context(args=args, **context)
        code = int(args.func(ctx))
        if "stdout" not in context:
            sys.stdout.flush()  # here, not at exit: a closed pipe is then caught below
        return code
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0) if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        _report(ctx, stderr, args, "interrupted", None)
        return 130
    except BrokenPipeError as exc:
        if "stdout" in context or not _reader_gone(sys.stdout):
            return _internal_error(ctx, stderr, args, exc)
        # `xaf-hub sessions --json | head`: the reader took what it wanted. Like any Unix
        # tool ended by SIGPIPE: quiet, 128 + 13.
        _drop_stdout()
        return PIPE_CLOSED
    except HubError as raised:
        _report(ctx, stderr, args, str(raised), raised)
        return int(raised.exit_code)
    except Exception as exc:  # noqa: BLE001 - the last line of defence prints one line
        return _internal_error(ctx, stderr, args, exc)
    finally:
        if ctx is not None:
            with contextlib.suppress(Exception):  # closing never hides the command's answer
                ctx.close()


def run() -> NoReturn:
    """The `xaf-hub` program: ``main`` on this process's own command line, then ``leave``."""
    leave(main())


def leave(code: int) -> NoReturn:
    """End the process with ``code``: its output written, its exit handlers run, the threads
    that outlive a program awaited as at any exit, but without tearing the interpreter down.

    Tearing down frees every module and object one by one and collects the cycles a scan
    left, work nobody waits for in a process about to end (docs/performance.md). The process
    exits the usual way when something waits for that end: a thread still running, a tracer,
    profiler or debugger (it reports after the program returns), `python -i` (its prompt),
    or the allocator's statistics that PYTHONMALLOCSTATS prints at shutdown."""
    if (
        sys.gettrace() is not None
        or sys.getprofile() is not None
        or "bdb" in sys.modules  # pdb's base: a debugger between breakpoints traces nothing
        or sys.flags.inspect
        or os.environ.get("PYTHONINSPECT")
        or os.environ.get("PYTHONMALLOCSTATS")
        or any(not t.daemon and t is not threading.main_thread() for t in threading.enumerate())
    ):
        sys.exit(code)
    atexit._run_exitfuncs()  # what registered itself for the exit (logging's last flush)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # as at any exit: a gone reader loses nothing
            stream.flush()
    os._exit(code)


def _utf8_words(words: Sequence[str]) -> None:
    """Refuse an argument that holds bytes UTF-8 cannot read (a GBK terminal under a UTF-8
    locale: Python keeps them as lone surrogates, and the first write of the text, to a server,
    a file or the screen, failed as an internal error)."""
    for i, word in enumerate(words, 1):
        bad = next((c for c in word if "\udc80" <= c <= "\udcff"), None)
        if bad is not None:
            at = word.index(bad)
            raise UsageError(
                f"argument {i} is not UTF-8 text (byte 0x{ord(bad) - 0xDC00:02x} at character "
                f"{at + 1}); set the terminal to UTF-8 (LANG/LC_ALL=*.UTF-8) and type it again"
            )
        if any("\ud800" <= c <= "\udfff" for c in word):
            raise UsageError(f"argument {i} holds half a surrogate pair, not text")


def _internal_error(
    ctx: Context | None, stderr: TextIO, args: argparse.Namespace | None, exc: BaseException
) -> int:
    """Report an error no HubError names: one line (the traceback with --debug), exit 1."""
    _report(ctx, stderr, args, f"internal error: {type(exc).__name__}: {exc}", exc, internal=True)
    return int(ExitCode.INTERNAL)


def _replace_unencodable(stream: TextIO) -> None:
    """Let a stream whose encoding cannot show every character (GBK / cp936 on a Chinese
    Windows, a PYTHONIOENCODING=gbk pipe) print ``?`` for the rest instead of raising
    UnicodeEncodeError halfway through a table; a UTF-8 stream is left as it is."""
    if not isinstance(stream, io.TextIOWrapper) or stream.errors != "strict":
        return

    with contextlib.suppress(LookupError, AttributeError, ValueError, OSError):  # closed...
        if not codecs.lookup(stream.encoding).name.startswith("utf"):
            stream.reconfigure(errors="replace")


PIPE_CLOSED = 141  # 128 + SIGPIPE: what a shell reports for a tool its reader stopped


def _reader_gone(stream: TextIO) -> bool:
    """Whether ``stream`` is a pipe or socket whose reader has closed its end (POSIX poll).

    Windows has no poll on pipes: a broken pipe there is reported as an error line (exit 1),
    never taken for a reader that stopped on purpose."""
    if sys.platform == "win32":
        return False
    import select  # deferred: start-up, docs/performance.md

    try:
        fd = stream.fileno()
        poller = select.poll()
        poller.register(fd, 0)  # POLLERR and POLLHUP are reported whatever the mask
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no fd (a test's stream), no poll
        return False


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush has nowhere to fail."""

    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _report(
    ctx: Context | None, stderr: TextIO, args: argparse.Namespace | None, message: str,
    exc: BaseException | None, internal: bool = False,
) -> None:

    secrets = ctx.every_secret() if ctx is not None else ()
    debug = args is not None and bool(getattr(args, "debug", False))
    if debug and exc is not None:
        text = "".join(traceback.format_exception(exc))
        print(terminal_safe(redact(text, secrets)), file=stderr, end="")
    line = f"xaf-hub: error: {message}"
    if internal and not debug:
        line += " (run with --debug for details)"
    print(terminal_safe(redact(line, secrets)), file=stderr)
