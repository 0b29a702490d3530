"""Generated programs that are large in one dimension, each with a time
bound: the front end and the passes must be linear in the program's size.

  size-sweep.py PAGEDC WORKDIR MAKE_NPY

- a chain of 20,000 mods, m0 calling m1 ... calling m20000 (inlining walks
  the calls with an explicit stack, not the native one);
- 50,000 small mods (dependence analysis gathers the declaration order once
  per module, not once per mod);
- 3,000 lets that do not fold, run through the CPU JIT (a function that
  large is compiled without LLVM's optimiser, whose time grows faster than
  the function).
Each bound is on CPU seconds. Prints one 'ok NAME SECONDS' line each, `FAIL NAME: why` on failure, and
`size-sweep: all as expected` at the end."""
import os
import resource
import subprocess
import sys
import time

pagedc, work, make_npy = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(work, exist_ok=True)
failures = []


def write(name, text):
    path = os.path.join(work, name + ".attn")
    with open(path, "w") as f:
        f.write(text)
    return path


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def check(name, args, limit):
    """Runs pagedc; the bound is on its CPU time (user + system), which a
    loaded machine does not inflate the way it does wall-clock time."""
    start = cpu_seconds()
    try:
        result = subprocess.run([pagedc] + args, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, timeout=20 * limit)
        code, err = result.returncode, result.stderr.decode(errors="replace")
    except subprocess.TimeoutExpired:
        code, err = "timeout", ""
    elapsed = cpu_seconds() - start
    if code != 0 or elapsed > limit:
        failures.append("%s: exit %s after %.1f CPU s (limit %d s): %s"
                        % (name, code, elapsed, limit, err[-300:]))
        print("FAIL %s" % failures[-1])
    else:
        print("ok %s %.1f" % (name, elapsed))


n = 20000
chain = write("modchain-%d" % n,
              "".join("mask m%d(b, h, q, kv) = m%d(b, h, q, kv)\n" % (i, i + 1)
                      for i in range(n)) + "mask m%d(b, h, q, kv) = q >= kv\n" % n)
check("modchain-20000", ["--emit=lowered", "--mask=m0", chain], 10)

n = 50000
many = write("mods-%d" % n, "".join("mask m%d(b, h, q, kv) = q >= kv - %d\n" % (i, i)
                                    for i in range(n)))
check("mods-50000", ["--emit=lowered", many], 10)

npy = {}
for name, shape in [("q", "1,1,3,8"), ("k", "1,1,5,8"), ("v", "1,1,5,8")]:
    npy[name] = os.path.join(work, name + ".npy")
    subprocess.run([sys.executable, make_npy, npy[name], "--shape", shape], check=True)
n = 3000
lets = write("lets-%d" % n, "mask m(b, h, q, kv) {\n  let x0 = q\n" +
             "".join("  let x%d = x%d * 3 + kv\n" % (i + 1, i) for i in range(n)) +
             "  x%d >= kv\n}\n" % n)
check("lets-3000-run", ["run", lets, "--mask=m", "--q", npy["q"], "--k", npy["k"],
                        "--v", npy["v"], "-o", os.path.join(work, "out.npy")], 10)

if failures:
    sys.exit(1)
print("size-sweep: all as expected")
