#!/usr/bin/env python3
"""The Python package as a wheel that carries the C library.

    python_wheel.py PACKAGE_DIR LIBRARY.so VERSION OUT_DIR

writes OUT_DIR/fencekeeper-VERSION-py3-none-linux_ARCH.whl: the package
(host/capi/python/fencekeeper) with libfencekeeper_capi.so in fencekeeper/lib/, where
the package looks first after FENCEKEEPER_CAPI_LIB. `pip install` of the file needs
nothing else: no checkout, no compiler, no network. Written with the standard library
alone (a wheel is a zip with three metadata files), reproducibly (fixed times).

The platform tag is linux_ARCH, not manylinux: the library is built on this machine's
glibc, and no auditwheel checks it against an older one. Install it on the same
distribution it was built on, or set FENCEKEEPER_CAPI_LIB to a library of your own.
"""

import base64
import hashlib
import os
import platform
import sys
import zipfile

EPOCH = (1980, 1, 1, 0, 0, 0)


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main(package_dir, library, version, out_dir):
    tag = f"py3-none-linux_{platform.machine()}"
    files = []
    for name in sorted(os.listdir(package_dir)):
        if name.endswith(".py"):
            with open(os.path.join(package_dir, name), "rb") as f:
                files.append((f"fencekeeper/{name}", f.read(), 0o644))
    with open(library, "rb") as f:
        files.append(("fencekeeper/lib/libfencekeeper_capi.so", f.read(), 0o755))
    info = f"fencekeeper-{version}.dist-info"
    files.append((f"{info}/METADATA", (
        "Metadata-Version: 2.1\n"
        "Name: fencekeeper\n"
        f"Version: {version}\n"
        "Summary: Fencing for storage engines in Python: a ctypes layer over libfencekeeper_capi, bundled.\n"
        "License: Apache-2.0\n"
        "Requires-Python: >=3.9\n").encode(), 0o644))
    files.append((f"{info}/WHEEL", (
        "Wheel-Version: 1.0\n"
        "Generator: fencekeeper scripts/lib/python_wheel.py\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {tag}\n").encode(), 0o644))
    record = "\n".join([record_line(n, d) for n, d, _ in files] + [f"{info}/RECORD,,", ""])
    files.append((f"{info}/RECORD", record.encode(), 0o644))
    out = os.path.join(out_dir, f"fencekeeper-{version}-{tag}.whl")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data, mode in files:
            entry = zipfile.ZipInfo(name, EPOCH)
            entry.external_attr = (0o100000 | mode) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(entry, data)
    print(out)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: python_wheel.py PACKAGE_DIR LIBRARY.so VERSION OUT_DIR")
    main(*sys.argv[1:])
