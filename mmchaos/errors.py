"""What stops a command, said the one way every `mmchaos` command says it.

A failure the user can act on raises a subclass of :class:`MmchaosError` with one line of text (what is wrong, what
to do); the command line (`harness/cli.py`) catches the base alone, prints ``<prefix>: <message>`` and ends with the
error's exit code, never a traceback. Each room keeps its own error classes beside the code that raises them; only
their base lives here.
"""

from __future__ import annotations


def one_line(text: str) -> str:
    """An error stays one line: control characters from the user's input are shown escaped, not acted on."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


class MmchaosError(Exception):
    """One line: what is wrong, what to do; and the exit code the command ends with (2: it could not run)."""

    exit_code: int = 2
    prefix: str = "mmchaos"  # who says it: the line reads "<prefix>: <message>"

    def __init__(self, *args: object, exit_code: int | None = None) -> None:
        super().__init__(*args)
        if exit_code is not None:
            self.exit_code = exit_code

    def line(self) -> str:
        """What the user reads, in one line whatever the message holds."""
        return f"{self.prefix}: {one_line(str(self))}"
