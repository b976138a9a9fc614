"""Jobs of several processes, most under ``python -m snnjax.launch``: 2 processes train as 1 does (fsdp x tensor, dp,
the pipeline), stop agreement, restarts, shrinking, hang detection, checkpoints restored on another process count and
mesh, SLURM preemption.

Every job is the digits MLP in float64 on 2 processes x 4 CPU devices (FSDP across the processes, tensor
parallelism inside each) unless said otherwise; ``reference`` is the uninterrupted job: the interrupted ones must
reproduce it bitwise, 1 process x 8 devices and the other layouts to rounding. Every process compiles without XLA's
expensive optimisations (``conftest.quick_compiles``, in this process too): what is compared is what the layouts,
restarts and checkpoints do, not XLA's optimised code.
"""
import json
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import QUICK_COMPILES_ENV
from helpers import ROOT, child_env, launch_cmd

from snnjax.runtime import launch
from snnjax.train import config as config_lib
from snnjax.train import train_and_evaluate
from snnjax.train.checkpoint import complete_steps

STEPS = 60  # long enough that a signal sent once the step has compiled lands mid-run on a fast machine
JOB = {"dtype": "float64", "num_steps": STEPS, "eval_every_steps": 1000, "checkpoint_every_steps": 20,
       "keep_checkpoints": 100, "schedule": "constant",  # a leg that ends early (num_steps) has the same rates
       "parallel.mode": "fsdp_tp", "parallel.mesh": "fsdp=-1,tensor=2"}


def overrides(**changes) -> list[str]:
    """``--config.KEY=VALUE`` flags of ``JOB`` with ``changes`` (dotted keys)."""
    return [f"--config.{k}={v}" for k, v in {**JOB, **changes}.items()]


def train_args(**changes) -> list:
    """train.py's arguments for ``JOB`` with ``changes``."""
    return ["--config", ROOT / "configs" / "digits.py", *overrides(**changes)]


TRAIN = train_args()
QUIET = train_args(log_every_steps=100000)  # no logging step for the processes to agree at
TWO = ["--nproc", 2, "--devices-per-proc", 4]

pytestmark = pytest.mark.usefixtures("quick_compiles_module")


def job_env(**extra) -> dict[str, str]:
    """``child_env`` of a job's process, compiling as this process does (``QUICK_COMPILES_ENV``)."""
    return child_env(**QUICK_COMPILES_ENV, **extra)


def arrays(workdir: pathlib.Path, step: int | None = None) -> dict[str, np.ndarray]:
    """The arrays of checkpoint ``step`` (default: the final one) as numpy (restorable whatever devices saved them)."""
    checkpoints = workdir / "checkpoints"
    if step is None:
        step = max(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
    path = checkpoints / str(step) / "state"
    checkpointer = ocp.PyTreeCheckpointer()
    metadata = checkpointer.metadata(path)
    metadata = getattr(metadata, "item_metadata", metadata)
    metadata = getattr(metadata, "tree", metadata)
    restored = checkpointer.restore(path, restore_args=jax.tree.map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata))
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(restored)[0]}


def metrics(workdir: pathlib.Path) -> tuple[list[float], dict[str, float]]:
    """Every logged training loss, and the last evaluation."""
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["train_loss"] for r in rows if "train_loss" in r], [r for r in rows if "eval_loss" in r][-1]


def digits_config(flags: list[str]):
    """``configs/digits.py`` with ``--config.KEY=VALUE`` flags applied, as train.py applies them."""
    return config_lib.load(ROOT / "configs" / "digits.py", flags)


def train_one_process(workdir: pathlib.Path, flags: list[str]) -> None:
    """train.py's run of ``configs/digits.py`` with ``flags`` as 1 process x 8 devices: in this process (float64
    under the ``x64`` fixture)."""
    c = digits_config(flags)
    assert c.dtype != "float64" or jax.config.read("jax_enable_x64")
    train_and_evaluate(c, workdir)


def start(tmp_path, name: str, *launcher_args, train=TRAIN, script=ROOT / "train.py") -> subprocess.Popen:
    """The launcher on ``train.py`` in workdir ``tmp_path/name``; its output goes to ``tmp_path/name.out``."""
    out = open(tmp_path / f"{name}.out", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(launch_cmd(*launcher_args, script, *train, "--workdir", tmp_path / name),
                            env=job_env(), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, tmp_path, name: str, timeout: float = 300) -> tuple[int, str]:
    try:
        proc.wait(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, (tmp_path / f"{name}.out").read_text()


def wait_for(predicate, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def rank_pid(launcher: subprocess.Popen, rank: int) -> int:
    """The pid of the launcher's child of rank ``rank`` (its JAX_PROCESS_ID)."""
    return wait_for(lambda: launch.running_ranks(launcher.pid).get(rank), f"rank {rank}'s process")


def assert_bitwise(got: dict, want: dict) -> None:
    assert got.keys() == want.keys() and any("params" in k for k in want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and np.array_equal(got[key], value), key


def losses(workdir: pathlib.Path) -> dict[int, float]:
    """Each step's logged loss (the last record of a step: a restarted job logs the steps after its checkpoint
    again)."""
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train_loss"] for r in rows if "train_loss" in r}


def assert_close(got: dict, want: dict) -> None:
    """Equal to rounding (float64): another layout sums in another order."""
    assert got.keys() == want.keys() and any("params" in k for k in want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype, key
        if np.issubdtype(value.dtype, np.floating):
            scale = max(float(np.max(np.abs(value))), 1e-300)
            assert np.max(np.abs(got[key] - value)) <= 1e-12 * scale, key
        else:  # step counts
            np.testing.assert_array_equal(got[key], value, err_msg=key)


class Reference(NamedTuple):
    out: str  # the launcher's output
    workdir: pathlib.Path
    params: dict[str, np.ndarray]  # the final checkpoint's arrays


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Reference:
    """The uninterrupted job, every step's loss logged."""
    tmp_path = tmp_path_factory.mktemp("reference")
    code, out = finish(start(tmp_path, "run", *TWO, train=train_args(log_every_steps=1)), tmp_path, "run")
    assert code == 0, out[-3000:]
    return Reference(out, tmp_path / "run", arrays(tmp_path / "run"))


def test_two_processes_train_as_one(tmp_path, reference, x64):
    """2 processes x 4 devices (fsdp=4 over both, tensor=2 within each) match 1 process x 8 (here, in-process) in
    float64: every step's loss, the evaluation and the final parameters and optimizer state."""
    assert "[rank 0] done: eval_accuracy" in reference.out and "[rank 1] done:" not in reference.out  # rank 0 reports
    assert "fsdp=4 x tensor=2" in reference.out
    train_one_process(tmp_path / "one", overrides(log_every_steps=1))

    losses_one, eval_one = metrics(tmp_path / "one")
    losses_two, eval_two = metrics(reference.workdir)
    assert len(losses_one) == len(losses_two) == STEPS
    np.testing.assert_allclose(losses_two, losses_one, rtol=1e-12, atol=0)
    # The test set (359 examples) ends in a padded, masked batch that each process reads its half of.
    assert eval_two["eval_accuracy"] == eval_one["eval_accuracy"]
    np.testing.assert_allclose(eval_two["eval_loss"], eval_one["eval_loss"], rtol=1e-12, atol=0)
    params_one = arrays(tmp_path / "one")
    assert all(v.dtype == np.float64 for v in params_one.values() if np.issubdtype(v.dtype, np.floating))
    assert_close(reference.params, params_one)


def test_checkpoint_restores_on_another_process_count_and_mesh(tmp_path, reference, x64):
    """The reference's checkpoint of step 20 (2 processes, fsdp=4 x tensor=2) resumed by 1 process x 8 devices (here,
    in-process; data=2 x tensor=4) to step 40, then by 2 processes under the pipeline (stage=2 x data=4, the stages
    across the processes) to the end, follows the uninterrupted job's trajectory: the loss of every step, the final
    parameters and optimizer state."""
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference.workdir / "checkpoints" / "20", tmp_path / "run" / "checkpoints" / "20")
    train_one_process(tmp_path / "run", overrides(**{"num_steps": 40, "log_every_steps": 1, "resume": True,
                                                     "parallel.mode": "dp_tp", "parallel.mesh": "data=2,tensor=4"}))
    pp = train_args(**{"log_every_steps": 1, "resume": True, "parallel.mode": "pp", "parallel.mesh": "stage=2,data=4"})
    code, out = finish(start(tmp_path, "run", *TWO, train=pp), tmp_path, "run")
    assert code == 0 and "mode pp on data=4 x stage=2" in out and "resuming at step 40" in out, out[-3000:]
    resumed, straight = losses(tmp_path / "run"), losses(reference.workdir)
    assert sorted(resumed) == list(range(21, STEPS + 1))
    np.testing.assert_allclose([resumed[s] for s in resumed], [straight[s] for s in resumed], rtol=1e-12, atol=0)
    assert_close(arrays(tmp_path / "run"), reference.params)


def test_sigterm_saves_one_step_then_a_killed_process_restarts_the_resumed_job(tmp_path, reference):
    """SIGTERM to the launcher: every process saves the same step within the grace period and the job exits 143.
    Resumed with --max-restarts 1, the job loses rank 1 to SIGKILL after its next checkpoint and restarts from its
    latest checkpoint. The end equals the uninterrupted job bitwise."""
    proc = start(tmp_path, "run", *TWO, train=QUIET)
    wait_for(lambda: "compiled in" in (tmp_path / "run.out").read_text(), "compilation")
    time.sleep(random.uniform(0, 0.1))
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc, tmp_path, "run")
    # 143 only if every process saved and exited by itself within the grace period (10 s), else it is killed.
    assert code == 143, out[-3000:]
    step = int(re.search(r"stopped by SIGTERM after step (\d+) of", out).group(1))
    assert f"launch: stopped all 2 processes on SIGTERM; each saved its checkpoint of step {step} (exit code 143" in out
    assert complete_steps(tmp_path / "run" / "checkpoints")[-1] == step
    assert step < STEPS - 20, f"stopped at step {step}: too late to kill a process after the next checkpoint"

    proc = start(tmp_path, "run", *TWO, "--max-restarts", 1, "--grace-s", 2, train=train_args(resume=True))
    pid = rank_pid(proc, 1)
    wait_for(lambda: complete_steps(tmp_path / "run" / "checkpoints")[-1] > step, "a checkpoint after the resume")
    time.sleep(random.uniform(0, 0.1))
    os.kill(pid, signal.SIGKILL)
    code, out = finish(proc, tmp_path, "run")
    assert code == 0, out[-3000:]
    assert f"resuming at step {step}" in out
    restart = re.search(r"launch: restart 1 of 1 after rank 1 was killed by SIGKILL( at step \d+)?: 2 processes, "
                        r"resumed at step (\d+)\n", out)
    assert restart, out[-3000:]
    resumed = int(restart.group(2))
    assert resumed > step and f"resuming at step {resumed}" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["restarts"] == [{"attempt": 1, "processes": 2, "resumed_step": resumed,
                                    "cause": re.search(r"after (rank 1 [^:]*):", out).group(1)}]
    assert_bitwise(arrays(tmp_path / "run"), reference.params)


QUIET_STEPS = int(os.environ.get("SNNJAX_QUIET_STEPS", "0"))


@pytest.mark.skipif(not QUIET_STEPS, reason="by hand (about 1 min on 2 cores): SNNJAX_QUIET_STEPS=300")
def test_a_job_without_host_syncs_does_not_deadlock(tmp_path):
    """2 processes x 4 devices (dp, a tiny MLP) for QUIET_STEPS steps with no logging, evaluation or checkpoint
    before the last step: the loop's bound on steps in flight (loop.STEPS_IN_FLIGHT) keeps gloo from deadlocking,
    as it did after 36-150 steps without it."""
    never = 10 * QUIET_STEPS
    flags = ["--config", ROOT / "configs" / "digits.py", f"--config.num_steps={QUIET_STEPS}",
             f"--config.log_every_steps={never}", f"--config.checkpoint_every_steps={never}",
             f"--config.eval_every_steps={never}", "--config.model.hidden=(16,)", "--config.parallel.mode=dp"]
    code, out = finish(start(tmp_path, "run", *TWO, "--hang-timeout-s", 60, train=flags), tmp_path, "run")
    assert code == 0 and f"{QUIET_STEPS}/{QUIET_STEPS}" in out, out[-3000:]


def test_a_stopped_process_is_reported_with_its_stack_and_ended(tmp_path):
    fast = ["--config", ROOT / "configs" / "digits.py", "--config.num_steps=100000",
            "--config.eval_every_steps=1000000", "--config.checkpoint_every_steps=1000000"]
    timeout = 4
    proc = start(tmp_path, "run", "--nproc", 2, "--hang-timeout-s", timeout, "--grace-s", 1, train=fast)
    wait_for(lambda: (tmp_path / "run" / "metrics.jsonl").exists(), "the first logged step")  # both are stepping
    os.kill(rank_pid(proc, 1), signal.SIGSTOP)
    stopped = time.monotonic()
    code, out = finish(proc, tmp_path, "run")
    took = time.monotonic() - stopped
    assert code == launch.EXIT_HUNG, out[-3000:]
    assert re.search(r"launch: rank 1 made no progress (for \d+ s after step \d+|before its first step, while another "
                     rf"waited \d+ s) \(--hang-timeout-s {timeout}\); its Python stack:\n\[rank 1\] (Thread|Current "
                     r"thread)", out), out[-3000:]
    assert re.search(r'\[rank 1\]   File ".*train.py", line \d+ in <module>', out), out[-3000:]
    assert re.search(r"launch: rank 1 hung (after step \d+|before its first step); stopped the other 1 process", out)
    assert took < timeout + 10, f"the job ended {took:.1f} s after the process stopped"


WRAPPER = """
import os, runpy, sys
if int(os.environ["SNNJAX_ATTEMPT"]) >= 1 and int(os.environ["JAX_PROCESS_ID"]) >= 1:
    sys.exit("this host is gone")  # the process fails again at once when restarted
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


LOST = ["--config.dtype=float64", "--config.num_steps=60", "--config.schedule=constant",
        "--config.eval_every_steps=1000", "--config.checkpoint_every_steps=10", "--config.keep_checkpoints=100",
        "--config.log_every_steps=1", "--config.parallel.mode=dp"]


def test_a_lost_process_shrinks_the_job_along_the_elastic_axis(tmp_path, x64):
    """dp over 2 processes x 4 devices (data=8) trains as 1 process x 8 does (here, in-process; to rounding) up to its
    first checkpoint. Then rank 1 is killed, and fails again at the restart: the job goes on as 1 process x 4
    devices, the data axis halved and the global batch kept; its losses equal those of a 1-process run resumed from
    the same checkpoint."""
    (tmp_path / "wrapper.py").write_text(WRAPPER)
    train = [ROOT / "train.py", "--config", ROOT / "configs" / "digits.py", *LOST]
    proc = start(tmp_path, "run", *TWO, "--max-restarts", 2, "--nproc-min", 1, "--grace-s", 1, train=train,
                 script=tmp_path / "wrapper.py")
    pid = rank_pid(proc, 1)
    wait_for(lambda: complete_steps(tmp_path / "run" / "checkpoints"), "the first checkpoint")
    os.kill(pid, signal.SIGKILL)
    code, out = finish(proc, tmp_path, "run")
    assert code == 0, out[-3000:]
    assert re.search(r"launch: restart 1 of 2 after rank 1 was killed by SIGKILL[^:]*: 2 processes, ", out)
    assert "launch: restart 2 of 2 after rank 1 exited with code 1: 1 process, resumed at step" in out, out[-3000:]
    resumed = int(re.search(r"restart 2 of 2 .* resumed at step (\d+)", out).group(1))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["mesh"]["data"] == 4 and summary["global_batch_size"] == 64
    assert [r["processes"] for r in summary["restarts"]] == [2, 1]

    # Steps 1-10 ran in 2 processes (the restarts resumed at or after step 10).
    train_one_process(tmp_path / "one", [*LOST, "--config.num_steps=10"])
    two, one = losses(tmp_path / "run"), losses(tmp_path / "one")
    assert sorted(one) == list(range(1, 11))
    np.testing.assert_allclose([two[s] for s in one], [one[s] for s in one], rtol=1e-12, atol=0)
    assert_close(arrays(tmp_path / "run", 10), arrays(tmp_path / "one", 10))

    # The same checkpoint resumed by one process with 4 devices, no launcher.
    (tmp_path / "alone" / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "run" / "checkpoints" / str(resumed), tmp_path / "alone" / "checkpoints" / str(resumed))
    alone = subprocess.run([sys.executable, *train, "--config.resume=True", "--workdir", tmp_path / "alone"],
                           env=job_env(XLA_FLAGS="--xla_force_host_platform_device_count=4"), cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-3000:]

    shrunk, single = ({k: v for k, v in losses(w).items() if k > resumed} for w in (tmp_path / "run",
                                                                                        tmp_path / "alone"))
    assert sorted(shrunk) == sorted(single) == list(range(resumed + 1, 61))
    assert shrunk == single
    assert metrics(tmp_path / "run")[1]["eval_loss"] == metrics(tmp_path / "alone")[1]["eval_loss"]


def slurm_env(tasks: int, task: int, port: int, **extra) -> dict[str, str]:
    """What srun sets for task ``task`` of ``tasks`` on this machine (by hand: no SLURM here)."""
    return job_env(SLURM_JOB_ID="4242", SLURM_STEP_NODELIST="127.0.0.1", SLURM_NTASKS=str(tasks),
                     SLURM_PROCID=str(task), SLURM_LOCALID=str(task), JAX_COORDINATOR_PORT=str(port),
                     XLA_FLAGS="--xla_force_host_platform_device_count=4", **extra)


def test_slurm_preemption_then_requeue_on_fewer_nodes(tmp_path, reference):
    """SLURM signals every task of a preempted job: both save the same step and exit 143, the code a requeue script
    looks for; requeued on one node (SLURM_RESTART_COUNT=1), the job resumes by itself on half the devices."""
    quiet = [sys.executable, ROOT / "train.py", *QUIET, "--workdir", tmp_path / "run"]
    port = launch.free_port()
    outs = [open(tmp_path / f"task{k}.out", "w") for k in range(2)]  # noqa: SIM115 (closed below)
    tasks = [subprocess.Popen(quiet, env=slurm_env(2, k, port), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
             for k, out in enumerate(outs)]
    try:
        wait_for(lambda: "compiled in" in (tmp_path / "task0.out").read_text(), "compilation")
        for task in tasks:
            task.send_signal(signal.SIGTERM)
        codes = [task.wait(timeout=120) for task in tasks]
    finally:
        for task, out in zip(tasks, outs, strict=True):
            task.kill()
            out.close()
    text = (tmp_path / "task0.out").read_text()
    assert codes == [143, 143], text[-3000:]
    step = int(re.search(r"stopped by SIGTERM after step (\d+) of", text).group(1))
    assert complete_steps(tmp_path / "run" / "checkpoints")[-1] == step and step < STEPS

    requeued = subprocess.run(quiet, env=slurm_env(1, 0, port, SLURM_RESTART_COUNT="1"), cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    assert "fsdp=2 x tensor=2" in requeued.stdout and f"resuming at step {step}" in requeued.stdout
    assert_close(arrays(tmp_path / "run"), reference.params)  # another layout for the last steps
