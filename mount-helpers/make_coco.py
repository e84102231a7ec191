"""Writes a small COCO-shaped detection dataset: real JPEGs and one annotation file.

    python make_coco.py OUT [--images 48] [--size 64]

OUT/train2017/NNNNNNNNNNNN.jpg   one coloured box on noise per image
OUT/annotations/instances_train2017.json   COCO format: images, annotations (bbox [x, y, w,
                                           h], category_id, area, iscrowd), categories
OUT/classes.txt                            one category name per line

Mounted with `--format tree --replicate 'annotations/*' --replicate classes.txt`, every rank's
epoch holds its share of the images and the whole annotation file (docs/layouts.md).
"""
import argparse
import json
import os

import numpy as np
from PIL import Image

CATEGORIES = ["person", "bicycle", "car"]
COLOURS = [(220, 40, 40), (40, 220, 40), (40, 40, 220)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--images", type=int, default=48)
    ap.add_argument("--size", type=int, default=64)
    a = ap.parse_args()
    rng = np.random.default_rng(7)
    os.makedirs(os.path.join(a.out, "train2017"), exist_ok=True)
    os.makedirs(os.path.join(a.out, "annotations"), exist_ok=True)
    images, annotations = [], []
    for i in range(a.images):
        cat = i % len(CATEGORIES)
        img = rng.integers(0, 80, size=(a.size, a.size, 3), dtype=np.uint8)
        w, h = (int(v) for v in rng.integers(a.size // 4, a.size // 2, size=2))
        x, y = (int(v) for v in rng.integers(0, a.size - max(w, h), size=2))
        img[y:y + h, x:x + w] = COLOURS[cat]
        name = f"{i:012d}.jpg"
        Image.fromarray(img).save(os.path.join(a.out, "train2017", name), quality=90)
        images.append({"id": i, "file_name": name, "width": a.size, "height": a.size})
        annotations.append({"id": i, "image_id": i, "category_id": cat, "bbox": [x, y, w, h],
                            "area": w * h, "iscrowd": 0})
    coco = {"images": images, "annotations": annotations,
            "categories": [{"id": k, "name": n} for k, n in enumerate(CATEGORIES)]}
    with open(os.path.join(a.out, "annotations", "instances_train2017.json"), "w") as f:
        json.dump(coco, f)
    with open(os.path.join(a.out, "classes.txt"), "w") as f:
        f.write("\n".join(CATEGORIES) + "\n")


if __name__ == "__main__":
    main()
