"""Built-in rules for XGBoost runs: tree depth and feature-importance concentration.

Parameter names and defaults follow the public SageMaker Debugger built-in rules reference
("List of Debugger built-in rules", docs.aws.amazon.com/sagemaker/latest/dg/debugger-built-in-rules.html).
They read what ``smdebug.xgboost.Hook`` saves: the ``trees`` collection (``trees/<column>`` of
``Booster.trees_to_dataframe()``) and ``feature_importance/<type>/<feature>``.
"""
from __future__ import annotations

import math
from typing import Dict

import numpy as np

from . import _params as P
from .rule import DATA_MISSING, Rule
from .views import Required

_TREE_COLUMNS = ("Tree", "Node", "ID", "Yes", "No")
_TREE_REGEX = tuple(rf"(^|/)trees/{c}$" for c in _TREE_COLUMNS)


def tree_depths(columns: Dict[str, np.ndarray]) -> Dict[int, int]:
    """Depth (edges on the longest root-to-leaf path) of every tree, from ``trees/*`` columns.

    Uses the Yes/No child links when saved; otherwise estimates from the node numbering as
    floor(log2(largest node id + 1)), a lower bound of the depth.
    """
    trees = np.asarray(columns["Tree"]).astype(np.int64)
    if all(c in columns for c in ("ID", "Yes", "No")):
        ids = [str(v) for v in columns["ID"]]
        children = {node: (str(yes), str(no)) for node, yes, no in zip(ids, columns["Yes"], columns["No"])}
        roots = {int(t): f"{int(t)}-0" for t in trees}
        depths = {}
        for tree, root in roots.items():
            deepest, stack = 0, [(root, 0)]
            while stack:
                node, depth = stack.pop()
                deepest = max(deepest, depth)
                for child in children.get(node, ()):
                    if child and child in children and depth < 10_000:
                        stack.append((child, depth + 1))
            depths[tree] = deepest
        return depths
    nodes = np.asarray(columns["Node"]).astype(np.int64)
    return {int(t): int(math.floor(math.log2(int(nodes[trees == t].max()) + 1))) for t in np.unique(trees)}


class TreeDepth(Rule):
    """Fires when a tree of the model is deeper than ``depth`` (default 6, XGBoost's own default
    ``max_depth``: the reference's 4 fires on every booster trained with XGBoost's defaults).

    Reads the ``trees`` collection (include it in the XGBoost hook). The depth is computed
    from the saved child links; with only node numbers saved it is the reference's estimate,
    the base-2 logarithm of the largest node id.
    """

    reads_what = "XGBoost's trees/<column> tensors (the tree table's whole values)"

    def __init__(self, base_trial=None, depth=6, actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self.depth = P.number(self.rule_name, "depth", depth, minimum=0)

    def required_tensors(self, step):
        return [Required(regex=_TREE_REGEX, value=True)]

    def invoke_at_step(self, step):
        columns = {}
        for name in self.view.tensor_names(regex=_TREE_REGEX):
            try:
                columns[name.rpartition("/")[2]] = self.view.value(name)
            except DATA_MISSING:
                self.unavailable()
        if "Tree" not in columns or not ("Node" in columns or "ID" in columns):
            self.no_data("step %d has no trees/Tree and trees/Node tensors (include the 'trees' "
                           "collection in the XGBoost hook)", step)
            return False
        depths = tree_depths(columns)
        if not depths:
            return False
        tree, deepest = max(depths.items(), key=lambda kv: kv[1])
        if deepest > self.depth:
            too_deep = sum(1 for d in depths.values() if d > self.depth)
            first_tree = min(t for t, d in depths.items() if d > self.depth)
            self.note(f"{too_deep} of {len(depths)} trees are deeper than {self.depth:g} (tree {tree}: depth "
                      f"{deepest})", max_depth=deepest, tree=tree, trees_too_deep=too_deep,
                      culprit={"layer": f"tree {first_tree}", "tensor": "trees/Tree", "first_step":
                               self.streak_start("deep", True), "why": f"depth {depths[first_tree]}"})
            return True
        self.streak_start("deep", False)
        return False


class FeatureImportanceOverweight(Rule):
    """Fires when the ``nfeatures`` most important features hold more than ``threshold`` of the
    total importance.

    Reads the tensors matching ``tensor_regex`` (default ``.*feature_importance/weight``, one
    per feature). XGBoost reports only the features used in some split, so a model that uses
    ``nfeatures`` features or fewer holds all of its importance in them and fires (early
    rounds, with few trees, may do so). Parameters: ``threshold`` (0.8), ``nfeatures`` (3),
    ``tensor_regex``.
    """

    reads_what = "XGBoost's feature importance tensors (whole values)"

    def __init__(self, base_trial=None, threshold=0.8, nfeatures=3, tensor_regex=".*feature_importance/weight",
                 actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self.threshold = P.number(self.rule_name, "threshold", threshold, minimum=0, maximum=1)
        self.nfeatures = P.number(self.rule_name, "nfeatures", nfeatures, minimum=1, integer=True)
        self.tensor_regex = P.regex_list(self.rule_name, "tensor_regex", tensor_regex)

    def required_tensors(self, step):
        return [Required(regex=self.tensor_regex, value=True)]

    def invoke_at_step(self, step):
        importance: Dict[str, float] = {}
        names = self.reads(self.view.tensor_names(regex=self.tensor_regex))
        if not names:
            self.no_data("step %d has no tensor matching %s (include the 'feature_importance' collection)", step,
                         list(self.tensor_regex))
        for name in names:
            try:
                value = self.view.scalar(name)
            except DATA_MISSING:
                self.unavailable()
                continue
            if np.isfinite(value) and value > 0:
                importance[name] = value
        if not importance:
            return False
        ranked = sorted(importance.items(), key=lambda kv: kv[1], reverse=True)
        top = ranked[: self.nfeatures]
        share = sum(v for _, v in top) / sum(importance.values())
        if share > self.threshold:
            names = ", ".join(n.rpartition("/")[2] for n, _ in top)
            self.note(f"the top {self.nfeatures} features ({names}) hold {share:.0%} of the importance "
                      f"(> {self.threshold:.0%})", share=share, top_features={n: v for n, v in top},
                      culprit={"layer": top[0][0].rpartition("/")[2], "tensor": top[0][0],
                               "first_step": self.streak_start("overweight", True),
                               "why": f"{top[0][1] / sum(importance.values()):.0%} of the importance"})
            return True
        self.streak_start("overweight", False)
        return False
