"""ProbeCallback on a short HF Trainer run; rank-0-only scoring; export of the series."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from probeselect.integrations import ProbeCallback, add_probe_callback, is_rank_zero, score_checkpoint_now

FAST = dict(seeds=(0, 1), audit_items=0, plots=False, device="cpu")


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, vocab: int, n: int = 16, length: int = 16):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(3, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i].clone()}


def _trainer(tmp_path, ckpt, steps=4, save_steps=2, report_to=()):
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    args = TrainingArguments(output_dir=str(tmp_path / "train"), max_steps=steps, save_steps=save_steps,
                             save_strategy="steps", per_device_train_batch_size=4, logging_steps=1, report_to=list(report_to),
                             use_cpu=True, disable_tqdm=True, save_only_model=True, seed=0)
    return Trainer(model=model, args=args, train_dataset=_Tokens(len(tok)), processing_class=tok)


@pytest.mark.parametrize("background", [False, True])
def test_callback_scores_every_save_and_logs_probe_scalars(tmp_path, ladder_checkpoints, arith_spec, background):
    trainer = _trainer(tmp_path, ladder_checkpoints[-1])
    run = tmp_path / "run"
    cb = add_probe_callback(trainer, [arith_spec], run, background=background, **FAST)
    trainer.train()
    summary = pd.read_csv(run / "summary.csv")
    assert sorted(summary["checkpoint"].unique()) == ["checkpoint-2", "checkpoint-4"]
    variants = sorted(summary.loc[summary["family"] == "arith_pattern", "variant"].astype(str).unique())
    logged = [h for h in trainer.state.log_history if "probes/checkpoint_step" in h]
    assert sorted(h["probes/checkpoint_step"] for h in logged) == [2.0, 4.0]
    for h in logged:
        row = summary[(summary["step"] == h["probes/checkpoint_step"]) & (summary["family"] == "arith_pattern")]
        for v in variants:
            want = row.loc[row["variant"].astype(str) == v, "mean_margin"].item()
            assert h[f"probes/arith_pattern/{v}/margin"] == pytest.approx(want)
    if not background:  # logged inside on_save: at the checkpoint's own step
        assert [h["step"] for h in logged] == [2, 4]
    assert (run / "dynamics" / "dynamics.csv").is_file()
    assert len(cb.logged) == 2


def test_only_world_process_zero_scores(tmp_path, arith_spec, monkeypatch):
    run = tmp_path / "run"
    cb = ProbeCallback([arith_spec], run, **FAST)
    state = SimpleNamespace(is_world_process_zero=False, global_step=2, log_history=[])
    args = SimpleNamespace(output_dir=str(tmp_path / "does-not-matter"))
    cb.on_save(args, state, None)
    assert not run.exists() and cb.logged == [] and state.log_history == []
    assert score_checkpoint_now(tmp_path, "checkpoint-2", [arith_spec], run, state=state) is None
    assert not run.exists()
    assert is_rank_zero(SimpleNamespace(is_world_process_zero=True))
    monkeypatch.setenv("RANK", "1")
    assert not is_rank_zero()
    monkeypatch.setenv("RANK", "0")
    assert is_rank_zero()


def test_score_checkpoint_now_reports_a_deleted_checkpoint(tmp_path, arith_spec):
    (tmp_path / "ckpts").mkdir()
    lines = []
    assert score_checkpoint_now(tmp_path / "ckpts", "checkpoint-9", [arith_spec], tmp_path / "run",
                                echo=lines.append, **FAST) is None
    assert "checkpoint-9" in json.loads((tmp_path / "run" / "watch" / "state.json").read_text())["vanished"]
    assert "deleted before it was scored" in lines[0]


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="the tensorboard package is not installed (pip install 'probeselect[tensorboard]')")
def test_callback_probe_scalars_reach_tensorboard_via_report_to(tmp_path, ladder_checkpoints, arith_spec, monkeypatch):
    _tensorboard_read_back(tmp_path, ladder_checkpoints, arith_spec, monkeypatch, background=False)


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="the tensorboard package is not installed (pip install 'probeselect[tensorboard]')")
def test_background_results_logged_at_train_end_reach_the_open_tensorboard_writer(tmp_path, ladder_checkpoints,
                                                                                   arith_spec, monkeypatch):
    """In background mode the last checkpoint's scalars are logged in on_train_end; the callback runs before the
    TensorBoard integration closes its writer, so they land in the run's one event file (not a second writer's)."""
    events = _tensorboard_read_back(tmp_path, ladder_checkpoints, arith_spec, monkeypatch, background=True)
    assert len(events) == 1, events


def _tensorboard_read_back(tmp_path, ladder_checkpoints, arith_spec, monkeypatch, *, background):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "train" / "tb"))  # transformers 5; older: runs/
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = _trainer(tmp_path, ladder_checkpoints[-1], report_to=["tensorboard"])
    add_probe_callback(trainer, [arith_spec], tmp_path / "run", background=background, **FAST)
    trainer.train()
    summary = pd.read_csv(tmp_path / "run" / "summary.csv")
    events = sorted((tmp_path / "train").rglob("events.out.tfevents.*"))
    assert events, "report_to=tensorboard wrote no event files"
    v = str(summary.loc[summary["family"] == "arith_pattern", "variant"].iloc[0])
    margins, ckpt_steps, tags = [], [], set()
    for ev in events:  # every event file: a writer re-opened after train end would start a second file
        ea = EventAccumulator(str(ev))
        ea.Reload()
        tags |= set(ea.Tags()["scalars"])
        for pre in ("train/", ""):
            if f"{pre}probes/arith_pattern/{v}/margin" in ea.Tags()["scalars"]:
                margins += [(e.wall_time, e.step, e.value) for e in ea.Scalars(f"{pre}probes/arith_pattern/{v}/margin")]
                ckpt_steps += [(e.wall_time, e.value) for e in ea.Scalars(f"{pre}probes/checkpoint_step")]
    margins, ckpt_steps = sorted(margins), sorted(ckpt_steps)
    want = summary[(summary["family"] == "arith_pattern") & (summary["variant"].astype(str) == v)]
    assert [c for _, c in ckpt_steps] == [2, 4], (events, sorted(tags), ckpt_steps)
    assert [x for _, _, x in margins] == pytest.approx(want.sort_values("step")["mean_margin"].tolist(), rel=1e-6)
    if not background:  # scored inside on_save: logged at the checkpoint's own step
        assert [s for _, s, _ in margins] == [2, 4], margins
    return events


_TWO_RANKS = """
import json, os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
from probeselect.integrations import score_checkpoint_now
from probeselect.probes import spec_from_dict
spec = spec_from_dict({"family": "arith_pattern", "n_items": 6, "n_demos": 4})
m = score_checkpoint_now(sys.argv[1], sys.argv[2], [spec], sys.argv[3], seeds=(0, 1), audit_items=0, plots=False,
                         device="cpu", echo=lambda s: None)
open(os.path.join(sys.argv[4], f"rank{dist.get_rank()}.json"), "w").write(json.dumps(m))
dist.barrier()
dist.destroy_process_group()
"""


def test_only_rank_zero_scores_under_two_processes(tmp_path, ladder_checkpoints):
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    src = tmp_path / "ckpts"
    src.mkdir()
    ck = ladder_checkpoints[1]
    import shutil

    shutil.copytree(ck, src / ck.name)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
        procs.append(subprocess.Popen([sys.executable, "-c", _TWO_RANKS, str(src), ck.name, str(tmp_path / "run"),
                                       str(tmp_path)], env=env))
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    m0 = json.loads((tmp_path / "rank0.json").read_text())
    m1 = json.loads((tmp_path / "rank1.json").read_text())
    assert m1 is None and m0 and m0["probes/checkpoint_step"] == float(ck.name.split("-")[-1])
    log = (tmp_path / "run" / "watch" / "log.jsonl").read_text().splitlines()
    assert len(log) == 1  # scored once, by rank 0


@pytest.mark.slow
def test_toy_ladder_build_scores_each_save_and_alerts_on_the_parrot_dip_while_building(tmp_path):
    """A 400-step planted toy ladder (the curriculum of tests/toy/test_dip.py's small_planted_run:
    parrot window 201-300) built with ``on_save`` = :func:`score_checkpoint_now`: every saved
    checkpoint is scored inside the build, right after it is saved, and the parrot window's
    tmpl_mismatch dip is raised as an ``undone_gain`` (or ``deeper_dip``) alert naming the parrot window before the
    build has finished (``data_lineage.json`` is written only at the end; the planned windows
    are passed as ``lineage``). About 2-4 minutes on 2 loaded CPU cores."""
    import dataclasses
    from pathlib import Path

    from probeselect.probes import load_spec
    from probeselect.toy.curriculum import PARROT_MIXTURE, RECOVERY_MIXTURE
    from probeselect.toy.ladder import build_toy_ladder

    root = Path(__file__).resolve().parents[1]
    windows = [("base", 0, 200, None, "default"), ("parrot", 200, 300, "parrot", PARROT_MIXTURE),
               ("recovery", 300, 400, None, RECOVERY_MIXTURE)]
    cur = {"windows": [{"name": n, "start_step": a, "end_step": b, "mixture": m, "planted": p}
                       for n, a, b, p, m in windows]}
    planned = tmp_path / "planned.csv"
    planned.write_text("start_step,end_step,window,planted\n" + "".join(
        f"{a},{b},{n},{p or ''}\n" for n, a, b, p, _ in windows))
    spec = dataclasses.replace(load_spec(root / "probes" / "tmpl_mismatch.yaml"), n_items=24)
    ladder, run = tmp_path / "ladder", tmp_path / "run"
    seen: list[dict] = []

    def alerts() -> list[dict]:
        f = run / "alerts.jsonl"
        return [json.loads(x) for x in f.read_text().splitlines()] if f.is_file() else []

    def on_save(path, step):
        assert not (ladder / "data_lineage.json").exists()  # the ladder is still being built
        m = score_checkpoint_now(path.parent, path.name, [spec], run, lineage=planned, echo=print, **FAST)
        seen.append({"step": step, "metrics": m, "alerts": alerts(),
                     "later_saved": sorted(p.name for p in ladder.glob("checkpoint-*") if p.name != path.name
                                           and int(p.name.split("-")[1]) > step)})

    info = build_toy_ladder(ladder, seed=0, steps=400, save_every=50, curriculum=cur, progress=False, num_threads=1,
                            on_save=on_save)
    steps = [c.step for c in info.checkpoints]
    assert steps == list(range(50, 401, 50))
    assert [s["step"] for s in seen] == steps  # every save scored, in order, during the build
    assert all(s["later_saved"] == [] for s in seen)  # each before the next checkpoint existed
    assert [s["metrics"]["probes/checkpoint_step"] for s in seen] == [float(x) for x in steps]
    log = [json.loads(x) for x in (run / "watch" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == steps and all(r["model_work"] for r in log)  # each scored once
    parrot = [a for a in alerts() if a["kind"] in ("undone_gain", "deeper_dip") and a["family"] == "tmpl_mismatch"
              and any(w["window"] == "parrot" and w["planted"] == "parrot" for w in a["windows"])]
    assert parrot, alerts()
    first = min(parrot, key=lambda a: a["step"])
    assert 200 < first["step"] <= 350 and first["value"] < first["previous_value"] - first["threshold"]
    raised_at = next(s["step"] for s in seen if any(a["checkpoint"] == first["checkpoint"] for a in s["alerts"]))
    assert raised_at == first["step"] < steps[-1]  # raised when that checkpoint was saved, mid-build
    print(json.dumps(first, indent=1))


_TWO_RANK_TRAINER = """
import json, os, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments
from probeselect.integrations import add_probe_callback
from probeselect.probes import spec_from_dict

ckpt, out_dir, run, where = sys.argv[1:5]
tok = AutoTokenizer.from_pretrained(ckpt)
model = AutoModelForCausalLM.from_pretrained(ckpt)
g = torch.Generator().manual_seed(0)
x = torch.randint(3, len(tok), (32, 16), generator=g)
ds = [{"input_ids": r, "labels": r.clone()} for r in x]
args = TrainingArguments(output_dir=out_dir, max_steps=4, save_steps=2, save_strategy="steps",
                         per_device_train_batch_size=4, logging_steps=1, report_to=[], use_cpu=True, disable_tqdm=True,
                         save_only_model=True, seed=0, ddp_backend="gloo")
trainer = Trainer(model=model, args=args, train_dataset=ds, processing_class=tok)
spec = spec_from_dict({"family": "arith_pattern", "n_items": 6, "n_demos": 4})
cb = add_probe_callback(trainer, [spec], run, seeds=(0, 1), audit_items=0, plots=False, device="cpu")
trainer.train()
rank = int(os.environ["RANK"])
open(os.path.join(where, f"trainer_rank{rank}.json"), "w").write(json.dumps(
    {"world": trainer.args.world_size, "process_zero": trainer.is_world_process_zero(), "logged": cb.logged}))
"""


@pytest.mark.slow
def test_callback_on_a_two_process_trainer_run_scores_on_rank_zero_only(tmp_path, ladder_checkpoints):
    """A real 2-process (gloo, CPU) HF Trainer run with the callback on both ranks: each saved
    checkpoint is scored once, by world process zero (in a single-process child, so the scoring
    does not join the training's process group); rank 1 scores and logs nothing."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
        procs.append(subprocess.Popen([sys.executable, "-c", _TWO_RANK_TRAINER, str(ladder_checkpoints[-1]),
                                       str(tmp_path / "train"), str(tmp_path / "run"), str(tmp_path)], env=env))
    assert [p.wait(timeout=900) for p in procs] == [0, 0]
    r0 = json.loads((tmp_path / "trainer_rank0.json").read_text())
    r1 = json.loads((tmp_path / "trainer_rank1.json").read_text())
    assert r0["world"] == r1["world"] == 2 and r0["process_zero"] and not r1["process_zero"]
    assert [m["probes/checkpoint_step"] for m in r0["logged"]] == [2.0, 4.0] and r1["logged"] == []
    log = [json.loads(x) for x in (tmp_path / "run" / "watch" / "log.jsonl").read_text().splitlines()]
    assert [r["checkpoint"] for r in log] == ["checkpoint-2", "checkpoint-4"]  # each once, by rank 0
    summary = pd.read_csv(tmp_path / "run" / "summary.csv")
    assert sorted(summary["checkpoint"].unique()) == ["checkpoint-2", "checkpoint-4"]


def test_background_child_receives_path_arguments(tmp_path, arith_spec, monkeypatch):
    """score_kwargs such as heldout=Path(...) reach the background scoring child (as strings)."""
    import subprocess
    from pathlib import Path

    import probeselect.integrations as integ

    got = {}
    monkeypatch.setattr(subprocess, "Popen", lambda argv, env: got.setdefault("argv", argv))
    integ._spawn(str(tmp_path), "checkpoint-2", [arith_spec], tmp_path / "run", False,
                 {"heldout": Path("/data/heldout.txt"), "seeds": (0, 1)})
    cfg = json.loads(got["argv"][-1])
    assert cfg["score_kwargs"] == {"heldout": "/data/heldout.txt", "seeds": [0, 1]}
