#!/usr/bin/env python3
"""Runs a command, prints its stderr then stdout, and exits 0 only when the
command's exit status is the expected one:  expect_exit.py STATUS CMD ARGS..."""
import subprocess
import sys

expected = int(sys.argv[1])
result = subprocess.run(sys.argv[2:], capture_output=True, text=True)
sys.stdout.write(result.stderr)
sys.stdout.write(result.stdout)
if result.returncode != expected:
    print("expect_exit.py: exit status %d, expected %d" % (result.returncode, expected))
    sys.exit(1)
