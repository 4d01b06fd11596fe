"""`scripts/gpu-check.sh dry-run`: the GPU check's steps without a GPU (docs/gpu.md, *CUDA*). Everything but
the build runs as it would on the lent machine, on the CPU with .venv's llama.cpp: the machine report, the
Vulkan probe, the model made on the spot, both runtimes' parity against the CPU reference, the timings. The
report is the one the GPU machine writes, so a line it must have and lacks fails here first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "python").exists(),
                                reason="the dry run uses .venv's llama.cpp (scripts/setup_env.sh)")


def test_the_dry_run_writes_the_report_a_gpu_machine_would(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path)}
    env.pop("GGML_VK_VISIBLE_DEVICES", None)
    done = subprocess.run(["bash", "scripts/gpu-check.sh", "dry-run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    report = (tmp_path / "gpu-check.txt").read_text()
    sys.stdout.write(report)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for line in ("== machine", "Vulkan on this machine: ", "== doctor (cpu (dry run))",
                 "gpu-check parity on cpu (dry run): PASS", "gpu-check: PASS ("):
        assert line in report, line
    for runtime in ("on the project's ggml graphs on the talker's device", "on ONNX Runtime on the CPU"):
        assert f"{runtime}: 30/30 frames equal" in report, runtime
        for streams in ("1 stream:", "2 streams:"):
            assert f"{runtime}, {streams} first audio median" in report and "RTF" in report
        assert f"{runtime}, engine of 1 stream(s)" in report and "peak RSS" in report
    assert "teacher-forced: logits max|d| 0.00e+00" in report  # the CPU against itself
