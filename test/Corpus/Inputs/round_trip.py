"""Round-trip checks over every examples/*.attn file.

For each file:
  1. `pagedc --emit=mlir` parses back: `pagedc-opt` prints it, and printing
     that again gives the same text (the printed form is stable);
  2. the same holds for `pagedc --emit=lowered`;
  3. `pagedc-opt -flex-pipeline` on the MLIRGen output gives exactly what
     `pagedc --emit=lowered` prints (the CLI runs the one pipeline).
Prints a unified diff and exits 1 on the first mismatch.
"""
import difflib
import pathlib
import subprocess
import sys


def run(args, stdin=None):
    result = subprocess.run(args, input=stdin, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result.stdout


def expect_same(name, what, expected, actual):
    # Tools differ only in whether the module ends with a newline.
    expected, actual = expected.rstrip() + "\n", actual.rstrip() + "\n"
    if expected == actual:
        return
    diff = difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                f"{name}: {what} (expected)", f"{name}: {what} (actual)")
    sys.stdout.writelines(diff)
    sys.exit(1)


def main():
    examples = sorted(pathlib.Path(sys.argv[1]).glob("*.attn"))
    if not examples:
        sys.exit(f"no .attn files in {sys.argv[1]}")
    for path in examples:
        name = path.name
        mlir = run(["pagedc", "--emit=mlir", str(path)])
        once = run(["pagedc-opt"], mlir)
        expect_same(name, "mlir printed twice", once, run(["pagedc-opt"], once))
        lowered = run(["pagedc", "--emit=lowered", str(path)])
        lowered_once = run(["pagedc-opt"], lowered)
        expect_same(name, "lowered printed twice", lowered_once,
                    run(["pagedc-opt"], lowered_once))
        expect_same(name, "pagedc-opt -flex-pipeline vs --emit=lowered", lowered,
                    run(["pagedc-opt", "-flex-pipeline"], mlir))
    print(f"round-trip: {len(examples)} files stable")


main()
