#!/usr/bin/env python3
"""The filter as an OCI image that Istio's WasmPlugin pulls (`url: oci://...`).

    oci_image.py FILTER.wasm VERSION OUT.tar

writes OUT.tar, an OCI image layout in a tar (skopeo's `oci-archive:`), tagged
VERSION, in the "compat" variant of the Wasm image format: an ordinary image whose
one layer holds the filter as `plugin.wasm`, so that any registry, skopeo and podman
handle it, and Istio (and other fetchers of Wasm images) find the module in it. The
manifest digest is printed, for pinning (`oci://REGISTRY/NAME@sha256:...`).

Every byte is a function of the filter and the version (no timestamps, fixed
owners and modes): rebuilding the same release gives the same digest.
"""

import gzip
import hashlib
import io
import json
import sys
import tarfile


def blob(data):
    """(digest, size) of bytes, as OCI descriptors name them."""
    return "sha256:" + hashlib.sha256(data).hexdigest(), len(data)


def tar_of(files):
    """A reproducible tar of (name, bytes, mode)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def main(filter_path, version, out_path):
    with open(filter_path, "rb") as f:
        wasm = f.read()
    if wasm[:4] != b"\0asm":
        sys.exit(f"oci_image: {filter_path} is not a WebAssembly module")
    layer_tar = tar_of([("plugin.wasm", wasm, 0o444)])
    layer = gzip.compress(layer_tar, mtime=0)
    config = canonical({
        # Docker's and podman's platform for Wasm: the image runs on no OS's kernel.
        "architecture": "wasm",
        "os": "wasip1",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [blob(layer_tar)[0]]},
    })
    annotations = {
        "module.wasm.image/variant": "compat",
        "org.opencontainers.image.title": "fencekeeper_filter.wasm",
        "org.opencontainers.image.description": "Fencekeeper's proxy-wasm filter: fencing tokens checked in front of a store",
        "org.opencontainers.image.version": version,
    }
    (layer_digest, layer_size), (config_digest, config_size) = blob(layer), blob(config)
    manifest = canonical({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest, "size": layer_size,
                    "annotations": {"org.opencontainers.image.title": "plugin.wasm"}}],
        "annotations": annotations,
    })
    manifest_digest, manifest_size = blob(manifest)
    index = canonical({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": manifest_digest, "size": manifest_size,
                       "annotations": {"org.opencontainers.image.ref.name": version}}],
    })
    blobs = [(d.split(":")[1], data) for d, data in
             ((config_digest, config), (layer_digest, layer), (manifest_digest, manifest))]
    layout = tar_of(
        [("oci-layout", canonical({"imageLayoutVersion": "1.0.0"}), 0o444), ("index.json", index, 0o444)]
        + [(f"blobs/sha256/{hexdigest}", data, 0o444) for hexdigest, data in sorted(blobs)]
    )
    with open(out_path, "wb") as f:
        f.write(layout)
    print(manifest_digest)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: oci_image.py FILTER.wasm VERSION OUT.tar")
    main(*sys.argv[1:])
