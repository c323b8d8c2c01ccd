"""`contrastive-export`: see ``python tools/export.py --help``; the code is in contrastive.eval.cli."""

import sys

from contrastive.eval.cli import export_main


def main() -> int:
    return export_main()


if __name__ == "__main__":
    sys.exit(main())
