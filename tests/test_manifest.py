"""probeselect.manifest: the machine facts a run's manifest records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from probeselect.manifest import base_manifest, cpu_info


def test_base_manifest_records_the_cpu_model_and_torchs_instruction_set():
    import torch

    man = base_manifest("test", {})
    assert man["cpu"] == cpu_info()
    assert set(man["cpu"]) == {"model", "torch_cpu_capability"}
    if Path("/proc/cpuinfo").exists():
        assert man["cpu"]["model"]  # the processor's name, read from /proc/cpuinfo
    # torch is loaded here, so the vector instruction set its CPU kernels dispatch to is named
    assert man["cpu"]["torch_cpu_capability"] == str(torch.backends.cpu.get_cpu_capability())
    json.dumps(man)  # plain JSON


def test_cpu_info_does_not_import_torch():
    code = ("import sys, json; from probeselect.manifest import cpu_info; info = cpu_info();"
            "print(json.dumps([info, 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    info, loaded = json.loads(out)
    assert loaded is False and info["torch_cpu_capability"] is None
