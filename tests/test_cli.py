import shutil
import subprocess
import sys


def test_module_and_console_script_agree():
    mod = subprocess.run([sys.executable, "-m", "probeselect", "--help"], capture_output=True, text=True)
    script = shutil.which("probeselect", path=str(__import__("pathlib").Path(sys.executable).parent))
    assert mod.returncode == 0 and "score" in mod.stdout and "toy-ladder" in mod.stdout
    assert script, "console script not installed next to the interpreter"
    cs = subprocess.run([script, "--help"], capture_output=True, text=True)
    assert cs.returncode == 0 and cs.stdout == mod.stdout.replace("__main__.py", "probeselect")


def _subcommands(parser, path=()):
    """Every (sub)command path of the parser, read from argparse itself, so a new subcommand is
    covered without editing this test."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _subcommands(sub, (*path, name))


def test_every_subcommand_has_help(capsys):
    import pytest

    from probeselect.cli import build_parser, main

    paths = [p for p, _ in _subcommands(build_parser())]
    # the parser really is walked (these are the commands the README documents; more may exist)
    assert {("score",), ("toy-ladder",), ("probes",), ("probes", "list"), ("dynamics",), ("average",), ("shortlist",),
            ("report",), ("pilot",), ("plan",), ("plan", "lock"), ("select",), ("confirm",), ("run",)} <= set(paths)
    for path in paths:
        with pytest.raises(SystemExit) as exc:
            main([*path, "--help"])
        out = capsys.readouterr().out
        assert exc.value.code == 0, path
        assert out.startswith(f"usage: probeselect {' '.join(path)} "), (path, out[:200])
        assert "options:" in out and "-h, --help" in out, path
    # and once through the real entry point, as a user runs it
    r = subprocess.run([sys.executable, "-m", "probeselect", "run", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("usage: probeselect run ")


def _run(*args):
    return subprocess.run([sys.executable, "-m", "probeselect", *args], capture_output=True, text=True)


def test_probes_subcommands(tmp_path):
    from conftest import REPO

    r = _run("probes", "list", "--dir", str(REPO / "probes"))
    assert r.returncode == 0
    for fam in ("arith_pattern", "tmpl_repeated", "tmpl_mismatch", "tmpl_flipped", "persona_qa", "arith_plain"):
        assert fam in r.stdout
    r = _run("probes", "validate", str(REPO / "probes"))
    assert r.returncode == 0 and "0 invalid" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("family: arith_pattern\nn_demos: 1\n")
    r = _run("probes", "validate", str(bad))
    assert r.returncode == 1 and "FAIL" in r.stdout and "n_demos" in r.stdout
    r = _run("probes", "show", "arith_pattern", "--seed", "1", "-n", "2", "--variant", "eq")
    assert r.returncode == 0 and r.stdout.count("[task]") == 2 and "seed 1" in r.stdout


def test_watch_and_score_share_their_scoring_options():
    """`watch` scores with `score`'s engine: its model/scoring options are the same definitions
    (names, defaults, choices, help), from probeselect._cli_common.add_scoring_options."""
    import argparse

    from probeselect.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    opts = {}
    for cmd in ("score", "watch"):
        opts[cmd] = {a.dest: (tuple(a.option_strings), a.default, a.choices, a.help, a.type, a.nargs, a.metavar)
                     for a in sub.choices[cmd]._actions}
    shared = ("seeds", "dtype", "device", "max_batch_tokens", "heldout", "heldout_stride", "audit_items")
    for dest in shared:
        assert opts["watch"][dest] == opts["score"][dest], dest


def test_cli_sets_the_deterministic_cublas_workspace_and_keeps_a_users_value(monkeypatch):
    """cuBLAS reads CUBLAS_WORKSPACE_CONFIG when its first handle is made, so the CLI sets it (the pilot's
    value) before the command runs: the command itself sees it. A value the user set is left alone."""
    import os

    from probeselect import cli
    from probeselect.pilot import CUBLAS_WORKSPACE

    seen = []
    real = cli.build_parser

    def parser_with_a_spy():
        p = real()
        sub = next(a for a in p._actions if a.dest == "command").choices["toy-ladder"]
        sub.set_defaults(func=lambda args: seen.append(os.environ.get("CUBLAS_WORKSPACE_CONFIG")) or 0)
        return p

    monkeypatch.setattr(cli, "build_parser", parser_with_a_spy)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert cli.main(["toy-ladder", "/nonexistent/never-built"]) == 0
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert cli.main(["toy-ladder", "/nonexistent/never-built"]) == 0
    assert seen == [CUBLAS_WORKSPACE, ":16:8"]
