"""The benchmark's dataset and its two converted forms, all under one store folder:

    STORE/imagefolder/class_CC/img_NNNNNN.jpg   real JPEGs of about --sample-kb KB
    STORE/mds/                                  mosaicml-streaming MDS shards (MDSWriter)
    STORE/litdata/                              litdata chunks (litdata.optimize)

Images are 384x384 noise over a per-class colour, JPEG quality chosen so the mean size is near
the target (noise does not compress, so size follows quality). The converted forms keep the
JPEG bytes untouched (`x`), the class index (`y`) and the ImageFolder name (`name`), written in
ImageFolder order, as a user converting an ImageFolder would. A folder that already holds a
dataset of the same parameters (STORE/params.json) is reused; conversion times are returned
for the report, never counted in epoch time.
"""
import io
import json
import os
import shutil
import time

import numpy as np
from PIL import Image

SIDE = 384


def _jpeg(rng, colour, quality):
    noise = rng.integers(0, 96, size=(SIDE, SIDE, 3), dtype=np.uint8)
    img = np.clip(noise.astype(np.int16) + colour, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _quality_for(target_bytes):
    rng = np.random.default_rng(0)
    best = 90
    for q in range(60, 98):
        if len(_jpeg(rng, np.array([100, 120, 140]), q)) >= target_bytes:
            return q
        best = q
    return best


def make_imagefolder(root, samples, classes, sample_kb, seed=0):
    """Writes `samples` JPEGs spread evenly over `classes` class folders."""
    rng = np.random.default_rng(seed)
    quality = _quality_for(sample_kb * 1000)
    colours = rng.integers(0, 160, size=(classes, 3))
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class_{c:02d}"), exist_ok=True)
    for i in range(samples):
        c = i % classes
        with open(os.path.join(root, f"class_{c:02d}", f"img_{i:06d}.jpg"), "wb") as f:
            f.write(_jpeg(rng, colours[c], quality))


def image_items(root):
    classes = sorted(os.listdir(root))
    for ci, cls in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(root, cls))):
            yield os.path.join(root, cls, f), ci, f"{cls}/{f}"


def convert_mds(src, out, shard_bytes):
    from streaming import MDSWriter

    with MDSWriter(out=out, columns={"x": "bytes", "y": "int", "name": "str"},
                   size_limit=shard_bytes, compression=None) as w:
        for path, y, name in image_items(src):
            with open(path, "rb") as f:
                w.write({"x": f.read(), "y": y, "name": name})


def _lit_item(item):
    path, y, name = item
    with open(path, "rb") as f:
        return {"x": f.read(), "y": y, "name": name}


def convert_litdata(src, out, chunk_bytes):
    from litdata import optimize

    optimize(fn=_lit_item, inputs=list(image_items(src)), output_dir=out,
             chunk_bytes=chunk_bytes, num_workers=1, mode="overwrite")


def prepare(store, samples, classes, sample_kb, shard_bytes, log):
    """Makes (or reuses) every form under `store`; returns {step: seconds} of what it made and
    the dataset's bytes."""
    params = {"samples": samples, "classes": classes, "sample_kb": sample_kb, "shard_bytes": shard_bytes, "side": SIDE}
    pfile = os.path.join(store, "params.json")
    times = {}
    if os.path.exists(pfile) and json.load(open(pfile)).get("params") == params:
        times = json.load(open(pfile))["times"]
        log(f"reusing the dataset in {store}")
    else:
        shutil.rmtree(store, ignore_errors=True)
        os.makedirs(store)
        for step, fn in (("generate", lambda: make_imagefolder(os.path.join(store, "imagefolder"), samples, classes, sample_kb)),
                         ("convert_mds", lambda: convert_mds(os.path.join(store, "imagefolder"), os.path.join(store, "mds"), shard_bytes)),
                         ("convert_litdata", lambda: convert_litdata(os.path.join(store, "imagefolder"), os.path.join(store, "litdata"), shard_bytes))):
            log(f"{step} ...")
            t = time.time()
            fn()
            times[step] = round(time.time() - t, 2)
        json.dump({"params": params, "times": times}, open(pfile, "w"))
    total = sum(os.path.getsize(p) for p, _, _ in image_items(os.path.join(store, "imagefolder")))
    return times, total
