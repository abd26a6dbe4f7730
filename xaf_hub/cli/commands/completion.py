"""Print a shell completion script for bash, zsh or fish.

The script is generated from the command line parser, so it always knows every command and
option. Instance names after -i/--instance are read from the config when the user presses Tab
(`xaf-hub completion --instances`, no network); file names after --config, --out, --html and
other FILE options. Session ids are not completed: listing them needs a scan of every server.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass
from typing import Literal

from xaf_hub.cli.context import Context
from xaf_hub.cli.main import COMMANDS, build_parser
from xaf_hub.cli.options import HIDDEN, flag, opt
from xaf_hub.errors import UsageError

EXAMPLES = """\
examples:
  source <(xaf-hub completion bash)                      # now; add it to ~/.bashrc to keep it
  xaf-hub completion zsh > "${fpath[1]}/_xaf-hub"        # zsh: then start a new shell
  xaf-hub completion fish > ~/.config/fish/completions/xaf-hub.fish
"""

FILE_DESTS = {"config", "out", "html", "prompt_file"}


@dataclass(frozen=True)
class Option:
    """One option as a completion script needs it."""

    flags: tuple[str, ...]
    takes_value: bool
    kind: str  # "instance", "file" or ""
    help: str


@dataclass(frozen=True)
class Command:
    """One subcommand: its help, options and any sub-actions (backlog list/add/...)."""

    name: str
    help: str
    options: tuple[Option, ...]
    actions: tuple[str, ...]


def _options(parser: argparse.ArgumentParser) -> list[Option]:
    out = []
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        metavar = str(action.metavar or "")
        kind = ("instance" if action.dest == "instance" and metavar == "NAME" else
                "file" if action.dest in FILE_DESTS or metavar in ("FILE", "PATH") else "")
        text = (action.help or "").replace("%(default)s", str(action.default))
        out.append(Option(tuple(action.option_strings), action.nargs != 0, kind, text))
    return out


def model() -> list[Command]:
    """Every command with its options, from the real parser."""

    parser = build_parser(None)
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = []
    for name, help_text in COMMANDS.items():
        sub = subs.choices[name]
        actions: list[str] = []
        options = _options(sub)
        for a in sub._actions:
            if not a.option_strings and a.choices and not isinstance(a, argparse._SubParsersAction):
                actions += [str(c) for c in a.choices]
            if isinstance(a, argparse._SubParsersAction):
                actions = list(a.choices)
                for child in a.choices.values():
                    options += [o for o in _options(child) if o not in options]
        commands.append(Command(name, help_text, tuple(options), tuple(actions)))
    return commands


def _words(c: Command) -> str:
    flags = dict.fromkeys(f for o in c.options for f in o.flags if f not in ("-h", "--help"))
    return " ".join([*c.actions, *flags, "--help"])


def _flags(c: Command, *, kind: str | None = None, value: bool = False) -> str:
    chosen = (
        o for o in c.options if (kind is None or o.kind == kind) and (o.takes_value or not value)
    )
    return " ".join(dict.fromkeys(f for o in chosen for f in o.flags))


def bash_script(commands: list[Command]) -> str:
    """A bash completion function for xaf-hub."""
    names = " ".join(c.name for c in commands)
    cases = "\n".join(
        f'        {c.name}) words="{_words(c)}"\n'
        f'            inst=" {_flags(c, kind="instance")} " files=" {_flags(c, kind="file")} "'
        f' vals=" {_flags(c, value=True)} " ;;'
        for c in commands
    )
    return f"""\
# bash completion for xaf-hub; load it with:  source <(xaf-hub completion bash)
_xaf_hub() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
    local cmd="" i words="" inst=" " files=" --config " vals=" --config "
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${{COMP_WORDS[i]}} in
            --config) ((i++)) ;;
            -*) ;;
            *) cmd=${{COMP_WORDS[i]}}; break ;;
        esac
    done
    case $cmd in
{cases}
    esac
    if [[ $files == *" $prev "* ]]; then
        COMPREPLY=($(compgen -f -- "$cur"))
    elif [[ $inst == *" $prev "* ]]; then
        COMPREPLY=($(compgen -W "$(xaf-hub completion --instances 2>/dev/null)" -- "$cur"))
    elif [[ $vals == *" $prev "* ]]; then
        COMPREPLY=()
    elif [[ -z $cmd && $cur == -* ]]; then
        COMPREPLY=($(compgen -W "--config --debug --version --help" -- "$cur"))
    elif [[ -z $cmd ]]; then
        COMPREPLY=($(compgen -W "{names}" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
    fi
}}
complete -o default -F _xaf_hub xaf-hub
"""


def _zsh_quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "'\\''").replace(":", "\\:")


def zsh_script(commands: list[Command]) -> str:
    """A zsh completion function for xaf-hub (compdef)."""
    described = "\n".join(f"    '{c.name}:{_zsh_quote(c.help)}'" for c in commands)
    flags = {kind: {f for c in commands for o in c.options if o.kind == kind for f in o.flags}
             for kind in ("instance", "file")}
    cases = "\n".join(f"    {c.name}) compadd -- {_words(c)} ;;" for c in commands)
    return f"""\
#compdef xaf-hub
# zsh completion for xaf-hub; install with:  xaf-hub completion zsh > "${{fpath[1]}}/_xaf-hub"
# or load it now with:  source <(xaf-hub completion zsh)
_xaf_hub() {{
  local -a commands
  commands=(
{described}
  )
  local cmd="" i
  for (( i = 2; i < CURRENT; i++ )); do
    case ${{words[i]}} in
      --config) (( i++ )) ;;
      -*) ;;
      *) cmd=${{words[i]}}; break ;;
    esac
  done
  case ${{words[CURRENT-1]}} in
    {"|".join(sorted(flags["file"] | {"--config"}))}) _files; return ;;
  esac
  if [[ -n $cmd ]]; then
    case ${{words[CURRENT-1]}} in
      {"|".join(sorted(flags["instance"]))})
        compadd -- ${{(f)"$(xaf-hub completion --instances 2>/dev/null)"}}; return ;;
    esac
  fi
  if [[ -z $cmd ]]; then
    if [[ ${{words[CURRENT]}} == -* ]]; then
      compadd -- --config --debug --version --help
    else
      _describe 'xaf-hub command' commands
    fi
    return
  fi
  case $cmd in
{cases}
  esac
}}
if (( $+functions[compdef] )); then compdef _xaf_hub xaf-hub; fi
"""


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# What follows an option of each kind in fish (another that takes a value: "-x").
_FISH_VALUES = {"instance": "-x -a '(xaf-hub completion --instances 2>/dev/null)'", "file": "-r -F"}


def fish_script(commands: list[Command]) -> str:
    """Fish `complete` lines for xaf-hub."""
    lines = [
        "# fish completion for xaf-hub; install with:",
        "#   xaf-hub completion fish > ~/.config/fish/completions/xaf-hub.fish",
        "complete -c xaf-hub -f",
        "complete -c xaf-hub -n __fish_use_subcommand -l config -r -F -d 'config file'",
        "complete -c xaf-hub -n __fish_use_subcommand -l debug -d 'show tracebacks on errors'",
        "complete -c xaf-hub -n __fish_use_subcommand -l version -d 'print the version'",
    ]
    lines += [f"complete -c xaf-hub -n __fish_use_subcommand -a {c.name} -d {_fish_quote(c.help)}"
              for c in commands]
    for c in commands:
        seen = f"-n '__fish_seen_subcommand_from {c.name}'"
        lines += [f"complete -c xaf-hub {seen} -a {action}" for action in c.actions]
        for o in c.options:
            parts = [f"complete -c xaf-hub {seen}"]
            parts += [f"-s {name[1:]}" if len(name) == 2 else f"-l {name[2:]}" for name in o.flags]
            value = _FISH_VALUES.get(o.kind, "-x" if o.takes_value else "")
            parts += [value] if value else []
            if o.help:
                parts.append(f"-d {_fish_quote(o.help.splitlines()[0][:80])}")
            lines.append(" ".join(parts))
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, kw_only=True)
class Options:
    """The options of `completion`."""

    shell: Literal["bash", "zsh", "fish"] | None = opt(help="the shell to print a script for")
    instances: bool = flag("--instances", help=HIDDEN)


def run(ctx: Context) -> int:
    """Print the script (or, for the scripts themselves, the configured instance names)."""
    opts = ctx.options(Options)
    if opts.instances:
        with contextlib.suppress(Exception):  # Tab must never print an error
            ctx.out(*(inst.name for inst in ctx.config.instances))
        return 0
    if not opts.shell:
        raise UsageError("name a shell: bash, zsh or fish (e.g. xaf-hub completion bash)")
    make = {"bash": bash_script, "zsh": zsh_script, "fish": fish_script}[opts.shell]
    print(make(model()), end="", file=ctx.stdout)
    return 0
