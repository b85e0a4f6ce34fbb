"""run_pilot(jobs=N): bases trained at once in worker processes (CPU, or sharing one CUDA device), with the same
numbers as one process."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from _sft_helpers import small_recipe
from probeselect.cli import main
from probeselect.errors import UsageError
from probeselect.pilot import resolve_jobs, run_pilot

TIMING = ["seconds", "tokens_per_s"]


def _log(path):
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if "time" not in k and "second" not in k and "per_s" not in k} for r in rows]


@pytest.fixture(scope="module")
def two_pilots(tiny_ladder, ladder_checkpoints, tmp_path_factory):
    """The same 3-base pilot with jobs=1 and jobs=2 (so one worker trains two bases in turn). In the
    jobs=2 run this process never trains a base (run_base here raises), and the workers have already
    evaluated every base before SFT when this process's own pass over the bases comes."""
    from probeselect import pilot as pilot_mod

    root = tmp_path_factory.mktemp("pilot_jobs")
    recipe = small_recipe(tiny_ladder, budget={"optimizer_steps": 4}, seeds=[0, 1])
    bases = ladder_checkpoints[-3:]
    res = {1: run_pilot(bases, recipe, root / "jobs1", progress=False, device="cpu", jobs=1)}
    orig_eval = pilot_mod._evaluate_bases
    seen = []

    def evaluated_by_workers(ckpts, *a, **k):
        seen.append([(root / "jobs2" / c.name / "base" / "done.json").is_file() for c in ckpts])
        return orig_eval(ckpts, *a, **k)

    def no_training_here(self, ckpt):
        raise AssertionError(f"{ckpt.name} trained in the parent process with jobs=2")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pilot_mod, "_evaluate_bases", evaluated_by_workers)
        mp.setattr(pilot_mod._Pairs, "run_base", no_training_here)
        res[2] = run_pilot(bases, recipe, root / "jobs2", progress=False, device="cpu", jobs=2)
    assert seen == [[True, True, True]]
    return res, recipe, bases, root


def test_two_jobs_give_the_numbers_of_one(two_pilots):
    """Every output that carries a number is byte-identical (timings aside): transfer before and after SFT,
    diagnostics, per-step logs, adapters; both bases were trained (batched seeds) and recorded in base order."""
    res, recipe, bases, root = two_pilots
    one, two = res[1], res[2]
    names = [b.name for b in bases]
    assert len(names) == 3 and one.trained == two.trained == [(n, s) for n in names for s in (0, 1)]
    a, b = root / "jobs1", root / "jobs2"
    for f in ("transfer.csv", "transfer_base.csv"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    pd.testing.assert_frame_equal(one.transfer_items, two.transfer_items)
    da, db = (pd.read_csv(x / "diagnostics.csv").drop(columns=TIMING) for x in (a, b))
    pd.testing.assert_frame_equal(da, db)
    for n in names:
        for s in (0, 1):
            run_a, run_b = a / n / f"seed{s}", b / n / f"seed{s}"
            assert (run_a / "adapter" / "adapter_model.safetensors").read_bytes() == \
                (run_b / "adapter" / "adapter_model.safetensors").read_bytes()
            assert _log(run_a / "train_log.jsonl") == _log(run_b / "train_log.jsonl")
    ma, mb = (json.loads((x / "manifest.json").read_text()) for x in (a, b))
    assert "jobs" not in ma and mb["jobs"] == 2 and ma["batch_seeds"] == mb["batch_seeds"]
    assert all(v["batched"] for v in mb["batch_seeds"]["bases"].values())
    assert mb["status"] == "complete"


def test_workers_come_from_the_server_by_default_and_spawn_gives_the_same_numbers(two_pilots, tmp_path,
                                                                                     monkeypatch):
    """By default (Linux) the workers are forked from the forkserver, which the jobs=2 pilot above
    started; PROBESELECT_MP_START=spawn (fresh interpreters) gives byte-identical outputs."""
    from multiprocessing import forkserver

    from probeselect.pilot import worker_context

    res, recipe, bases, root = two_pilots
    monkeypatch.delenv("PROBESELECT_MP_START", raising=False)
    assert worker_context().get_start_method() == "forkserver"
    assert forkserver._forkserver._forkserver_pid is not None  # started by the pilot: its workers came from it
    monkeypatch.setenv("PROBESELECT_MP_START", "spawn")
    assert worker_context().get_start_method() == "spawn"
    spawned = run_pilot(bases[-2:], recipe, tmp_path / "spawned", progress=False, device="cpu", jobs=2)
    assert spawned.trained == [(b.name, s) for b in bases[-2:] for s in (0, 1)]
    names = [b.name for b in bases[-2:]]
    want = pd.read_csv(root / "jobs1" / "transfer.csv")
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "spawned" / "transfer.csv"),
                                  want[want["base"].isin(names)].reset_index(drop=True))
    for n in names:
        for s in (0, 1):
            assert (root / "jobs1" / n / f"seed{s}" / "adapter" / "adapter_model.safetensors").read_bytes() == \
                (tmp_path / "spawned" / n / f"seed{s}" / "adapter" / "adapter_model.safetensors").read_bytes()


@pytest.mark.parametrize("value, match", [("fork", "forkserver, spawn"), ("thread", "forkserver, spawn")])
def test_a_bad_start_method_is_refused_before_anything_is_written(value, match, two_pilots, tmp_path, monkeypatch):
    res, recipe, bases, root = two_pilots
    monkeypatch.setenv("PROBESELECT_MP_START", value)
    with pytest.raises(UsageError, match=f"PROBESELECT_MP_START=.*{match}"):
        run_pilot(bases[-2:], recipe, tmp_path / "p", progress=False, device="cpu", jobs=2)
    assert not (tmp_path / "p").exists()


def test_a_rerun_with_jobs_reuses_finished_pairs(two_pilots, tmp_path):
    res, recipe, bases, root = two_pilots
    copy = tmp_path / "again"
    shutil.copytree(root / "jobs1", copy)
    again = run_pilot(bases, recipe, copy, progress=False, device="cpu", jobs=2)
    assert again.trained == [] and again.reused == [(b.name, s) for b in bases for s in (0, 1)]
    assert (copy / "transfer.csv").read_bytes() == (root / "jobs1" / "transfer.csv").read_bytes()


def test_a_failing_base_is_raised_after_the_others_finish(two_pilots, tmp_path, ladder_checkpoints):
    """The worker of a base whose weights vanished after the pre-flight returns the error; the other base
    (after it in base order, so a serial loop would never have reached it) is trained and finished, and the
    pilot raises the failing base's own error with the worker's traceback as its cause."""
    from probeselect import pilot as pilot_mod
    from probeselect.errors import ProbeselectError

    res, recipe, bases, root = two_pilots
    bad = tmp_path / "gone" / ladder_checkpoints[-1].name
    shutil.copytree(ladder_checkpoints[-1], bad)
    orig = pilot_mod._run_bases_in_workers

    def remove_then_run(pairs, ckpts, jobs, threads, *, evaluate_base):
        for f in bad.glob("*.safetensors"):
            f.unlink()
        return orig(pairs, ckpts, jobs, threads, evaluate_base=evaluate_base)

    pilot_mod._run_bases_in_workers = remove_then_run
    try:
        with pytest.raises(Exception) as info:
            run_pilot([bad, ladder_checkpoints[-2]], recipe, tmp_path / "out", progress=False, device="cpu", jobs=2)
    finally:
        pilot_mod._run_bases_in_workers = orig
    msg = str(info.value)
    assert isinstance(info.value, ProbeselectError) and str(bad) in msg, msg
    assert "stopped without a result" not in msg
    cause = info.value.__cause__
    assert isinstance(cause, pilot_mod.WorkerTraceback) and "Traceback (most recent call last)" in cause.tb
    good = tmp_path / "out" / ladder_checkpoints[-2].name
    assert all((good / f"seed{s}" / "done.json").is_file() for s in (0, 1))
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert man["status"] == "failed"


@pytest.mark.parametrize("jobs, env, device, match", [
    (0, {}, "cpu", "integer >= 1"),
    ("two", {}, "cpu", "integer >= 1"),
    (True, {}, "cpu", "integer >= 1"),
    (None, {"PROBESELECT_JOBS": "-1"}, "cpu", "PROBESELECT_JOBS"),
    ("\u00b2", {}, "cpu", "integer >= 1"),
    (2, {"WORLD_SIZE": "2"}, "cpu", "DDP"),
    (2, {}, "mps", "CPU or on one CUDA device"),
])
def test_bad_jobs_are_refused_with_the_fix(jobs, env, device, match, monkeypatch):
    import torch

    from probeselect import score

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(score, "resolve_device", lambda d: torch.device(d))  # as on a machine with CUDA
    with pytest.raises(UsageError, match=match):
        resolve_jobs(jobs, device=device)


def test_jobs_defaults_and_on_step(monkeypatch):
    monkeypatch.delenv("PROBESELECT_JOBS", raising=False)
    assert resolve_jobs(None) == 1 and resolve_jobs("3", device="cpu") == 3
    monkeypatch.setenv("PROBESELECT_JOBS", "2")
    assert resolve_jobs(None, device="cpu") == 2
    monkeypatch.setenv("PROBESELECT_JOBS", " ")  # empty = unset
    assert resolve_jobs(None) == 1
    assert resolve_jobs(1, on_step=print) == 1
    with pytest.raises(UsageError, match="on_step"):
        resolve_jobs(2, device="cpu", on_step=print)


def test_jobs_share_one_cuda_device(monkeypatch):
    """Worker processes may share one CUDA device (a small model's step is host-bound there); the bench
    on a GPU (bench/gpu_check.sh part G, jobs3) checks that the outputs equal jobs=1's."""
    import torch

    from probeselect import score

    monkeypatch.delenv("PROBESELECT_JOBS", raising=False)
    monkeypatch.setattr(score, "resolve_device", lambda d: torch.device(d))  # as on a machine with CUDA
    assert resolve_jobs(3, device="cuda") == 3 and resolve_jobs("2", device="cuda:0") == 2


def test_a_worker_out_of_gpu_memory_says_to_use_fewer_jobs():
    import torch

    from probeselect import pilot as pilot_mod

    oom = pilot_mod._portable(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    with pytest.raises(UsageError, match="out of GPU memory with 3 workers.*fewer jobs") as info:
        pilot_mod._raise_worker_error(oom, "RUN/pilot", 3)
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError)
    other = pilot_mod._portable(ValueError("bad data"))
    with pytest.raises(ValueError, match="bad data") as info:
        pilot_mod._raise_worker_error(other, "RUN/pilot", 3)
    assert isinstance(info.value.__cause__, pilot_mod.WorkerTraceback)


def test_cli_refuses_bad_jobs_before_writing(ladder_checkpoints, tiny_ladder, tmp_path, capsys):
    out = tmp_path / "p"
    rc = main(["pilot", "--bases", str(ladder_checkpoints[-1]), "--recipe", "recipes/pilot.yaml", "--out", str(out),
               "--jobs", "0", "--device", "cpu"])
    assert rc == 2 and "integer >= 1" in capsys.readouterr().err and not out.exists()


_INTERRUPT_RUNNER = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from probeselect.sft import _runbook

MARKERS = Path({markers!r})
_log = _runbook.RunBook.log


def log_then_wait(self, row):  # in each worker (spawn re-imports this file as __mp_main__)
    _log(self, row)
    if row["step"] == 3 and self.run_dir.name == "seed1":  # states of step 2 and log rows 1-3 on disk
        (MARKERS / self.run_dir.parent.name).write_text(str(os.getpid()))
        time.sleep(300)


_runbook.RunBook.log = log_then_wait

if __name__ == "__main__":
    import signal

    # as in a terminal: a process started in the background of a non-interactive shell (as CI may start
    # pytest) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from _sft_helpers import small_recipe
    from probeselect.pilot import run_pilot

    recipe = small_recipe(Path({ladder!r}), budget={{"optimizer_steps": 4}}, seeds=[0, 1])
    run_pilot([Path(b) for b in {bases!r}], recipe, Path({out!r}), progress=False, device="cpu", jobs=2)
"""


def _pilot_paused_in_both_workers(tiny_ladder, bases, out, tmp_path):
    """A jobs=2 pilot of ``bases`` in a subprocess (its own process group), returned with the pids of its
    two workers once both are paused at step 3 (states of step 2 on disk)."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    markers = tmp_path / "markers"
    markers.mkdir()
    runner = tmp_path / "runner.py"  # a file, not -c: the workers' server re-imports it (and its patch)
    runner.write_text(_INTERRUPT_RUNNER.format(tests=str(Path(__file__).parent), markers=str(markers),
                                               ladder=str(tiny_ladder), bases=[str(b) for b in bases], out=str(out)))
    proc = subprocess.Popen([sys.executable, str(runner)], env=dict(os.environ, OMP_NUM_THREADS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 600
    while len(list(markers.iterdir())) < 2:
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            pytest.fail(f"the workers never reached step 3: {proc.communicate()[1][-3000:]}")
        time.sleep(0.2)
    return proc, [int(p.read_text()) for p in markers.iterdir()]


def test_ctrl_c_stops_the_workers_and_a_rerun_resumes_to_the_same_numbers(two_pilots, tiny_ladder, tmp_path):
    """Ctrl-C in a terminal (SIGINT to the whole process group) while both workers are mid-training:
    the pilot exits with its manifest saying interrupted, no worker process is left running, and a
    re-run resumes each run from its saved state to outputs byte-identical to the uninterrupted
    one-process pilot (adapters, per-step logs, transfer rows)."""
    import os
    import signal
    import time
    from pathlib import Path

    res, recipe, bases, root = two_pilots
    bases = bases[-2:]
    out = tmp_path / "cut"
    proc, workers = _pilot_paused_in_both_workers(tiny_ladder, bases, out, tmp_path)
    try:
        assert proc.pid not in workers and len(set(workers)) == 2  # two worker processes, not the parent
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-3000:]
    man = json.loads((out / "manifest.json").read_text())
    assert man["status"] == "interrupted" and "re-run the same command" in man["error"]
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{w}").exists() for w in workers):  # the parent stopped them; nothing orphaned
        assert time.monotonic() < deadline, f"worker processes {workers} still running after the pilot exited"
        time.sleep(0.2)
    for b in bases:
        for s in (0, 1):
            assert not (out / b.name / f"seed{s}" / "done.json").exists()
            assert json.loads((out / b.name / f"seed{s}" / "state" / "latest.json").read_text())["step"] == 2

    again = run_pilot(bases, recipe, out, progress=False, device="cpu", jobs=2)
    assert again.trained == [(b.name, s) for b in bases for s in (0, 1)] and again.manifest["status"] == "complete"
    ref = root / "jobs1"
    for b in bases:
        for s in (0, 1):
            run_ref, run_cut = ref / b.name / f"seed{s}", out / b.name / f"seed{s}"
            assert json.loads((run_cut / "done.json").read_text())["resumes"] == 1
            assert (run_ref / "adapter" / "adapter_model.safetensors").read_bytes() == \
                (run_cut / "adapter" / "adapter_model.safetensors").read_bytes()
            assert [r["loss"] for r in _log(run_ref / "train_log.jsonl")] == \
                [r["loss"] for r in _log(run_cut / "train_log.jsonl")]
    names = [b.name for b in bases]
    want = pd.read_csv(ref / "transfer.csv")
    want = want[want["base"].isin(names)].reset_index(drop=True)
    pd.testing.assert_frame_equal(pd.read_csv(out / "transfer.csv"), want)


_ENV_RUNNER = """
import os, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from probeselect.sft import _runbook

_log = _runbook.RunBook.log


def log_env(self, row):  # in each worker
    _log(self, row)
    Path({markers!r}, self.run_dir.parent.name).write_text(os.environ.get("PS_TEST_VALUE", "unset") + " " + os.getcwd())


_runbook.RunBook.log = log_env

if __name__ == "__main__":
    from _sft_helpers import small_recipe
    from probeselect.pilot import run_pilot, worker_context

    worker_context(start=True)  # the server starts (and imports) with the variable unset, here
    recipe = small_recipe(Path({ladder!r}), budget={{"optimizer_steps": 2}}, seeds=[0, 1])
    os.environ["PS_TEST_VALUE"] = "set-after-the-server-started"
    os.chdir({cwd!r})
    run_pilot([Path(b) for b in {bases!r}], recipe, Path({out!r}), progress=False, device="cpu", jobs=2)
"""


def test_workers_see_the_pilots_environment_and_directory_not_the_servers(two_pilots, tiny_ladder, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    res, recipe, bases, root = two_pilots
    markers, cwd = tmp_path / "markers", tmp_path / "cwd"
    markers.mkdir()
    cwd.mkdir()
    runner = tmp_path / "runner.py"
    runner.write_text(_ENV_RUNNER.format(tests=str(Path(__file__).parent), markers=str(markers), cwd=str(cwd),
                                         ladder=str(tiny_ladder), bases=[str(b) for b in bases[-2:]],
                                         out=str(tmp_path / "p")))
    env = {k: v for k, v in os.environ.items() if k != "PS_TEST_VALUE"}
    done = subprocess.run([sys.executable, str(runner)], env=dict(env, OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = {p.name: p.read_text() for p in markers.iterdir()}
    assert seen == {b.name: f"set-after-the-server-started {cwd}" for b in bases[-2:]}


def _running(pid: int) -> bool:
    from pathlib import Path

    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except (FileNotFoundError, ProcessLookupError):
        return False


def _ppid(pid: int) -> int:
    from pathlib import Path

    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_pilot_killed_with_sigkill_leaves_no_worker_or_server_behind(two_pilots, tiny_ladder, tmp_path):
    """kill -9 of the pilot process alone (as the OOM killer does) while both workers are mid-training: the
    worker server (the workers' parent) and the workers exit instead of training on into the pilot folder."""
    import contextlib
    import os
    import signal
    import time

    res, recipe, bases, root = two_pilots
    proc, workers = _pilot_paused_in_both_workers(tiny_ladder, bases[-2:], tmp_path / "killed", tmp_path)
    try:
        servers = {_ppid(w) for w in workers}
        assert proc.pid not in workers and proc.pid not in servers  # forked by the server, not by the pilot
        assert {_ppid(s) for s in servers} == {proc.pid}
        os.kill(proc.pid, signal.SIGKILL)  # the pilot only, not its process group
        proc.communicate(timeout=60)
        deadline = time.monotonic() + 30
        while any(_running(p) for p in [*workers, *servers]):
            assert time.monotonic() < deadline, f"workers {workers} / server {servers} still running"
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever of the run is left (nothing, if it passed)
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.communicate()
