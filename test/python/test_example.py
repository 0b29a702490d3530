"""examples/python/serve_loop.py runs and checks itself against float64."""
import os
import subprocess
import sys

from conftest import SOURCE_DIR


def test_serve_loop_example():
    script = os.path.join(SOURCE_DIR, "examples", "python", "serve_loop.py")
    result = subprocess.run([sys.executable, script, "--steps", "30", "--seed", "3"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all pages free again: True" in result.stdout
    assert " 0 forked" not in result.stdout  # the shared-prefix path ran
