"""What is secret, decided once, and how every writer keeps it out of what it writes.

Secret: the value of ``--api-key`` (``--api-key X`` and ``--api-key=X``, in flags or inside a command), the values of
environment entries whose names contain KEY, TOKEN, SECRET, PASSWORD or AUTH, ``Authorization`` header values, and
the user:password part of URLs. A :class:`Redactor` knows the values of a run (the servers still receive them) and
masks them, and anything the patterns recognise, in text and in data; manifests, campaign.json, server logs,
reports, the terminal, the web UI's state and Locust's own files all go through one.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping

MASK = "***"
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|AUTH", re.IGNORECASE)
API_KEY_FLAG = "--api-key"
MIN_SECRET = 4  # shorter values are masked where they stand (flags, env), never searched for in free text
_PATTERNS = (
    re.compile(r"(?i)(\bauthorization[\"']?\s*[:=]\s*[\"']?(?:bearer|basic|token)?\s*)([^\s\"',}]+)"),
    re.compile(r"(--api-key(?:=|\s+))([^\s\"',\]]+)"),
    re.compile(r"(['\"]api_key['\"]\s*:\s*\[?\s*['\"])([^'\"]+)"),  # vLLM's "non-default args: {'api_key': [...]}"
    re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]+:)([^/\s@]+)(?=@)"),  # user:password@ in URLs
)


def flag_values(argv: Iterable[str], flag: str = API_KEY_FLAG) -> list[str]:
    """Values of ``flag`` in an argument list (``--flag a b`` takes every value up to the next option)."""
    argv, out = list(argv), []
    for i, arg in enumerate(argv):
        if arg.startswith(flag + "="):
            out.append(arg.split("=", 1)[1])
        elif arg == flag:
            for value in argv[i + 1 :]:
                if value.startswith("-"):
                    break
                out.append(value)
    return out


def split_command(command: str | None) -> list[str]:
    try:
        return shlex.split(command or "")
    except ValueError:  # an unbalanced quote: still look at its words
        return (command or "").split()


def secret_env(env: Mapping[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (env or {}).items() if SECRET_NAME.search(k) and v}


def secrets_of(argv: Iterable[str] = (), env: Mapping[str, str] | None = None, command: str | None = None) -> set[str]:
    """The secret values given to a server: its flags, its environment, its command line."""
    return {*flag_values(argv), *flag_values(split_command(command)), *secret_env(env).values()}


class Redactor:
    def __init__(self, values: Iterable[str] = ()):
        self.values = sorted({v for v in values if v and len(v) >= MIN_SECRET}, key=len, reverse=True)

    @classmethod
    def from_environment(cls, extra: Iterable[str] = ()) -> Redactor:
        """This process's secrets: its environment's secret entries (MMCHAOS_API_KEY among them), and ``extra``."""
        return cls([*secret_env(os.environ).values(), *extra])

    def with_values(self, values: Iterable[str]) -> Redactor:
        return Redactor([*self.values, *values])

    def text(self, text: str) -> str:
        for v in self.values:
            text = text.replace(v, MASK)
        for p in _PATTERNS:
            text = p.sub(lambda m: m.group(1) + MASK, text)
        return text

    __call__ = text

    def argv(self, argv: Iterable[str]) -> list[str]:
        """An argument list with the values of --api-key masked (whatever their length)."""
        out, masking = [], False
        for arg in argv:
            if arg.startswith(API_KEY_FLAG + "="):
                out.append(f"{API_KEY_FLAG}={MASK}")
                masking = False
                continue
            if masking and not arg.startswith("-"):
                out.append(MASK)
                continue
            masking = arg == API_KEY_FLAG
            out.append(self.text(arg))
        return out

    def env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        return {k: MASK if SECRET_NAME.search(k) and v else self.text(str(v)) for k, v in (env or {}).items()}

    def data(self, value):
        """Every string in nested dicts and lists, redacted (environment tables: :meth:`env`)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {k: self.data(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.data(v) for v in value]
        return value


class RedactingStream:
    """A text stream (the terminal) that redacts what is written to it."""

    def __init__(self, stream, redactor: Redactor):
        self._stream, self.redactor = stream, redactor

    def write(self, text: str) -> int:
        return self._stream.write(self.redactor.text(text))

    def __getattr__(self, name):  # isatty, fileno, flush, encoding... are the stream's
        return getattr(self._stream, name)
