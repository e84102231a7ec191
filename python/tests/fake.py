"""A folder that looks like a shufflefs mount to the helpers: `.shufflefs/status` and
`epoch-N/CLASS/FILE` views (no daemon: nothing advances, the views are written by the test)."""
import json
import os

import shufflefs


def make_mount(root, epoch=0, views=None, **status):
    """`views`: {epoch: {class: [file names]}}; each file holds its own name."""
    os.makedirs(os.path.join(root, ".shufflefs"), exist_ok=True)
    for e, classes in (views or {}).items():
        for c, files in classes.items():
            os.makedirs(os.path.join(root, f"epoch-{e}", c), exist_ok=True)
            for f in files:
                with open(os.path.join(root, f"epoch-{e}", c, f), "wb") as out:
                    out.write(f.encode())
    write_status(root, epoch=epoch, **status)
    return root


def write_status(root, **fields):
    st = {"version": shufflefs.__version__, "epoch": 0, "staging": {"files_done": 0, "files_total": 0}}
    st.update(fields)
    tmp = os.path.join(root, ".shufflefs", "status.tmp")
    with open(tmp, "w") as f:
        json.dump(st, f)
    os.replace(tmp, os.path.join(root, ".shufflefs", "status"))
