"""A fake mount (see fake.py) whose views hold small real PNG images."""
import os

from fake import make_mount


def image_mount(root, views, size=8):
    """`views`: {epoch: {class: count}}; image i of a class is filled with grey level i."""
    from PIL import Image

    make_mount(root, views={e: {c: [] for c in classes} for e, classes in views.items()})
    for e, classes in views.items():
        for c, n in classes.items():
            for i in range(n):
                Image.new("RGB", (size, size), (i, i, i)).save(os.path.join(root, f"epoch-{e}", c, f"{i}.png"))
    return root
