"""A corpus of small, real training runs, healthy and broken, for judging the built-in rules.

Each run is a real training loop (PyTorch, XGBoost, Keras) recorded with the smdebug hook of its
framework, a few seconds each. Every run directory gets a ``corpus.json`` label next to the
hook's files: whether the run is healthy, and for a broken run the rules meant to catch it, the
injected fault's first step and the layer (or tensor) it starts in. Tests
(``tests/*/test_rules_corpus*.py``) and ``benchmarks/bench_rules_trust.py`` share it.

    python tests/support/rules_corpus.py --out /tmp/corpus            # every run this env can build
    python tests/support/rules_corpus.py --out /tmp/corpus --runs pt_lr_zero,pt_dead_relu

A run that already has its label is not built again (the label is written last).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional

LABEL_FILE = "corpus.json"


@dataclass
class Label:
    """What a corpus run is: healthy, or broken with the rules meant to catch it and where."""

    name: str
    framework: str
    healthy: bool
    description: str
    rules: List[str] = field(default_factory=list)  # rules meant to fire (broken runs)
    # The global step a rule watching single steps sees the fault at (None: not pinned to a step,
    # e.g. a loss that never falls, which trend rules can only judge after some steps).
    fault_step: Optional[int] = None
    culprit: Optional[str] = None  # the layer or tensor the fault starts in
    culprit_rules: List[str] = field(default_factory=list)  # the rules expected to name it (default: all)

    def __post_init__(self):
        if self.culprit is not None and not self.culprit_rules:
            self.culprit_rules = list(self.rules)


_RUNS: Dict[str, tuple] = {}  # name -> (framework, builder, Label kwargs)


def _run(name: str, framework: str, healthy: bool, description: str, **label):
    def register(builder: Callable[[str], None]):
        _RUNS[name] = (framework, builder, dict(name=name, framework=framework, healthy=healthy,
                                                description=description, **label))
        return builder
    return register


def run_names(framework: Optional[str] = None) -> List[str]:
    return [n for n, (fw, _, _) in _RUNS.items() if framework is None or fw == framework]


def label_of(name: str) -> Label:
    return Label(**_RUNS[name][2])


def available(framework: str) -> bool:
    module = {"pytorch": "torch", "xgboost": "xgboost", "keras": "keras", "lightning": "pytorch_lightning",
              "transformers": "transformers"}[framework]
    return importlib.util.find_spec(module) is not None


def build(name: str, root: str) -> str:
    """Build run ``name`` under ``root`` (once: a run with its label is reused); its directory."""
    framework, builder, label = _RUNS[name]
    out_dir = os.path.join(root, name)
    label_path = os.path.join(out_dir, LABEL_FILE)
    if os.path.exists(label_path):
        return out_dir
    if os.path.exists(out_dir):
        import shutil

        shutil.rmtree(out_dir)  # a half-built run
    builder(out_dir)
    with open(label_path, "w") as fh:
        json.dump(asdict(Label(**label)), fh, indent=1)
    return out_dir


def read_label(run_dir: str) -> Label:
    with open(os.path.join(run_dir, LABEL_FILE)) as fh:
        return Label(**json.load(fh))


def default_rules(run_dir: str):
    """``smdebug rules RUN_DIR`` (the default rules): its exit status and output."""
    import contextlib
    import io

    from smdebug.analysis.rules.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = main([run_dir, "--no-progress"])
    return status, out.getvalue()


def evaluate(run_dir: str, rule_name: str, **params):
    """The report of built-in ``rule_name`` as the default set runs it (``params`` added) over the run."""
    from smdebug.analysis.rules.builtin import make_rule
    from smdebug.analysis.rules.rule import invoke_rule
    from smdebug.trials import create_trial

    return invoke_rule(make_rule(rule_name, create_trial(run_dir, wait_timeout=0), **params), follow=False)


def healthy_runs(framework: str) -> List[str]:
    return [n for n in run_names(framework) if label_of(n).healthy]


def broken_cases(framework: str) -> List[tuple]:
    """``(run, rule)`` for each built-in rule meant to catch each broken run of ``framework``."""
    from smdebug.analysis.rules.builtin import BUILTIN_RULES

    return [(n, r) for n in run_names(framework) for r in label_of(n).rules if r in BUILTIN_RULES]


def build_all(framework: str, root: str) -> Dict[str, str]:
    return {name: build(name, root) for name in run_names(framework)}


def noise(run_dir: str) -> Optional[str]:
    """The default ``smdebug rules`` output on a healthy run when it is not silent (an exit
    status other than 0, or a rule that fired); None when it is."""
    status, output = default_rules(run_dir)
    return None if status == 0 and "FIRED" not in output else output


def misses(run_dir: str, name: str, rule: str) -> List[str]:
    """What is wrong with ``rule`` on broken run ``name`` (empty when nothing is): it must fire
    within two steps of the injected fault, name the layer it started in (where the label
    says), and the default ``smdebug rules`` must say so."""
    report = evaluate(run_dir, rule)
    if not report.triggered:
        return [f"{rule} did not fire: {report}"]
    found = []
    label = label_of(name)
    first = report.to_dict()["violations"][0]
    if label.fault_step is not None and abs(first["step"] - label.fault_step) > 2:
        found.append(f"first firing at step {first['step']}, the fault at {label.fault_step}: "
                     f"{report.violation_steps[:5]}")
    if label.culprit is not None and rule in label.culprit_rules:
        named = first["details"].get("culprit")
        if named is None or named["layer"] != label.culprit:
            found.append(f"culprit {named}, not layer {label.culprit}")
        elif label.fault_step is not None and abs(named["first_step"] - label.fault_step) > 2:
            found.append(f"culprit {named} starts more than two steps from the fault at {label.fault_step}")
    status, output = default_rules(run_dir)
    if not (status == 1 and any(line.startswith(rule) and "FIRED" in line for line in output.splitlines())):
        found.append(f"the default smdebug rules (exit {status}) do not say {rule} fired: {output}")
    return found


def corpus_fixture(framework: str):
    """A module-scoped ``corpus`` fixture: every run of ``framework`` built once for the test
    module that assigns it (``corpus = rules_corpus.corpus_fixture("keras")``)."""
    import pytest

    @pytest.fixture(scope="module", name="corpus")
    def corpus(tmp_path_factory):
        return build_all(framework, str(tmp_path_factory.mktemp("rules_corpus")))

    return corpus


# =============================================================================================
# PyTorch: an MLP classifier on a synthetic task (4 classes from a fixed linear teacher).
# Modules are named as users name them: fc1, relu1, ... (the rules' ReLU/tanh patterns must
# match such names).
FEATURES, HIDDEN, CLASSES = 16, 32, 4


def _torch():
    import torch

    torch.set_num_threads(1)
    return torch


class _Data:
    """A fixed pool of samples labelled by a linear teacher; batches drawn at random."""

    def __init__(self, n_train=4096, n_val=512, label_noise=0.0, seed=0, imbalance=None):
        torch = _torch()
        gen = torch.Generator().manual_seed(seed)
        teacher = torch.randn(FEATURES, CLASSES, generator=gen)
        x = torch.randn(n_train + n_val, FEATURES, generator=gen)
        y = (x @ teacher).argmax(1)
        if imbalance is not None:  # keep ~imbalance of class 0, the rest from the other classes
            keep = torch.rand(len(y), generator=gen) < torch.where(y == 0, torch.tensor(1.0),
                                                                   torch.tensor(imbalance))
            x, y = x[keep], y[keep]
            n_train = int(len(y) * n_train / (n_train + n_val))
        if label_noise:
            flip = torch.rand(len(y), generator=gen) < label_noise
            y = torch.where(flip, torch.randint(0, CLASSES, (len(y),), generator=gen), y)
        self.x_train, self.y_train = x[:n_train], y[:n_train]
        self.x_val, self.y_val = x[n_train:], y[n_train:]
        self.gen = gen

    def batch(self, size):
        torch = _torch()
        idx = torch.randint(0, len(self.y_train), (size,), generator=self.gen)
        return self.x_train[idx], self.y_train[idx]


def _mlp(activation="relu", depth=2, width=HIDDEN, seed=0):
    torch = _torch()
    torch.manual_seed(seed)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            sizes = [FEATURES] + [width] * depth
            for i in range(depth):
                setattr(self, f"fc{i + 1}", torch.nn.Linear(sizes[i], sizes[i + 1]))
                act = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid}[activation]()
                setattr(self, f"{activation}{i + 1}", act)
            self.out = torch.nn.Linear(width, CLASSES)
            self.depth, self.activation = depth, activation

        def forward(self, x):
            for i in range(self.depth):
                x = getattr(self, f"{self.activation}{i + 1}")(getattr(self, f"fc{i + 1}")(x))
            return self.out(x)

    return Net()


def _train_torch(out_dir, *, model=None, data=None, steps=200, batch=32, lr=3e-3, optimizer="adam",
                 schedule=None, eval_every=None, eval_batches=4, save_labels=False, before_step=None,
                 before_update=None, weight_decay=0.0):
    """The corpus's PyTorch loop: every step saved (weights, gradients, losses, activations)."""
    torch = _torch()
    import smdebug.pytorch as smd

    model = model if model is not None else _mlp()
    data = data if data is not None else _Data()
    loss_fn = torch.nn.CrossEntropyLoss()
    params = model.parameters() if not isinstance(lr, dict) else \
        [{"params": getattr(model, layer).parameters(), "lr": value} for layer, value in lr.items()]
    base_lr = lr if not isinstance(lr, dict) else lr.get("default", 0.0)
    if optimizer == "adam":
        opt = torch.optim.Adam(params, lr=base_lr, weight_decay=weight_decay)
    else:
        opt = torch.optim.SGD(params, lr=base_lr, momentum=0.9 if optimizer == "momentum" else 0.0,
                              weight_decay=weight_decay)
    sched = schedule(opt) if schedule is not None else None
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients", "losses", "activations"]
                    + (["labels", "predictions"] if save_labels else []))
    hook.get_collection("activations").include(r"(relu|tanh|sigmoid)\d*_(input|output)_0$")
    if save_labels:
        hook.get_collection("labels").include("^labels$")
        hook.get_collection("predictions").include("^predictions$")
    hook.register_module(model)
    hook.register_loss(loss_fn)
    for step in range(steps):
        if before_step is not None:
            before_step(step, model)
        model.train()
        x, y = data.batch(batch)
        logits = model(x)
        loss = loss_fn(logits, y)
        if save_labels:
            hook.save_tensor("labels", y, "labels")
            hook.save_tensor("predictions", logits.argmax(1), "predictions")
        opt.zero_grad()
        loss.backward()
        if before_update is not None:
            before_update(step, model)
        opt.step()
        if sched is not None:
            sched.step()
        if eval_every and (step + 1) % eval_every == 0:
            model.eval()
            with torch.no_grad():
                chunk = max(1, len(data.y_val) // eval_batches)
                for i in range(eval_batches):
                    loss_fn(model(data.x_val[i * chunk:(i + 1) * chunk]), data.y_val[i * chunk:(i + 1) * chunk])
    hook.close()


# --- healthy ---------------------------------------------------------------------------------
@_run("pt_converge_plateau", "pytorch", True, "Adam on separable data: loss to ~0.01, then a plateau",
      )
def _converge(out_dir):
    _train_torch(out_dir, steps=400, lr=1e-2)


@_run("pt_noise_floor", "pytorch", True, "30% label noise: the loss plateaus at its noise floor")
def _noise_floor(out_dir):
    _train_torch(out_dir, data=_Data(label_noise=0.3), steps=300, lr=3e-3)


@_run("pt_cosine_lr", "pytorch", True, "SGD with momentum and a cosine learning-rate schedule")
def _cosine(out_dir):
    torch = _torch()
    _train_torch(out_dir, steps=250, lr=0.05, optimizer="momentum",
                 schedule=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=250))


@_run("pt_step_lr", "pytorch", True, "SGD with a step learning-rate schedule (x0.1 every 80 steps)")
def _step_lr(out_dir):
    torch = _torch()
    _train_torch(out_dir, steps=240, lr=0.1, optimizer="sgd",
                 schedule=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=80, gamma=0.1))


@_run("pt_warmup", "pytorch", True, "linear warm-up over 50 steps from lr 0, then constant")
def _warmup(out_dir):
    torch = _torch()
    _train_torch(out_dir, steps=250, lr=5e-3,
                 schedule=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50)))


@_run("pt_val_tracks_train", "pytorch", True, "evaluation every 20 steps; validation loss tracks training")
def _val_tracks(out_dir):
    _train_torch(out_dir, steps=300, lr=3e-3, eval_every=20)


@_run("pt_minibatch_noise", "pytorch", True, "batch 8 SGD: a noisy loss that goes up on many steps")
def _noisy(out_dir):
    _train_torch(out_dir, steps=300, batch=8, lr=0.2, optimizer="sgd", data=_Data(label_noise=0.1))


@_run("pt_readme_example", "pytorch", True, "the README's example (examples/pytorch/train_cnn.py)")
def _readme(out_dir):
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "examples", "pytorch", "train_cnn.py")
    spec = importlib.util.spec_from_file_location("smdebug_example_train_cnn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _torch()
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        module.train(out_dir, 300, 50)


@_run("pt_training_health", "pytorch", True, "the README's training-health configuration (health reductions of "
      "weights, updates and optimizer state) on a regression with one output: a 1-element bias, whose kurtosis is NaN")
def _training_health(out_dir):
    torch = _torch()
    import smdebug.pytorch as smd

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4096, FEATURES, generator=generator)
    y = x @ torch.randn(FEATURES, 1, generator=generator) + 0.1 * torch.randn(4096, 1, generator=generator)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss_fn = torch.nn.MSELoss()
    health = smd.ReductionConfig(norms=["l2"], reductions=["nonfinite", "zero_fraction", "kurtosis",
                                                           "overflow_fp8_e4m3", "underflow_bf16"])
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), reduction_config=health,
                    include_collections=["weights", "biases", "gradients", "updates", "optimizer_variables",
                                         "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    for step in range(300):
        rows = torch.randint(0, 4096, (32,), generator=generator)
        optimizer.zero_grad()
        loss_fn(model(x[rows]), y[rows]).backward()
        optimizer.step()
    hook.close()


@_run("pt_tanh_step_decay", "pytorch", True, "a tanh MLP regression, Adam with a step-decay schedule (x0.5 every "
      "20 steps): the loss rises for its first ~20 steps, then falls to its noise floor")
def _tanh_step_decay(out_dir):
    torch = _torch()
    import smdebug.pytorch as smd

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2048, 8, generator=generator)
    y = torch.sin(x @ torch.randn(8, 1, generator=generator)) + 0.1 * torch.randn(2048, 1, generator=generator)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 1))
    with torch.no_grad():  # the output starts near zero: Adam's first steps overshoot it
        model[4].weight.mul_(0.1)
        model[4].bias.mul_(0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
    loss_fn = torch.nn.MSELoss()
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    for step in range(300):
        rows = torch.randint(0, 2048, (64,), generator=generator)
        optimizer.zero_grad()
        loss_fn(model(x[rows]), y[rows]).backward()
        optimizer.step()
        schedule.step()
    hook.close()


@_run("pt_sgd_batch8_500", "pytorch", True, "plain SGD with batch 8 for 500 steps: the loss trends down slowly, "
      "and goes up on many steps")
def _sgd_batch8(out_dir):
    _train_torch(out_dir, steps=500, batch=8, lr=0.05, optimizer="sgd", data=_Data(label_noise=0.1))


# --- broken ----------------------------------------------------------------------------------
@_run("pt_vanishing_gradient", "pytorch", False, "8 sigmoid layers with small weights: gradients vanish from fc5 "
      "back to fc1 (fc5 is where the backward pass first drops below 1e-7)",
      rules=["VanishingGradient"], fault_step=0, culprit="fc5")
def _vanishing(out_dir):
    torch = _torch()
    model = _mlp("sigmoid", depth=8)
    with torch.no_grad():
        for i in range(8):
            getattr(model, f"fc{i + 1}").weight.mul_(0.1)
    _train_torch(out_dir, model=model, steps=40, lr=1e-3)


@_run("pt_nan_injected", "pytorch", False, "a weight of fc2 turns infinite at step 60 (a corrupted update)",
      rules=["ExplodingTensor"], fault_step=60, culprit="fc2")
def _nan(out_dir):
    def corrupt(step, model):
        if step == 60:
            with _torch().no_grad():
                model.fc2.weight[0, 0] = float("inf")
    _train_torch(out_dir, steps=70, lr=3e-3, before_step=corrupt)


@_run("pt_exploding_lr", "pytorch", False, "a schedule bug multiplies the lr by 10 every step from step 20: "
      "weights and loss overflow to inf/NaN", rules=["ExplodingTensor"])
def _exploding(out_dir):
    torch = _torch()
    _train_torch(out_dir, steps=60, lr=0.01, optimizer="sgd",
                 schedule=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 10.0 ** min(40, max(0, s - 20))))


@_run("pt_dead_relu", "pytorch", False, "fc1 biases initialised to -8: relu1 never fires",
      rules=["DeadRelu"], fault_step=0, culprit="relu1")
def _dead(out_dir):
    torch = _torch()
    model = _mlp()
    with torch.no_grad():
        model.fc1.bias.fill_(-8.0)
    _train_torch(out_dir, model=model, steps=60, lr=1e-3)


@_run("pt_saturated_tanh", "pytorch", False, "tanh net with fc1 weights x20: most tanh1 inputs far outside (-4, 4)",
      rules=["SaturatedActivation"], fault_step=0, culprit="tanh1")
def _saturated(out_dir):
    torch = _torch()
    model = _mlp("tanh")
    with torch.no_grad():
        model.fc1.weight.mul_(20.0)
    _train_torch(out_dir, model=model, steps=60, lr=1e-3)


@_run("pt_poor_init", "pytorch", False, "fc1 initialised with std 3, fc2 with std 0.002: ReLU input variances "
      "differ by orders of magnitude", rules=["PoorWeightInitialization"], fault_step=0, culprit="relu2")
def _poor_init(out_dir):
    torch = _torch()
    model = _mlp()
    with torch.no_grad():
        model.fc1.weight.normal_(0, 3.0)
        model.fc2.weight.normal_(0, 0.002)
        model.fc2.bias.zero_()
    _train_torch(out_dir, model=model, steps=40, lr=1e-3)


@_run("pt_lr_zero", "pytorch", False, "learning rate 0: nothing is learnt",
      rules=["LossNotDecreasing", "WeightUpdateRatio"])
def _lr_zero(out_dir):
    _train_torch(out_dir, steps=100, lr=0.0, optimizer="sgd")


@_run("pt_shuffled_labels", "pytorch", False, "labels drawn at random: the loss stays at log(4)",
      rules=["LossNotDecreasing"])
def _shuffled(out_dir):
    _train_torch(out_dir, data=_Data(label_noise=1.0), steps=150, lr=1e-3)


@_run("pt_overfit", "pytorch", False, "64 training samples, a wide net, evaluation every 20 steps: the "
      "validation loss climbs away from the training loss", rules=["Overfit"])
def _overfit(out_dir):
    _train_torch(out_dir, model=_mlp(width=128), data=_Data(n_train=64, n_val=512, label_noise=0.2), steps=400,
                 lr=1e-2, eval_every=20)


@_run("pt_overtraining", "pytorch", False, "256 noisy samples trained far past the best validation loss",
      rules=["Overtraining"])
def _overtraining(out_dir):
    _train_torch(out_dir, model=_mlp(width=128), data=_Data(n_train=256, n_val=512, label_noise=0.3), steps=600,
                 lr=1e-2, eval_every=20)


@_run("pt_class_imbalance", "pytorch", False, "class 0 is ~40x more frequent than each other class",
      rules=["ClassImbalance"])
def _imbalance(out_dir):
    _train_torch(out_dir, data=_Data(imbalance=0.025), steps=60, lr=3e-3, save_labels=True)


@_run("pt_update_too_large", "pytorch", False, "out initialised 1000x too small and trained with Adam lr 0.1: "
      "its first update is ~100x its weights", rules=["WeightUpdateRatio"], fault_step=0, culprit="out")
def _update_large(out_dir):
    torch = _torch()
    model = _mlp()
    with torch.no_grad():
        model.out.weight.mul_(1e-3)
    _train_torch(out_dir, model=model, steps=30, lr={"fc1": 1e-3, "fc2": 1e-3, "out": 0.1})


@_run("pt_update_too_small", "pytorch", False, "fc2 trained with lr 1e-12: its updates are ~1e-13 of its "
      "weights", rules=["WeightUpdateRatio"], fault_step=0, culprit="fc2")
def _update_small(out_dir):
    _train_torch(out_dir, steps=60, lr={"fc1": 1e-3, "fc2": 1e-12, "out": 1e-3})


@_run("pt_loss_spike", "pytorch", False, "at step 150 a corrupted gradient (x30000) hits fc2: the loss spikes at "
      "the next step", rules=["LossSpike"], fault_step=150, culprit="fc2")
def _spike(out_dir):
    def corrupt(step, model):
        if step == 150:
            model.fc2.weight.grad.mul_(30000.0)
    _train_torch(out_dir, steps=200, lr=0.05, optimizer="momentum", before_update=corrupt)


# =============================================================================================
# XGBoost
def _train_xgboost(out_dir, *, max_depth=6, informative=8, rounds=30, label_noise=0.5):
    import numpy as np
    import xgboost as xgb

    import smdebug.xgboost as smd

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 12))
    logit = x[:, :informative] @ rng.uniform(0.5, 1.5, informative)
    y = (logit + label_noise * rng.standard_normal(2000) > 0).astype(int)
    train, valid = xgb.DMatrix(x[:1500], label=y[:1500]), xgb.DMatrix(x[1500:], label=y[1500:])
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["metrics", "trees", "feature_importance", "hyperparameters"],
                    train_data=train, validation_data=valid)
    params = {"objective": "binary:logistic", "max_depth": max_depth, "eta": 0.3, "nthread": 1,
              "eval_metric": "logloss"}
    xgb.train(params, train, rounds, evals=[(train, "train"), (valid, "validation")], callbacks=[hook],
              verbose_eval=False)
    hook.close()


@_run("xgb_classifier", "xgboost", True, "a binary classifier, XGBoost defaults (max_depth 6), 8 useful features")
def _xgb_ok(out_dir):
    _train_xgboost(out_dir)


@_run("xgb_too_deep", "xgboost", False, "max_depth 14 on 1500 samples", rules=["TreeDepth"], fault_step=0)
def _xgb_deep(out_dir):
    _train_xgboost(out_dir, max_depth=14)


@_run("xgb_one_feature", "xgboost", False, "the label is a threshold on feature 0 alone (a leaked label): it "
      "holds nearly all the importance",
      rules=["FeatureImportanceOverweight"], culprit="f0")
def _xgb_one(out_dir):
    _train_xgboost(out_dir, informative=1, label_noise=0.0)


def _xgb_early_stopping(out_dir, rounds):
    """Issue 45's construction: noisy labels, validation error and logloss watched (logloss
    last: the metric XGBoost's early stopping monitors), ``early_stopping_rounds=rounds``."""
    import numpy as np
    import xgboost as xgb

    import smdebug.xgboost as smd

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1200, 10))
    y = (x[:, :4] @ np.array([1.0, -1.0, 0.5, 0.5]) + rng.standard_normal(1200) > 0).astype(int)
    train, valid = xgb.DMatrix(x[:800], label=y[:800]), xgb.DMatrix(x[800:], label=y[800:])
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["metrics"])
    params = {"objective": "binary:logistic", "max_depth": 6, "eta": 0.3, "nthread": 1,
              "eval_metric": ["error", "logloss"]}
    xgb.train(params, train, 200, evals=[(train, "train"), (valid, "valid")], early_stopping_rounds=rounds,
              callbacks=[hook], verbose_eval=False)
    hook.close()


@_run("xgb_early_stopping", "xgboost", True, "a classifier on noisy labels with early_stopping_rounds=10: "
      "validation logloss plateaus and training stops 10 rounds after its best")
def _xgb_stops(out_dir):
    _xgb_early_stopping(out_dir, 10)


@_run("xgb_patience_too_long", "xgboost", False, "the same classifier with early_stopping_rounds=150: training "
      "runs ~150 rounds past the best validation logloss", rules=["Overtraining"])
def _xgb_late(out_dir):
    _xgb_early_stopping(out_dir, 150)


# =============================================================================================
# Keras (the tensorflow env)
@_run("keras_fit", "keras", True, "Keras model.fit with validation data, 5 epochs")
def _keras(out_dir):
    import numpy as np

    import smdebug.tensorflow as smd
    import keras

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2048, FEATURES)).astype("float32")
    y = (x @ rng.standard_normal((FEATURES, CLASSES))).argmax(1)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="relu", name="dense1"),
                              keras.layers.Dense(CLASSES, name="out")])
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "gradients", "losses"])
    model.fit(x[:1536], y[:1536], batch_size=32, epochs=5, validation_data=(x[1536:], y[1536:]),
              callbacks=[hook], verbose=0)
    hook.close()


def _keras_overfitting(out_dir, stopping, epochs=80):
    """256 noisy samples, a wide net, Adam at 1e-2: the validation loss is best after a few
    epochs and climbs after; ``stopping`` (an EarlyStopping or None) is among fit's callbacks."""
    import numpy as np

    import smdebug.tensorflow as smd
    import keras

    rng = np.random.default_rng(0)
    x = rng.standard_normal((768, FEATURES)).astype("float32")
    y = (x @ rng.standard_normal((FEATURES, CLASSES))).argmax(1)
    flip = rng.random(len(y)) < 0.3
    y = np.where(flip, rng.integers(0, CLASSES, len(y)), y)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(128, activation="relu", name="dense1"),
                              keras.layers.Dense(CLASSES, name="out")])
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hook = smd.KerasHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["losses"])
    model.fit(x[:256], y[:256], batch_size=64, epochs=epochs, validation_data=(x[256:], y[256:]),
              callbacks=[hook] + ([stopping] if stopping is not None else []), verbose=0)
    hook.close()


@_run("keras_early_stopping", "keras", True, "Keras fit on 256 noisy samples with EarlyStopping(val_loss, "
      "patience=10): training stops 10 epochs after the best validation loss")
def _keras_stops(out_dir):
    import keras

    _keras_overfitting(out_dir, keras.callbacks.EarlyStopping(monitor="val_loss", patience=10))


@_run("keras_patience_too_long", "keras", False, "the same fit with EarlyStopping(val_loss, patience=60): "
      "training runs ~60 epochs past the best validation loss", rules=["Overtraining"])
def _keras_late(out_dir):
    import keras

    _keras_overfitting(out_dir, keras.callbacks.EarlyStopping(monitor="val_loss", patience=60))


# =============================================================================================
# PyTorch Lightning (the lightning env)
@_run("lightning_fit", "lightning", True, "a LightningModule trained with DebuggerCallback, validation each epoch")
def _lightning(out_dir):
    import pytorch_lightning as pl

    from smdebug.lightning import DebuggerCallback, SaveConfig

    torch = _torch()

    class Classifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _mlp()

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.cross_entropy(self(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.cross_entropy(self(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=3e-3)

    data = _Data(n_train=2048, n_val=256)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data.x_train, data.y_train), batch_size=32,
                                         shuffle=True, generator=torch.Generator().manual_seed(0))
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data.x_val, data.y_val), batch_size=64)
    callback = DebuggerCallback(out_dir=out_dir, save_config=SaveConfig(save_interval=1),
                                include_collections=["weights", "biases", "gradients", "losses"])
    trainer = pl.Trainer(accelerator="cpu", max_epochs=4, callbacks=[callback], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Classifier(), loader, val)
    callback.close()



def _lightning_overfitting(out_dir, stopping, epochs=80):
    """The Keras early-stopping runs' set-up in Lightning: 256 noisy samples, a wide net, Adam
    at 1e-2, validation each epoch; ``stopping`` (an EarlyStopping or None) in the callbacks."""
    import pytorch_lightning as pl

    from smdebug.lightning import DebuggerCallback, SaveConfig

    torch = _torch()

    class Classifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _mlp(width=128)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])
            self.log("train_loss", loss, on_step=False, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    data = _Data(n_train=256, n_val=512, label_noise=0.3)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data.x_train, data.y_train), batch_size=64,
                                         shuffle=True, generator=torch.Generator().manual_seed(0))
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data.x_val, data.y_val), batch_size=512)
    callback = DebuggerCallback(out_dir=out_dir, save_config=SaveConfig(save_interval=1), include_collections=["losses"])
    trainer = pl.Trainer(accelerator="cpu", max_epochs=epochs, callbacks=[callback, stopping], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    trainer.fit(Classifier(), loader, val)
    callback.close()


@_run("lightning_early_stopping", "lightning", True, "a Lightning fit on 256 noisy samples with "
      "EarlyStopping(val_loss, patience=10): training stops 10 epochs after the best validation loss")
def _lightning_stops(out_dir):
    from pytorch_lightning.callbacks import EarlyStopping

    _lightning_overfitting(out_dir, EarlyStopping(monitor="val_loss", patience=10))


@_run("lightning_early_stopping_on_train_loss", "lightning", False, "the same fit with early stopping "
      "configured on the wrong metric (train_loss, which keeps falling): it never stops, and training runs "
      "~70 epochs past the best validation loss", rules=["Overtraining"])
def _lightning_wrong_metric(out_dir):
    from pytorch_lightning.callbacks import EarlyStopping

    _lightning_overfitting(out_dir, EarlyStopping(monitor="train_loss", patience=10))



# =============================================================================================
# Hugging Face Trainer (the transformers env)
def _trainer_overfitting(out_dir, patience, epochs=40):
    """A tiny BERT (random weights, nothing downloaded) memorising 64 randomly labelled
    sequences: the evaluation loss is best after a few epochs and climbs after. Evaluated each
    epoch; ``EarlyStoppingCallback(patience)`` on ``eval_loss``."""
    import tempfile

    import transformers

    from smdebug.transformers import DebuggerCallback, SaveConfig

    torch = _torch()

    class Sequences(torch.utils.data.Dataset):
        def __init__(self, n, seed):
            gen = torch.Generator().manual_seed(seed)
            self.ids, self.labels = torch.randint(0, 50, (n, 8), generator=gen), torch.randint(0, 3, (n,), generator=gen)

        def __len__(self):
            return len(self.labels)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "attention_mask": torch.ones(8, dtype=torch.long), "labels": self.labels[i]}

    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=16, num_labels=3))
    callback = DebuggerCallback(out_dir=out_dir, save_config=SaveConfig(save_interval=1), include_collections=["losses"])
    with tempfile.TemporaryDirectory() as scratch:
        args = transformers.TrainingArguments(
            output_dir=scratch, per_device_train_batch_size=16, per_device_eval_batch_size=64, num_train_epochs=epochs,
            learning_rate=3e-3, report_to=[], eval_strategy="epoch", save_strategy="no", logging_strategy="epoch",
            metric_for_best_model="loss", greater_is_better=False, use_cpu=True, dataloader_num_workers=0,
            disable_tqdm=True, seed=0)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=Sequences(64, 0),
                                       eval_dataset=Sequences(64, 1),
                                       callbacks=[callback, transformers.EarlyStoppingCallback(patience)])
        trainer.remove_callback(transformers.trainer_callback.PrinterCallback)  # no log line per epoch
        trainer.train()
    callback.close()


@_run("hf_early_stopping", "transformers", True, "a Hugging Face Trainer memorising random labels with "
      "EarlyStoppingCallback(patience=10) on eval_loss: training stops 10 evaluations after the best")
def _hf_stops(out_dir):
    _trainer_overfitting(out_dir, 10)


@_run("hf_patience_too_long", "transformers", False, "the same Trainer with EarlyStoppingCallback(patience=30): "
      "training runs ~30 evaluations past the best evaluation loss", rules=["Overtraining"])
def _hf_late(out_dir):
    _trainer_overfitting(out_dir, 30)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Build the rules corpus (runs this env can build).")
    parser.add_argument("--out", required=True, help="directory for the runs")
    parser.add_argument("--runs", help="comma-separated run names (default: every run this env can build)")
    args = parser.parse_args(argv)
    names = args.runs.split(",") if args.runs else [n for n in run_names() if available(_RUNS[n][0])]
    for name in names:
        path = build(name, args.out)
        print(f"{name}: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
