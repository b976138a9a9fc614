"""Multi-process runs: ``snnjax.runtime.distributed.initialize``, the local launcher, a stuck process, the distributed
benchmark.

Training jobs of several processes (2 processes train as 1 does, restarts, checkpoints across process counts) are
tests/test_elastic.py's.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import jax
import numpy as np
import pytest
from conftest import COMPILE_SPEED_FLAGS
from helpers import CLUSTER_VARS, ROOT, child_env, launch_cmd

from snnjax.data.loader import Loader, process_slice
from snnjax.data.source import ArraySource
from snnjax.parallel import mesh as mesh_lib
from snnjax.runtime import distributed, launch


def write_script(tmp_path, body: str) -> pathlib.Path:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; only its parent has not reaped it yet.
    stat = pathlib.Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


@pytest.fixture
def cleanup():
    """Pids to SIGKILL at the end if still running our script (a failing test leaves no waiter behind)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline")
        if cmdline.exists() and b"script.py" in cmdline.read_bytes():
            os.kill(pid, signal.SIGKILL)


def wait_for_pids(directory: pathlib.Path, n: int, timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = sorted(directory.glob("pid*"))
        if len(files) == n and all(f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.05)
    raise AssertionError(f"only {len(list(directory.glob('pid*')))} of {n} processes started")


# A child that records its pid, says it is ready, and waits; it can ignore SIGTERM or fail.
WAITER = """
    import os, pathlib, signal, sys, time
    rank = int(os.environ["JAX_PROCESS_ID"])
    out = pathlib.Path(sys.argv[1])
    if rank in map(int, sys.argv[3].split(",")):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # As train.py does after saving its checkpoint: exit with 128 + signal.
    signal.signal(signal.SIGINT, lambda *_: ((out / f"sigint{rank}").write_text("1"), sys.exit(130)))
    (out / f"pid{rank}.tmp").write_text(str(os.getpid()))
    (out / f"pid{rank}.tmp").rename(out / f"pid{rank}")
    print("waiting\\r", end="", file=sys.stderr, flush=True)  # a line left open, as progress bars do
    if rank == int(sys.argv[2]):
        time.sleep(0.5)
        print("failing on purpose", file=sys.stderr)
        sys.stderr.write("3 2 1\\r")  # leaves the line open
        sys.exit(3)
    time.sleep(600)
"""


# -- snnjax.runtime.distributed.initialize ---------------------------------------------------------------


def test_single_process_is_a_no_op(monkeypatch):
    for name in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES, distributed.ENV_PROCESS_ID,
                 *CLUSTER_VARS):
        monkeypatch.delenv(name, raising=False)
    assert distributed.initialize() is False
    assert distributed.initialize("127.0.0.1:1234", 1, 0) is False  # a job of one process (the launcher's --nproc 1)
    assert not jax.distributed.is_initialized()
    # Any Kubernetes pod looks like a job to jax; only an Indexed Job (JOB_COMPLETION_INDEX) is one.
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # jax warns when it takes the pod for a job without the kubernetes package
        assert distributed.initialize() is False
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    # A SLURM job of one task stays a plain process, as jax alone would not (it would start a coordinator).
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "node1")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    assert distributed.initialize() is False
    assert not jax.distributed.is_initialized()


@pytest.mark.parametrize("args, env, match", [
    (("127.0.0.1:1234", 2, None), {}, "go together.*coordinator_address='127.0.0.1:1234', num_processes=2"),
    ((None, 2, None), {}, "go together"),
    ((None, None, 1), {"JAX_NUM_PROCESSES": "2"}, "go together"),
    (("127.0.0.1:1234", 2, 2), {}, "process_id=2 is not below num_processes=2"),
    (("127.0.0.1:1234", 0, 0), {}, "num_processes must be >= 1"),
    (("127.0.0.1:1234", 2, -1), {}, "process_id must be >= 0"),
    (("localhost", 2, 0), {}, "HOST:PORT"),
    (("localhost:99999", 2, 0), {}, "port must be in"),
    ((None, None, None), {"JAX_NUM_PROCESSES": "two"}, "JAX_NUM_PROCESSES='two' is not an integer"),
    (("127.0.0.1:1234", 2.0, 0), {}, "num_processes must be an integer"),
    ((None, None, None), {"SNNJAX_COLLECTIVE_TIMEOUT_S": "0"}, "collective_timeout_s must be > 0"),
    ((None, None, None), {"SNNJAX_COLLECTIVE_TIMEOUT_S": "soon"}, "not a number of seconds"),
])
def test_bad_settings_are_clear_errors(monkeypatch, args, env, match):
    for name in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES, distributed.ENV_PROCESS_ID,
                 *CLUSTER_VARS):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=match):
        distributed.initialize(*args)


def test_joining_after_jax_started_is_an_error():
    jax.devices()  # this test process computes already
    with pytest.raises(RuntimeError, match="before any JAX computation"):
        distributed.initialize("127.0.0.1:1234", 2, 0)
    with pytest.raises(RuntimeError, match="before any JAX computation"):
        distributed.initialize(local_device_count=4)
    assert not jax.distributed.is_initialized()


def test_local_device_count_sets_the_cpu_devices():
    code = ("from snnjax.runtime import distributed; import jax;"
            "assert distributed.initialize(local_device_count=3) is False;"
            "print(jax.device_count(), jax.process_count())")
    env = child_env(XLA_FLAGS="--xla_force_host_platform_device_count=8")  # the argument wins
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["3", "1"], out.stderr


def test_unreachable_coordinator_is_a_clear_error():
    address = f"127.0.0.1:{launch.free_port()}"  # nothing serves it
    code = f"from snnjax.runtime import distributed; distributed.initialize({address!r}, 2, 1, timeout_s=1)"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and time.monotonic() - t0 < 30
    assert "process 1 could not reach the coordinator" in out.stderr


# -- which rows each process reads ---------------------------------------------------------------


class HeldRows:
    """A stand-in batch sharding: this process's devices hold the given row ranges."""

    def __init__(self, *ranges):
        self.ranges = ranges

    def addressable_devices_indices_map(self, shape):
        return {i: (slice(a, b),) for i, (a, b) in enumerate(self.ranges)}


def test_process_slice_follows_the_devices_rows():
    assert process_slice(HeldRows((16, 24), (24, 32)), 64) == (1, 4)  # data axis over 4 processes
    assert process_slice(HeldRows((0, 32), (0, 32)), 32) == (0, 1)  # batch replicated (tensor across processes)
    assert process_slice(HeldRows((32, 48), (48, 64), (32, 48)), 64) == (1, 2)  # replicas within the process
    with pytest.raises(ValueError, match="not one aligned contiguous slice"):
        process_slice(HeldRows((0, 8), (16, 24)), 64)
    with pytest.raises(ValueError, match="no device"):
        process_slice(HeldRows(), 64)
    mesh = mesh_lib.make_mesh("fsdp=4,tensor=2")  # one process holds every row
    assert process_slice(mesh_lib.batch_sharding(mesh, 1), 64) == (0, 1)
    source = ArraySource(np.zeros((40, 2, 2, 1)), np.zeros(40), 10)
    loader = Loader(source, 16, batch_sharding=HeldRows((8, 12)), prefetch=0)
    assert (loader.process_index, loader.process_count, loader.local_batch_size) == (2, 4, 4)
    with pytest.raises(ValueError, match="not both"):
        Loader(source, 16, batch_sharding=HeldRows((0, 16)), process_index=0, process_count=1)
    with pytest.raises(ValueError, match=r"multiple of process_count=3.*--config.global_batch_size"):
        Loader(source, 16, process_index=0, process_count=3)


# -- the launcher --------------------------------------------------------------------------------


def test_children_get_their_rank_devices_and_prefixed_output(tmp_path):
    script = write_script(tmp_path, """
        import json, os, sys
        keys = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "XLA_FLAGS",
                "SNNJAX_COLLECTIVE_TIMEOUT_S")
        print(json.dumps({k: os.environ.get(k) for k in keys} | {"argv": sys.argv[1:]}))
        print("to stderr", file=sys.stderr)
        sys.stdout.write("bar 1\\rbar 2\\r\\n")
    """)
    out = subprocess.run(launch_cmd("--nproc", 3, "--devices-per-proc", 2, "--collective-timeout-s", 7,
                                    script, "--flag", "x y"),
                         env=child_env(XLA_FLAGS="--xla_cpu_use_thunk_runtime=true "
                                                 "--xla_force_host_platform_device_count=8"),
                         capture_output=True, timeout=60)
    stdout, stderr = out.stdout.decode(), out.stderr.decode()  # not text=True: that turns "\r" into "\n"
    assert out.returncode == 0, stderr
    seen = {}
    for line in stdout.split("\n"):
        if line.startswith("[rank ") and "{" in line:
            rank = int(line[len("[rank "):line.index("]")])
            seen[rank] = json.loads(line[line.index("{"):])
    assert sorted(seen) == [0, 1, 2]
    address = seen[0]["JAX_COORDINATOR_ADDRESS"]
    assert address.startswith("127.0.0.1:")
    # child_env put the suite's compile-speed flags in front
    added = set(COMPILE_SPEED_FLAGS.split())
    for rank, got in seen.items():
        got["XLA_FLAGS"] = " ".join(f for f in got["XLA_FLAGS"].split() if f not in added)
        assert got == {"JAX_COORDINATOR_ADDRESS": address, "JAX_NUM_PROCESSES": "3", "JAX_PROCESS_ID": str(rank),
                       "XLA_FLAGS": "--xla_cpu_use_thunk_runtime=true --xla_force_host_platform_device_count=2",
                       "SNNJAX_COLLECTIVE_TIMEOUT_S": "7.0", "argv": ["--flag", "x y"]}
        assert f"[rank {rank}] to stderr" in stderr.split("\n")
        assert f"[rank {rank}] bar 1\r[rank {rank}] bar 2\r\n" in stdout


def test_gpu_processes_split_the_visible_gpus():
    assert launch.find_gpus("auto", {"CUDA_VISIBLE_DEVICES": "3,5,6,7"}) == ["3", "5", "6", "7"]
    assert launch.find_gpus("auto", {"CUDA_VISIBLE_DEVICES": "3", "JAX_PLATFORMS": "cpu"}) == []
    assert launch.find_gpus("auto", {"CUDA_VISIBLE_DEVICES": ""}) == []
    assert launch.find_gpus("none", {"CUDA_VISIBLE_DEVICES": "0"}) == []
    assert launch.find_gpus("1,2", {}) == ["1", "2"]
    envs = launch.child_envs(2, 2, ["3", "5", "6", "7"], "127.0.0.1:1", None, {"XLA_FLAGS": "--a=1"})
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["3,5", "6,7"]
    assert all(e["XLA_FLAGS"] == "--a=1" and "JAX_PLATFORMS" not in e for e in envs)


def test_usage_errors(tmp_path, capsys):
    """Each refused command line exits 2 with its reason (the launcher's ``main``, in this process)."""
    script = write_script(tmp_path, "print('never')")
    for args, message in [(("--nproc", 0, script), "--nproc must be >= 1"),
                          ((script,), "--nproc is required"),
                          (("--nproc", 2, tmp_path / "missing.py"), "not found"),
                          (("--nproc", 2, "--gpus", "0", script), "need 2 GPUs but 1 are available"),
                          (("--nproc", 2, "--nproc-min", 3, script), "--nproc-min must be in 1..--nproc (2), got 3")]:
        try:
            code = launch.main([str(a) for a in args])
        except SystemExit as e:  # argparse's refusals
            code = e.code
        assert code == 2 and message in capsys.readouterr().err, args


def test_a_failing_rank_stops_the_others(tmp_path, cleanup):
    script = write_script(tmp_path, WAITER)
    t0 = time.monotonic()
    # Rank 1 fails; rank 2 ignores SIGTERM, so it needs the SIGKILL after the grace period.
    out = subprocess.run(launch_cmd("--nproc", 3, "--grace-s", 1, script, tmp_path, 1, 2), env=child_env(),
                         capture_output=True, timeout=60)
    took = time.monotonic() - t0
    stderr = out.stderr.decode()
    assert out.returncode == 3, stderr
    assert "[rank 1] failing on purpose\n" in stderr
    assert "[rank 1] 3 2 1\r\nlaunch: rank 1 exited with code 3; stopped the other 2 processes\n" in stderr
    assert took < 30
    pids = wait_for_pids(tmp_path, 3)
    cleanup += pids
    assert not [p for p in pids if alive(p)]


def test_signals_reach_the_children_and_the_launcher_takes_them_along(tmp_path, cleanup):
    script = write_script(tmp_path, WAITER)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # SIGINT is passed on: each child handles it and exits 0; the launcher reports the signal.
    proc = subprocess.Popen(launch_cmd("--nproc", 2, script, tmp_path / "a", -1, -1), env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = wait_for_pids(tmp_path / "a", 2)
    cleanup += pids
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "launch: stopped all 2 processes on SIGINT; each saved its checkpoint (exit code 130: resumable)" in err
    assert sorted(p.name for p in (tmp_path / "a").glob("sigint*")) == ["sigint0", "sigint1"]
    assert not [p for p in pids if alive(p)]
    # A process that cannot stop in --grace-s is killed: not 128 + signal, and the launcher names it.
    (tmp_path / "c").mkdir()
    proc = subprocess.Popen(launch_cmd("--nproc", 2, "--grace-s", 0.5, script, tmp_path / "c", -1, 1),
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cleanup += wait_for_pids(tmp_path / "c", 2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == launch.EXIT_UNSAVED, err
    assert ("launch: stopped on SIGTERM, but rank 1 was killed by SIGKILL 0.5 s after SIGTERM (--grace-s) before it "
            "saved its checkpoint (a process that saved exits with 143); exit code 125") in err
    assert "rank 0 was killed by SIGTERM without saving" in err  # the default action: no handler, no checkpoint
    # A launcher killed outright (no chance to clean up) takes its children with it.
    proc = subprocess.Popen(launch_cmd("--nproc", 2, script, tmp_path / "b", -1, "0,1"), env=child_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = wait_for_pids(tmp_path / "b", 2)
    cleanup += pids
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while [p for p in pids if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)]


# A child that reports (heartbeat) that its checkpoints take 1 s to write, and on SIGTERM takes 1 s to save.
SLOW_SAVER = """
    import json, os, pathlib, signal, sys, time
    rank, beats = int(os.environ["JAX_PROCESS_ID"]), pathlib.Path(os.environ["SNNJAX_HEARTBEAT_DIR"])
    def beat(saved):
        record = {"pid": os.getpid(), "attempt": 0, "start": 0, "step": 1, "time": time.time(), "saved": saved,
                  "save_s": 1.0}
        (beats / f"beat{rank}.tmp").write_text(json.dumps(record))
        (beats / f"beat{rank}.tmp").rename(beats / f"heartbeat{rank}.json")
    def save(signum, frame):
        time.sleep(1.0)
        beat(1)
        sys.exit(143)
    signal.signal(signal.SIGTERM, save)
    beat(None)
    (pathlib.Path(sys.argv[1]) / f"pid{rank}").write_text(str(os.getpid()))
    time.sleep(600)
"""


def test_the_grace_period_covers_the_measured_saves(tmp_path, cleanup):
    """--grace-s 0.3, but the processes report saves of 1 s: the launcher waits 0.3 + 2 x 1 s, and the job, whose
    preemption save takes 1 s, exits 143 (saved) rather than 125."""
    script = write_script(tmp_path, SLOW_SAVER)
    proc = subprocess.Popen(launch_cmd("--nproc", 2, "--grace-s", 0.3, script, tmp_path), env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cleanup += wait_for_pids(tmp_path, 2)
    time.sleep(0.6)  # the launcher reads the heartbeats every 0.25 s
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert "launch: stopped all 2 processes on SIGTERM; each saved its checkpoint of step 1 (exit code 143" in err


# -- real jobs -----------------------------------------------------------------------------------


def test_a_stuck_process_ends_the_job_within_the_collective_timeout(tmp_path):
    """Two processes (no launcher to stop them): rank 1 stops answering mid-run; both exit with errors."""
    script = write_script(tmp_path, """
        import sys, time
        from snnjax.runtime import distributed
        distributed.initialize()
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P
        mesh = jax.make_mesh((jax.device_count(),), ("x",))
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), np.ones(jax.local_device_count()))
        total = jax.jit(jnp.sum)
        print("first sum", float(total(x)), flush=True)
        if jax.process_index() == 1:
            time.sleep(600)  # alive (heartbeats go on) but never joins the next collective
        t0 = time.monotonic()
        try:
            total(x * 2).block_until_ready()
        except Exception as e:
            print(f"collective failed after {time.monotonic() - t0:.1f} s: {e}", flush=True)
            sys.exit(1)
    """)
    timeout_s = 2
    address = f"127.0.0.1:{launch.free_port()}"
    env = child_env(XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_COORDINATOR_ADDRESS=address,
                    JAX_NUM_PROCESSES="2", SNNJAX_COLLECTIVE_TIMEOUT_S=str(timeout_s))
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, script], env={**env, "JAX_PROCESS_ID": str(k)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for k in range(2)]
    try:
        outs = [p.communicate(timeout=90)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    took = time.monotonic() - t0
    assert all(p.returncode != 0 for p in procs), outs
    assert "first sum 4.0" in outs[0] and "collective failed after" in outs[0], outs[0]
    assert "Timed out" in outs[0]
    assert took < 30, f"the job took {took:.0f} s to end with a {timeout_s} s collective timeout"


def test_distributed_benchmark_runs_under_the_launcher(tmp_path):
    """2 processes x 4 devices: one record, written by rank 0, that counts both processes."""
    bench = ["--model", "mlp", "--mode", "dp", "--mesh", "data=8", "--batch-size", "8", "--T", "2", "--steps", "2",
             "--warmup", "1", "--no-phases", "--dtype", "float64", "--out", tmp_path / "dist.jsonl"]
    two = subprocess.run(launch_cmd("--nproc", 2, "--devices-per-proc", 4, "--collective-timeout-s", 60,
                                    ROOT / "snnjax" / "bench" / "distributed.py", *bench),
                         env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "dist.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["process_count"] == 2 and records[0]["device_count"] == 8
