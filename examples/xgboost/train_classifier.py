"""Train an XGBoost classifier with the smdebug hook, then read the run back with a Trial.

The hook saves the evaluation metrics, the feature importances and the mean absolute
SHAP value of each feature every ``--interval`` rounds; the Trial prints the metric
curve and the features that matter most. Runs in a few seconds:

    pip install ".[xgboost,examples]"    # xgboost and scikit-learn (its data)
    python examples/xgboost/train_classifier.py --out-dir /tmp/xgb_run
"""
import argparse
import shutil
import tempfile

import xgboost as xgb
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split

import smdebug.xgboost as smd


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", help="run directory to write (default: a new temporary directory)")
    parser.add_argument("--rounds", type=int, default=50, help="boosting rounds")
    parser.add_argument("--interval", type=int, default=5, help="save every N rounds")
    return parser.parse_args()


def train(out_dir, rounds, interval):
    X, y = make_classification(n_samples=5000, n_features=12, n_informative=5, n_redundant=2, random_state=7)
    X_train, X_valid, y_train, y_valid = train_test_split(X, y, test_size=0.25, random_state=7)
    dtrain, dvalid = xgb.DMatrix(X_train, y_train), xgb.DMatrix(X_valid, y_valid)

    hook = smd.Hook(
        out_dir=out_dir,
        save_config=smd.SaveConfig(save_interval=interval),
        include_collections=[smd.CollectionKeys.METRICS, smd.CollectionKeys.FEATURE_IMPORTANCE,
                             smd.CollectionKeys.AVERAGE_ABS_SHAP],
        # SHAP values are computed on a sample of the training data: they cost more than a round.
        train_data=(X_train[:1000], y_train[:1000]),
    )
    params = {"objective": "binary:logistic", "max_depth": 4, "eta": 0.2, "nthread": 2,
              "eval_metric": ["logloss", "auc"]}
    xgb.train(params, dtrain, rounds, evals=[(dtrain, "train"), (dvalid, "valid")], callbacks=[hook],
              verbose_eval=False)
    hook.close()  # writes the end-of-training marker


def report(out_dir):
    trial = smd.create_trial(out_dir)
    print(f"saved steps: {trial.steps()}")
    print("\nvalidation curve")
    print(f"{'round':>6} {'logloss':>9} {'auc':>7}")
    logloss, auc = trial.tensor("valid-logloss"), trial.tensor("valid-auc")
    for step in logloss.steps():
        print(f"{step:>6} {logloss.value(step).item():>9.4f} {auc.value(step).item():>7.4f}")

    last = trial.steps()[-1]
    shap = {name.split("/", 1)[1]: trial.tensor(name).value(last).item()
            for name in trial.tensor_names(collection="average_abs_shap")}
    gain = {name.rsplit("/", 1)[1]: trial.tensor(name).value(last).item()
            for name in trial.tensor_names(regex="^feature_importance/total_gain/")}
    print(f"\ntop features at round {last} (mean |SHAP|, share of the total gain)")
    for feature, value in sorted(shap.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  {feature:>4} {value:8.4f} {gain.get(feature, 0.0):10.1%}")


def main():
    args = parse_args()
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="smdebug_xgb_")
    try:
        train(out_dir, args.rounds, args.interval)
        report(out_dir)
        print(f"\nrun written to {out_dir}")
    finally:
        if not args.out_dir:
            shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
