#!/usr/bin/env python3
"""Sweeps of `pagedc run` file-system cases and of kernel-cache entries that
are not regular files (issue 10) or not of a size an entry can have (issue
47: truncated, extended, sparse 64 GiB). Each case checks the exit status,
that the error names the right option or file, and what the file system
holds after; it prints one 'ok CASE' line, or 'FAIL CASE: why' and exits 1
at the end. ARCH (cache mode) is pagedc-jit's --arch, e.g. emu for emulator
images.

  run_hardening.py outputs|inputs|cache WORKDIR EXAMPLES_DIR [ARCH]
"""
import os
import stat
import struct
import subprocess
import sys

mode, work, examples = sys.argv[1], sys.argv[2], sys.argv[3]
arch = sys.argv[4] if len(sys.argv) > 4 else None
failures = []


def npy(path, shape, data=None, descr="<f4"):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, "".join("%d, " % s for s in shape))
    while (10 + len(header) + 1) % 64:
        header += " "
    header += "\n"
    count = 1
    for s in shape:
        count *= s
    if data is None:
        data = struct.pack("<%df" % count, *[((i * 7919) % 97) / 97.0 - 0.5 for i in range(count)])
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)


def run(args, timeout=120):
    try:
        r = subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=timeout)
        return r.returncode, r.stderr + r.stdout
    except subprocess.TimeoutExpired:
        return "timeout", ""


def check(name, condition, why):
    if condition:
        print("ok", name)
    else:
        print("FAIL %s: %s" % (name, why))
        failures.append(name)


def listing(directory):
    return sorted(os.listdir(directory))


def snapshot(paths):
    out = {}
    for p in paths:
        try:
            st = os.lstat(p)
            data = open(p, "rb").read() if stat.S_ISREG(st.st_mode) else None
            out[p] = (st.st_mode, st.st_ino, data, os.readlink(p) if stat.S_ISLNK(st.st_mode) else None)
        except OSError:
            out[p] = None
    return out


os.makedirs(work, exist_ok=True)
# A copy of the program: the outputs sweep writes onto the program's path when
# pagedc regresses, which must never damage the source tree.
program = os.path.join(work, "causal.attn")
with open(os.path.join(examples, "causal.attn")) as source, open(program, "w") as copy:
    copy.write(source.read())
q, k, v = (os.path.join(work, n) for n in ("q.npy", "k.npy", "v.npy"))
npy(q, (1, 2, 3, 8))
npy(k, (1, 1, 19, 8))
npy(v, (1, 1, 19, 8))
base = ["pagedc", "run", program, "--mask=causal", "--q", q, "--k", k, "--v", v,
        "--device", "cpu"]

if mode == "outputs":
    inputs = {"program": program, "--q": q, "--k": k, "--v": v}
    os.symlink(k, os.path.join(work, "link-to-k.npy"))
    os.makedirs(os.path.join(work, "sub"))
    # An output that is an input, however it is spelt: the same path, a
    # relative path, a ./ path, a symlink, a hard link; for -o and --lse.
    os.link(v, os.path.join(work, "hard-v.npy"))
    spellings = []
    for role, path in inputs.items():
        spellings.append((role, path))
        spellings.append((role, os.path.join(os.path.dirname(path), ".", os.path.basename(path))))
        spellings.append((role, os.path.relpath(path)))
    spellings.append(("--k", os.path.join(work, "link-to-k.npy")))
    spellings.append(("--v", os.path.join(work, "hard-v.npy")))
    for option in ("-o", "--lse"):
        for role, path in spellings:
            before = snapshot(inputs.values())
            args = base + ["-o", os.path.join(work, "out.npy")]
            if option == "-o":
                args = base + ["-o", path]
            else:
                args = args + ["--lse", path]
            status, text = run(args)
            name = "%s=%s(%s)" % (option, role, os.path.basename(path))
            check(name, status == 1 and "same file as the input %s" % role in text
                  and snapshot(inputs.values()) == before
                  and "out.npy" not in listing(work),
                  "status %s, output %r" % (status, text))
    # -o X --lse X, spelt the same or differently; --lse a directory; -o a
    # directory; an output in a directory that does not exist: exit 1, no file.
    out = os.path.join(work, "o.npy")
    for name, extra in [("same-path", ["-o", out, "--lse", out]),
                        ("same-path-dot", ["-o", out, "--lse", os.path.join(work, ".", "o.npy")]),
                        ("lse-dir", ["-o", out, "--lse", os.path.join(work, "sub")]),
                        ("lse-dir-slash", ["-o", out, "--lse", os.path.join(work, "sub") + "/"]),
                        ("out-dir", ["-o", os.path.join(work, "sub"), "--lse", out]),
                        ("lse-missing-dir", ["-o", out, "--lse", os.path.join(work, "nodir", "l.npy")])]:
        before = listing(work)
        status, text = run(base + extra)
        check("all-or-none:" + name, status == 1 and listing(work) == before
              and listing(os.path.join(work, "sub")) == [],
              "status %s, files %s, output %r" % (status, listing(work), text))
    # Devices are written in place; a symlink is written through (the link
    # stays, its target gets the output); a dangling symlink is refused.
    status, text = run(base + ["-o", "/dev/null", "--lse", "/dev/null"])
    check("dev-null", status == 0 and stat.S_ISCHR(os.stat("/dev/null").st_mode), text)
    target = os.path.join(work, "target.npy")
    npy(target, (1,))
    link = os.path.join(work, "link.npy")
    os.symlink(target, link)
    status, text = run(base + ["-o", link])
    check("symlink-through", status == 0 and os.path.islink(link)
          and os.path.getsize(target) > 100, text)
    dangling = os.path.join(work, "dangling.npy")
    os.symlink(os.path.join(work, "nowhere.npy"), dangling)
    status, text = run(base + ["-o", dangling])
    check("symlink-dangling", status == 1 and os.path.islink(dangling)
          and not os.path.exists(os.path.join(work, "nowhere.npy")), text)
    fifo = os.path.join(work, "fifo")
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", fifo], stdout=subprocess.PIPE)
    status, text = run(base + ["-o", fifo])
    data = reader.communicate(timeout=60)[0]
    check("fifo-in-place", status == 0 and stat.S_ISFIFO(os.lstat(fifo).st_mode)
          and data[:6] == b"\x93NUMPY", text)
    # No temporary files left anywhere.
    check("no-temporaries", not [f for f in listing(work) if ".tmp-" in f], listing(work))

elif mode == "inputs":
    os.makedirs(os.path.join(work, "adir"), exist_ok=True)
    fifo = os.path.join(work, "in.fifo")
    os.mkfifo(fifo)
    cases = {"directory": os.path.join(work, "adir"), "dev-zero": "/dev/zero",
             "fifo": fifo, "dev-null": "/dev/null"}
    big = os.path.join(work, "big.npy")
    for option in ("--q", "--k", "--v"):
        for name, path in cases.items():
            args = list(base) + ["-o", os.path.join(work, "o.npy")]
            args[args.index(option) + 1] = path
            status, text = run(args, timeout=60)
            check("%s=%s" % (option, name), status == 1 and ("npy file '%s'" % path) in text
                  and "o.npy" not in listing(work), "status %s, output %r" % (status, text))
    # --buffer with a directory: mods.attn's sliding/capped reads `slopes`.
    mods = os.path.join(examples, "mods.attn")
    args = ["pagedc", "run", mods, "--mask=sliding", "--score=capped", "--q", q, "--k", k,
            "--v", v, "-o", os.path.join(work, "o.npy"), "--device", "cpu"]
    for name, path in cases.items():
        status, text = run(args + ["--buffer", "slopes=" + path], timeout=60)
        check("--buffer=" + name, status == 1 and ("npy file '%s'" % path) in text, text)
    # Headers whose byte size overflows 64 bits (or int64): rejected, naming
    # the file, with nothing allocated. A generated sweep over dtypes/extents.
    for descr, size in (("<f4", 4), ("<f2", 2), ("|u1", 1), ("<f8", 8)):
        for shape in ((2**62, 4), (2**61, 2**3), (2**32, 2**32), (1, 2**62), (2**61, 3),
                      (3, 3, 2**61), (2**31, 2**31, 4, 1)):
            path = os.path.join(work, "ovf.npy")
            npy(path, shape, data=b"", descr=descr)
            args = list(base) + ["-o", os.path.join(work, "o.npy")]
            args[args.index("--q") + 1] = path
            status, text = run(args)
            count = 1
            for s in shape:
                count *= s
            expect = "overflows 64 bits" if count * size >= 2**63 else "truncated data"
            check("overflow %s %s" % (descr, shape), status == 1 and expect in text
                  and ("npy file '%s'" % path) in text, "status %s, output %r" % (status, text))
    # An empty dimension names the file that has it (k, not q).
    kz, vz = os.path.join(work, "kz.npy"), os.path.join(work, "vz.npy")
    npy(kz, (1, 1, 0, 8), data=b"")
    npy(vz, (1, 1, 0, 8), data=b"")
    args = list(base) + ["-o", os.path.join(work, "o.npy")]
    args[args.index("--k") + 1] = kz
    args[args.index("--v") + 1] = vz
    status, text = run(args)
    check("names-k", status == 1 and "npy file '%s'" % kz in text, text)

elif mode == "cache":
    jit = ["pagedc-jit", program, "--mask=causal", "--kernel=decode",
           "--cache-dir=" + work, "--stats=-"] + (["--arch=" + arch] if arch else [])
    status, text = run(jit, timeout=300)
    check("first-build", status == 0, text)
    entries = [f for f in listing(work) if f.endswith(".kernel") or f.endswith(".variant")]
    # The decode's split-kernel and merge units (KernelCache::Modules) and
    # the variant.
    check("entries", len(entries) == 3, entries)
    intact = {e: open(os.path.join(work, e), "rb").read() for e in entries}

    def rewrite(p, data):
        with open(p, "wb") as f:
            f.write(data)

    def sparse(p, size):
        with open(p, "wb") as f:
            f.truncate(size)

    damages = {
        "truncated": lambda p: rewrite(p, intact[os.path.basename(p)][:-100]),
        "extended": lambda p: rewrite(p, intact[os.path.basename(p)] + b"\0" * 4096),
        # Read into a buffer sized from the file, this allocated 64 GiB.
        "sparse-64g": lambda p: sparse(p, 64 << 30),
        "fifo": lambda p: os.mkfifo(p),
        "symlink-dev-zero": lambda p: os.symlink("/dev/zero", p),
        "symlink-dir": lambda p: os.symlink(work, p),
        "symlink-dangling": lambda p: os.symlink(os.path.join(work, "nowhere"), p),
        "directory": lambda p: (os.makedirs(os.path.join(p, "sub")),
                                open(os.path.join(p, "sub", "x"), "w").close()),
    }
    for entry in entries:
        path = os.path.join(work, entry)
        for name, damage in damages.items():
            if os.path.isdir(path) and not os.path.islink(path):
                subprocess.run(["rm", "-rf", path])
            else:
                os.unlink(path)
            damage(path)
            status, text = run(jit, timeout=60)
            st = os.lstat(path)
            check("%s %s" % (entry.split(".")[-1], name),
                  status == 0 and stat.S_ISREG(st.st_mode) and os.path.exists("/dev/zero")
                  and os.path.isdir(work),
                  "status %s, mode %o, output %r" % (status, st.st_mode, text))
    status, text = run(jit + ["--require-hit"], timeout=60)
    check("hit-after-rebuild", status == 0 and "outcome=variant-hit" in text, text)

sys.exit(1 if failures else 0)
