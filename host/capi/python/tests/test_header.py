"""The module's constants and struct layouts are the committed header's: a change to
the ABI that the module did not follow fails here."""

import ctypes
import re
from pathlib import Path

import fencekeeper

HEADER = (Path(__file__).resolve().parents[2] / "include" / "fencekeeper_capi.h").read_text()


def defines():
    return {name: int(value) for name, value in re.findall(r"^#define FENCEKEEPER_(\w+) (\d+)$", HEADER, re.M)}


def test_every_constant_of_the_header_has_the_modules_value():
    found = defines()
    assert len(found) > 25
    for name, value in found.items():
        if name.startswith("CLASS_"):
            assert fencekeeper.CLASSES[value] == name.removeprefix("CLASS_").lower(), name
        else:
            assert getattr(fencekeeper, name) == value, name


def struct_fields(name):
    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), HEADER, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    return [re.search(r"\(?\*?(\w+)\)?(\[\w+\])?\s*(\(.*\))?$", decl.strip()).group(1)
            for decl in re.sub(r"\s+", " ", body).split(";") if decl.strip()]


def test_the_structs_have_the_headers_fields_in_order():
    for c_name, py in [("fencekeeper_options", fencekeeper._Options), ("fencekeeper_outcome", fencekeeper._Outcome),
                       ("fencekeeper_mark_store", fencekeeper._MarkStore)]:
        assert struct_fields(c_name) == [f[0] for f in py._fields_], c_name
    assert ctypes.sizeof(fencekeeper._Outcome) > fencekeeper.REASON_CAP
