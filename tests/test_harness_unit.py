"""Fast tests of the harness plumbing (no vLLM): CLI errors, signatures, server lifecycle on a stand-in."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from cli_inprocess import mmchaos
from conftest import TESTS, standin_server

from mmchaos.harness.servers import engines
from mmchaos.harness.servers.server import Server, ServerError, Target, tensor_parallel_size
from mmchaos.signatures import SignatureError, Signatures


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mmchaos.harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    "version,needle",
    [("bogus", "not a vLLM version"), ("0.1.0", "not supported on CPU"), ("9.9.9", "not on the package index")],
)
def test_engine_install_rejects_bad_versions_in_one_line(version, needle, tmp_path):
    r = run_cli("engine", "install", version, env={"MMCHAOS_HOME": str(tmp_path)})
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not (tmp_path / "engines" / version).exists()  # nothing half-written


def test_serve_without_installed_engine_says_how_to_install(tmp_path):
    r = mmchaos("serve", "--engine", "0.31.0", env={"MMCHAOS_HOME": str(tmp_path)})
    assert r.returncode == 2
    assert "mmchaos engine install 0.31.0" in r.stderr


def test_torchvision_guard_patch(tmp_path):
    tv = tmp_path / "torchvision"
    tv.mkdir()
    src = (
        '@torch.library.register_fake("torchvision::nms")\ndef meta_nms(): pass\n'
        '@torch.library.register_fake("torchvision::qnms")\ndef meta_qnms(): pass\n'
    )
    (tv / "_meta_registrations.py").write_text(src)
    assert engines.patch_torchvision(tmp_path)
    patched = (tv / "_meta_registrations.py").read_text()
    assert patched.count("if torchvision.extension._has_ops() else (lambda f: f))") == 2
    assert not engines.patch_torchvision(tmp_path)  # idempotent


@pytest.mark.parametrize(
    "flags,tp",
    [([], 1), (["--tensor-parallel-size", "2"], 2), (["-tp", "4"], 4), (["--tensor-parallel-size=2"], 2)],
)
def test_tensor_parallel_size(flags, tp):
    assert tensor_parallel_size(flags) == tp


def test_signatures_classify_the_report_lines():
    sigs = Signatures.load()
    log = (
        "INFO ok\n"
        "WARNING [core.py:1868] Multi-modal cache miss for request embd-1 (mm_hashes=['a9a6596b0123']): "
        "P0/P1 cache drift; returning a retryable response so the items are resent with data.\n"
        "ERROR AsyncLLM output_handler failed.\n"
        "    assert req_state.detokenizer is not None\n"
    )
    matches = sigs.scan(log)
    assert [m.signature.name for m in matches] == ["cache_drift", "output_handler_failed", "detokenizer_assert"]
    assert matches[0].mm_hash == "a9a6596b0123"
    assert sigs.classify_crash(matches) == "detokenizer_assert"
    assert sigs.classify_crash(matches[:1]) == "unknown"  # drift alone is not fatal


def test_user_signatures_extend_and_bad_files_are_rejected(tmp_path):
    good = tmp_path / "mine.toml"
    good.write_text('[[signature]]\nname = "segfault"\npattern = "Segmentation fault"\nfatal = true\nrank = 0\n')
    sigs = Signatures.load(good)
    assert sigs.classify_crash(sigs.scan("Segmentation fault\nEngineDeadError")) == "segfault"
    bad = tmp_path / "bad.toml"
    bad.write_text('[[signature]]\nname = "x"\npatern = "typo"\n')
    with pytest.raises(SignatureError, match=r"bad\.toml.*patern"):
        Signatures.load(bad)


@pytest.mark.integration
def test_launched_server_runs_in_its_own_group_and_stop_leaves_nothing(tmp_path):
    with standin_server(tmp_path / "s.log") as s:
        assert os.getpgid(s.proc.pid) == s.pgid != os.getpgid(0)
        assert s.group_pids() == [s.proc.pid]
        assert s.model_name() == "standin"
        tmpdir = s._tmpdir
    assert s.group_pids() == []
    assert not os.path.exists(tmpdir)


def test_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        cmd = f"{sys.executable} {TESTS / 'standin_server.py'} --port {{port}}"
        with pytest.raises(ServerError, match=f"port {port} .* in use"):
            Server(Target(mode="command", command=cmd), tmp_path / "s.log", port=port).start()


@pytest.mark.integration
def test_server_that_exits_during_startup_fails_fast_with_its_last_line(tmp_path):
    cmd = f"{sys.executable} -c \"print('boom: bad flag'); raise SystemExit(3)\""
    s = Server(Target(mode="command", command=cmd), tmp_path / "s.log").start()
    try:
        with pytest.raises(ServerError, match=r"exited with code 3.*boom: bad flag"):
            s.wait_healthy(30, interval=0.05)
    finally:
        s.stop()


@pytest.mark.integration
def test_a_start_that_lost_its_port_is_tried_once_more_on_another(tmp_path):
    """Two servers starting at once can take each other's ports: the first start dies of it, the second serves; the
    caller hears of both process groups, and the message of a start that dies again names the error, not the last
    warning printed on the way out."""
    first = tmp_path / "first-start"
    lost = "OSError: [Errno 98] Address already in use"
    fail_first = (
        f"import pathlib, subprocess, sys; m = pathlib.Path({str(first)!r}); "
        f"sys.exit(subprocess.call([sys.executable, {str(TESTS / 'standin_server.py')!r}, '--port', sys.argv[1]])) "
        f"if m.exists() else (m.touch(), print({lost!r}), print('warning: leaked semaphores'), sys.exit(1))"
    )
    cmd = f'{sys.executable} -c "{fail_first}" {{port}}'
    s = Server(Target(mode="command", command=cmd), tmp_path / "s.log")
    launched: list[int] = []
    s.on_start = launched.append
    s.start()
    try:
        s.wait_healthy(30, interval=0.05)
        assert s.model_name() == "standin"
    finally:
        s.stop()
    assert len(set(launched)) == 2 and "starting again" in (tmp_path / "s.log").read_text()

    always = f"import sys; print({lost!r}); print('warning: leaked semaphores'); sys.exit(1)"
    s = Server(Target(mode="command", command=f'{sys.executable} -c "{always}"'), tmp_path / "s2.log").start()
    try:
        with pytest.raises(ServerError, match=r"exited with code 1 during start-up: OSError: \[Errno 98\]"):
            s.wait_healthy(30, interval=0.05)
    finally:
        s.stop()


@pytest.mark.integration
def test_server_never_healthy_times_out_and_is_cleaned_up(tmp_path):
    cmd = f"{sys.executable} {TESTS / 'standin_server.py'} --port {{port}} --unhealthy"
    s = Server(Target(mode="command", command=cmd), tmp_path / "s.log").start()
    try:
        with pytest.raises(ServerError, match="not healthy after 2 s"):
            s.wait_healthy(2, interval=0.1)
    finally:
        s.stop()
    assert s.group_pids() == []


@pytest.mark.integration
def test_attach_to_unreachable_url_is_one_line_error():
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{port.getsockname()[1]}"
    port.close()
    r = run_cli("repro", "--url", url)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "did not answer 200" in r.stderr


PARENT = """
import os, subprocess, sys
env = dict(os.environ, PYTHONPATH=sys.argv[1])
if sys.argv[2] == "yes":
    env.update({{"{env}": str(os.getpid()), "{tmp_env}": sys.argv[3]}})
child = subprocess.Popen([sys.executable, {launcher!r}, "serve"], env=env, start_new_session=True)
print(child.pid, flush=True)
child.wait()
"""


@pytest.mark.integration
@pytest.mark.parametrize("told", ["yes", "no"])
def test_the_engine_launcher_ends_with_the_process_that_started_it(told, tmp_path):
    """A SIGKILL of mmchaos leaves it no chance to stop its server: the launcher (run by every engine server) asks
    Linux for a SIGTERM when its starter dies, if the starter says who it is, and removes the server's temp folder.
    A stand-in `vllm` CLI that waits, and takes SIGTERM as a shutdown as vLLM does."""
    from mmchaos.harness.servers.server import OWN_TMPDIR_ENV, PARENT_ENV

    fake = tmp_path / "vllm" / "entrypoints" / "cli"
    fake.mkdir(parents=True)
    for d in (fake.parent.parent, fake.parent, fake):
        (d / "__init__.py").write_text("")
    (fake / "main.py").write_text(
        "import signal, sys, time\n\ndef main():\n"
        "    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "    print('serving', flush=True)\n    time.sleep(120)\n"
    )
    own_tmp = tmp_path / "mmchaos-server-x"
    (own_tmp / "sockets").mkdir(parents=True)
    script = PARENT.format(env=PARENT_ENV, tmp_env=OWN_TMPDIR_ENV, launcher=str(engines.LAUNCHER))
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path), told, str(own_tmp)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    server = psutil.Process(int(parent.stdout.readline()))
    try:
        assert parent.stdout.readline().strip() == "serving"  # the server's own output: it is up, as mmchaos waits
        parent.kill()
        parent.wait(10)
        try:
            server.wait(10 if told == "yes" else 3)  # an orphan is seen alive for 3 s
            ended = True
        except psutil.TimeoutExpired:
            ended = False
        assert ended == (told == "yes")
        assert own_tmp.exists() == (told == "no")
    finally:
        if server.is_running():
            os.killpg(server.pid, signal.SIGKILL)  # its own group, recorded at launch


@pytest.mark.parametrize(
    "text, says",
    [
        ('[[signature]]\nname = "x"\npattern = "("\n', "bad.toml: signature x: bad pattern (missing )"),
        ('[[signature]]\nname = "x"\npattern = "a"\nfatal = "yes"\n', "signature x: 'fatal' must be true or false"),
        ('[[signature]]\nname = "x"\npattern = "a"\nrank = 1.5\n', "signature x: 'rank' must be an integer"),
        ('mm_hash_patern = "x"\n', "bad.toml: unknown key 'mm_hash_patern'; did you mean 'mm_hash_pattern'?"),
        ('request_id_pattern = "("\n', "bad.toml: request_id_pattern: bad pattern"),
        ('[[signature]]\npattern = "a"\n', "signature #1: needs name and pattern; unknown keys: []"),
    ],
)
def test_a_signature_file_is_typed_and_its_errors_are_one_line(tmp_path, text, says):
    """Each [[signature]] is a model (mmchaos/signatures.py Signature): a value of the wrong type is an error, not
    read as true (``fatal = "yes"`` was), and a misspelt key of the file is named with the closest one."""
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(SignatureError) as e:
        Signatures.load(bad)
    assert says in str(e.value) and "\n" not in str(e.value)


class _DyingServer:
    """Plays a vLLM 0.30.0 server dying of drift: /health is refused, its log gets the drift warning and the
    assert only then (read as its last words)."""

    LAST_WORDS = (
        "(EngineCore pid=1) WARNING [core.py:1868] Multi-modal cache miss for request embd-mmc-0a1b-0-1-2-0-f "
        "(mm_hashes=['6db6b0cc0495e58d']): P0/P1 cache drift\n"
        "(APIServer pid=2) AssertionError: assert req_state.detokenizer is not None\n"
    )

    def __init__(self, log_path):
        self.log_path, self.dead = log_path, False
        log_path.write_text("")

    def exit_code(self):
        return 1 if self.dead else None

    def health(self, timeout=0.5):
        self.dead = True
        with open(self.log_path, "a") as f:
            f.write(self.LAST_WORDS)
        return False, None, "connection refused"


def test_a_dying_servers_last_words_are_stamped_in_the_life_they_end(tmp_path):
    from mmchaos.harness.servers.crash_watch import CrashWatch
    from mmchaos.tables import read_table

    watch = CrashWatch(_DyingServer(tmp_path / "server.log"), tmp_path, Signatures.default())
    watch.healthy_at(time.time())
    crash = watch.check()
    watch.finish()
    assert crash is not None and crash.chain == "cache_drift → detokenizer_assert"
    events = read_table(tmp_path, "log_events").to_pandas()
    assert list(events["signature"]) == ["cache_drift", "detokenizer_assert"]
    # read after the crash was detected, but written before: a restart's life must not take them
    assert (events["t"] <= crash.t_detected).all(), (events["t"] - crash.t_detected).tolist()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the loss, as Python reports it
def test_a_sigterm_whose_interrupt_a_callback_swallowed_is_still_a_stop():
    """A KeyboardInterrupt raised inside a garbage collector's callback or a __del__ is printed and lost, and the
    command would go on as if never asked to stop; the request is remembered, and check() raises it where raising
    is safe."""
    from mmchaos.harness.servers import sigterm

    class Swallows:
        def __del__(self):
            sigterm._interrupt()  # the handler, run where Python ignores what it raises

    sigterm.check()  # nothing asked yet: nothing raised
    try:
        Swallows()  # collected at once: its __del__ runs the handler, whose KeyboardInterrupt is lost
        with pytest.raises(KeyboardInterrupt):
            sigterm.check()
    finally:
        sigterm._asked = False
