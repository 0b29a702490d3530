"""Sweeps `-D NAME=VALUE` values through `pagedc --emit=ast`: every accepted
value must exit 0 and show up in the tree; every malformed or out-of-range
one must be a usage error (exit 2) that names the value. `pagedc run` parses
its -D values before it opens any file: each rejected value is a usage error
there too, and each accepted one gets past the command line (it then fails
with exit 1 on the missing input files this script names). Prints one line per
failure and `define-sweep: N values, all as expected` when all held."""
import itertools
import subprocess
import sys

pagedc, source = sys.argv[1], sys.argv[2]

accepted = ["0", "7", "4096", "-1", "-0", "007", "2147483647", "-2147483648",
            "0.5", "-0.5", "1.", ".5", "1e3", "1E3", "1e-3", "1e+3", "-1.5e-3",
            "2.5E+10", "inf", "-inf", "3.4028235e38", "-3.4028235e38",
            "340282346638528859811704183484516925440.0", "1e-50", "-1e-50", "1e-400",
            "1e-99999"]
malformed = ["", "-", "--5", "+5", "+inf", " 5", "5 ", "5\t", "1e", "5e", "1e+",
             "1e-", "e5", ".", ".e1", "1.5.2", "0x10", "nan", "-nan", "true",
             "false", "1_000", "5f", "1e3.5", "--inf", "- 5", "inf5", "12abc",
             "\u0661"]
out_of_range = ["2147483648", "-2147483649", "99999999999999999999999",
                "-99999999999999999999999", "1e999", "-1e999", "1e39", "-1e39",
                "3.4028236e38", "-3.4028236e38", "3.5e38", "1.7976931348623157e308",
                "340282366920938463463374607431768211456.0"]
# Generated: every digit count around the i32 limit, both signs.
for digits in range(9, 13):
    for sign in ["", "-"]:
        value = sign + "9" * digits
        (accepted if int(value) in range(-2**31, 2**31) else out_of_range).append(value)
# Generated: every malformed exponent form.
for mantissa, e, sign in itertools.product(["1", "1.", ".5", "2.5"], "eE", ["", "+", "-"]):
    malformed.append(mantissa + e + sign)
    accepted.append(mantissa + e + sign + "2")

failures = 0
def run(value):
    result = subprocess.run([pagedc, "--emit=ast", "-D", "WINDOW=" + value, source],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return result.returncode, result.stdout.decode(), result.stderr.decode()

def run_command(value):
    result = subprocess.run([pagedc, "run", source, "-D", "WINDOW=" + value,
                             "--q", "missing-q.npy", "--k", "missing-k.npy",
                             "--v", "missing-v.npy", "-o", "missing-out.npy"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return result.returncode, result.stdout.decode(), result.stderr.decode()

for value in accepted:
    code, out, err = run_command(value)
    if code != 1 or "missing-q.npy" not in err:
        failures += 1
        print("FAIL run accepted %r: exit %d: %s" % (value, code, err.strip()))
    code, out, err = run(value)
    if code != 0 or "(set by -D)" not in out:
        failures += 1
        print("FAIL accepted %r: exit %d: %s" % (value, code, err.strip()))
for value, reason in [(v, "is not an int or float literal") for v in malformed] + \
                     [(v, "does not fit in i32") for v in out_of_range
                      if "e" not in v and "." not in v] + \
                     [(v, "is out of the range of a float (f32: magnitude at most "
                       "3.40282347e+38; use inf for infinity)") for v in out_of_range
                      if "e" in v or "." in v]:
    expected = "-D WINDOW=%s: the value '%s' %s" % (value, value, reason)
    for command in (run, run_command):
        code, out, err = command(value)
        if code != 2 or expected not in err or out:
            failures += 1
            print("FAIL %s rejected %r: exit %d: %s" % (command.__name__, value, code,
                                                      err.strip()))
total = 2 * (len(accepted) + len(malformed) + len(out_of_range))
if failures:
    print("define-sweep: %d of %d values wrong" % (failures, total))
    sys.exit(1)
print("define-sweep: %d values x (pagedc, pagedc run), all as expected" % (total // 2))
