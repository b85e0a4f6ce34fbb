"""The hardening battery: every bad input is one ``error:`` line with exit code 2, a run
folder never loses complete tables, Ctrl-C/SIGTERM leave a truthful manifest, and no code
shipped with a checkpoint ever runs.

Most cases call ``probeselect.cli.main([...])`` in process (seconds); only the signal
tests start a subprocess.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from probeselect.cli import main

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "probeselect"


def cli(capsys, *argv) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.err


def one_error_line(err: str, command: str) -> str:
    """The single ``probeselect COMMAND: error: ...`` line of ``err`` (no traceback)."""
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith(f"probeselect {command}: error: ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def ladder2(ladder_checkpoints, tmp_path_factory) -> Path:
    """A 2-checkpoint ladder (copies; read-only for the tests)."""
    root = tmp_path_factory.mktemp("ladder2")
    for ck in ladder_checkpoints[-2:]:
        shutil.copytree(ck, root / ck.name)
    return root


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("spec") / "arith.yaml"
    p.write_text("family: arith_pattern\nn_items: 4\nn_demos: 2\nvariants: [eq]\n", encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def spec_b(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("specb") / "arith_qa.yaml"
    p.write_text("family: arith_pattern\nn_items: 4\nn_demos: 2\nvariants: [qa]\n", encoding="utf-8")
    return p


def score_args(ladder, spec, out, *extra):
    return [str(a) for a in ("score", ladder, "--probes", spec, "--seeds", "0", "--audit-items", "0", "--out", out,
                             "--no-progress", *extra)]


def manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------
# Security
# ---------------------------------------------------------------------------


def _evil_checkpoint(src: Path, dest: Path, *, model_type: str) -> Path:
    shutil.copytree(src, dest)
    marker = dest / "CODE_RAN"
    (dest / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n", encoding="utf-8")
    cfg = json.loads((dest / "config.json").read_text(encoding="utf-8"))
    cfg["model_type"] = model_type
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (dest / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return dest


def test_auto_map_with_unknown_model_type_is_refused(ladder_checkpoints, spec, tmp_path, capsys):
    ck = _evil_checkpoint(ladder_checkpoints[-1], tmp_path / "checkpoint-5", model_type="evilgpt")
    rc, err = cli(capsys, *score_args(ck, spec, tmp_path / "run"))
    line = one_error_line(err, "score")
    assert rc == 2
    assert "model_type 'evilgpt' is unknown to transformers" in line and "never runs code from a checkpoint" in line
    assert not (ck / "CODE_RAN").exists()


def test_tokenizer_auto_map_is_refused(ladder_checkpoints, spec, tmp_path, capsys):
    ck = shutil.copytree(ladder_checkpoints[-1], tmp_path / "checkpoint-5")
    tc = json.loads((ck / "tokenizer_config.json").read_text(encoding="utf-8"))
    tc.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]})
    (ck / "tokenizer_config.json").write_text(json.dumps(tc), encoding="utf-8")
    rc, err = cli(capsys, *score_args(ck, spec, tmp_path / "run"))
    assert rc == 2
    assert "tokenizer_class 'EvilTokenizer' is not a transformers tokenizer" in one_error_line(err, "score")


def test_auto_map_on_known_model_type_warns_once(ladder_checkpoints, tmp_path, caplog):
    from probeselect.score import check_no_remote_code

    ck = _evil_checkpoint(ladder_checkpoints[-1], tmp_path / "ck", model_type="llama")
    with caplog.at_level("WARNING"):
        check_no_remote_code(ck)
        check_no_remote_code(ck)
    warned = [r for r in caplog.records if "ignoring auto_map" in r.getMessage()]
    assert len(warned) == 1


def test_every_from_pretrained_passes_trust_remote_code_false():
    calls = []
    for f in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_pretrained":
                kw = {k.arg: k.value for k in node.keywords}
                ok = isinstance(kw.get("trust_remote_code"), ast.Constant) and kw["trust_remote_code"].value is False
                calls.append((f"{f.name}:{node.lineno}", ok))
    assert calls, "expected from_pretrained calls in src/"
    assert all(ok for _, ok in calls), calls


def test_data_symlink_out_of_spec_folder_is_refused(tmp_path, capsys):
    (tmp_path / "data.csv").symlink_to("/etc/passwd")
    spec = tmp_path / "leak.yaml"
    spec.write_text("family: leak\ndata: data.csv\n", encoding="utf-8")
    rc, out = main(["probes", "validate", str(spec)]), capsys.readouterr().out
    assert rc == 1
    assert "is a symbolic link to /etc/passwd" in out and "does not follow data links" in out
    rc, err = cli(capsys, "probes", "show", spec)
    assert rc == 2 and "symbolic link to /etc/passwd" in one_error_line(err, "probes")
    assert "root:" not in err


def test_data_symlink_inside_spec_folder_is_followed(tmp_path):
    from probeselect.probes import load_spec

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "rows.csv").write_text(
        "prompt,task_answer,shortcut_answer\nQ: 2+2 =, 4, 5\nQ: 3+3 =, 6, 7\n", encoding="utf-8")
    (tmp_path / "data.csv").symlink_to(tmp_path / "real" / "rows.csv")
    spec = tmp_path / "ok.yaml"
    spec.write_text("family: linked_ok\ndata: data.csv\n", encoding="utf-8")
    assert load_spec(spec).family == "linked_ok"


# ---------------------------------------------------------------------------
# Never lose results; the manifest tells the truth
# ---------------------------------------------------------------------------


@pytest.fixture
def complete_run(ladder2, spec, tmp_path, capsys):
    run = tmp_path / "run"
    rc, err = cli(capsys, *score_args(ladder2, spec, run))
    assert rc == 0, err
    assert manifest(run)["status"] == "complete"
    return run


def _table_hashes(run: Path) -> dict:
    from probeselect._io import sha256_file

    return {n: sha256_file(run / n) for n in ("summary.csv", "scores.parquet", "items.jsonl")}


def test_crashed_rerun_keeps_tables_and_says_failed(complete_run, ladder2, spec, monkeypatch):
    import probeselect.score as score

    before = _table_hashes(complete_run)

    def boom(*a, **k):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(score, "load_model", boom)
    with pytest.raises(RuntimeError, match="simulated crash"):  # a bug keeps its traceback
        main(score_args(ladder2, spec, complete_run, "--seeds", "5"))
    m = manifest(complete_run)
    assert m["status"] == "failed" and "simulated crash" in m["error"]
    assert m["previous_outputs"]["status"] == "complete"
    assert _table_hashes(complete_run) == before
    assert m["previous_outputs"]["outputs"]["summary.csv"] == before["summary.csv"]


def test_load_failure_sets_failed(complete_run, ladder2, spec, monkeypatch, capsys):
    import probeselect.score as score
    from probeselect.errors import CheckpointError

    def refuse(path, *a, **k):
        raise CheckpointError(f"{path}: failed to load the model (UnpicklingError: Weights only load failed).")

    monkeypatch.setattr(score, "load_model", refuse)
    rc, err = cli(capsys, *score_args(ladder2, spec, complete_run, "--seeds", "5"))
    assert rc == 2 and "Weights only load failed" in one_error_line(err, "score")
    m = manifest(complete_run)
    assert m["status"] == "failed" and "Weights only load failed" in m["error"]
    assert (complete_run / "summary.csv").is_file() and (complete_run / "scores.parquet").is_file()


def test_interrupted_rerun_keeps_tables(complete_run, ladder2, spec, monkeypatch, capsys):
    import probeselect.score as score

    before = _table_hashes(complete_run)

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(score, "load_model", ctrl_c)
    rc, err = cli(capsys, *score_args(ladder2, spec, complete_run, "--seeds", "5"))
    assert rc == 130
    assert "probeselect score: interrupted; 0 units saved; re-run the same command to resume" in err
    assert manifest(complete_run)["status"] == "interrupted"
    assert _table_hashes(complete_run) == before


def test_new_probe_set_moves_downstream_files_aside(complete_run, ladder2, spec, spec_b, capsys):
    for name in ("shortlist.csv", "report.md"):
        (complete_run / name).write_text("old\n", encoding="utf-8")
    (complete_run / "dynamics").mkdir()
    (complete_run / "report_figures").mkdir()  # the front page's figures belong to the old report
    # Same inputs: nothing is moved.
    rc, _ = cli(capsys, *score_args(ladder2, spec, complete_run))
    assert rc == 0 and (complete_run / "shortlist.csv").is_file()
    # Different probe set: the old shortlist, report and dynamics move to superseded/.
    rc, err = cli(capsys, *score_args(ladder2, spec_b, complete_run))
    assert rc == 0
    assert not (complete_run / "shortlist.csv").exists() and not (complete_run / "dynamics").exists()
    assert not (complete_run / "report_figures").exists()
    moved = list((complete_run / "superseded").glob("*/shortlist.csv"))
    assert len(moved) == 1 and moved[0].read_text(encoding="utf-8") == "old\n"
    assert "moved the previous run's shortlist.csv" in err
    m = manifest(complete_run)
    assert m["status"] == "complete" and len(m["superseded"]) == 4 and "previous_outputs" not in m
    assert set(pd.read_parquet(complete_run / "scores.parquet")["variant"]) == {"qa"}


def test_concurrent_run_is_refused(ladder2, spec, tmp_path, capsys):
    from probeselect._io import RunLock
    from probeselect.errors import UsageError

    run = tmp_path / "run"
    run.mkdir()
    with RunLock(run, error_cls=UsageError):
        rc, err = cli(capsys, *score_args(ladder2, spec, run))
    line = one_error_line(err, "score")
    assert rc == 2 and f"another probeselect process is writing {run} (pid {os.getpid()})" in line
    assert not (run / "manifest.json").exists()


# ---------------------------------------------------------------------------
# Ctrl-C and SIGTERM (subprocess)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 130)])
def test_signal_saves_units_and_resumes(ladder2, tmp_path, sig, code, capsys):
    spec = tmp_path / "arith.yaml"
    spec.write_text("family: arith_pattern\nn_items: 48\nn_demos: 2\n", encoding="utf-8")
    run = tmp_path / "run"
    args = score_args(ladder2, spec, run, "--seeds", "0", "1", "2", "--chunk-items", "1")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    # A shell's background job inherits SIGINT ignored (and Python then keeps ignoring it);
    # give the child the default disposition, as a terminal's foreground process has.
    proc = subprocess.Popen([sys.executable, "-m", "probeselect", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline and not list((run / "cache").glob("*/*.parquet")):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    line = [ln for ln in err.splitlines() if "interrupted;" in ln]
    assert line and line[0].startswith("probeselect score: interrupted; ") and line[0].endswith(
        "units saved; re-run the same command to resume")
    saved = int(line[0].split("interrupted; ")[1].split(" ")[0])
    m = manifest(run)
    assert m["status"] == "interrupted" and m["units_saved"] == saved >= 1
    assert not (run / "summary.csv").exists()
    # Resume: the saved units are reused and reported.
    rc, err = cli(capsys, *args)
    assert rc == 0 and f"({saved} of " in err and "work units reused from cache" in err
    assert manifest(run)["units"]["from_cache"] == saved


# ---------------------------------------------------------------------------
# One-line errors, exit code 2
# ---------------------------------------------------------------------------


def test_non_utf8_spec(ladder2, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"family: arith_pattern\n# caf\xe9\n")
    rc, err = cli(capsys, *score_args(ladder2, bad, tmp_path / "run"))
    assert rc == 2 and "bad.yaml: not UTF-8 text" in one_error_line(err, "score")


def test_non_utf8_data_file(ladder2, tmp_path, capsys):
    (tmp_path / "rows.csv").write_bytes(b"prompt,task_answer,shortcut_answer\nQ: caf\xe9 =, a, b\n")
    spec = tmp_path / "user.yaml"
    spec.write_text("family: latin1_rows\ndata: rows.csv\n", encoding="utf-8")
    rc, err = cli(capsys, *score_args(ladder2, spec, tmp_path / "run"))
    assert rc == 2 and "not UTF-8 text" in one_error_line(err, "score")


def test_probes_validate_reports_every_bad_file(tmp_path, capsys):
    (tmp_path / "a.yaml").write_bytes(b"family: x\n\xff\n")
    (tmp_path / "b.yaml").write_text("family: [\n", encoding="utf-8")
    (tmp_path / "c.yaml").write_text("family: arith_pattern\nn_items: 2\n", encoding="utf-8")
    (tmp_path / "rows.csv").write_bytes(b"prompt,task_answer,shortcut_answer\n\xff =, a, b\n")
    (tmp_path / "d.yaml").write_text("family: d_rows\ndata: rows.csv\n", encoding="utf-8")
    rc = main(["probes", "validate", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1
    fails = [ln for ln in out.splitlines() if ln.startswith("FAIL")]
    assert len(fails) == 3 and sum(ln.startswith("ok") for ln in out.splitlines()) == 1
    assert "a.yaml: not UTF-8" in out and "b.yaml: invalid YAML" in out and "rows.csv" in out


def test_out_is_a_file(ladder2, spec, tmp_path, capsys):
    f = tmp_path / "taken.txt"
    f.write_text("x", encoding="utf-8")
    rc, err = cli(capsys, *score_args(ladder2, spec, f))
    assert rc == 2 and "is a file, not a folder" in one_error_line(err, "score")


def test_device_cuda_without_cuda(ladder2, spec, tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, err = cli(capsys, *score_args(ladder2, spec, tmp_path / "run", "--device", "cuda"))
    assert rc == 2 and "--device cuda: this machine or PyTorch build has no CUDA" in one_error_line(err, "score")
    rc, err = cli(capsys, *score_args(ladder2, spec, tmp_path / "run", "--device", "gpu"))
    assert rc == 2 and "not a device" in one_error_line(err, "score")


@pytest.mark.parametrize("flags, text", [(["--steps", "0"], "--steps must be a positive"),
                                         (["--steps", "-5"], "--steps must be a positive"),
                                         (["--steps", "8", "--save-every", "0"], "--save-every must be a positive"),
                                         (["--steps", "8", "--save-every", "-2"], "--save-every must be a positive")])
def test_toy_ladder_invalid_steps(tmp_path, capsys, flags, text):
    rc, err = cli(capsys, "toy-ladder", tmp_path / "lad", *flags, "--no-progress")
    assert rc == 2 and text in one_error_line(err, "toy-ladder")
    assert not (tmp_path / "lad").exists()


def test_negative_seed(ladder2, spec, tmp_path, capsys):
    rc, err = cli(capsys, *score_args(ladder2, spec, tmp_path / "run", "--seeds", "-1"))
    assert rc == 2 and "non-negative" in one_error_line(err, "score")


def test_recipe_typo_before_missing_data(ladder2, tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: t\ndata: {train: /no/such/sft.jsonl}\nbudget: {optimizer_steps: 2}\n"
        "optimizer: {lr: 1.0e-3, micro_batch_size: 2, clip: {rule: global_norm, max_nrom: 1.0}}\nseeds: [0]\n",
        encoding="utf-8")
    rc, err = cli(capsys, "pilot", "--bases", ladder2 / sorted(os.listdir(ladder2))[0], "--recipe", recipe,
                  "--out", tmp_path / "p")
    line = one_error_line(err, "pilot")
    assert rc == 2 and "max_nrom" in line and "not found" not in line


def test_recipe_transfer_typo_before_missing_data(ladder2, tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: t\ndata: {train: /no/such/sft.jsonl}\nbudget: {optimizer_steps: 2}\n"
        "optimizer: {lr: 1.0e-3, micro_batch_size: 2}\nseeds: [0]\ntransfer: {taks: x.jsonl}\n", encoding="utf-8")
    rc, err = cli(capsys, "pilot", "--bases", ladder2 / sorted(os.listdir(ladder2))[0], "--recipe", recipe,
                  "--out", tmp_path / "p")
    assert rc == 2 and "unknown key 'taks'" in one_error_line(err, "pilot")


def test_toy_ladder_out_is_a_file(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("x", encoding="utf-8")
    rc, err = cli(capsys, "toy-ladder", f, "--steps", "4")
    assert rc == 2 and "is a file" in one_error_line(err, "toy-ladder")


def test_dynamics_non_utf8_summary_names_the_file(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.csv").write_bytes(b"checkpoint,step,family,variant\n\xff,1,a,b\n")
    rc, err = cli(capsys, "dynamics", run)
    assert rc == 2 and "summary.csv: not UTF-8 text" in one_error_line(err, "dynamics")


def test_unreadable_spec(ladder2, spec, tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    p = tmp_path / "locked.yaml"
    p.write_text(spec.read_text(encoding="utf-8"), encoding="utf-8")
    p.chmod(0)
    rc, err = cli(capsys, *score_args(ladder2, p, tmp_path / "run"))
    assert rc == 2 and "Permission denied" in one_error_line(err, "score")


def test_oserror_last_resort_names_the_file(capsys, monkeypatch):
    import probeselect.cli as cli_mod

    def broken(args):
        raise PermissionError(13, "Permission denied", "/some/file")

    parser = cli_mod.build_parser()
    args = parser.parse_args(["report", "x"])
    args.func = broken
    monkeypatch.setattr(cli_mod, "build_parser", lambda: type("P", (), {"parse_args": lambda self, a: args})())
    rc = cli_mod.main(["report", "x"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == "probeselect report: error: /some/file: Permission denied"


# ---------------------------------------------------------------------------
# Overlong prompts
# ---------------------------------------------------------------------------


def test_overlong_prompt_is_an_error_by_default(ladder2, spec, tmp_path, capsys):
    rc, err = cli(capsys, *score_args(ladder2, spec, tmp_path / "run", "--max-length", "12"))
    line = one_error_line(err, "score")
    assert rc == 2 and "4 of 4 prompts do not fit the model's 12-token context" in line
    assert "--on-overflow truncate" in line
    assert manifest(tmp_path / "run")["status"] == "failed"


def test_overlong_prompt_truncate_is_recorded(ladder2, spec, tmp_path, capsys, caplog):
    run = tmp_path / "run"
    with caplog.at_level("WARNING", logger="probeselect.score"):
        rc, err = cli(capsys, *score_args(ladder2, spec, run, "--max-length", "12", "--on-overflow", "truncate"))
    assert rc == 0
    warned = [r.getMessage() for r in caplog.records if "cut from the left" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("8 of 8 scored prompts")
    scores = pd.read_parquet(run / "scores.parquet")
    assert (scores["truncated_tokens"] > 0).all()
    items = [json.loads(ln) for ln in (run / "items.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(items) == 4 and all(it["truncated_tokens"] > 0 for it in items)
    assert pd.read_csv(run / "summary.csv")["truncated_items"].tolist() == [4, 4]
    # A context that fits cuts nothing, and the column says so.
    rc, _ = cli(capsys, *score_args(ladder2, spec, tmp_path / "run2"))
    assert rc == 0 and (pd.read_parquet(tmp_path / "run2" / "scores.parquet")["truncated_tokens"] == 0).all()


# ---------------------------------------------------------------------------
# --keep-going and the summary line
# ---------------------------------------------------------------------------


def test_keep_going_skips_checkpoint_rejected_at_discovery(ladder_checkpoints, spec, tmp_path, capsys):
    lad = tmp_path / "lad"
    for ck in ladder_checkpoints[-3:]:
        shutil.copytree(ck, lad / ck.name)
    bad = lad / ladder_checkpoints[-2].name
    (bad / "config.json").write_text("{not json", encoding="utf-8")
    rc, err = cli(capsys, *score_args(lad, spec, tmp_path / "stop"))
    assert rc == 2 and "corrupt config.json" in one_error_line(err, "score")
    rc, err = cli(capsys, *score_args(lad, spec, tmp_path / "run", "--keep-going"))
    assert rc == 0
    assert "scored 2 of 3 checkpoints, 1 failed, 0 from cache" in err
    assert f"FAILED {bad.name}: " in err
    m = manifest(tmp_path / "run")
    assert m["status"] == "incomplete" and [f["checkpoint"] for f in m["failed"]] == [bad.name]
    # The re-run reuses the two scored checkpoints and still reports the failure.
    rc, err = cli(capsys, *score_args(lad, spec, tmp_path / "run", "--keep-going"))
    assert rc == 0 and "scored 0 of 3 checkpoints, 1 failed, 2 from cache" in err


# ---------------------------------------------------------------------------
# Progress bars and help text
# ---------------------------------------------------------------------------


def test_progress_bars_name_every_long_phase(ladder2, tmp_path, capsys, tiny_ladder):
    spec = tmp_path / "persona.yaml"
    spec.write_text("family: persona_qa\nn_items: 2\nn_demos: 1\nvariants: [block]\n"
                    "params: {gen_samples: 2, gen_max_new_tokens: 4}\n", encoding="utf-8")
    rc = main(["score", str(ladder2), "--probes", str(spec), "--seeds", "0", "--audit-items", "2",
               "--heldout", str(tiny_ladder / "data" / "heldout.txt"), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 0
    for phase in ("persona_qa sampling", "generative audit", "held-out NLL", "persona_qa:"):
        assert phase in err, phase
    assert "window/s" in err or "s/window" in err


def test_help_texts(capsys):
    def helptext(*argv):
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        return " ".join(capsys.readouterr().out.split())

    assert "(default 200)" in helptext("toy-ladder") and "steps/8" not in helptext("toy-ladder")
    assert "average" in helptext("run")
    conf = helptext("confirm")
    assert "RUN_DIR the scored run folder holding selection.json" in conf
    from probeselect.cli import DEVICE_HELP

    for cmd in ("score", "pilot", "confirm"):
        assert f"--device DEVICE {DEVICE_HELP}" in helptext(cmd), cmd
    assert DEVICE_HELP.split(" (default")[0] in helptext("run")
