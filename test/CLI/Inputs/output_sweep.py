#!/usr/bin/env python3
"""Sweeps every output option of every tool (issue 47) against the same set
of destinations: the input itself, a symlink to the input, a symlink to
another file, /dev/null, a FIFO with a reader, '-', /dev/stdout into a pipe,
/dev/full, a file in a read-only directory and a directory. Each case checks
the exit status, the message, what the destination holds after and that the
inputs are untouched; it prints 'ok TOOL OPTION CASE' or 'FAIL ...: why'.
At the end, no temporary file may be left anywhere in the work directory.

  output_sweep.py WORKDIR EXAMPLES_DIR
"""
import os
import shutil
import stat
import struct
import subprocess
import sys
import threading

work, examples = sys.argv[1], sys.argv[2]
failures = []


def check(name, condition, why):
    if condition:
        print("ok", name)
    else:
        print("FAIL %s: %s" % (name, why))
        failures.append(name)


def npy(path, shape):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % (
        "".join("%d, " % s for s in shape))
    while (10 + len(header) + 1) % 64:
        header += " "
    header += "\n"
    count = 1
    for s in shape:
        count *= s
    data = struct.pack("<%df" % count, *[((i * 31) % 17) / 17.0 - 0.5 for i in range(count)])
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)


def run(args, prefix=(), timeout=300):
    r = subprocess.run(list(prefix) + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout)
    return r.returncode, r.stdout, r.stderr.decode(errors="replace")


def contents(paths):
    out = {}
    for p in paths:
        st = os.lstat(p)
        out[p] = (st.st_mode, st.st_ino, open(p, "rb").read())
    return out


# A read-only directory refuses files only to a process without
# CAP_DAC_OVERRIDE: as root, the tool runs with that capability dropped.
read_only_prefix = []
if os.geteuid() == 0:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        print("UNSUPPORTED: root without setpriv cannot test a read-only directory")
        sys.exit(0)
    read_only_prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]

shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
os.chdir(work)
program = os.path.join(work, "causal.attn")
shutil.copyfile(os.path.join(examples, "causal.attn"), program)
q, k, v = (os.path.join(work, n) for n in ("q.npy", "k.npy", "v.npy"))
npy(q, (1, 2, 3, 8))
npy(k, (1, 1, 19, 8))
npy(v, (1, 1, 19, 8))
cache = os.path.join(work, "kernel-cache")
other_out = os.path.join(work, "other-out.npy")
run_base = ["pagedc", "run", program, "--mask=causal", "--q", q, "--k", k, "--v", v,
            "--device", "cpu"]

# (tool and option, argv for an output path, the input an output may not be,
#  every input, what a written output starts with)
tools = [
    ("pagedc -o", lambda o: ["pagedc", program, "-o", o], program, [program], b"module"),
    ("pagedc --emit=ast -o", lambda o: ["pagedc", "--emit=ast", program, "-o", o], program,
     [program], b"Program"),
    ("pagedc run -o", lambda o: run_base + ["-o", o], program, [program, q, k, v],
     b"\x93NUMPY"),
    ("pagedc run --lse", lambda o: run_base + ["-o", other_out, "--lse", o], q,
     [program, q, k, v], b"\x93NUMPY"),
]
jit_base = ["pagedc-jit", program, "--mask=causal", "--kernel=decode", "--cache-dir=" + cache]
if shutil.which("pagedc-jit"):
    # Fill the kernel cache once so that each case below is a cache hit.
    status, _, text = run(jit_base, timeout=600)
    check("pagedc-jit warm-up", status == 0, text)
    tools.append(("pagedc-jit --stats", lambda o: jit_base + ["--stats=" + o], program,
                  [program], b"outcome="))

other = os.path.join(work, "other.txt")
read_only = os.path.join(work, "read-only")
directory = os.path.join(work, "a-directory")
os.makedirs(directory)
os.makedirs(read_only)
os.chmod(read_only, 0o555)

for tool, argv, own_input, inputs, magic in tools:
    def name(case):
        return "%s %s" % (tool, case)

    # The input itself and a symlink to it: refused, the inputs unchanged.
    link_to_input = os.path.join(work, "link-to-input")
    if os.path.lexists(link_to_input):
        os.unlink(link_to_input)
    os.symlink(own_input, link_to_input)
    for case, path in (("input", own_input), ("symlink-to-input", link_to_input)):
        before = contents(inputs)
        status, out, text = run(argv(path))
        check(name(case), status == 1 and "same file as the input" in text
              and contents(inputs) == before and os.path.islink(link_to_input),
              "status %s, %r" % (status, text))

    # A symlink to another file: the target gets the output, the link stays.
    with open(other, "w") as f:
        f.write("old\n")
    os.chmod(other, 0o640)
    link = os.path.join(work, "link-to-other")
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(other, link)
    status, out, text = run(argv(link))
    check(name("symlink-to-other"), status == 0 and os.path.islink(link)
          and open(other, "rb").read().startswith(magic)
          and stat.S_IMODE(os.stat(other).st_mode) == 0o640, "status %s, %r" % (status, text))

    # /dev/null: written in place, still the device.
    status, out, text = run(argv("/dev/null"))
    check(name("/dev/null"), status == 0 and stat.S_ISCHR(os.stat("/dev/null").st_mode),
          "status %s, %r" % (status, text))

    # A FIFO with a reader: the reader gets the output, the FIFO stays.
    fifo = os.path.join(work, "fifo")
    if os.path.lexists(fifo):
        os.unlink(fifo)
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    status, out, text = run(argv(fifo))
    if status != 0:
        # Nothing opened the FIFO for writing: release the reader.
        with open(fifo, "wb"):
            pass
    reader.join(timeout=60)
    check(name("fifo"), status == 0 and got and got[0].startswith(magic)
          and stat.S_ISFIFO(os.lstat(fifo).st_mode), "status %s, %r" % (status, text))

    # '-' and /dev/stdout into a pipe: standard output, no file named '-'.
    for case in ("-", "/dev/stdout"):
        status, out, text = run(argv(case))
        check(name(case), status == 0 and out.startswith(magic)
              and not os.path.lexists(os.path.join(work, "-")),
              "status %s, stdout %r, %r" % (status, out[:20], text))

    # /dev/full: every write is checked; exit 1 with the system's reason.
    status, out, text = run(argv("/dev/full"))
    check(name("/dev/full"), status == 1 and "No space left on device" in text
          and "/dev/full" in text, "status %s, %r" % (status, text))

    # A file in a read-only directory: a clear error, nothing left there.
    status, out, text = run(argv(os.path.join(read_only, "out")), prefix=read_only_prefix)
    check(name("read-only-directory"), status == 1 and "is not writable" in text
          and os.listdir(read_only) == [], "status %s, %r" % (status, text))

    # A directory: refused, left empty.
    status, out, text = run(argv(directory))
    check(name("directory"), status == 1 and "is a directory" in text
          and os.listdir(directory) == [], "status %s, %r" % (status, text))

    # Standard output that is the input (the shell opened it for appending,
    # so nothing is lost): refused.
    before = contents(inputs)
    with open(own_input, "ab") as stdout:
        r = subprocess.run(argv("-"), stdout=stdout, stderr=subprocess.PIPE, timeout=300)
    check(name("stdout-is-the-input"), r.returncode == 1
          and b"same file as the input" in r.stderr and contents(inputs) == before,
          "status %s, %r" % (r.returncode, r.stderr))

# --emit=bundle -o: a directory; an existing file (the input itself included)
# or a directory it cannot write is a clear error before compiling.
status, out, text = run(["pagedc", "--help"])
if "bundle" in out.decode():
    bundle = ["pagedc", "--emit=bundle", "--kernel=decode", program, "--mask=causal", "-o"]
    for case, path, prefix, expect in [
            ("input", program, [], "exists and is not a directory"),
            ("file", other, [], "exists and is not a directory"),
            ("read-only-directory", os.path.join(read_only, "bundle"), read_only_prefix,
             "is not writable"),
            ("read-only-directory-itself", read_only, read_only_prefix, "is not writable"),
            ("/dev/null", "/dev/null", [], "exists and is not a directory")]:
        before = contents([program, other])
        status, out, text = run(bundle + [path], prefix=prefix)
        check("pagedc --emit=bundle -o " + case, status == 1 and expect in text
              and "filesystem_error" not in text and contents([program, other]) == before
              and os.listdir(read_only) == [], "status %s, %r" % (status, text))
    for case in ("-", "/dev/stdout"):
        status, out, text = run(bundle + [case])
        check("pagedc --emit=bundle -o " + case, status == 2 and "writes a directory" in text,
              "status %s, %r" % (status, text))

# No temporary file anywhere.
left = [os.path.join(d, f) for d, _, fs in os.walk(work) for f in fs if ".tmp-" in f]
check("no-temporaries", not left, left)
os.chmod(read_only, 0o755)
sys.exit(1 if failures else 0)
