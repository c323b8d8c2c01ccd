"""`contrastive-plot`: see ``python tools/plot.py --help``; the code is in contrastive.eval.cli."""

import sys

from contrastive.eval.cli import plot_main


def main() -> int:
    return plot_main()


if __name__ == "__main__":
    sys.exit(main())
