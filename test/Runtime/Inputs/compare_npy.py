#!/usr/bin/env python3
"""Compares two f32 .npy files (pure Python): same shape, no NaN, and
max |a - b| <= atol (infinities must match exactly).

  compare_npy.py A B [--atol 1e-4] [--expect-different]

Prints the shape and the max difference; exit status 0 when the files agree
(or, with --expect-different, when they do not), 1 otherwise.
"""
import argparse
import ast
import math
import struct
import sys


def read_npy(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY":
        sys.exit("%s: not a .npy file" % path)
    major = data[6]
    if major == 1:
        length = struct.unpack("<H", data[8:10])[0]
        start = 10
    else:
        length = struct.unpack("<I", data[8:12])[0]
        start = 12
    header = ast.literal_eval(data[start:start + length].decode("latin1"))
    if header["descr"] != "<f4" or header["fortran_order"]:
        sys.exit("%s: expected a C-order <f4 array, got %s" % (path, header))
    shape = tuple(header["shape"])
    count = math.prod(shape)
    body = data[start + length:]
    if len(body) != 4 * count:
        sys.exit("%s: %d data bytes for shape %s" % (path, len(body), shape))
    return shape, struct.unpack("<%df" % count, body)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument("--expect-different", action="store_true")
    parser.add_argument("--rel-l2", type=float, default=None,
                        help="agree when ||a - b|| / ||b|| <= this (instead "
                             "of --atol); NaN or infinite elements never agree")
    args = parser.parse_args()
    shape_a, a = read_npy(args.a)
    shape_b, b = read_npy(args.b)
    if shape_a != shape_b:
        print("shapes differ: %s vs %s" % (shape_a, shape_b))
        return 1
    worst = 0.0
    bad = 0
    for x, y in zip(a, b):
        if math.isnan(x) or math.isnan(y):
            bad += 1
        elif math.isinf(x) or math.isinf(y):
            bad += x != y
        else:
            worst = max(worst, abs(x - y))
    if args.rel_l2 is not None:
        finite = [(x, y) for x, y in zip(a, b)
                  if math.isfinite(x) and math.isfinite(y)]
        bad = len(a) - len(finite)
        norm = math.sqrt(sum(y * y for _, y in finite))
        error = math.sqrt(sum((x - y) ** 2 for x, y in finite))
        rel = error / norm if norm > 0 else (0.0 if error == 0 else math.inf)
        agree = bad == 0 and rel <= args.rel_l2
        print("shape %s relative L2 %.3g %s" % (
            list(shape_a), rel, "agree" if agree else "DIFFER"))
        if bad:
            print("%d NaN or infinite elements" % bad)
        return 0 if agree != args.expect_different else 1
    agree = bad == 0 and worst <= args.atol
    print("shape %s max abs diff %.3g %s" % (
        list(shape_a), worst, "agree" if agree else "DIFFER"))
    if bad:
        print("%d NaN or mismatched infinite elements" % bad)
    return 0 if agree != args.expect_different else 1


if __name__ == "__main__":
    sys.exit(main())
