"""`contrastive-knn-eval`: see ``python tools/knn_eval.py --help``; the code is in contrastive.eval.cli."""

import sys

from contrastive.eval.cli import knn_eval_main


def main() -> int:
    return knn_eval_main()


if __name__ == "__main__":
    sys.exit(main())
