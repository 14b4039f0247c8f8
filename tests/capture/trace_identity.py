#!/usr/bin/env python3
"""Are two traces the same file, timing aside?

    trace_identity.py A.kvtrace.h5 B.kvtrace.h5 [--quiet]

Compares everything a reader or h5py can see: the object tree in creation
order, every dataset's dtype, shape, maximum shape, chunking, filters
(deflate level, shuffle), fill value, values and stored chunks (their
places and compressed sizes), each object header's address in the file
(the order the writer created them in), every attribute's name, type and
value. The only things allowed to differ are
the ones that measure time (TIMING: wall-clock seconds and the creation
time), whose values change from run to run of the same binary, and, in the
command line, the executable's and the output's paths. Exit 0 when
the files are the same, 1 with the differences listed otherwise.

Used to show that a refactoring of the writer, the recorder or the capture
leaves traces as they were (scripts/compare-captures).
"""
import sys

import h5py
import numpy as np

# Datasets and attributes that hold times: their shapes, types and storage
# are still compared, only their values are not.
TIMING_DATASETS = {"/steps/time_s", "/steps/wall_s", "/steps/t_start_s"}
TIMING_ATTRIBUTES = {("/", "created_utc")}


def storage(d):
    """What of a dataset's creation properties a reader can observe."""
    return {
        "dtype": str(d.dtype),
        "shape": d.shape,
        "maxshape": d.maxshape,
        "chunks": d.chunks,
        "compression": d.compression,
        "compression_opts": d.compression_opts,
        "shuffle": d.shuffle,
        "fletcher32": d.fletcher32,
        "fillvalue": repr(d.fillvalue),
    }


def values_equal(a, b):
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.kind == "f":
            return np.array_equal(a, b, equal_nan=True)
        return np.array_equal(a, b)
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return type(a) is type(b) and a == b


def attr_list(obj):
    out = []
    for name in obj.attrs:
        v = obj.attrs[name]
        out.append((name, obj.attrs.get_id(name).dtype.str, v))
    return out


def walk(f):
    """[(path, kind, header address)] in name order; the header addresses
    show the order the writer created the objects in."""
    items = []

    def visit(group, prefix):
        for n in group.keys():
            path = prefix.rstrip("/") + "/" + n
            link = group.get(n, getlink=True)
            if isinstance(link, (h5py.SoftLink, h5py.ExternalLink)):
                items.append((path, "link:" + str(link.path), 0))
                continue
            child = group[n]
            addr = h5py.h5o.get_info(child.id).addr
            if isinstance(child, h5py.Group):
                items.append((path, "group", addr))
                visit(child, path)
            else:
                items.append((path, "dataset", addr))

    visit(f, "/")
    return items


def chunk_layout(d):
    """How a dataset is stored: each written chunk's place in the dataset, its
    stored (compressed) size and filter mask, or the contiguous block's size.
    Not where the chunks lie in the file: the timing datasets' compressed
    chunks change size from run to run and move everything written after
    them."""
    if d.chunks is None:
        return [("contiguous", d.id.get_storage_size())]
    out = []
    for i in range(d.id.get_num_chunks()):
        c = d.id.get_chunk_info(i)
        out.append((tuple(c.chunk_offset), c.size, c.filter_mask))
    return out


def command_words(line):
    """A command line without the executable and the output path, which name
    the build and the folder a capture was made from and into."""
    words = line.split(" ")
    out, skip = [], False
    for i, w in enumerate(words[1:]):
        if skip:
            skip = False
            continue
        if w in ("-o", "--output"):
            skip = True
            continue
        out.append(w)
    return out


def compare(pa, pb):
    diffs = []
    with h5py.File(pa, "r") as a, h5py.File(pb, "r") as b:
        ta, tb = walk(a), walk(b)
        na, nb = [x[:2] for x in ta], [x[:2] for x in tb]
        if na != nb:
            sa, sb = set(na), set(nb)
            for x in sorted(sa - sb):
                diffs.append(f"{x[0]}: only in {pa}")
            for x in sorted(sb - sa):
                diffs.append(f"{x[0]}: only in {pb}")
        else:
            for (path, _, xa), (_, _, xb) in zip(ta, tb):
                if xa != xb:
                    diffs.append(f"{path}: object header at byte {xa} vs {xb} (created in "
                                 "another order or size)")
        for path, kind in [("/", "group")] + na:
            if path not in a or path not in b or kind.startswith("link"):
                continue
            oa, ob = a[path], b[path]
            aa, ab = attr_list(oa), attr_list(ob)
            if [x[:2] for x in aa] != [x[:2] for x in ab]:
                diffs.append(f"{path}: attributes {[x[:2] for x in aa]} vs {[x[:2] for x in ab]}")
            else:
                for (n, _, va), (_, _, vb) in zip(aa, ab):
                    if (path, n) in TIMING_ATTRIBUTES:
                        continue
                    if (path, n) == ("/run", "command_line") and isinstance(va, str) and \
                            isinstance(vb, str) and command_words(va) == command_words(vb):
                        continue
                    if not values_equal(va, vb):
                        diffs.append(f"{path} attribute {n}: {va!r:.120} vs {vb!r:.120}")
            if kind != "dataset":
                continue
            sa, sb = storage(oa), storage(ob)
            if sa != sb:
                diffs.append(f"{path}: storage {sa} vs {sb}")
                continue
            if path not in TIMING_DATASETS and chunk_layout(oa) != chunk_layout(ob):
                diffs.append(f"{path}: stored in other chunks (or chunks of other sizes)")
            if path in TIMING_DATASETS:
                continue
            if not values_equal(oa[()], ob[()]):
                va, vb = np.asarray(oa[()]), np.asarray(ob[()])
                where = ""
                if va.shape == vb.shape and va.size:
                    ne = np.argwhere(~((va == vb) | (va != va) & (vb != vb)) if va.dtype.kind == "f"
                                     else va != vb)
                    if len(ne):
                        i = tuple(ne[0])
                        where = f" (first at {i}: {va[i]!r} vs {vb[i]!r}; {len(ne)} differ)"
                diffs.append(f"{path}: values differ{where}")
    return diffs


def main():
    args = [x for x in sys.argv[1:] if not x.startswith("--")]
    if len(args) != 2:
        sys.exit(__doc__)
    diffs = compare(*args)
    if diffs:
        print(f"DIFFERENT {args[0]} {args[1]}:")
        for d in diffs[:40]:
            print("  " + d)
        if len(diffs) > 40:
            print(f"  ... {len(diffs) - 40} more")
        return 1
    if "--quiet" not in sys.argv:
        print(f"same {args[0]} {args[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
