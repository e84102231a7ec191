"""One reader process of tests/stress_mpi.rs (standard library only).

    reader.py VIEW SOURCE SEED              read every file of VIEW once, in a random order
    reader.py VIEW SOURCE SEED --until-gone read random files until the mount goes away

Each file is opened, read with 1-4 random partial reads (os.pread at random offsets and
lengths) and sometimes whole, and every byte is compared with the same file in SOURCE. Exits 1
on the first difference or unexpected error; prints the number of bytes checked.
"""
import errno
import os
import random
import sys


def main():
    view, source, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    until_gone = "--until-gone" in sys.argv[4:]
    rng = random.Random(seed)
    files = [
        os.path.join(c, f) for c in sorted(os.listdir(view)) for f in sorted(os.listdir(os.path.join(view, c)))
    ]
    checked = 0

    def check(rel):
        nonlocal checked
        with open(os.path.join(source, rel), "rb") as f:
            want = f.read()
        fd = os.open(os.path.join(view, rel), os.O_RDONLY)
        try:
            for _ in range(rng.randint(1, 4)):
                off = rng.randrange(len(want) + 1)
                n = rng.randint(1, 1 << 16)
                got = os.pread(fd, n, off)
                if got != want[off:off + n]:
                    sys.exit(f"{view}/{rel}: bytes {off}..{off + n} differ from the source")
                checked += len(got)
            if rng.random() < 0.3:
                got = os.pread(fd, len(want) + 10, 0)
                if got != want:
                    sys.exit(f"{view}/{rel}: whole file differs from the source")
                checked += len(got)
        finally:
            os.close(fd)

    if until_gone:
        print(f"listed {len(files)} files", flush=True)
        while True:
            try:
                check(rng.choice(files))
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTCONN, errno.ENODEV):
                    print(f"mount gone ({e.strerror}) after {checked} bytes checked")
                    return
                raise
    order = list(files)
    rng.shuffle(order)
    for rel in order:
        check(rel)
    print(checked)


if __name__ == "__main__":
    main()
