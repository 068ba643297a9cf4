"""A training job with Hugging Face's own MLflow, TensorBoard and W&B callbacks beside the relay's
sinks (``python -m trainer``'s ``main(argv, callbacks=...)``): what tests/test_hf_fidelity.py compares, and what
the screenshots in docs/sinks/ were taken from. Run by torchrun like ``-m trainer``."""
import sys

from transformers.integrations import MLflowCallback, TensorBoardCallback, WandbCallback

from trainer.__main__ import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], callbacks=[MLflowCallback(), TensorBoardCallback(), WandbCallback()]))
