"""`contrastive-linear-eval`: see ``python tools/linear_eval.py --help``; the code is in contrastive.eval.cli."""

import sys

from contrastive.eval.cli import linear_eval_main


def main() -> int:
    return linear_eval_main()


if __name__ == "__main__":
    sys.exit(main())
