"""The commands that README.md and docs/ print parse with the argument parser that will read them: an option renamed
or removed since the page was written fails here, not for the reader who copies the command.

Experiment and benchmark scripts: each runs in a process of its own (some pick their Keras backend when imported)
until it calls ``parse_args``, which stops it before any work; its published argument lists are then parsed by that
parser, as the shell would pass them (redirections, comments and placeholders taken out). What a script checks after
parsing (e.g. that named presets exist) is not exercised.

``otzoo`` commands (the fenced blocks' lines; inline spans are often fragments such as `otzoo train --resume`): each
runs through ``otzoo.cli.main`` up to the point where it would pick its backend and start its work. Files and
preset directories that a page makes in an earlier step (``my_mpw``, ``runs/gsp_c100``) are taken as given: the
argument types that check such a path exists accept any text here."""
import concurrent.futures
import contextlib
import io
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

import pytest

from otzoo import cli, explain_command

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# a script and its arguments, up to the end of the line or the next "&&", ";" or "|" (another command may follow)
COMMAND = re.compile(r"python3? ((?:experiments|benchmarks)/\w+\.py)((?:(?!&&|;|\|).)*)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
# Placeholders of the pages: a seed in a shell loop ($S) or one the reader picks (S), the reader's preset, folder,
# count or data set; "..." elides the rest
PLACEHOLDERS = {"S": "0", "...": None, "PRESET": "resnet20_mpw_fashion_mnist",
                "PRESET_OR_DIR": "resnet20_mpw_fashion_mnist", "DIR": "otzoo_published_dir", "N": "2",
                "NAME": "cifar100"}  # "$S" inside a token: replaced below
SEPARATORS = ("&&", ";", "||", "|")

# Runs one script with its first published arguments as sys.argv until its ArgumentParser.parse_args returns, then
# parses the script's other published arguments with the same parser; prints one JSON list: per argument list, None
# (parsed) or the parser's last line of complaint. The script's folder comes first on sys.path, as when Python runs
# a file.
RUNNER = r"""
import argparse, contextlib, io, json, os, runpy, sys
path, lists = sys.argv[1], json.loads(sys.argv[2])
original = argparse.ArgumentParser.parse_args
original_known = argparse.ArgumentParser.parse_known_args

class Parsed(BaseException):
    pass

def parse(parser, arguments):
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            original(parser, arguments)
    except SystemExit as exit:
        if exit.code in (0, None):  # --help
            return None
        return (stderr.getvalue().strip().splitlines() or ["refused"])[-1]
    return None

def stop_at_the_command_line(method):
    def patched(self, args=None, namespace=None):
        if args is None:  # the parser of the command line (a pre-parser given a list is left to run)
            raise Parsed(self)
        return method(self, args, namespace)
    return patched

argparse.ArgumentParser.parse_args = stop_at_the_command_line(original)
argparse.ArgumentParser.parse_known_args = stop_at_the_command_line(original_known)
sys.argv = [path] + lists[0]
sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
try:
    runpy.run_path(path, run_name="__main__")
except Parsed as stopped:
    print(json.dumps([parse(stopped.args[0], arguments) for arguments in lists]))
else:
    sys.exit("the script returned without reading its command line")
"""


def _arguments(text):
    """The arguments of one command as the shell would pass them, without redirections, a trailing comment or
    brackets around optional parts; ``None`` where the page elides them."""
    return _arguments_of(shlex.split(text, comments=True))


def _arguments_of(tokens):
    """:func:`_arguments` of the shell's tokens, up to the first that ends the command."""
    arguments, skip = [], False
    for token in tokens:
        if skip:
            skip = False
            continue
        if token in SEPARATORS:
            break
        if re.fullmatch(r"\d?>>?(&\d)?", token):  # "> log" or "2>&1"
            skip = not token.endswith(("&1", "&2"))
            continue
        if re.match(r"\d?>", token):  # ">log"
            continue
        token = token.strip("[]")
        if token in PLACEHOLDERS:
            if PLACEHOLDERS[token] is None:
                return None
            token = PLACEHOLDERS[token]
        arguments.append(token.replace("$S", "0"))
    return arguments


def _command_texts(text, inline=True):
    """The shell lines of a page's fenced blocks (a line ending in a backslash joined to the next) and, with
    ``inline``, its inline code spans (a span broken over two lines of the page joined with a space)."""
    for body in FENCE.findall(text):
        yield from body.replace("\\\n", " ").splitlines()
    if not inline:
        return
    for span in re.findall(r"`([^`]+)`", FENCE.sub("", text)):
        yield span.replace("\n", " ")


def _page_lines(inline=True):
    """``(page, line)`` of every shell line of the pages (see :func:`_command_texts`)."""
    for page in PAGES:
        for line in _command_texts(page.read_text(encoding="utf-8"), inline):
            yield page.relative_to(ROOT).as_posix(), line


def published_commands():
    """``(script, arguments, where)`` of every experiment or benchmark command on the pages, each once, and the
    commands the shell could not read (``where: text``: an unbalanced quote)."""
    found, unreadable = {}, []
    for where, line in _page_lines():
        for match in COMMAND.finditer(line):
            try:
                arguments = _arguments(match.group(2))
            except ValueError as error:
                unreadable.append(f"{where}: {match.group(0)} ({error})")
                continue
            if arguments is not None:
                found.setdefault((match.group(1), tuple(arguments)), where)
    return [(script, list(arguments), where) for (script, arguments), where in sorted(found.items())], unreadable


COMMANDS, UNREADABLE = published_commands()


def test_the_pages_publish_commands_of_both_folders():
    """The pattern finds what the pages print (an empty list would pass the test below without checking)."""
    scripts = {script for script, _, _ in COMMANDS}
    assert any(s.startswith("experiments/") for s in scripts) and any(s.startswith("benchmarks/") for s in scripts)
    assert ("benchmarks/gsp.py", ["--repeats", "100"]) in [(s, a) for s, a, _ in COMMANDS]
    assert not UNREADABLE, UNREADABLE


def test_the_arguments_are_read_as_the_shell_reads_them():
    assert _arguments(" --seed $S --out r/x_seed$S.json > r/x.log 2>&1") == ["--seed", "0", "--out", "r/x_seed0.json"]
    assert _arguments(" --presets A B --seeds 0 1 --output FILE [--train]") == [
        "--presets", "A", "B", "--seeds", "0", "1", "--output", "FILE", "--train"]
    assert _arguments(" report --results d --markdown seeds.md  # the tables") == [
        "report", "--results", "d", "--markdown", "seeds.md"]
    assert _arguments(" --shots 1 --seed S") == ["--shots", "1", "--seed", "0"]
    assert _arguments(" ...") is None
    assert _arguments(" --repeats 100 | tee log") == ["--repeats", "100"]
    line = "python benchmarks/a.py --x 1 2>&1 && python experiments/b.py --y; python benchmarks/c.py | tee c.log"
    assert [(m.group(1), _arguments(m.group(2))) for m in COMMAND.finditer(line)] == [
        ("benchmarks/a.py", ["--x", "1"]), ("experiments/b.py", ["--y"]), ("benchmarks/c.py", [])]


def test_a_removed_option_is_refused():
    """The check can fail: an option the parser does not know is the parser's complaint; --help parses."""
    assert _parse("benchmarks/gsp.py", [["--repeats", "100"], ["--repetitions", "100"], ["--help"]]) == [
        None, "gsp.py: error: unrecognized arguments: --repetitions 100", None]


def _parse(script, argument_lists):
    """What :data:`RUNNER` prints for ``script`` and the argument lists; a script that fails before it reads its
    command line gives its error's last line for every list."""
    result = subprocess.run([sys.executable, "-c", RUNNER, script, json.dumps(argument_lists)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2"))
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        return [f"the script failed: {last}"] * len(argument_lists)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # one process per script, each importing its frameworks: a minute or two on two cores
def test_every_published_command_parses():
    """A script without an argument parser must be published without arguments (it would ignore them); it is not
    run (it would do its work). The others run two at a time."""
    by_script = {}
    for script, arguments, where in COMMANDS:
        by_script.setdefault(script, []).append((arguments, where))
    failures = []
    with_parser = {}
    for script, commands in by_script.items():
        if "argparse" in (ROOT / script).read_text(encoding="utf-8"):
            with_parser[script] = commands
        else:
            failures += [f"{where}: {script} reads no arguments, given {arguments}"
                         for arguments, where in commands if arguments]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        answers = pool.map(lambda item: _parse(item[0], [arguments for arguments, _ in item[1]]), with_parser.items())
        for (script, commands), complaints in zip(with_parser.items(), answers):
            failures += [f"{where}: python {script} {shlex.join(arguments)} -> {complaint}"
                         for (arguments, where), complaint in zip(commands, complaints) if complaint]
    assert not failures, json.dumps(failures, indent=1)


def _cli_subcommands():
    """The sub-commands ``otzoo.cli.main`` registers (the parsers it makes, recorded while ``--help`` runs)."""
    made = []

    class Recording(cli.ArgumentParser):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self.prog)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "ArgumentParser", Recording)
        with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit):
            cli.main(["--help"])
    return {prog.split()[1] for prog in made[1:]}


def _runs_otzoo(tokens, index):
    """Whether ``tokens[index]`` (``otzoo``, ``.venv/bin/otzoo``) is a command's program, not an argument as in
    ``pip install otzoo``: it starts the line or follows a separator, ``python -m`` or an environment setting."""
    if not re.fullmatch(r"(?:\S*/)?otzoo", tokens[index]):
        return False
    before = tokens[index - 1] if index else None
    return before is None or before in SEPARATORS or before == "-m" or bool(re.fullmatch(r"\w+=\S*", before))


def _subcommand(arguments):
    """The sub-command of ``otzoo`` arguments, after a leading ``--backend NAME`` (or ``--backend=NAME``)."""
    if arguments[:1] == ["--backend"]:
        arguments = arguments[2:]
    elif arguments[:1] and arguments[0].startswith("--backend="):
        arguments = arguments[1:]
    return arguments[0] if arguments else None


def published_cli_commands():
    """``(arguments, where)`` of every ``otzoo`` command on the fenced lines of the pages (the program left out),
    each once, and the lines the shell could not read."""
    found, unreadable = {}, []
    for where, line in _page_lines(inline=False):
        if "otzoo" not in line:
            continue
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as error:
            unreadable.append(f"{where}: {line.strip()} ({error})")
            continue
        for index in range(len(tokens)):
            arguments = _arguments_of(tokens[index + 1:]) if _runs_otzoo(tokens, index) else None
            if arguments is not None:
                found.setdefault(tuple(arguments), where)
    return [(list(arguments), where) for arguments, where in sorted(found.items())], unreadable


class _Parsed(Exception):
    pass


def _parse_cli(arguments):
    """``None`` where ``otzoo.cli.main`` reads ``arguments`` up to choosing its backend, else its complaint's last
    line. Paths a page made in an earlier step are accepted (see the module's docstring)."""
    def stop(args):
        raise _Parsed()

    stderr = io.StringIO()
    # in an empty folder: a preset directory the reader made by following a page (my_mpw) is not there to be refused
    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory() as empty:
        patch.chdir(empty)
        patch.setattr(cli, "check_backend", stop)
        for module in (cli, explain_command):
            patch.setattr(module, "weights_location", str)
            patch.setattr(module, "preset_or_directory", str)
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                status = cli.main(arguments)
        except _Parsed:
            return None
        except SystemExit as stopped:
            if stopped.code in (0, None):
                return None
            return (stderr.getvalue().strip().splitlines() or [f"exit status {stopped.code}"])[-1]
    return f"ran without choosing a backend (status {status})"


def test_every_published_otzoo_command_parses():
    """A sub-command that no longer exists is the parser's complaint too."""
    commands, unreadable = published_cli_commands()
    assert not unreadable, unreadable
    # every sub-command is published (the README lists them all)
    assert {_subcommand(arguments) for arguments, _ in commands} == _cli_subcommands()
    failures = [f"{where}: otzoo {shlex.join(arguments)} -> {complaint}" for arguments, where in commands
                if (complaint := _parse_cli(arguments))]
    assert not failures, json.dumps(failures, indent=1)


def test_a_renamed_otzoo_option_is_refused():
    """The check can fail: an unknown option or a misspelled preset is refused with the parser's line."""
    assert _parse_cli(["evaluate", "resnet20_mpw_fashion_mnist", "--limit", "2000"]) is None
    assert _parse_cli(["evaluate", "resnet20_mpw_fashion_mnist", "--test-limit", "2000"]) == \
        "otzoo: error: unrecognized arguments: --test-limit 2000"
    assert "unknown preset 'resnet20_mpw'" in _parse_cli(["train", "resnet20_mpw", "--out", "runs/x"])
    assert _parse_cli(["export", "my_mpw"]) == "otzoo export: error: the following arguments are required: --out"
    assert "invalid choice: 'serve'" in _parse_cli(["--backend=jax", "serve", "resnet20_mpw_fashion_mnist"])


def test_the_program_is_told_from_an_argument():
    def commands(line):
        tokens = shlex.split(line, comments=True)
        return [_arguments_of(tokens[i + 1:]) for i in range(len(tokens)) if _runs_otzoo(tokens, i)]

    assert commands("pip install --no-deps otzoo  # otzoo list") == []
    assert commands("bash scripts/setup.sh && .venv/bin/otzoo demo  # set up") == [["demo"]]
    assert commands("KERAS_BACKEND=jax otzoo evaluate x > log ; python -m otzoo list") == [["evaluate", "x"], ["list"]]
    assert [_subcommand(a) for a in (["--backend", "jax", "train"], ["--backend=torch", "tune"], ["list"], [])] == [
        "train", "tune", "list", None]
