"""Fine-tune a tiny BERT with the Hugging Face Trainer and smdebug's DebuggerCallback.

Nothing is downloaded: the model is built from a 2-layer ``BertConfig`` with random
weights, and the task is synthetic (is token 7 in the sequence?). The callback saves, with
one smdebug step per optimizer step (2 batches each, ``gradient_accumulation_steps=2``):

* weights, biases and the accumulated gradients every ``--interval`` steps, with their
  L2 norms,
* each step's loss (``losses``), and what the Trainer logs (loss, learning rate, gradient
  norm, eval metrics) as scalars,
* one EVAL step per evaluation batch.

Under a minute on two CPU cores:

    HF_HUB_OFFLINE=1 python examples/transformers/train_transformers.py --out-dir /tmp/hf_run
"""
import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from smdebug.transformers import DebuggerCallback, ReductionConfig, SaveConfig, create_trial, modes


class HasSeven(torch.utils.data.Dataset):
    """Sequences of 12 tokens from a vocabulary of 40; label 1 when token 7 occurs."""

    def __init__(self, n, seed):
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 40, (n, 12), generator=gen)
        self.labels = (self.ids == 7).any(1).long()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", help="run directory to write (default: a new temporary directory)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--interval", type=int, default=5, help="save whole tensors every N steps")
    args = parser.parse_args()
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="smdebug_transformers_")

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=16, num_labels=2))
    callback = DebuggerCallback(out_dir=out_dir, save_config=SaveConfig(save_interval=args.interval),
                                include_collections=["weights", "biases", "gradients", "losses"],
                                reduction_config=ReductionConfig(norms=["l2"], save_raw_tensor=True),
                                overwrite=True)
    training_args = TrainingArguments(
        output_dir=os.path.join(out_dir, "trainer"), per_device_train_batch_size=16, per_device_eval_batch_size=32,
        gradient_accumulation_steps=2, num_train_epochs=args.epochs, learning_rate=3e-3, eval_strategy="epoch",
        logging_steps=5, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=training_args, train_dataset=HasSeven(512, 0),
                      eval_dataset=HasSeven(128, 1), callbacks=[callback])
    trainer.train()
    callback.close()

    trial = create_trial(out_dir)
    loss = trial.tensor("loss")
    saved = loss.steps(mode=modes.TRAIN)
    print(f"{out_dir}: TRAIN steps saved {saved} of {trainer.state.global_step}, "
          f"{len(trial.steps(mode=modes.EVAL))} EVAL steps")
    print("loss:", " ".join(f"{loss.value(s, mode=modes.TRAIN):.3f}" for s in saved))
    norm = trial.tensor("gradient/BertForSequenceClassification_classifier.weight")
    print("|grad classifier.weight|:", " ".join(f"{norm.reduction_value(s, 'l2', mode=modes.TRAIN):.3f}"
                                                for s in saved))
    eval_loss = trial.tensor("scalar/eval_loss")
    print("eval_loss after each epoch:", [round(eval_loss.value(s).item(), 3) for s in eval_loss.steps()])
    assert saved == list(range(0, trainer.state.global_step, args.interval))  # TRAIN steps = optimizer steps


if __name__ == "__main__":
    main()
