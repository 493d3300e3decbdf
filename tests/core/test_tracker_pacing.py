"""What a tracker sink sends past its cost budget (smdebug.tracker_pacing): each bin's scalar
extremes at their real steps, the bin's per-layer statistics folded to each layer's most
extreme value, and the open bin at close."""
import numpy as np
import pytest

from smdebug.tracker_pacing import Pacing, more_extreme
from smdebug.trackers import StepPoints


def steps(losses, layer_values):
    out = []
    for i, (loss, values) in enumerate(zip(losses, layer_values)):
        p = StepPoints(i, "TRAIN", arrived=float(i))
        p.scalars.append(("loss", loss))
        p.add_stats("l2", ("a", "b"), values)
        out.append(p)
    return out


def test_a_full_bin_sends_its_extremes_and_folds_the_statistics():
    pacing = Pacing(0.02)
    pacing.every = 4
    batch = steps([3.0, 1.0, 2.0, 2.5], [[1.0, -1.0], [5.0, 0.5], [-7.0, 0.1], [2.0, 0.2]])
    sent = pacing.thin(batch)
    assert [p.step for p in sent] == [0, 1, 3]  # the max (0), the min (1) and the bin's last (3)
    assert [p.scalars for p in sent] == [[("loss", 3.0)], [("loss", 1.0)], [("loss", 2.5)]]
    assert not sent[0].stats and not sent[1].stats
    assert sent[2].stats["l2"].values.tolist() == [-7.0, -1.0]  # most extreme of each layer
    assert pacing.folded > 0


def test_the_open_bin_goes_out_at_close_even_with_nothing_new():
    pacing = Pacing(0.02)
    pacing.every = 8
    assert pacing.thin(steps([1.0, 9.0, 2.0], [[1.0, 1.0]] * 3)) == []  # held: the bin is open
    sent = pacing.thin([], final=True)
    assert [p.step for p in sent] == [0, 1, 2]


def test_within_the_budget_every_step_goes_as_it_is():
    pacing = Pacing(None)
    batch = steps([1.0, 2.0], [[1.0, 2.0], [3.0, 4.0]])
    assert pacing.thin(batch) is batch


def test_nan_and_inf_win_the_fold():
    old, new = np.array([1.0, np.inf, -3.0]), np.array([np.nan, 5.0, 2.0])
    assert np.isnan(more_extreme(old, new)[0]) and more_extreme(old, new)[1:].tolist() == [np.inf, -3.0]


def test_a_bad_budget_names_the_value():
    with pytest.raises(ValueError, match=r"cost_budget must be a number in \(0, 1\).*got -1"):
        Pacing(-1)
