"""A tiny BERT classifier from a config (random weights, nothing downloaded) and synthetic data."""
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments


def tiny_bert(seed=0, hidden=16):
    """hidden=16: ~10k parameters (reduced on the training thread); 128: ~400k (on the worker)."""
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=50, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=2 * hidden, max_position_embeddings=16, num_labels=3)
    return BertForSequenceClassification(config)


class Synthetic(torch.utils.data.Dataset):
    def __init__(self, n, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 50, (n, 8), generator=gen)
        self.labels = torch.randint(0, 3, (n,), generator=gen)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(8, dtype=torch.long), "labels": self.labels[i]}


class Recorder(TrainerCallback):
    """What each optimizer step used: ``seen[n]`` = name -> (weight, .grad) before optimizer step ``n``."""

    def __init__(self):
        self.seen = {}

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.seen[state.global_step] = {name: (p.detach().clone(), p.grad.detach().clone())
                                        for name, p in model.named_parameters() if p.grad is not None}


def make_trainer(tmp_path, callbacks, train_n=16, eval_n=0, hidden=16, **args):
    options = dict(output_dir=str(tmp_path / "hf"), per_device_train_batch_size=4, per_device_eval_batch_size=4,
                   num_train_epochs=1, learning_rate=1e-2, report_to=[], save_strategy="no", logging_steps=1,
                   use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=0, max_grad_norm=0.0)
    options.update(args)
    return Trainer(model=tiny_bert(hidden=hidden), args=TrainingArguments(**options), train_dataset=Synthetic(train_n),
                   eval_dataset=Synthetic(eval_n, seed=1) if eval_n else None, callbacks=callbacks)
