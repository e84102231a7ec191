"""A detection-style training loop on a COCO-shaped dataset read through shufflefs (one process
per rank), as torchvision's `CocoDetection` reads COCO: the annotation file, then each image of
the folder with its annotations looked up by file name, boxes transformed with the image.

    shufflefs mount --format tree --replicate 'annotations/*' --replicate classes.txt ...
    mpirun -np 4 python train_detection.py --mount /mnt/sfs-{rank} --epochs 2

The annotation file is a side file (`--replicate`): whole in every epoch on every rank, while
`train2017/` holds this rank's share of the images. The only change from the usual loop is the
root: `shufflefs.epoch_dir(mount, epoch)` per epoch, no DistributedSampler. The model is a
small CNN predicting one box and one class per image (CPU, seconds).
Prints `rank R epoch E: K images, loss L` per epoch.
"""
import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision import tv_tensors
from torchvision.io import decode_jpeg, read_file
from torchvision.transforms import v2

import shufflefs


class CocoStyle(torch.utils.data.Dataset):
    """torchvision's CocoDetection without pycocotools: images of `images/`, targets from
    `ann_file` by file name."""

    def __init__(self, images, ann_file, transforms):
        with open(ann_file) as f:
            coco = json.load(f)
        by_name = {im["file_name"]: im["id"] for im in coco["images"]}
        self.anns = {}
        for a in coco["annotations"]:
            self.anns.setdefault(a["image_id"], []).append(a)
        self.files = sorted(os.listdir(images))
        self.ids = [by_name[f] for f in self.files]  # KeyError: an image without annotations
        self.images, self.transforms = images, transforms

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        img = decode_jpeg(read_file(os.path.join(self.images, self.files[i])))
        anns = self.anns[self.ids[i]]
        boxes = tv_tensors.BoundingBoxes([a["bbox"] for a in anns], format="XYWH",
                                         canvas_size=img.shape[-2:])
        target = {"boxes": boxes, "labels": torch.tensor([a["category_id"] for a in anns])}
        return self.transforms(tv_tensors.Image(img), target)


class Net(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.Conv2d(8, 16, 3, 2, 1),
                                  nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.box, self.cls = nn.Linear(16, 4), nn.Linear(16, classes)

    def forward(self, x):
        h = self.conv(x)
        return self.box(h), self.cls(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True, help="this rank's mount ({rank} is expanded)")
    ap.add_argument("--epochs", type=int, default=2)
    a = ap.parse_args()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", "0")))
    mount = a.mount.replace("{rank}", str(rank))
    torch.manual_seed(0)
    transforms = v2.Compose([v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True),
                             v2.ConvertBoundingBoxFormat("CXCYWH")])
    model = None
    for epoch in range(a.epochs):
        root = shufflefs.epoch_dir(mount, epoch)
        classes = open(os.path.join(root, "classes.txt")).read().split()
        ds = CocoStyle(os.path.join(root, "train2017"),
                       os.path.join(root, "annotations", "instances_train2017.json"), transforms)
        loader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, num_workers=1,
                                             collate_fn=lambda b: tuple(zip(*b)))
        if model is None:
            model = Net(len(classes))
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
        total, n = 0.0, 0
        for imgs, targets in loader:
            x = torch.stack(imgs)
            size = x.shape[-1]
            box = torch.stack([t["boxes"][0] for t in targets]).float() / size
            label = torch.stack([t["labels"][0] for t in targets])
            pred_box, logits = model(x)
            loss = F.smooth_l1_loss(pred_box, box) + F.cross_entropy(logits, label)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, n = total + loss.item() * len(imgs), n + len(imgs)
        print(f"rank {rank} epoch {epoch}: {n} images, loss {total / max(n, 1):.4f}", flush=True)


if __name__ == "__main__":
    main()
