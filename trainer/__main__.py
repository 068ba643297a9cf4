"""``python -m trainer`` and the ``metrics-relay-train`` console script."""
import sys

from trainer.sft import main

if __name__ == "__main__":
    sys.exit(main())
