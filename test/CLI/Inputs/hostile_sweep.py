"""A hostile-input sweep across pagedc's edges (issue 47): inputs a script
could produce by accident, each run in its own process.

  hostile_sweep.py WORKDIR EXAMPLES_DIR [MODULE_PYTHON MODULE_DIR]

The command line (`pagedc`, `pagedc run`, `pagedc-jit`, `pagedc-gpu`),
malformed .npy files, shapes that disagree, absurd sizes and flags, output
paths that cannot be written, programs of binary garbage, the emulator's
PAGEDC_EMU_* settings and driver variables, garbage packs, and (given an
interpreter with NumPy and the built package) misuse of the Python API.

Every case must end by itself within TIME_LIMIT seconds, not by a signal,
with its expected exit status: 1 for an input error (a Python exception in
the Python cases), 2 for a usage error, as each tool's --help says; its
standard error must name the problem (a keyword per case); on failure no
file may appear or change in the case's directory (outputs go there) and
the shared inputs must be intact at the end. Each child runs with its
address space limited to ADDRESS_SPACE_LIMIT, and its peak resident set
(wait4's ru_maxrss) must stay under PEAK_RSS_BOUND. Prints one line per
case ('ok NAME' or 'FAIL NAME: why') and, when all held, `hostile-sweep: N
cases, all as expected`; N must be at least MIN_CASES.
"""
import os
import stat
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

TIME_LIMIT = 10.0
# The bound stated by the test: no hostile input may make a tool hold more
# than 1 GiB (the largest legitimate input here is a few kilobytes).
PEAK_RSS_BOUND = 1 << 30
# A runaway allocation fails instead of taking the machine's memory.
ADDRESS_SPACE_LIMIT = 4 << 30
MIN_CASES = 60

work, examples = os.path.abspath(sys.argv[1]), sys.argv[2]
module_python = sys.argv[3] if len(sys.argv) > 3 else ""
module_dir = sys.argv[4] if len(sys.argv) > 4 else ""
show = os.environ.get("HOSTILE_SWEEP_SHOW") == "1"

inputs = os.path.join(work, "in")
os.makedirs(inputs, exist_ok=True)

# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------


def write(path, data, mode="wb"):
    with open(path, mode) as f:
        f.write(data)
    return path


def npy_bytes(shape=None, descr="<f4", header=None, version=(1, 0), data=None, fortran=False,
              length=None):
    """A .npy file; `header` replaces the dict text, `length` the length field."""
    if header is None:
        dims = "".join("%d, " % s for s in shape)
        header = "{'descr': %s, 'fortran_order': %s, 'shape': (%s), }" % (
            descr if descr.startswith("[") else "'%s'" % descr, fortran, dims)
    header = header.encode("latin1") if isinstance(header, str) else header
    size_field = 2 if version[0] == 1 else 4
    while (6 + 2 + size_field + len(header) + 1) % 64:
        header += b" "
    header += b"\n"
    field = struct.pack("<H" if size_field == 2 else "<I",
                        len(header) if length is None else length)
    if data is None:
        count = 1
        for s in shape or ():
            count *= s
        item = {"<f4": 4, "<f2": 2, "<f8": 8, "|b1": 1}.get(descr, 4)
        data = struct.pack("<%df" % count, *[((i * 37) % 19) / 19.0 - 0.5 for i in range(count)]) \
            if item == 4 else bytes(count * item)
    return b"\x93NUMPY" + bytes(version) + field + header + data


def npy(name, *args, **kwargs):
    return write(os.path.join(inputs, name), npy_bytes(*args, **kwargs))


PROGRAM = write(os.path.join(inputs, "mods.attn"), """\
const WINDOW = 4
buffer slopes: f32[H]
mask causal(b, h, q, kv) = q >= kv
mask sliding(b, h, q, kv) = (q >= kv) & (q - kv <= WINDOW)
score alibi(s, b, h, q, kv) = s + slopes[h] * (kv - q)
""", "w")
Q = npy("q.npy", (1, 2, 3, 8))
K = npy("k.npy", (1, 1, 5, 8))
V = npy("v.npy", (1, 1, 5, 8))
PLAIN = write(os.path.join(inputs, "plain.txt"), b"not a directory\n")

tools = os.environ.get("PATH", "").split(os.pathsep)


def tool(name):
    for directory in tools:
        path = os.path.join(directory, name)
        if os.access(path, os.X_OK):
            return path
    return None


PAGEDC = tool("pagedc")
HAS_CUDA_STAGES = "--head-dim" in subprocess.run(
    [PAGEDC, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT).stdout.decode()

# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------

cases = []


class Case:
    def __init__(self, name, argv, status, keywords, env=None):
        self.name = name
        self.argv = argv
        self.status = status
        self.keywords = [keywords] if isinstance(keywords, str) else list(keywords)
        assert all(self.keywords), name + ": every case names the problem it expects"
        self.env = env or {}
        self.dir = os.path.join(work, "cases", name)


def case(name, argv, status, keywords, **kwargs):
    """Adds a case; `argv` and `env` may be functions of the case directory."""
    cases.append(Case(name, argv, status, keywords, **kwargs))


def run_args(d, q=Q, k=K, v=V, extra=(), mask="causal", program=PROGRAM):
    return ["pagedc", "run", program, "--mask=" + mask, "--q", q, "--k", k, "--v", v,
            "-o", os.path.join(d, "out.npy"), "--device", "cpu"] + list(extra)


def bad_npy(name, role, keyword, *args, **kwargs):
    """A malformed .npy as `role` (q, k or v; k also stands for v)."""
    path = npy(name + ".npy", *args, **kwargs)
    files = {"q": Q, "k": K, "v": V}
    files[role] = path
    if role == "k":
        files["v"] = path
    case("npy-" + name, lambda d: run_args(d, files["q"], files["k"], files["v"]), 1,
         ["npy file '%s'" % path, keyword])


# Malformed .npy files: every way the header or the data can lie.
bad_npy("object-dtype", "q", "unsupported dtype '|O'", (1, 2, 3, 8), descr="|O", data=b"")
bad_npy("big-endian", "q", "big-endian dtype '>f4' is not supported", (1, 2, 3, 8), descr=">f4")
bad_npy("complex64", "k", "unsupported dtype '<c8'", (1, 1, 5, 8), descr="<c8",
        data=bytes(320))
bad_npy("structured", "q", "structured arrays are not supported", (1, 2, 3, 8),
        descr="[('re', '<f4'), ('im', '<f4')]")
bad_npy("header-not-a-dict", "q", "bad header", header="garbage, not a dict", data=b"")
bad_npy("negative-extent", "q", "expected a non-negative integer dimension",
        header="{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, -3, 8), }", data=b"")
bad_npy("extent-30-digits", "k", "dimension too large",
        header="{'descr': '<f4', 'fortran_order': False, "
               "'shape': (1, 1, 999999999999999999999999999999, 8), }", data=b"")
bad_npy("no-shape-key", "q", "needs the keys 'descr', 'fortran_order' and 'shape'",
        header="{'descr': '<f4', 'fortran_order': False, }", data=b"")
bad_npy("unknown-key", "q", "unexpected key 'offset'",
        header="{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3, 8), "
               "'offset': 64, }", data=b"")
bad_npy("unterminated-string", "q", "unterminated string", header="{'descr", data=b"")
bad_npy("nul-in-header", "v", "bad header",
        header=b"{'descr': '<f4',\0\0 'fortran_order': False, 'shape': (1, 1, 5, 8), }")
bad_npy("text-after-dict", "q", "text after the closing '}'",
        header="{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3, 8), } junk")
bad_npy("order-not-bool", "q", "expected True or False",
        header="{'descr': '<f4', 'fortran_order': 0, 'shape': (1, 2, 3, 8), }")
bad_npy("shape-is-a-list", "q", "expected '('",
        header="{'descr': '<f4', 'fortran_order': False, 'shape': [1, 2, 3, 8], }")
bad_npy("version-0.9", "q", "unsupported .npy version 0.9", (1, 2, 3, 8), version=(0, 9))
bad_npy("rank-7", "q", "rank 7 exceeds the supported maximum of 6", (1, 1, 1, 1, 1, 1, 1))
bad_npy("f64-query", "q", "q must be f32, f16 or bf16 (as <u2), not f64", (1, 2, 3, 8),
        descr="<f8")
bad_npy("bool-keys", "k", "k must be f32, f16 or bf16 (as <u2), not bool", (1, 1, 5, 8),
        descr="|b1")
bad_npy("header-past-eof", "q", "truncated header: it declares 65535 bytes", (1, 2, 3, 8),
        length=65535)
empty = write(os.path.join(inputs, "empty.npy"), b"")
case("npy-empty-file", lambda d: run_args(d, q=empty), 1,
     ["npy file '%s'" % empty, "wrong magic"])
prefix_only = write(os.path.join(inputs, "prefix-only.npy"), b"\x93NUMPY\x01\x00")
case("npy-prefix-only", lambda d: run_args(d, q=prefix_only), 1,
     ["npy file '%s'" % prefix_only, "truncated header"])
loop_npy = os.path.join(inputs, "loop.npy")
os.symlink("loop.npy", loop_npy)
case("npy-symlink-loop", lambda d: run_args(d, k=loop_npy), 1,
     ["npy file '%s'" % loop_npy, "cannot open: Too many levels of symbolic links"])
# A version 2.0 header may claim 4 GiB; in a sparse file that long the
# reader once allocated and read the whole claimed header.
huge_header = os.path.join(inputs, "huge-header.npy")
with open(huge_header, "wb") as f:
    f.write(b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFF0))
    f.truncate(0xFFFFFFF0 + 12 + 64)
case("npy-4gib-header-sparse", lambda d: run_args(d, q=huge_header), 1,
     ["npy file '%s'" % huge_header, "is larger than the 1048576 a .npy header may be"])

# q, k and v that disagree, and extents no run can take.
v_batch = npy("v-batch-2.npy", (2, 1, 5, 8))
case("shape-v-batch", lambda d: run_args(d, v=v_batch), 1,
     ["npy file '%s'" % v_batch, "batch 2 differs from q's 1"])
kv_no_heads = npy("kv-no-heads.npy", (1, 0, 5, 8))
case("shape-zero-kv-heads", lambda d: run_args(d, k=kv_no_heads, v=kv_no_heads), 1,
     ["npy file '%s'" % kv_no_heads, "0 KV heads do not divide q's 2 heads"])
q_dim0, kv_dim0 = npy("q-dim0.npy", (1, 2, 3, 0)), npy("kv-dim0.npy", (1, 1, 5, 0))
case("shape-zero-head-dim", lambda d: run_args(d, q=q_dim0, k=kv_dim0, v=kv_dim0), 1,
     "every dimension must be positive")
# 2^30 + 1 keys: a 17 GB sparse file, refused from its header alone.
long_kv = os.path.join(inputs, "long-kv.npy")
write(long_kv, npy_bytes((1, 1, 2**30 + 1, 8), descr="<f2", data=b""))
with open(long_kv, "r+b") as f:
    f.truncate(os.path.getsize(long_kv) + (2**30 + 1) * 16)
case("shape-keys-past-int32", lambda d: run_args(d, k=long_kv, v=long_kv), 1,
     ["npy file '%s'" % long_kv, "sequence too long"])

# `pagedc run` flags: absurd numbers, missing and stray values (usage, exit 2).
for name, extra, keyword in [
        ("page-size-2048", ["--page-size", "2048"], "--page-size expects an integer in [1, 1024]"),
        ("page-size-negative", ["--page-size", "-16"], "got '-16'"),
        ("block-zero", ["--block", "0x128"], "--block expects an integer in [1, 4096], got '0'"),
        ("block-20-digits", ["--block=99999999999999999999x64"],
         "got '99999999999999999999'"),
        ("threads-100000", ["--threads", "100000"], "--threads expects an integer in [0, 1024]"),
        ("q-offset-past-int32", ["--q-offset", "2147483648"],
         "--q-offset expects an integer in [0, 2147483647]"),
        ("scale-nan", ["--scale", "nan"], "--scale expects a finite number, got 'nan'"),
        ("scale-overflow", ["--scale=1e999"], "--scale expects a finite number, got '1e999'"),
        ("kernel-option-20-digits", ["--kernel-option", "decode_split_factor=99999999999999999999"],
         "decode_split_factor"),
        ("kernel-option-no-name", ["--kernel-option", "=1"], "--kernel-option: "),
        ("reference-with-value", ["--reference=yes"], "--reference takes no value"),
        ("misspelt-flag", ["--devcie", "cpu"], "unknown option '--devcie'"),
        ("second-program", [PROGRAM], "unexpected argument"),
        ("buffer-no-name", ["--buffer", "=x.npy"], "--buffer expects NAME=VALUE, got '=x.npy'"),
        ("define-100k-digits", ["-D", "WINDOW=" + "9" * 100000], "does not fit in i32"),
        ("missing-last-value", ["--q"], "--q needs a value")]:
    case("run-" + name, lambda d, extra=extra: run_args(d, extra=extra), 2, keyword)
case("run-empty-output", lambda d: run_args(d)[:-4] + ["-o", "", "--device", "cpu"], 2,
     "-o is required")

# Compile mode: absurd target sizes and values (usage, exit 2).
if HAS_CUDA_STAGES:
    for name, extra, keyword in [
            ("head-dim-zero", ["--head-dim=0"], "--head-dim: '0' is not a positive integer"),
            ("head-dim-100000", ["--head-dim=100000"],
             "head dim 100000 is not supported by the CUDA kernels"),
            ("page-size-3", ["--page-size=3"], "page size 3 is not a power of two"),
            ("gqa-11-digits", ["--gqa=99999999999"], "--gqa: '99999999999' is not a positive"),
            ("block-no-kv", ["--block=64x"], "--block: '64x' is not QxKV"),
            ("arch-bare", ["--arch=sm_"], "'sm_' is not an architecture like sm_90"),
            ("kernel-empty-item", ["--kernel=prefill,,decode"], "'' is not prefill or decode"),
            ("warp-rows-48", ["--warp-rows=48"], "'48' is not 16, 32 or 64")]:
        case("cuda-" + name, lambda d, extra=extra: ["pagedc", "--emit=cuda", "--mask=causal",
                                                      "-o", os.path.join(d, "out.cu"), PROGRAM]
             + extra, 2, keyword)
case("emit-missing-value", lambda d: ["pagedc", PROGRAM, "-o", os.path.join(d, "o"), "--emit"], 2,
     "option '--emit' needs a value")
case("define-invalid-utf8-name",
     lambda d: ["pagedc", "--emit=ast", "-D", b"WIN\xffDOW=3", PROGRAM, "-o",
                os.path.join(d, "o")], 2, "-D expects NAME=VALUE")
case("define-100k-character-name",
     lambda d: ["pagedc", "--emit=ast", "-D", "W" * 100000 + "=3", PROGRAM, "-o",
                os.path.join(d, "o")], 1, "there is no constant named 'WWWW")

# Output paths that cannot be written: under a regular file, a symlink loop,
# a name too long for the file system.
case("run-output-under-a-file",
     lambda d: run_args(d)[:-4] + ["-o", os.path.join(PLAIN, "out.npy"), "--device", "cpu"], 1,
     "Not a directory")
case("run-output-symlink-loop",
     lambda d: (os.symlink("loop.npy", os.path.join(d, "loop.npy")),
                run_args(d)[:-4] + ["-o", os.path.join(d, "loop.npy"), "--device", "cpu"])[1],
     1, "Too many levels of symbolic links")
case("emit-output-name-too-long",
     lambda d: ["pagedc", "--emit=ast", PROGRAM, "-o", os.path.join(d, "x" * 300)], 1,
     "File name too long")
case("emit-output-file-with-slash",
     lambda d: ["pagedc", "--emit=ast", PROGRAM, "-o", PLAIN + "/"], 1, "plain.txt/")

# Programs: binary garbage, NUL bytes, invalid UTF-8, a megabyte identifier,
# nesting far past the limit through `pagedc run`, a directory.
garbage = write(os.path.join(inputs, "garbage.attn"),
                bytes((i * 131 + 7) % 256 for i in range(4096)))
case("program-binary-garbage",
     lambda d: ["pagedc", "--emit=ast", garbage, "-o", os.path.join(d, "o")], 1,
     garbage + ":1:")
nul = write(os.path.join(inputs, "nul.attn"), b"mask m(b, h, q, kv) = q\0 >= kv\n")
case("program-nul-byte", lambda d: ["pagedc", "--emit=lowered", nul, "-o", os.path.join(d, "o")],
     1, nul + ":1:")
bad_utf8 = write(os.path.join(inputs, "utf8.attn"), b"mask m\xc3\x28(b, h, q, kv) = q >= kv\n")
case("program-invalid-utf8",
     lambda d: ["pagedc", "--emit=mlir", bad_utf8, "-o", os.path.join(d, "o")], 1,
     bad_utf8 + ":1:")
huge_name = write(os.path.join(inputs, "huge-name.attn"),
                  "mask m(b, h, q, kv) = q >= %s\n" % ("n" * (1 << 20)), "w")
case("program-megabyte-identifier",
     lambda d: ["pagedc", "--emit=ast", huge_name, "-o", os.path.join(d, "o")], 1,
     "unknown name 'nnnn")
deep = write(os.path.join(inputs, "deep.attn"),
             "mask m(b, h, q, kv) = %sq%s >= kv\n" % ("(" * 100000, ")" * 100000), "w")
case("run-deep-nesting", lambda d: run_args(d, program=deep, mask="m"), 1,
     "expression nesting deeper than")
case("run-program-directory", lambda d: run_args(d, program=inputs), 1, "it is a directory")
case("run-garbage-program", lambda d: run_args(d, program=garbage, mask="m"), 1, garbage + ":1:")

# The emulator's settings and driver variables: refused before anything runs.
for name, env, keyword in [
        ("checks-empty-item", {"PAGEDC_EMU_CHECKS": "memcheck,,racecheck"},
         "an empty checker name"),
        ("checks-capitals", {"PAGEDC_EMU_CHECKS": "MEMCHECK"}, "unknown checker 'MEMCHECK'"),
        ("checks-spaces", {"PAGEDC_EMU_CHECKS": "memcheck racecheck"},
         "unknown checker 'memcheck racecheck'"),
        ("threads-plus-sign", {"PAGEDC_EMU_THREADS": "+4"}, "PAGEDC_EMU_THREADS is '+4'"),
        ("threads-20-digits", {"PAGEDC_EMU_THREADS": "9" * 20}, "PAGEDC_EMU_THREADS is '999"),
        ("multiprocessors-float", {"PAGEDC_EMU_MULTIPROCESSORS": "1e3"},
         "PAGEDC_EMU_MULTIPROCESSORS is '1e3'"),
        ("registers-second-entry", {"PAGEDC_EMU_REGISTERS": "pagedc_decode=64,pagedc_prefill=x"},
         "entry 'pagedc_prefill=x'"),
        ("sample-blocks-past-2^40", {"PAGEDC_EMU_SAMPLE_BLOCKS": "1099511627777"},
         "PAGEDC_EMU_SAMPLE_BLOCKS is '1099511627777'"),
        ("sample-kernels-dash", {"PAGEDC_EMU_SAMPLE_KERNELS": "pagedc-decode"},
         "kernel name 'pagedc-decode'"),
        ("quiet-on", {"PAGEDC_EMU_QUIET": "on"}, "PAGEDC_EMU_QUIET is 'on'"),
        ("counters-under-a-file", {"PAGEDC_EMU_COUNTERS": os.path.join(PLAIN, "c.jsonl")},
         "cannot write there"),
        ("two-refusals", {"PAGEDC_EMU_CHECKS": "none,memcheck", "PAGEDC_EMU_QUIET": "2"},
         ["unknown checker 'none'", "PAGEDC_EMU_QUIET is '2'"])]:
    case("emu-" + name, lambda d: run_args(d)[:-2] + ["--device", "emu"], 1, keyword, env=env)
case("emu-report-directory", lambda d: run_args(d)[:-2] + ["--device", "emu"], 1,
     "cannot write there", env=lambda d: {"PAGEDC_EMU_REPORT": d})
case("emu-driver-missing", lambda d: run_args(d)[:-2] + ["--device", "emu"], 1,
     "was not found", env={"PAGEDC_EMU_DRIVER": os.path.join(inputs, "no-such-driver.so")})
case("emu-driver-garbage", lambda d: run_args(d)[:-2] + ["--device", "emu"], 1,
     ["was not found", "garbage.attn"], env={"PAGEDC_EMU_DRIVER": garbage})
case("cuda-driver-not-a-library", lambda d: run_args(d)[:-2] + ["--device", "cuda"], 1,
     "did not load", env={"PAGEDC_CUDA_DRIVER": PLAIN})

# pagedc-jit's numbers and flags (usage, exit 2).
for name, extra, keyword in [
        ("head-dim-text", ["--head-dim=abc"], "bad --head-dim abc"),
        ("head-dim-past-int", ["--head-dim=2147483648"], "bad --head-dim 2147483648"),
        ("dtype-f32", ["--dtype=f32"], "--dtype must be f16 or bf16"),
        ("define-without-value", ["-D"], "-D needs NAME=VALUE"),
        ("define-100k-digits", ["-D", "WINDOW=" + "9" * 100000], "does not fit in i32")]:
    case("jit-" + name, lambda d, extra=extra: ["pagedc-jit", PROGRAM, "--mask=causal",
                                                 "--cache-dir=" + os.path.join(d, "cache")]
         + extra, 2, keyword)

# The kernel cache directory, as pagedc-jit's --cache-dir and as
# PAGEDC_CACHE_DIR (pagedc run --device emu, pagedc-jit): what cannot be a
# directory the tool may read is refused by name before any compile, and
# nothing is written in its place or elsewhere. A read-only directory is
# used with a warning (here the run then fails on its head dim, after the
# warning). As root, the permission cases drop the capabilities that ignore
# permissions.
FIFO = os.path.join(inputs, "fifo")
os.mkfifo(FIFO)
DANGLING = os.path.join(inputs, "dangling")
os.symlink(os.path.join(inputs, "no-such-target"), DANGLING)
READ_ONLY = os.path.join(inputs, "read-only-cache")
UNREADABLE = os.path.join(inputs, "unreadable-cache")
os.makedirs(READ_ONLY)
os.makedirs(UNREADABLE)
os.chmod(READ_ONLY, 0o555)
os.chmod(UNREADABLE, 0o311)
# Head dim 64: --device emu refuses 8 before it needs a kernel.
Q64, K64 = npy("q64.npy", (1, 2, 3, 64)), npy("k64.npy", (1, 1, 5, 64))
UNPRIVILEGED = []
if os.geteuid() == 0:
    UNPRIVILEGED = [tool("setpriv") or "/usr/bin/setpriv",
                    "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]
if os.geteuid() != 0 or os.path.exists(UNPRIVILEGED[0]):
    permission_cases = [
        ("unreadable", UNREADABLE, "it cannot be read: Permission denied"),
        ("not-creatable", os.path.join(READ_ONLY, "cache"),
         "it does not exist and cannot be created: Permission denied")]
else:
    permission_cases = []
for name, path, keyword in [
        ("file", PLAIN, "it is a regular file, not a directory"),
        ("fifo", FIFO, "it is a FIFO, not a directory"),
        ("dangling-symlink", DANGLING, "it is a dangling symbolic link"),
        ("under-a-file", os.path.join(PLAIN, "cache"),
         "'%s' is a regular file, not a directory" % PLAIN)] + permission_cases:
    prefix = UNPRIVILEGED if (name, path, keyword) in permission_cases else []
    case("cache-dir-" + name,
         lambda d, path=path, prefix=prefix: prefix + [
             "pagedc-jit", PROGRAM, "--mask=causal", "--kernel=decode", "--cache-dir=" + path],
         1, ["kernel cache directory '%s'" % path, keyword])
    case("cache-env-" + name,
         lambda d, prefix=prefix: prefix + run_args(d, Q64, K64, K64)[:-2] + ["--device", "emu"],
         1,
         ["kernel cache directory '%s'" % path, keyword], env={"PAGEDC_CACHE_DIR": path})
if HAS_CUDA_STAGES:
    # pagedc --emit=cubin reads the cache where it checks a prefill tile
    # for spills (sm_80's default tile): an error there, not a silent
    # change of tile.
    case("cache-env-file-cubin",
         lambda d: ["pagedc", "--emit=cubin", "--kernel=prefill", "--arch=sm_80", "--mask=causal",
                    PROGRAM, "-o", os.path.join(d, "out.cubin")], 1,
         ["kernel cache directory '%s'" % PLAIN, "it is a regular file, not a directory"],
         env={"PAGEDC_CACHE_DIR": PLAIN})
case("cache-dir-empty", lambda d: ["pagedc-jit", PROGRAM, "--mask=causal", "--cache-dir="], 1,
     "--cache-dir is empty")
case("cache-env-empty", lambda d: run_args(d, Q64, K64, K64)[:-2] + ["--device", "emu"], 1,
     "PAGEDC_CACHE_DIR is set but empty", env={"PAGEDC_CACHE_DIR": ""})
if permission_cases:
    case("cache-dir-read-only",
         lambda d: UNPRIVILEGED + ["pagedc-jit", PROGRAM, "--mask=causal", "--head-dim=100000",
                                   "--cache-dir=" + READ_ONLY], 1,
         ["kernel cache directory '%s' is not writable (Permission denied)" % READ_ONLY,
          "head dim 100000"])

# Packs (pagedc-gpu's input, holding kernel bundles) that are garbage.
if tool("pagedc-gpu"):
    def pack(text):
        def make(d):
            os.makedirs(os.path.join(d, "pack"), exist_ok=True)
            write(os.path.join(d, "pack", "pack.json"), text)
            return ["pagedc-gpu", "check", os.path.join(d, "pack"), "--dry-run"]
        return make
    case("gpu-pack-binary-garbage", pack(bytes((i * 97) % 256 for i in range(2048))), 2,
         "invalid JSON")
    case("gpu-pack-deep-nesting", pack(b"[" * 100000 + b"]" * 100000), 2,
         "nested deeper than 256")
    case("gpu-pack-wrong-types", pack(b'{"format": 7, "version": "one", "cases": {}}'), 2,
         "format must be a string, not a number")

# ---------------------------------------------------------------------------
# Python API misuse: each script catches nothing, so an exception is exit 1
# with its message on stderr; a signal would be a crash of the interpreter.
# ---------------------------------------------------------------------------

PY_PRELUDE = """\
import numpy as np, pagedc
rng = np.random.default_rng(0)
def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)
q, k, v = randn(1, 2, 3, 8), randn(1, 2, 5, 8), randn(1, 2, 5, 8)
mods = pagedc.compile("mask causal(b, h, q, kv) = q >= kv\\n")
"""

PY_CASES = [
    ("kvcache-negative-pages", "pagedc.PagedKVCache(-1, 16, 1, 2, 8)", "n_pages"),
    ("kvcache-zero-page-size", "pagedc.PagedKVCache(4, 0, 1, 2, 8)", "page_size"),
    ("kvcache-negative-head-dim", "pagedc.PagedKVCache(4, 16, 1, 2, -8)", "head_dim"),
    ("kvcache-int8", "pagedc.PagedKVCache(4, 16, 1, 2, 8, dtype='int8')", "int8"),
    ("batch-negative-heads", "pagedc.BatchAttention(None, -4, 2, 8, 16)",
     "num_q_heads must be at least 1 but is -4"),
    ("batch-heads-not-multiple", "pagedc.BatchAttention(None, 4, 3, 8, 16)",
     "num_q_heads 4 is not a multiple of num_kv_heads 3"),
    ("batch-zero-page-size", "pagedc.BatchAttention(None, 4, 2, 8, 0)",
     "page_size must be at least 1 but is 0"),
    ("batch-negative-max-tokens", "pagedc.BatchAttention(None, 4, 2, 8, 16, max_num_tokens=-1)",
     "max_num_tokens must be at least 1 but is -1"),
    ("batch-limits-overflow",
     "pagedc.BatchAttention(None, 4, 2, 8, 2**31, max_blocks_per_seq=2**33)",
     "must each fit int32"),
    ("plan-first-start-not-zero",
     "pagedc.BatchAttention(None, 2, 2, 8, 4).plan([1, 3], [3], np.zeros((1, 4), np.int32))",
     "query_start_loc[0] must be 0 but is 1"),
    ("plan-negative-seq-len",
     "pagedc.BatchAttention(None, 2, 2, 8, 4).plan([0, 0], [-5], np.zeros((1, 4), np.int32))",
     "seq_lens[0] = -5 is less than"),
    ("plan-negative-page",
     "pagedc.BatchAttention(None, 2, 2, 8, 4).plan([0, 2], [2], [[-7, 0]])",
     "block_table[0, 0] = -7 is negative"),
    ("plan-block-table-1d",
     "pagedc.BatchAttention(None, 2, 2, 8, 4).plan([0, 2], [2], [0, 1])",
     "block_table: expected 2 dimension(s)"),
    ("plan-float-starts",
     "pagedc.BatchAttention(None, 2, 2, 8, 4).plan(np.array([0.0, 2.5]), [3], [[0, 1]])",
     "query_start_loc: expected integers"),
    ("run-page-past-pool",
     "a = pagedc.BatchAttention(None, 2, 2, 8, 4)\n"
     "a.plan([0, 2], [2], [[2**31 - 1]])\n"
     "c = np.zeros((2, 4, 2, 8), np.float32)\n"
     "a.run(randn(2, 2, 8), c, c)",
     "block_table holds page 2147483647"),
    ("flex-q-none", "pagedc.flex_attention(None, k, v, mods=mods)", "q: expected a tensor"),
    ("flex-k-none", "pagedc.flex_attention(q, None, v, mods=mods)",
     "expected a tensor with __dlpack__"),
    ("flex-mixed-kv-dtypes", "pagedc.flex_attention(q, k, v.astype(np.float16), mods=mods)",
     "v is f16 but k is f32; they must match"),
    ("flex-scale-text", "pagedc.flex_attention(q, k, v, mods=mods, scale='abc')", "abc"),
    ("reserve-negative",
     "c = pagedc.PagedKVCache(4, 16, 1, 2, 8)\nc.reserve(0, -1)", "seq_len: -1 is negative"),
    ("compile-nan-define",
     "pagedc.compile('const W = 1\\nmask m(b, h, q, kv) = q - kv <= W\\n', "
     "defines={'W': float('nan')})", "NaN is not a constant value"),
    ("compile-bytes", "pagedc.compile(b'mask m(b, h, q, kv) = q >= kv')",
     "source: expected .attn text or a path, got bytes"),
    ("compile-nul", "pagedc.compile('mask m(b, h, q, kv) = q\\0 >= kv\\n')", "<string>:1:"),
    # 2^31 - 1 slots cost nothing until used (the wrapper once kept a list
    # of that many lengths: 16 GiB).
    ("kvcache-2^31-slots",
     "c = pagedc.PagedKVCache(4, 16, 2**31 - 1, 2, 8)\nc.reserve(2**31 - 2, 1000)",
     "requested 63 pages but there are only 4 empty pages"),
    ("assign-negative-position",
     "c = pagedc.PagedKVCache(4, 16, 1, 2, 8)\nc.reserve(0, 5)\n"
     "c.assign([0], np.array([[0, 1, -3, 2, 4]], np.int32), k, v)",
     "input_pos[0, 2] = -3 is outside slot 0's reserved capacity"),
    ("fork-onto-itself",
     "c = pagedc.PagedKVCache(4, 16, 2, 2, 8)\nc.reserve(0, 5)\nc.fork(0, 0, 5)",
     "fork: source and destination are the same slot 0"),
    ("block-mask-negative-batch", "pagedc.create_block_mask(mods, -1, 1, 16, 16)",
     "batch and heads must be at least 1 but are B=-1"),
    ("block-mask-zero-block", "pagedc.create_block_mask(mods, 1, 1, 16, 16, BLOCK_SIZE=0)",
     "block sizes must be at least 1 but are 0 x 0"),
    ("block-mask-huge-rows", "pagedc.create_block_mask(mods, 1, 1, 2**40, 2**40)",
     "block mask lengths must be from 1 to 2147483647"),
    ("from-kv-blocks-past-end",
     "pagedc.BlockMask.from_kv_blocks(np.ones((1, 1, 1), np.int32), "
     "np.full((1, 1, 1, 2), 99, np.int32), BLOCK_SIZE=4)",
     "lists partial kv block 99, outside [0, 2)"),
    ("merge-state-f64",
     "x = np.zeros((2, 2, 8)); s = np.zeros((2, 2))\npagedc.merge_state(x, s, x, s)",
     "v_a must be f32, bf16 or f16 but is f64"),
    ("flex-negative-threads", "pagedc.flex_attention(q, k, v, mods=mods, threads=-1)",
     "threads must not be negative but is -1"),
    ("flex-kv-length-past-keys", "pagedc.flex_attention(q, k, v, mods=mods, kv_length=[2**40])",
     "kv_length: 1099511627776 does not fit in int32"),
    ("flex-reversed-query", "pagedc.flex_attention(q[:, :, ::-1], k, v, mods=mods)",
     "q has negative stride -8 in dimension 2"),
    # CUDA memory on the emulated device (device="emu").
    ("device-unknown", "pagedc.empty((2,), 'f32', device='tpu')",
     "device: expected 'cpu', 'emu', 'cuda' or 'cuda:N'"),
    ("device-4tib", "pagedc.empty((2**40,), 'f32', device='emu')",
     "cuMemAlloc of 4398046511104 bytes on cuda:0 failed"),
    ("device-size-overflow", "pagedc.empty((2**40, 2**40), 'f32', device='emu')",
     "shape: the tensor's size in bytes overflows size_t"),
    ("device-to-host-of-host", "pagedc.to_host(q)", "tensor: must be in CUDA memory"),
    ("device-bad-dlpack-stream", "pagedc.to_device(q, device='emu').__dlpack__(stream='x')",
     "stream: expected an int"),
    ("device-host-keys",
     "m = pagedc.compile('mask causal(b, h, q, kv) = q >= kv\\n', cuda=True)\n"
     "pagedc.flex_attention(pagedc.to_device(q.astype(np.float16), device='emu'), "
     "k.astype(np.float16), v.astype(np.float16), mods=m)",
     "k: is on cpu but q is on cuda:0"),
]

if module_python and module_dir:
    for name, body, keyword in PY_CASES:
        case("python-" + name, [module_python, "-c", PY_PRELUDE + body], 1, keyword,
             env={"PYTHONPATH": module_dir, "PYTHONDONTWRITEBYTECODE": "1"})
    # PAGEDC_CACHE_DIR in Python: pagedc.Error when the first kernel is
    # needed, before it is built.
    PY_EMU_CALL = ("m = pagedc.compile('mask causal(b, h, q, kv) = q >= kv\\n', cuda=True)\n"
                   "d = lambda x: pagedc.to_device(x.astype(np.float16), device='emu')\n"
                   "pagedc.flex_attention(d(randn(1, 2, 3, 64)), d(randn(1, 2, 5, 64)), "
                   "d(randn(1, 2, 5, 64)), mods=m)")
    for name, path, keyword in [
            ("file", PLAIN, "it is a regular file, not a directory"),
            ("fifo", FIFO, "it is a FIFO, not a directory"),
            ("dangling-symlink", DANGLING, "it is a dangling symbolic link"),
            ("empty", "", "PAGEDC_CACHE_DIR is set but empty")]:
        case("python-cache-env-" + name, [module_python, "-c", PY_PRELUDE + PY_EMU_CALL], 1,
             ["pagedc.Error", keyword],
             env={"PYTHONPATH": module_dir, "PYTHONDONTWRITEBYTECODE": "1",
                  "PAGEDC_CACHE_DIR": path})

# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------

# Sets the address-space limit, then becomes the command (so that wait4's
# usage is the command's own).
LIMITED = ("import os, resource, sys\n"
           "resource.setrlimit(resource.RLIMIT_AS, (%d, %d))\n"
           "os.execvp(sys.argv[1], sys.argv[1:])\n" % (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


def snapshot(root):
    """Every path under `root` with its type, size, mtime and link target."""
    found = {}
    for directory, subdirs, files in os.walk(root):
        for name in subdirs + files:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            found[os.path.relpath(path, root)] = (
                stat.S_IFMT(info.st_mode), info.st_size, info.st_mtime_ns,
                os.readlink(path) if stat.S_ISLNK(info.st_mode) else None)
    return found


def run(c):
    os.makedirs(c.dir, exist_ok=True)
    argv = c.argv(c.dir) if callable(c.argv) else c.argv
    env = dict(os.environ)
    env.update(c.env(c.dir) if callable(c.env) else c.env)
    before = snapshot(c.dir)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        process = subprocess.Popen([sys.executable, "-c", LIMITED] + argv, stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=err, env=env, cwd=c.dir,
                                   start_new_session=True)
        timed_out = False
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - start > TIME_LIMIT:
                timed_out = True
                os.killpg(process.pid, 9)
                pid, status, usage = os.wait4(process.pid, 0)
                break
            time.sleep(0.005)
        elapsed = time.monotonic() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    problems = []
    if timed_out:
        problems.append("still running after %.0f s" % TIME_LIMIT)
    elif process.returncode < 0:
        problems.append("killed by signal %d" % -process.returncode)
    elif process.returncode != c.status:
        problems.append("exit %d, expected %d" % (process.returncode, c.status))
    for keyword in c.keywords:
        if keyword not in text:
            problems.append("no '%s' on stderr" % keyword[:120])
    peak = usage.ru_maxrss * 1024
    if peak > PEAK_RSS_BOUND:
        problems.append("peak RSS %d MiB over the bound" % (peak >> 20))
    after = snapshot(c.dir)
    if after != before:
        changed = sorted(set(after.items()) ^ set(before.items()))
        problems.append("the case directory changed: %s" % [p for p, _ in changed][:5])
    last = text.strip().splitlines()[-1][:200] if text.strip() else ""
    return c, problems, elapsed, peak, last


inputs_before = snapshot(inputs)
with ThreadPoolExecutor(max_workers=2) as pool:
    results = list(pool.map(run, cases))
inputs_intact = snapshot(inputs) == inputs_before
# The sparse files claim 21 GB between them; leave none of that behind.
for path in (huge_header, long_kv):
    os.unlink(path)
for path in (READ_ONLY, UNREADABLE):
    os.chmod(path, 0o755)

failures = 0
slowest, largest = 0.0, 0
for c, problems, elapsed, peak, last in results:
    slowest, largest = max(slowest, elapsed), max(largest, peak)
    if problems:
        failures += 1
        print("FAIL %s: %s (stderr: %s)" % (c.name, "; ".join(problems), last))
    else:
        print("ok %s%s" % (c.name, " | " + last if show else ""))
if not inputs_intact:
    failures += 1
    print("FAIL inputs: the shared inputs changed")
if len(cases) < MIN_CASES:
    failures += 1
    print("FAIL count: %d cases, fewer than %d" % (len(cases), MIN_CASES))
print("hostile-sweep: slowest case %.1f s, largest peak RSS %d MiB (bound %d MiB)"
      % (slowest, largest >> 20, PEAK_RSS_BOUND >> 20))
if failures:
    print("hostile-sweep: %d of %d cases failed" % (failures, len(cases)))
    sys.exit(1)
print("hostile-sweep: %d cases, all as expected" % len(cases))
