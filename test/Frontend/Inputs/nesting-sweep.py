"""Generated depth/size sweep of deeply nested and very long expressions.

  nesting-sweep.py PAGEDC LIMIT WORKDIR MAKE_NPY

For every shape (parentheses, unary -, ~ and not, calls, subscripts, chains
of binary operators, right-associative **, lets) and many sizes: pagedc must
never crash. Up to the nesting limit every stage compiles (ast, mlir,
lowered, cuda where built, and `pagedc run` through the CPU JIT and the
float64 reference); beyond it the input error is "expression nesting deeper
than LIMIT" at a file:line:col, exit 1. 100,000 `let`s type-check and lower
in seconds (linear time). Prints `nesting-sweep: ... all as expected`."""
import os
import subprocess
import sys
import time

pagedc, limit, work, make_npy = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.makedirs(work, exist_ok=True)
failures = []
has_cuda = "cuda" in subprocess.run([pagedc, "--help"], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT).stdout.decode()

# name -> (header, expression of nesting n over the i32 value `q`)
SHAPES = {
    "parens": ("", lambda n: "(" * n + "q" + ")" * n),
    "neg": ("", lambda n: "-" * n + "q"),
    "bitnot": ("", lambda n: "~" * n + "q"),
    "calls": ("", lambda n: "abs(" * n + "q" + ")" * n),
    "mincalls": ("", lambda n: "min(" * n + "q" + ", kv)" * n),
    "subscripts": ("buffer d: i32[?]\n", lambda n: "d[" * n + "q" + "]" * n),
    "add-chain": ("", lambda n: "q" + " + 1" * n),
    "mul-chain": ("", lambda n: "q" + " * 1" * n),
    "and-chain": ("", lambda n: "q" + " & kv" * n),
    "pow-chain": ("", lambda n: "q" + " ** 1" * n),
    "multiline-chain": ("", lambda n: "q" + " +\n 1" * n),
}
BOOL_SHAPES = {
    "not": lambda n: "not " * n + "(q >= kv)",
    "or-chain": lambda n: "(q >= kv)" + " or (q < 0)" * n,
}


def run(args, timeout=300):
    try:
        result = subprocess.run([pagedc] + args, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", "timeout"
    return result.returncode, result.stdout.decode(), result.stderr.decode()


def write(name, text):
    path = os.path.join(work, name + ".attn")
    with open(path, "w") as f:
        f.write(text)
    return path


def source(shape, n):
    if shape in BOOL_SHAPES:
        return "mask m(b, h, q, kv) = " + BOOL_SHAPES[shape](n) + "\n"
    header, make = SHAPES[shape]
    return header + "mask m(b, h, q, kv) = (" + make(n) + ") >= kv\n"


# Inputs for `pagedc run` (the CPU JIT and the float64 reference).
npy = {}
for name, shape, extra in [("q", "1,1,3,8", []), ("k", "1,1,5,8", []),
                           ("v", "1,1,5,8", []),
                           ("d", "6", ["--dtype", "i4", "--values", "0,1,2,3,4,5"])]:
    npy[name] = os.path.join(work, name + ".npy")
    subprocess.run([sys.executable, make_npy, npy[name], "--shape", shape] + extra,
                   check=True)


def check_accepted(shape, n, path, mask_name="m"):
    stages = ["ast", "mlir", "lowered"] + (["cuda"] if has_cuda else [])
    for stage in stages:
        args = ["--emit=" + stage, path]
        if stage == "cuda":
            args += ["--kernel=decode", "--head-dim=64"]
        code, _, err = run(args)
        if code != 0:
            failures.append("%s n=%d --emit=%s: exit %s: %s" % (shape, n, stage, code, err[:300]))
            return
    run_args = ["run", path, "--mask=" + mask_name, "--q", npy["q"], "--k", npy["k"], "--v", npy["v"]]
    if "buffer d" in open(path).read():
        run_args += ["--buffer", "d=" + npy["d"]]
    for extra in [[], ["--reference"]]:
        out = os.path.join(work, "out.npy")
        code, _, err = run(run_args + extra + ["-o", out])
        if code != 0:
            failures.append("%s n=%d run %s: exit %s: %s" % (shape, n, extra, code, err[:300]))


def check_rejected(shape, n, path):
    code, out, err = run(["--emit=ast", path])
    needle = "error: expression nesting deeper than %d levels" % limit
    lines = [l for l in err.splitlines() if "error:" in l]
    if code != 1 or out or len(lines) != 1 or needle not in lines[0] or \
            not lines[0].startswith(path + ":"):
        failures.append("%s n=%d: exit %s, want exit 1 and one located '%s': %s"
                        % (shape, n, code, needle, err[:300]))


count = 0
for shape in list(SHAPES) + list(BOOL_SHAPES):
    # Around the limit: a threshold t with limit - 8 <= t < limit such that
    # every n <= t compiles and every n > t is rejected.
    results = {}
    for n in [1, limit // 2] + list(range(limit - 8, limit + 2)):
        path = write("%s-%d" % (shape, n), source(shape, n))
        code, _, _ = run(["--emit=ast", path])
        results[n] = code
        count += 1
    accepted = [n for n, code in results.items() if code == 0]
    rejected = [n for n, code in results.items() if code != 0]
    if not accepted or not rejected or max(accepted) > min(rejected) or \
            max(accepted) < limit - 8 or max(accepted) >= limit:
        failures.append("%s: no clean threshold near %d: %s" % (shape, limit, results))
        continue
    for n in [1, max(accepted)]:
        check_accepted(shape, n, write("%s-%d" % (shape, n), source(shape, n)))
    for n in [min(rejected), 1000, 3000, 10000, 100000]:
        check_rejected(shape, n, write("%s-%d" % (shape, n), source(shape, n)))
        count += 1

# Long blocks: n lets, each using the previous one (linear time; every stage).
for n in [1000, 3000, 10000, 100000]:
    lets = "".join("  let x%d = x%d * 3 + kv\n" % (i + 1, i) for i in range(n))
    path = write("lets-%d" % n, "mask m(b, h, q, kv) {\n  let x0 = q\n" + lets +
                 "  x%d >= kv\n}\n" % n)
    start = time.time()
    code, _, err = run(["--emit=ast", path], timeout=60)
    elapsed = time.time() - start
    count += 1
    if code != 0 or elapsed > 20:
        failures.append("lets n=%d: exit %s after %.1f s: %s" % (n, code, elapsed, err[:300]))
    if n == 3000:  # every stage, the CPU JIT included
        check_accepted("lets", n, path)

# A chain of mods, each calling the next (recursion check, inlining).
for n in [1000, 10000]:
    mods = "".join("mask m%d(b, h, q, kv) = m%d(b, h, q, kv)\n" % (i, i + 1) for i in range(n))
    path = write("modchain-%d" % n, mods + "mask m%d(b, h, q, kv) = q >= kv\n" % n)
    code, _, err = run(["--emit=lowered", "--mask=m0", path])
    count += 1
    if code != 0:
        failures.append("modchain n=%d: exit %s: %s" % (n, code, err[:300]))
    cycle = path.replace(".attn", "-cycle.attn")
    with open(cycle, "w") as f:
        f.write(mods + "mask m%d(b, h, q, kv) = m0(b, h, q, kv)\n" % n)
    code, _, err = run(["--emit=ast", cycle])
    if code != 1 or "recursion is not allowed" not in err:
        failures.append("modchain cycle n=%d: exit %s: %s" % (n, code, err[:300]))

for failure in failures:
    print("FAIL " + failure)
if failures:
    sys.exit(1)
print("nesting-sweep: %d inputs, all as expected" % count)
