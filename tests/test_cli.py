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


def test_every_subcommand_has_help():
    for cmd in ("score", "toy-ladder", "dynamics", "average", "shortlist", "report"):
        r = subprocess.run([sys.executable, "-m", "probeselect", cmd, "--help"], capture_output=True, text=True)
        assert r.returncode == 0 and "usage: probeselect" in r.stdout
