"""A real fms-hf-tuning 3.2.2 job with the relay's one line: fms's own command line, parsed by fms's
own parser, run by fms's ``sft_trainer.train(..., additional_callbacks=[RelayCallback(...)])``; what
a user of fms-hf-tuning writes to add the relay to a job. Run in the compatibility venv (.venv-fms),
alone or under torchrun, on a model built beforehand (the demo's tiny one).

    python tests/fms_job.py --model_name_or_path DIR --training_data_path FILE --output_dir OUT ...
"""
from __future__ import annotations

import json
import sys

from tuning import sft_trainer

from trainer import RelayCallback


def main() -> int:
    parser = sft_trainer.get_parser()
    (model_args, data_args, training_args, _controller, tune_config, _quantization, _quantized_lora,
     _fused_ops, _packing, _fast_moe, tracker_configs, metadata) = sft_trainer.parse_arguments(parser)
    exp_metadata = json.loads(metadata) if metadata else None  # as fms-hf-tuning's own main() reads it
    sft_trainer.train(model_args=model_args, data_args=data_args, train_args=training_args,
                      peft_config=tune_config, tracker_configs=tracker_configs, exp_metadata=exp_metadata,
                      additional_callbacks=[RelayCallback(exp_metadata=exp_metadata)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
