#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (test/fuzz/corpus/<target>/).

Deterministic: the same files every run, so the committed corpus can be
checked with `make_corpus.py --check`. Seeds are small, valid inputs plus a
few near misses for each input surface:

  attn/          examples/*.attn and a few hand-written edge cases
  npy/           .npy files of every supported dtype and version, and
                 malformed ones (bad magic, Fortran order, big endian,
                 truncated data, overflowing shapes, bad headers)
  bundle/        bundle manifests (KernelBundle.h), valid and not
  cache-entry/   kernel-cache entries and variant files in the target's
                 "resealed" form (header lines, empty line, payload), and mod
                 declarations
  runtime-api/   byte streams decoded into runtime API calls
"""
import argparse
import json
import os
import random
import shutil
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def npy(descr, shape, data=b"", version=(1, 0), fortran=False, header=None):
    if header is None:
        header = "{'descr': '%s', 'fortran_order': %s, 'shape': %r, }" % (
            descr, "True" if fortran else "False", tuple(shape))
    size_bytes = 2 if version[0] == 1 else 4
    total = 6 + 2 + size_bytes + len(header) + 1
    header = header + " " * ((64 - total % 64) % 64) + "\n"
    length = struct.pack("<H" if size_bytes == 2 else "<I", len(header))
    return b"\x93NUMPY" + bytes(version) + length + header.encode("latin1") + data


def npy_seeds():
    f32 = struct.pack("<6f", 1, -2, 3.5, 0, float("inf"), float("nan"))
    seeds = {
        "f32-2x3.npy": npy("<f4", (2, 3), f32),
        "f64-3.npy": npy("<f8", (3,), struct.pack("<3d", 1, 2, 3)),
        "f16-4.npy": npy("<f2", (4,), struct.pack("<4H", 0x3C00, 0x7BFF, 0x8000, 0x7E00)),
        "u2-bf16-2x2.npy": npy("<u2", (2, 2), struct.pack("<4H", 0x3F80, 0x4000, 0xFF80, 0x7FC0)),
        "i32-1x2x2.npy": npy("<i4", (1, 2, 2), struct.pack("<4i", -1, 0, 2**31 - 1, -2**31)),
        "i64-2.npy": npy("<i8", (2,), struct.pack("<2q", 2**40, -5)),
        "u1-5.npy": npy("|u1", (5,), bytes([0, 1, 2, 254, 255])),
        "b1-3.npy": npy("|b1", (3,), bytes([0, 1, 1])),
        "scalar.npy": npy("<f4", (), struct.pack("<f", 7)),
        "empty-0x4.npy": npy("<f4", (0, 4)),
        "v2-f32-4.npy": npy("<f4", (4,), struct.pack("<4f", 1, 2, 3, 4), version=(2, 0)),
        "v3-i32-2.npy": npy("<i4", (2,), struct.pack("<2i", 1, 2), version=(3, 0)),
        "rank6.npy": npy("<f4", (1, 1, 1, 1, 1, 2), struct.pack("<2f", 1, 2)),
        # Near misses: each must be rejected with pagedc::Error.
        "bad-magic.npy": b"\x93NUMPZ" + npy("<f4", (1,), b"\0" * 4)[6:],
        "bad-version.npy": npy("<f4", (1,), b"\0" * 4, version=(4, 0)),
        "fortran.npy": npy("<f4", (2, 2), b"\0" * 16, fortran=True),
        "big-endian.npy": npy(">f4", (2,), b"\0" * 8),
        "unsupported-dtype.npy": npy("<c8", (1,), b"\0" * 8),
        "truncated.npy": npy("<f4", (4,), b"\0" * 10),
        "padded.npy": npy("<f4", (1,), b"\0" * 8),
        "negative-dim.npy": npy("<f4", (-1,), b""),
        "overflow-shape.npy": npy("<f8", (2**62, 2**62), b""),
        "overflow-bytes.npy": npy("<f8", (2**61,), b""),
        "huge-dim.npy": npy("<f4", (99999999999999999999999,), b""),
        "header-not-dict.npy": npy("", (), b"", header="[1, 2, 3]"),
        "header-missing-shape.npy": npy("", (), b"", header="{'descr': '<f4', 'fortran_order': False}"),
        "header-extra-key.npy": npy("", (), b"\0" * 4,
                                    header="{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}"),
        "header-unterminated.npy": b"\x93NUMPY\x01\x00\x40\x00{'descr': '<f4', 'shape': (1,",
        "header-length-past-end.npy": b"\x93NUMPY\x01\x00\xff\xff{'descr': '<f4'}\n",
        "header-no-newline.npy": npy("", (), b"\0" * 4,
                                     header="{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }")[:-5] + b"     " + b"\0" * 4,
        "shape-spaces.npy": npy("", (), b"\0" * 8,
                                header="{'shape':(  2 ,  ),'fortran_order':False,'descr':'<f4'}"),
        "only-magic.npy": b"\x93NUMPY",
        "empty.npy": b"",
    }
    return seeds


MODULE = {
    "file": "decode-0123456789abcdef0123456789abcdef.cubin",
    "arch": "sm_90",
    "key": "0123456789abcdef0123456789abcdef",
    "checksum": "0123456789abcdef",
    "image": "cubin",
    "kernels": ["pagedc_decode", "pagedc_decode_merge"],
    "threads": 128,
    "shared_memory": 83456,
    "config": {"kind": "decode", "dtype": "bf16", "head_dim": 128, "page_size": 16,
               "block_m": 64, "block_n": 64, "group_size": 4, "query_tokens": 1,
               "return_lse": False, "params_size": -1},
    "mods": "causal",
}


def bundle_seeds():
    def manifest(modules, **top):
        doc = {"format": "pagedc-kernel-bundle", "version": 1, "modules": modules}
        doc.update(top)
        return json.dumps(doc, indent=1).encode()

    prefill = json.loads(json.dumps(MODULE))
    prefill.update(file="prefill-ffff.ptx", image="ptx", kernels=["pagedc_prefill"], arch="sm_80")
    prefill["config"].update(kind="prefill", dtype="f16", head_dim=64, page_size=1,
                             block_m=128, block_n=32, return_lse=True, params_size=24)
    bad_config = json.loads(json.dumps(MODULE))
    bad_config["config"]["head_dim"] = 96
    path_file = dict(MODULE, file="../escape.cubin")
    no_kernels = dict(MODULE, kernels=[])
    huge = json.loads(json.dumps(MODULE))
    huge.update(threads=2**40, shared_memory=-1)
    huge["config"]["group_size"] = 2**31
    return {
        "one-module.json": manifest([MODULE]),
        "two-modules.json": manifest([MODULE, prefill]),
        "empty.json": manifest([]),
        "wrong-version.json": manifest([MODULE], version=2),
        "wrong-format.json": manifest([MODULE], format="other"),
        "bad-config.json": manifest([bad_config]),
        "path-in-file.json": manifest([path_file]),
        "no-kernels.json": manifest([no_kernels]),
        "huge-numbers.json": manifest([huge]),
        "not-object.json": b"[1, 2, 3]",
        "truncated.json": manifest([MODULE])[:200],
        "deep.json": b"[" * 200 + b"]" * 200,
    }


def cache_entry_seeds():
    config = "decode bf16 d128 page16 m64 n64 group4 tokens1 lse0 params-1"
    entry = ("key=0123456789abcdef0123456789abcdef\narch=sm_90\n"
             "kernels=pagedc_decode,pagedc_decode_merge\nconfig=%s\nimage=cubin\n\n"
             "\x7fELF fake cubin bytes" % config)
    declarations = ("param softcap f32 41f00000\nparam window i32 i32:1024\n"
                    "param causal bool bool:1\nbuffer slopes f32 H\n"
                    "buffer doc i32 ?\nbuffer table bf16 4,S,?\n")
    mod_code = "__device__ bool pagedc_mask(int b, int h, int q, int kv) { return q >= kv; }\n"
    variant = ("key=00112233445566778899aabbccddeeff\nplugin=/lib/libpagedc-codegen.so 1 2\n"
               "mask=causal\nscore=capped\nkernels=aaaa,bbbb\ndeclarations_size=%d\n\n%s%s"
               % (len(declarations), declarations, mod_code))
    return {
        "entry.txt": entry.encode(),
        "entry-ptx.txt": entry.replace("image=cubin", "image=ptx").encode(),
        "entry-no-kernels.txt": entry.replace("kernels=pagedc_decode,pagedc_decode_merge",
                                              "kernels=").encode(),
        "variant.txt": variant.encode(),
        "variant-size-past-end.txt": variant.replace(
            "declarations_size=%d" % len(declarations), "declarations_size=99999").encode(),
        "variant-negative-size.txt": variant.replace(
            "declarations_size=%d" % len(declarations), "declarations_size=-1").encode(),
        "declarations.txt": declarations.encode(),
        "declarations-bad.txt": b"param x f32 f32:zz\nbuffer y q 1,2\n",
        "raw-magic-only.txt": b"PAGEDC-KERNEL-CACHE 1\nsize=0\n\n",
        "raw-variant-magic.txt": b"PAGEDC-VARIANT 1\nkey=x\nheader_checksum=0000000000000000\n\n",
    }


def runtime_api_seeds():
    seeds = {}
    rng = random.Random(20261124)
    for i in range(12):
        seeds["random-%02d.bin" % i] = bytes(rng.randrange(256) for _ in range(64 + 48 * i))
    # Streams that start by making a cache (op 0), then reserve/assign/mask.
    for i in range(6):
        body = bytes(rng.randrange(256) for _ in range(200))
        seeds["cache-first-%02d.bin" % i] = b"\x00" * 16 + body
    return seeds


def attn_seeds():
    seeds = {}
    examples = os.path.join(ROOT, "examples")
    for name in sorted(os.listdir(examples)):
        if name.endswith(".attn"):
            with open(os.path.join(examples, name), "rb") as f:
                seeds[name] = f.read()
    seeds["edge-int-ops.attn"] = (
        b"const A = -2147483648\nparam d: i32 = -1\n"
        b"mask m(b, h, q, kv) = (A // d + q % (kv + 1) << 3 >> 31) != (~kv ^ 5)\n"
        b"score s(s, b, h, q, kv) = s * float(q ** 2) + float(int(s / 0.0))\n")
    seeds["edge-buffers.attn"] = (
        b"buffer doc: i32[?]\nbuffer t: f32[S, 4]\nbuffer z: bf16[0]\n"
        b"mask m(b, h, q, kv) = doc[q] == doc[kv + 2000000000]\n"
        b"score s(s, b, h, q, kv) = s + t[q, kv % 4] + float(z[0])\n")
    seeds["edge-nesting.attn"] = (
        b"mask m(b, h, q, kv) = " + b"(" * 40 + b"q >= kv" + b")" * 40 + b"\n"
        b"score s(s, b, h, q, kv) = s" + b" + 1.0" * 60 + b"\n")
    seeds["edge-calls.attn"] = (
        b"mask inner(b, h, q, kv) = q >= kv\n"
        b"mask outer(b, h, q, kv) = inner(b, h, q, kv) & not inner(b, h, kv, q)\n"
        b"score sc(s, b, h, q, kv) {\n  let x = s\n  let y = x * x\n  tanh(y) }\n")
    return seeds


TARGETS = {
    "attn": attn_seeds,
    "npy": npy_seeds,
    "bundle": bundle_seeds,
    "cache-entry": cache_entry_seeds,
    "runtime-api": runtime_api_seeds,
}


def write(out_root):
    for target, make in TARGETS.items():
        directory = os.path.join(out_root, target)
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        for name, data in make().items():
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "corpus"))
    parser.add_argument("--check", action="store_true",
                        help="fail when the committed corpus differs from what this writes")
    args = parser.parse_args()
    if not args.check:
        write(args.out)
        return 0
    with tempfile.TemporaryDirectory() as fresh:
        write(fresh)
        import filecmp
        for target in TARGETS:
            a, b = os.path.join(fresh, target), os.path.join(args.out, target)
            cmp = filecmp.dircmp(a, b)
            if cmp.left_only or cmp.right_only or cmp.diff_files:
                print("corpus/%s differs from make_corpus.py: %s" %
                      (target, cmp.left_only + cmp.right_only + cmp.diff_files))
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
