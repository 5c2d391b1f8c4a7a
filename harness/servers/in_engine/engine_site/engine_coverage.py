"""Line coverage of vLLM's own code in every process of an engine, for the hunt's search (harness/hunt/coverage.py
reads it). Started by sitecustomize.py when MMCHAOS_COVERAGE_DIR names a folder; runs in the engine's interpreter.

Each process (API servers, the engine core, the workers) records into a data file of its own, ``cov.<pid>``
(coverage.py's SQLite data). The harness asks for the data of a case by touching ``flush`` in the folder; each
process's watcher thread sees the new time, saves what it has measured so far and answers in ``ack.<pid>`` with
that time, so the harness knows the files are current. A forked child starts a measurement of its own. Where
coverage.py is missing, ``unavailable`` says so and nothing is measured (the hunt then searches blind).
"""

import atexit
import contextlib
import os
import threading
import time

POLL_S = 0.05  # how often each process looks at the flush file (a stat: cheap)


def start(folder):
    try:
        import coverage
        import coverage.inorout
    except ImportError as e:
        _write(os.path.join(folder, "unavailable"), f"coverage.py cannot be imported in this engine: {e}")
        return
    # coverage.py looks for the source package again whenever sys.path changes (multiprocessing's spawn changes it),
    # from its tracer, in whichever thread meets a new file, and on the way out deletes from sys.modules every module
    # that appeared meanwhile: a module another thread was importing then is gone, and that import dies of KeyError.
    # Finding a top-level package imports nothing: keep sys.modules as it is.
    if hasattr(coverage.inorout, "sys_modules_saved"):
        coverage.inorout.sys_modules_saved = contextlib.nullcontext
    state = {"cov": None}

    def begin():
        cov = coverage.Coverage(
            data_file=os.path.join(folder, f"cov.{os.getpid()}"), source_pkgs=["vllm"], config_file=False
        )
        cov.start()
        state["cov"] = cov
        threading.Thread(target=_watch, args=(folder, cov), name="mmchaos-coverage", daemon=True).start()

    def in_child():
        old = state["cov"]
        if old is not None:
            old.stop()  # the parent's measurement, inherited: this process keeps one of its own
        begin()

    begin()
    os.register_at_fork(after_in_child=in_child)
    atexit.register(lambda: _save(state["cov"], stop=True))


def _watch(folder, cov):
    flush, ack = os.path.join(folder, "flush"), os.path.join(folder, f"ack.{os.getpid()}")
    seen = None
    while True:
        time.sleep(POLL_S)
        try:
            asked = os.stat(flush).st_mtime_ns
        except OSError:
            continue
        if asked != seen:
            seen = asked
            _save(cov)
            _write(ack, str(asked))


def _save(cov, stop=False):
    if cov is None:
        return
    try:
        if stop:
            cov.stop()
        cov.save()
    except Exception:  # never harm the server for the measurement's sake
        pass


def _write(path, text):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
