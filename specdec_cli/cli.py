"""The `specdec` command line: a typer app with one module per subcommand under `commands/`."""

from __future__ import annotations

import atexit
import errno
import os
import signal
import sys

from .commands import interrupt


def _interrupted(stop: KeyboardInterrupt | None = None) -> int:
    """Ctrl-C, wherever it came: one line saying what was kept (commands/interrupt.py), and exit code 130;
    SIGTERM (interrupt.Terminated) the same line and 143, as a process that SIGTERM ends exits."""
    print(f"specdec: {interrupt.line(stop)}", file=sys.stderr, flush=True)
    return 128 + (signal.SIGTERM if isinstance(stop, interrupt.Terminated) else signal.SIGINT)


try:  # Ctrl-C while the commands' modules load ends as it does anywhere else, not in a traceback
    import typer
    from typer._click import exceptions as click_errors  # typer 0.29 carries its own click
    from typer.core import TyperArgument, TyperGroup

    from .commands.bench import bench_command
    from .commands.calibrate import calibrate_k
    from .commands.export import export
    from .commands.export_head import export_head_command
    from .commands.common import error_line, warning_line
    from .commands.generate import generate
    from .commands.models import models
    from .commands.predict import predict_command
    from .commands.train_draft import train_draft
    from .commands.verify import verify_equivalence
    from .commands.watch import watch
    from . import notices
    from .runtime import threads
except KeyboardInterrupt:
    raise SystemExit(_interrupted()) from None


class SpecdecGroup(TyperGroup):
    """Every way out of a command through one door: usage errors as one `specdec: error:` line with
    exit 2, a reader that closed the pipe as a quiet exit 0, Ctrl-C as one line saying what the command
    kept (commands/interrupt.py) with exit 130, and SIGTERM the same way with exit 143, whatever the
    command was."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        interrupt.begin()
        previous = _take_sigterm()
        try:
            code = super().main(args, prog_name or "specdec", complete_var, standalone_mode=False, **extra)
            _flush_stdout()
        except KeyboardInterrupt as stop:
            code = _interrupted(stop)
        except click_errors.NoArgsIsHelpError as exc:
            print(exc.ctx.get_help() if exc.ctx else "")
            code = 0
        except click_errors.UsageError as exc:
            error_line(_usage_message(exc))
            code = 2
        except click_errors.ClickException as exc:
            error_line(exc.format_message())
            code = exc.exit_code
        except typer.Abort:
            code = 130
        except BrokenPipeError:
            code = _quiet_after_broken_pipe()
        except StdoutFailed as exc:
            error_line(f"could not write to stdout: {exc}")
            code = 2
            _stdout_to_devnull()
        finally:
            _give_back_sigterm(previous)
        code = code if isinstance(code, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code

    def get_command(self, ctx, name):
        command = super().get_command(ctx, name)
        for param in getattr(command, "params", ()):
            if isinstance(param, TyperArgument):  # `PROMPT <str>`: the name says it, the type adds noise
                param.display_type_rich = lambda ctx: None
        return command

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as stop:  # caught here, as typer's own handler turns it into exit 130 without a word
            raise typer.Exit(_interrupted(stop)) from None
        except OSError as exc:
            # Caught here because click's own handler turns a broken pipe into exit code 1.
            if isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE:
                return _quiet_after_broken_pipe()
            raise


def _take_sigterm():
    """While a command runs, SIGTERM raises interrupt.Terminated: without a handler the process died
    at once, and a run with --memory lost this run's answers. A SIGTERM the caller chose to ignore stays
    ignored; and the handler is given back after, so that a test runner that invokes commands keeps its own."""
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            return signal.signal(signal.SIGTERM, interrupt.on_sigterm)
    except ValueError:  # not the main thread: signals are the main thread's
        pass
    return None


def _give_back_sigterm(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def _usage_message(exc: click_errors.UsageError) -> str:
    command = exc.ctx.command_path if exc.ctx else "specdec"
    message = exc.format_message().rstrip(".")
    return f"{message} (see `{command} --help`)"


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_after_broken_pipe()


def _quiet_after_broken_pipe() -> int:
    """`specdec ... | head -c 10`: the reader left, which is its right; no traceback, no error, exit 0.

    stdout is pointed at /dev/null so that the interpreter's last flush cannot fail again."""
    _stdout_to_devnull()
    return 0


def _stdout_to_devnull() -> None:
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test runner's buffer)
        pass


class StdoutFailed(Exception):
    """A write to stdout failed (a full disk, a file too large): not an OSError, so that no handler
    of a file's OSError below takes it for its own file."""


class _GuardedStdout:
    """sys.stdout, with its failed writes told apart from every other OSError; a reader that left
    (a broken pipe) stays a BrokenPipeError, which ends the command quietly."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        return self._guarded(self._stream.write, text)

    def flush(self):
        return self._guarded(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)

    @staticmethod
    def _guarded(call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise
            raise StdoutFailed(exc.strerror or str(exc)) from None


app = typer.Typer(
    name="specdec",
    cls=SpecdecGroup,
    help="Lossless speculative decoding: a draft proposes, the target decides, the output stays the target's.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: paragraphs as written, flags without a <bool>
    context_settings={"max_content_width": 120, "help_option_names": ["-h", "--help"]},
)


def _print_version(wanted: bool) -> None:
    """`specdec --version`, answered from the installed distribution's metadata before torch loads."""
    if wanted:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"specdec {version('specdec')}")
        except PackageNotFoundError:
            typer.echo("specdec (version unknown: the distribution is not installed)")
        raise typer.Exit()


@app.callback()
def _root(show_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                            help="Print specdec's version and exit.")) -> None:
    notices.render(info=_notice_line, warning=warning_line)


def _notice_line(message: str) -> None:
    """`specdec: MESSAGE` on stderr: what the core is doing that takes a while (notices.py)."""
    print(f"specdec: {message}", file=sys.stderr, flush=True)


app.command(short_help="Generate with speculative decoding and a live view of acceptance.")(generate)
app.command(short_help="List the pairs in models.yaml and whether each runs offline.")(models)
app.command("verify-equivalence", short_help="Prove that speculation gives the target's own tokens.")(verify_equivalence)
app.command("bench", short_help="Speed, acceptance and latency per mode against plain decoding.")(bench_command)
app.command("calibrate-k", short_help="Measure every K on your prompts and pick K per scenario.")(calibrate_k)
app.command("predict", short_help="Will speculation pay here? Predicted speed-up and break-even acceptance per K, in under a minute.")(predict_command)
app.command("watch", short_help="A running server's acceptance, latency and load, live.")(watch)
app.command("train-draft", short_help="Distil a drafter (a small model or a head) from the target.")(train_draft)
app.command("export", short_help="The calibrated K as a serving engine's config (vLLM, SGLang, llama.cpp, transformers).")(export)
app.command("export-head", short_help="A trained draft head in the EAGLE-3 layout vLLM loads.")(export_head_command)


def main() -> None:
    """The `specdec` command. One that loaded torch leaves without the interpreter's teardown:
    freeing torch's and transformers' modules object by object takes most of a second here, after
    the answer is out. The atexit hooks (stopping servers among them) still run first; the commands
    close their own files. The look at the machine is opened first (one reading, nothing waited for), so
    that typer's building and parsing fill the sample of a command that computes (runtime/threads.py)."""
    sys.stdout = _GuardedStdout(sys.stdout)
    try:
        threads.begin_look()
        app()
        code = 0
    except SystemExit as exit:
        code = exit.code
    except KeyboardInterrupt as stop:  # before the group's door opens (typer building the command) or after it shut
        code = _interrupted(stop)
    if "torch" not in sys.modules:
        sys.exit(code)
    if not isinstance(code, int):
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
