#!/usr/bin/env python3
"""Writes a float32 .npy file of the given shape whose data is a hole: the
file has its full size but occupies no disk blocks, so tests can hand pagedc
inputs of gigabytes.

  sparse_npy.py OUT 1,1,4194304,256
"""
import sys

out, shape = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % "".join(
    "%d, " % s for s in shape)
while (10 + len(header) + 1) % 64:
    header += " "
header += "\n"
count = 1
for s in shape:
    count *= s
with open(out, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())
    f.truncate(f.tell() + 4 * count)
