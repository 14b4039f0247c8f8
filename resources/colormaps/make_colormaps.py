#!/usr/bin/env python3
"""Regenerates the 256-entry colour maps KVScope's views use (resources/colormaps/*.csv).

viridis, magma and cividis are perceptually uniform and readable with the common
colour-vision deficiencies (cividis was designed for them); values come from
matplotlib's published tables. Run: python3 make_colormaps.py (needs matplotlib).
"""
import matplotlib

for name in ("viridis", "magma", "cividis", "Greys"):
    cmap = matplotlib.colormaps[name]
    out = name.lower() if name != "Greys" else "grey"
    with open(f"{out}.csv", "w") as f:
        f.write(f"# {out}: 256 RGB rows, from matplotlib {matplotlib.__version__}\n")
        for i in range(256):
            # Greys runs white->black; KVScope's grey runs black->white like the others' dark->light.
            x = i / 255.0 if name != "Greys" else 1.0 - i / 255.0
            r, g, b, _ = cmap(x)
            f.write(f"{round(r * 255)},{round(g * 255)},{round(b * 255)}\n")
