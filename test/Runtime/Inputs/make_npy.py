#!/usr/bin/env python3
"""Writes a random .npy array (pure Python, no NumPy) for the Runtime tests.

  make_npy.py OUT --shape 1,2,37,16 [--dtype f4|f2|bf16|i4|i8|b1] [--seed S]
              [--low L --high H] [--sorted] [--values 1,2,3]
              [--segments 20,25,8] [--segment-starts 20,25,8]
              [--climb START,STEP[,PEAK]]
              [--corrupt magic|truncate|fortran|version]

Values are uniform in [low, high) and never exactly zero (floats); --sorted
sorts each last-dimension row (document ids); --values writes the given
values. --segments N0,N1,... writes document ids (N0 zeros, N1 ones, ...);
--segment-starts N0,N1,... writes where each of those documents starts.
--climb sets the first element of each last-dimension row to START + STEP *
i (i: the row's index along the dimension before the last), rounded to a
value bf16 holds exactly, so that device runs (bf16 inputs) and the f32 /
float64 reference see the same number: queries and keys whose scores
climb along the keys. With PEAK the value climbs up to row PEAK and falls
by STEP a row after it (START + STEP * (PEAK - |i - PEAK|)): scores that
climb over the first tiles and fall over the rest, so that row maxima move
and then stand. --corrupt damages the file the way the named error case needs.
"""
import argparse
import math
import random
import struct

DESCR = {"f4": "<f4", "f2": "<f2", "bf16": "<u2", "i4": "<i4", "i8": "<i8",
         "b1": "|b1"}


def half_bits(value):
    return struct.unpack("<H", struct.pack("<e", value))[0]


def bf16_bits(value):
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    bits += 0x7FFF + ((bits >> 16) & 1)  # round to nearest even
    return (bits >> 16) & 0xFFFF


def encode(dtype, values):
    if dtype == "f4":
        return struct.pack("<%df" % len(values), *values)
    if dtype == "f2":
        return struct.pack("<%dH" % len(values), *[half_bits(v) for v in values])
    if dtype == "bf16":
        return struct.pack("<%dH" % len(values), *[bf16_bits(v) for v in values])
    if dtype == "i4":
        return struct.pack("<%di" % len(values), *[int(v) for v in values])
    if dtype == "i8":
        return struct.pack("<%dq" % len(values), *[int(v) for v in values])
    return bytes(1 if v else 0 for v in values)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--shape", required=True)
    parser.add_argument("--dtype", default="f4", choices=sorted(DESCR))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--low", type=float, default=-1.0)
    parser.add_argument("--high", type=float, default=1.0)
    parser.add_argument("--sorted", action="store_true")
    parser.add_argument("--values")
    parser.add_argument("--segments")
    parser.add_argument("--segment-starts")
    parser.add_argument("--climb")
    parser.add_argument("--corrupt",
                        choices=["magic", "truncate", "fortran", "version"])
    args = parser.parse_args()

    shape = [int(d) for d in args.shape.split(",") if d]
    count = math.prod(shape)
    rng = random.Random(args.seed)
    if args.segments:
        sizes = [int(n) for n in args.segments.split(",")]
        values = [i for i, n in enumerate(sizes) for _ in range(n)]
    elif args.segment_starts:
        sizes = [int(n) for n in args.segment_starts.split(",")]
        values = [sum(sizes[:i]) for i in range(len(sizes))]
    elif args.values:
        values = [float(v) for v in args.values.split(",")]
        assert len(values) == count, "--values needs %d values" % count
    elif args.dtype in ("i4", "i8", "b1"):
        values = [rng.randrange(int(args.low), int(args.high)) for _ in range(count)]
    else:
        values = []
        while len(values) < count:
            value = rng.uniform(args.low, args.high)
            if value != 0.0:
                values.append(value)
    if args.climb:
        start, step, *peak = (float(x) for x in args.climb.split(","))
        row, rows = shape[-1], shape[-2]
        for index in range(0, count, row):
            i = (index // row) % rows
            climbed = start + step * (peak[0] - abs(i - peak[0]) if peak else i)
            values[index] = struct.unpack("<f", struct.pack("<I", bf16_bits(climbed) << 16))[0]
    if args.sorted and shape:
        row = shape[-1]
        values = [v for start in range(0, count, row)
                  for v in sorted(values[start:start + row])]

    fortran = "True" if args.corrupt == "fortran" else "False"
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (
        DESCR[args.dtype], fortran, dims)
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    magic = b"\x93NUMPX" if args.corrupt == "magic" else b"\x93NUMPY"
    version = b"\x07\x00" if args.corrupt == "version" else b"\x01\x00"
    data = encode(args.dtype, values)
    if args.corrupt == "truncate":
        data = data[: len(data) // 2]
    with open(args.out, "wb") as out:
        out.write(magic + version + struct.pack("<H", len(header)))
        out.write(header.encode("latin1"))
        out.write(data)


if __name__ == "__main__":
    main()
