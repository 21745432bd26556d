"""Draw glam's import graph in layers: docs/architecture.png, and the layers as text.

    python scripts/draw_architecture.py                      # docs/architecture.png
    python scripts/draw_architecture.py --out /tmp/arch.png

Reads every import of glam/ with `ast` (`glam.structure`: nothing is imported), puts each unit
(a subpackage or a top-level module) one layer above the highest unit it imports, and draws the
edges that no longer path implies. Prints the layers from the top, as docs/architecture.md lists
them (tests/test_structure.py holds the order every import must follow). An existing `--out` is
replaced only if this script drew it, or with `--overwrite`. Exit status: 0 drawn; 2 an import
cycle (the layers are undefined: the message names it) or an `--out` it may not write.
"""

from __future__ import annotations

import argparse
import sys

from glam.cli import exit_on, report
from glam.outputs import OutputDirError, add_output_file_options, check_output_file, png_metadata
from glam.structure import ROOT, draw, import_graph, longest_path_layers, units

WRITER = "scripts/draw_architecture.py"
"""The mark of the PNG this script writes (`glam.outputs.png_metadata`)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_file_options(parser, help="PNG path (default docs/architecture.png)")
    args = parser.parse_args()
    out = args.out or ROOT / "docs" / "architecture.png"
    with exit_on(OutputDirError):
        check_output_file(
            out, key="--out", writer=WRITER, overwrite=args.overwrite, suffixes=(".png",)
        )
    edges, _ = import_graph()
    nodes = set(units())
    try:
        layers = longest_path_layers(edges, nodes)
    except ValueError as error:
        return report(f"glam's imports have {error}: no layers")
    draw(layers, edges, out, png_metadata(WRITER))
    for row in reversed(range(len(layers))):
        print(f"{row:>2}  {', '.join(layers[row])}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
