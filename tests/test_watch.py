"""probeselect watch: completeness rule, exactly-once across restarts, idle exit, alerts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from probeselect.attribution import Window
from probeselect.checkpoints import fingerprint_checkpoint
from probeselect.dynamics import compute_dynamics
from probeselect.watch import Watcher, checkpoint_alerts, checkpoint_ready

FAST = dict(seeds=(0, 1), audit_items=0, report=False, plots=False, device="cpu")


def _log(run: Path) -> list[dict]:
    f = run / "watch" / "log.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.is_file() else []


def test_watch_each_checkpoint_once_across_restart_and_idle_exit(tmp_path, ladder_checkpoints, arith_spec):
    src = tmp_path / "ckpts"
    src.mkdir()
    for i in (0, 1):
        shutil.copytree(ladder_checkpoints[i], src / ladder_checkpoints[i].name)
    run = tmp_path / "run"
    lines: list[str] = []
    r1 = Watcher(src, [arith_spec], run, every=0.05, idle_exit=0.005, echo=lines.append, **FAST).run()
    names = [p.name for p in ladder_checkpoints[:3]]
    assert r1.processed == names[:2] and r1.model_scored == names[:2]
    assert r1.stop_reason.startswith("no new checkpoint")
    assert sum(ln.startswith(f"[watch] {names[0]} ") for ln in lines) == 1
    # the trainer saves a third checkpoint while the watcher is down; the restart scores only it
    shutil.copytree(ladder_checkpoints[2], src / names[2])
    r2 = Watcher(src, [arith_spec], run, every=0.05, idle_exit=0.005, echo=lines.append, **FAST).run()
    assert r2.processed == [names[2]] and r2.model_scored == [names[2]]
    r3 = Watcher(src, [arith_spec], run, every=0.05, idle_exit=0.005, echo=lines.append, **FAST).run()
    assert r3.processed == []
    log = _log(run)
    assert [r["checkpoint"] for r in log] == names  # each exactly once, in step order
    summary = pd.read_csv(run / "summary.csv")
    assert sorted(summary["checkpoint"].unique()) == sorted(names)
    assert (run / "dynamics" / "dynamics.csv").is_file()
    assert not (run / "superseded").exists()  # the watcher's own previous dynamics are not piled up
    assert all(f"probes/arith_pattern/{v}/margin" in log[-1]["metrics"]
               for v in summary.loc[summary["family"] == "arith_pattern", "variant"].unique())


_SLOW_WRITER = textwrap.dedent("""
    import os, shutil, sys, time
    from pathlib import Path
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    dst.mkdir()
    # the nasty order: the trainer marker first, then config and tokenizer, the weights last and slowly
    names = sorted(p.name for p in src.iterdir())
    first = [n for n in names if n == "trainer_state.json"] + [n for n in names if not n.endswith(".safetensors")
                                                                and n != "trainer_state.json"]
    for n in first:
        shutil.copyfile(src / n, dst / n)
    for n in [n for n in names if n.endswith(".safetensors")]:
        data = (src / n).read_bytes()
        k = 5
        with open(dst / n, "wb") as fh:
            for i in range(k):
                fh.write(data[i * len(data) // k:(i + 1) * len(data) // k])
                fh.flush(); os.fsync(fh.fileno())
                time.sleep(0.4)
    print("done", flush=True)
""")


def test_watch_never_scores_a_half_written_checkpoint(tmp_path, ladder_checkpoints, arith_spec, monkeypatch):
    import probeselect.watch as w

    src = tmp_path / "ckpts"
    src.mkdir()
    ck = ladder_checkpoints[3]
    reasons: list[str] = []
    real = w.checkpoint_ready

    def spy(path, prev):
        out = real(path, prev)
        reasons.append(out[1])
        return out

    monkeypatch.setattr(w, "checkpoint_ready", spy)
    writer = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, str(ck), str(src / ck.name)])
    try:
        res = Watcher(src, [arith_spec], tmp_path / "run", every=0.1, idle_exit=0.5, until_step=int(ck.name.split("-")[-1]),
                      **FAST).run()
    finally:
        writer.wait(timeout=60)
    assert writer.returncode == 0
    assert any(r.startswith("incomplete") for r in reasons), reasons  # it did poll the partial folder
    assert res.processed == [ck.name] and not res.failed
    log = _log(tmp_path / "run")
    assert len(log) == 1
    assert log[0]["fingerprint"] == fingerprint_checkpoint(src / ck.name)[0] == fingerprint_checkpoint(ck)[0]


def test_checkpoint_ready_rules(tmp_path, copy_ckpt):
    ck = copy_ckpt(tmp_path / "checkpoint-7", 1)
    (ck / "trainer_state.json").unlink()  # plain save_pretrained: no marker
    got, why, snap = checkpoint_ready(ck, None)
    assert got is None and why.startswith("waiting")  # first sight: not yet known to be stable
    got, why, _ = checkpoint_ready(ck, snap)
    assert got is not None and got.step == 7 and why == "complete (stable)"
    w = next(ck.glob("*.safetensors"))
    w.write_bytes(w.read_bytes()[:-100])  # a weight file still being written
    got, why, snap = checkpoint_ready(ck, None)
    got2, why2, _ = checkpoint_ready(ck, snap)
    assert got is None and got2 is None and why2.startswith("incomplete")


def test_watch_reports_checkpoint_deleted_before_scoring(tmp_path, arith_spec):
    src = tmp_path / "ckpts"
    (src / "checkpoint-5").mkdir(parents=True)
    (src / "checkpoint-5" / "config.json").write_text("{}")
    lines: list[str] = []
    wt = Watcher(src, [arith_spec], tmp_path / "run", every=0.05, echo=lines.append, **FAST)
    try:
        assert wt.poll_once().processed == []
        shutil.rmtree(src / "checkpoint-5")
        assert wt.poll_once().processed == []
    finally:
        wt.close()
    assert any("checkpoint-5: deleted before it was scored" in ln for ln in lines)
    assert "checkpoint-5" in json.loads((tmp_path / "run" / "watch" / "state.json").read_text())["vanished"]


def _hand_run(tmp_path: Path, values, *, sd=0.05, bpb=None) -> Path:
    rows = []
    for i, v in enumerate(values):
        rows.append({"checkpoint": f"checkpoint-{(i + 1) * 10}", "step": (i + 1) * 10, "family": "fam", "variant": "v",
                     "kind": "conflict", "mean_margin": v, "seed_sd": sd, "n_seeds": 4, "n_items": 10,
                     "accuracy": float(v > 0)})
        if bpb is not None:
            rows.append({"checkpoint": f"checkpoint-{(i + 1) * 10}", "step": (i + 1) * 10, "family": "heldout_nll",
                         "variant": "bpb", "kind": "nll", "bits_per_byte": bpb[i]})
    run = tmp_path / "hand"
    run.mkdir()
    pd.DataFrame(rows).to_csv(run / "summary.csv", index=False)
    return run


def test_alert_rule_is_the_dynamics_hop_rule(tmp_path):
    # rise, gain given back (a hop), wiggle within noise, recovery, second drop (second hop)
    values = [0.0, 0.6, 1.2, 0.3, 0.35, 1.1, 0.2]
    run = _hand_run(tmp_path, values, bpb=[2.0, 1.9, 1.8, 1.85, 1.7, 1.6, 1.6])
    dyn = compute_dynamics(run, plots=False)
    traj, stats = dyn.trajectories, dyn.stats
    row = stats[stats["track"] == "fam/v"].iloc[0]
    h = row["hop_threshold"]
    assert 0.1 < h < 0.5  # 3 * sqrt(2/4) * 0.05 = 0.106
    windows = [Window("parrot", 25, 40, planted="parrot"), Window("clean", 40, 100)]
    alerts = {c: checkpoint_alerts(traj, stats, c, windows=windows) for c in traj["checkpoint"].unique()}
    hop_alerts = [a for c in alerts for a in alerts[c] if a["track"] == "fam/v"]
    assert [(a["checkpoint"], a["kind"]) for a in hop_alerts] == [("checkpoint-40", "undone_gain"),
                                                                  ("checkpoint-70", "undone_gain")]
    assert len(hop_alerts) == row["hops"]  # the same count as dynamics.csv
    assert str(row["hop_turning_steps"]).split(";")[:2] == ["30", "40"]
    a = hop_alerts[0]
    assert a["threshold"] == pytest.approx(h) and a["step"] == 40 and a["previous_step"] == 30
    assert [w["window"] for w in a["windows"]] == ["parrot"]  # the data seen between step 30 and 40
    bpb = [a for c in alerts for a in alerts[c] if a["kind"] == "bpb_worse"]
    assert [a["checkpoint"] for a in bpb] == ["checkpoint-40"]
    assert [x["kind"] for x in checkpoint_alerts(traj, stats, "checkpoint-40", bpb_tolerance=0.1)] == ["undone_gain"]


def test_a_dip_that_goes_on_falling_is_alerted_again_as_deeper_dip(tmp_path):
    """A small give-back that just crosses the threshold completes the hop at checkpoint-40 (in the
    clean window); the much larger fall at checkpoint-50 extends the same leg, so the hop rule raises
    nothing there; ``deeper_dip`` does, naming the parrot window where that fall happened. A further
    move within the threshold (checkpoint-60) raises nothing."""
    values = [0.0, 0.6, 1.2, 1.05, -0.5, -0.55]
    run = _hand_run(tmp_path, values)
    dyn = compute_dynamics(run, plots=False)
    traj, stats = dyn.trajectories, dyn.stats
    h = float(stats[stats["track"] == "fam/v"].iloc[0]["hop_threshold"])
    assert 1.2 - 1.05 > h > 0.1  # the first give-back just crosses it
    windows = [Window("clean", 0, 40), Window("parrot", 40, 50, planted="parrot"), Window("late", 50, 100)]
    got = {c: [a for a in checkpoint_alerts(traj, stats, c, windows=windows) if a["track"] == "fam/v"]
           for c in traj["checkpoint"].unique()}
    assert [(c, a["kind"]) for c in got for a in got[c]] == [("checkpoint-40", "undone_gain"),
                                                             ("checkpoint-50", "deeper_dip")]
    deeper = got["checkpoint-50"][0]
    assert [w["window"] for w in deeper["windows"]] == ["parrot"] and deeper["hops"] == 1
    assert deeper["leg_change"] == pytest.approx(-0.5 - 1.2) and deeper["change"] == pytest.approx(-1.55)


def test_no_alert_for_moves_within_noise_or_monotone_learning(tmp_path):
    values = list(np.linspace(-1, 2, 8) + np.array([0, 0.05, -0.05, 0.05, 0, -0.04, 0.03, 0]))
    run = _hand_run(tmp_path, values)
    dyn = compute_dynamics(run, plots=False)
    assert all(checkpoint_alerts(dyn.trajectories, dyn.stats, c) == [] for c in dyn.trajectories["checkpoint"])


def test_on_alert_command_gets_the_alert_json(tmp_path, arith_spec):
    got = tmp_path / "got.json"
    cmd = f"{sys.executable} -c \"import json,sys; json.dump(json.load(sys.stdin), open(r'{got}', 'w'))\""
    (tmp_path / "ckpts").mkdir()
    wt = Watcher(tmp_path / "ckpts", [arith_spec], tmp_path / "run", on_alert=cmd, echo=lambda s: None, **FAST)
    alert = {"kind": "undone_gain", "track": "fam/v", "checkpoint": "checkpoint-40", "step": 40, "value": 0.3,
             "previous_value": 1.2, "threshold": 0.106, "windows": [{"window": "parrot", "start_step": 25,
                                                                     "end_step": 40, "planted": "parrot"}]}
    wt._raise(alert)
    assert json.loads(got.read_text()) == alert


def test_watch_cli_ctrl_c_then_resume_scores_each_checkpoint_once(tmp_path, ladder_checkpoints):
    import os
    import signal
    import time

    src = tmp_path / "ckpts"
    src.mkdir()
    names = [p.name for p in ladder_checkpoints[:3]]
    for p in ladder_checkpoints[:3]:
        shutil.copytree(p, src / p.name)
    spec = tmp_path / "arith.yaml"
    spec.write_text("family: arith_pattern\nn_items: 6\nn_demos: 4\n")
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "probeselect", "watch", str(src), "--probes", str(spec), "--out", str(run),
           "--seeds", "0", "1", "--every", "0.1", "--idle-exit", "0.01", "--audit-items", "0", "--no-report",
           "--device", "cpu"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    # A shell without job control (`cmd &` in a script, nohup, some CI runners) starts its children with SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler: give the child the default disposition,
    # as a terminal's Ctrl-C would find it, so that the test does not depend on how pytest was launched.
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline and not list((run / "cache").glob("*/*.parquet")):
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)  # Ctrl-C in the middle of scoring
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-2000:]
    assert "re-run the same command to resume" in err
    done_before = [r["checkpoint"] for r in _log(run)]
    p2 = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p2.returncode == 0, p2.stderr[-2000:]
    log = _log(run)
    assert sorted(r["checkpoint"] for r in log) == sorted(names)  # each exactly once across the two runs
    assert [r["checkpoint"] for r in log][: len(done_before)] == done_before
    # the work units saved before Ctrl-C were read back, not scored again
    assert json.loads((run / "manifest.json").read_text())["units"]["from_cache"] >= 1
    for n in names[len(done_before):]:
        assert f"[watch] {n} (step " in p2.stdout


def test_watch_writes_the_report_after_each_checkpoint(tmp_path, ladder_checkpoints, arith_spec):
    src = tmp_path / "ckpts"
    src.mkdir()
    shutil.copytree(ladder_checkpoints[0], src / ladder_checkpoints[0].name)
    run = tmp_path / "run"
    kw = {**FAST, "report": True}
    assert Watcher(src, [arith_spec], run, every=0.05, idle_exit=0.002, echo=lambda s: None, **kw).run().processed
    first = (run / "report.md").read_text()
    shutil.copytree(ladder_checkpoints[1], src / ladder_checkpoints[1].name)
    assert Watcher(src, [arith_spec], run, every=0.05, idle_exit=0.002, echo=lambda s: None, **kw).run().processed
    assert (run / "report.html").is_file() and (run / "report.md").read_text() != first
    assert not (run / "superseded").exists()


_SLOW_LADDER_WRITER = textwrap.dedent("""
    import os, shutil, sys, time
    from pathlib import Path
    dst_root = Path(sys.argv[1])
    jobs = [a.split("=", 2) for a in sys.argv[2:]]  # style=src=name
    def slow_weights(src, dst):
        for n in sorted(p.name for p in src.iterdir() if p.name.endswith(".safetensors")):
            data = (src / n).read_bytes()
            with open(dst / n, "wb") as fh:
                for i in range(4):
                    time.sleep(0.3)  # pauses longer than the poll interval, between chunks
                    fh.write(data[i * len(data) // 4:(i + 1) * len(data) // 4])
                    fh.flush(); os.fsync(fh.fileno())
    for style, src, name in jobs:
        src = Path(src)
        files = sorted(p.name for p in src.iterdir() if not p.name.endswith(".safetensors"))
        if style == "marker-first":  # the trainer marker first, the weights last and slowly
            dst = dst_root / name
            dst.mkdir()
            for n in ["trainer_state.json"] + [n for n in files if n != "trainer_state.json"]:
                shutil.copyfile(src / n, dst / n)
            slow_weights(src, dst)
        elif style == "plain":  # save_pretrained without a marker: config, weights slowly, then the tokenizer
            dst = dst_root / name
            dst.mkdir()
            shutil.copyfile(src / "config.json", dst / "config.json")
            slow_weights(src, dst)
            for n in files:
                if n not in ("config.json", "trainer_state.json"):
                    shutil.copyfile(src / n, dst / n)
        else:  # staged: written slowly into tmp-<name>, then renamed into place (HF Trainer, the toy ladder)
            tmp = dst_root / ("tmp-" + name)
            tmp.mkdir()
            for n in files:
                shutil.copyfile(src / n, tmp / n)
            slow_weights(src, tmp)
            os.replace(tmp, dst_root / name)
        print("wrote", name, flush=True)
""")


def test_watch_on_a_folder_written_slowly_by_another_process_scores_each_once_across_a_restart(
        tmp_path, ladder_checkpoints, arith_spec, monkeypatch):
    """Another process writes three checkpoints slowly (marker first; plain save_pretrained with
    no marker, judged by the stable rule; staged folder renamed into place) while the watcher
    runs, stops after the first (a restart in the middle of the writes) and is started again:
    each checkpoint is scored exactly once, from its complete bytes, and the partial folders were
    seen and refused."""
    import probeselect.watch as w

    src = tmp_path / "ckpts"
    src.mkdir()
    cks = ladder_checkpoints[2:5]
    styles = ["marker-first", "plain", "staged"]
    seen: list[tuple[str, str]] = []
    real = w.checkpoint_ready

    def spy(path, prev):
        out = real(path, prev)
        seen.append((Path(path).name, out[1]))
        return out

    monkeypatch.setattr(w, "checkpoint_ready", spy)
    steps = [int(c.name.split("-")[-1]) for c in cks]
    writer = subprocess.Popen([sys.executable, "-c", _SLOW_LADDER_WRITER, str(src)] +
                              [f"{s}={c}={c.name}" for s, c in zip(styles, cks)], stdout=subprocess.PIPE, text=True)
    run = tmp_path / "run"
    try:
        r1 = Watcher(src, [arith_spec], run, every=0.1, until_step=steps[0], echo=lambda s: None, **FAST).run()
        assert r1.processed == [cks[0].name]
        r2 = Watcher(src, [arith_spec], run, every=0.1, until_step=steps[-1], echo=lambda s: None, **FAST).run()
    finally:
        out, _ = writer.communicate(timeout=120)
    assert writer.returncode == 0 and out.count("wrote") == 3
    assert r2.processed == [c.name for c in cks[1:]] and not r2.failed
    r3 = Watcher(src, [arith_spec], run, every=0.05, idle_exit=0.002, echo=lambda s: None, **FAST).run()
    assert r3.processed == []
    log = _log(run)
    assert [r["checkpoint"] for r in log] == [c.name for c in cks]  # each exactly once across the restarts
    for r, c in zip(log, cks):
        assert r["fingerprint"] == fingerprint_checkpoint(src / c.name)[0] == fingerprint_checkpoint(c)[0]
    by = {c.name: [why for n, why in seen if n == c.name] for c in cks}
    assert any(x.startswith("incomplete") for x in by[cks[0].name])  # the marker alone was not trusted
    assert any(x.startswith("incomplete") for x in by[cks[1].name]) and "complete (stable)" in by[cks[1].name]
    assert all(n != "tmp-" + cks[2].name for n, _ in seen)  # the staging folder was never looked at
    assert sorted(pd.read_csv(run / "summary.csv")["checkpoint"].unique()) == sorted(c.name for c in cks)


def test_a_kill_between_the_log_line_and_the_state_leaves_one_log_line(tmp_path, ladder_checkpoints, arith_spec):
    """Killed after log.jsonl got a checkpoint's line but before state.json recorded it (and with
    a torn half line at the end of log.jsonl): the restart processes it again from the cache
    without a second line, and its next line starts on a line of its own."""
    src = tmp_path / "ckpts"
    src.mkdir()
    shutil.copytree(ladder_checkpoints[0], src / ladder_checkpoints[0].name)
    run = tmp_path / "run"
    kw = dict(every=0.05, idle_exit=0.002, echo=lambda s: None, **FAST)
    assert Watcher(src, [arith_spec], run, **kw).run().processed == [ladder_checkpoints[0].name]
    st = json.loads((run / "watch" / "state.json").read_text())
    st["processed"] = {}  # the kill came before state.json was written
    (run / "watch" / "state.json").write_text(json.dumps(st))
    with open(run / "watch" / "log.jsonl", "a") as fh:
        fh.write('{"checkpoint": "checkpoint-')  # and a torn line
    shutil.copytree(ladder_checkpoints[1], src / ladder_checkpoints[1].name)
    r = Watcher(src, [arith_spec], run, **kw).run()
    assert r.processed == [p.name for p in ladder_checkpoints[:2]] and r.model_scored == [ladder_checkpoints[1].name]
    lines = (run / "watch" / "log.jsonl").read_text().splitlines()
    assert lines[1] == '{"checkpoint": "checkpoint-'  # the torn line stays alone on its line
    assert [json.loads(x)["checkpoint"] for i, x in enumerate(lines) if i != 1] == [p.name for p in ladder_checkpoints[:2]]
