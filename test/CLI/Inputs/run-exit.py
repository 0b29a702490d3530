"""Runs a command, passes its output through, and prints `exit=N` last, so
FileCheck can check an exact exit status (lit's `not` accepts any failure)."""
import subprocess
import sys

result = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
sys.stdout.write(result.stdout.decode("utf-8", "replace"))
print("exit=%d" % result.returncode)
