"""The command line that seeded_bugs.py gives each step script
(packed_step.py, f8_decode_step.py, mla_step.py):

  SCRIPT -o OUT.npy --lse LSE.npy (--device emu | --reference)

--reference writes the float64 reference's out (as f32) and lse, --device
emu the SIMT emulator's. One place, so that the scripts cannot drift apart
in what seeded_bugs.py compares.
"""
import argparse

import numpy as np


def step_main(make_step, reference, run_on_device):
    parser = argparse.ArgumentParser()
    parser.add_argument("-o", dest="out", required=True)
    parser.add_argument("--lse", required=True)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--device", choices=["emu"])
    which.add_argument("--reference", action="store_true")
    args = parser.parse_args()
    step = make_step()
    out, lse = reference(step) if args.reference else run_on_device(step)
    np.save(args.out, np.ascontiguousarray(out, dtype=np.float32))
    np.save(args.lse, np.ascontiguousarray(lse, dtype=np.float32))
