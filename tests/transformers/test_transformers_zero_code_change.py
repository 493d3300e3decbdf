"""Zero code change: an unmodified Trainer script, configured only by SMDEBUG_CONFIG_FILE_PATH."""
import numpy as np

from trainer_helpers import run_unmodified, write_config
from smdebug.trials import create_trial

# The user's script: no smdebug in it. A tiny BERT from a config, 16 samples, 2 batches per
# optimizer step, then an evaluation of 2 batches. Nothing is downloaded.
SCRIPT = """
import json
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

class Data(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids, self.labels = torch.randint(0, 50, (n, 8), generator=g), torch.randint(0, 3, (n,), generator=g)
    def __len__(self):
        return len(self.labels)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}

torch.manual_seed(0)
model = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
    num_attention_heads=2, intermediate_size=32, max_position_embeddings=16, num_labels=3))
args = TrainingArguments(output_dir="hf", per_device_train_batch_size=4, per_device_eval_batch_size=4,
                         gradient_accumulation_steps=2, num_train_epochs=1, report_to=[], save_strategy="no",
                         logging_steps=1, use_cpu=True, disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=Data(16, 0), eval_dataset=Data(8, 1))
trainer.train()
metrics = trainer.evaluate()
print(json.dumps({"global_step": trainer.state.global_step, "eval_loss": metrics["eval_loss"],
                  "callbacks": [type(c).__name__ for c in trainer.callback_handler.callbacks],
                  "torch_instrumentor_hooks": len(torch.nn.modules.module._global_forward_pre_hooks)}))
"""


def test_unmodified_trainer_script_is_captured_by_one_callback(tmp_path):
    out = tmp_path / "run"
    config = write_config(tmp_path / "hook.json", out, {"save_interval": "1"}, ["weights", "gradients", "losses"])
    result, _ = run_unmodified(tmp_path, SCRIPT, {"SMDEBUG_CONFIG_FILE_PATH": config})
    assert result["global_step"] == 2
    assert result["callbacks"].count("DebuggerCallback") == 1
    assert result["torch_instrumentor_hooks"] == 0  # the PyTorch instrumentor stood down
    trial = create_trial(str(out))
    assert [(trial.mode(s).name, trial.mode_step(s)) for s in trial.steps()] == [
        ("TRAIN", 0), ("TRAIN", 1), ("EVAL", 0), ("EVAL", 1)]
    assert trial.tensor("gradient/BertForSequenceClassification_classifier.weight").steps() == [0, 1]
    np.testing.assert_allclose(trial.tensor("scalar/eval_loss").value(3), result["eval_loss"], rtol=1e-6)


def test_a_bad_config_warns_once_and_training_runs(tmp_path):
    config = tmp_path / "hook.json"
    config.write_text('{"LocalPath": 42}')
    result, stderr = run_unmodified(tmp_path, SCRIPT, {"SMDEBUG_CONFIG_FILE_PATH": str(config)})
    assert result["global_step"] == 2
    assert stderr.count("zero code change: the config is not usable") == 1
