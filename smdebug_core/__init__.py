"""smdebug: capture, reduce and analyse tensors during training.

``import smdebug as smd`` gives the framework-agnostic API (configs, collections, modes,
the numpy ``Hook`` for custom loops, ``create_trial``); ``import smdebug.pytorch as smd``
(or ``tensorflow``, ``mxnet``, ``xgboost``) gives the same plus that framework's hook.
"""
import os as _os


def _refuse_mixed_install() -> None:
    """Fail with what to do when the original smdebug's files share our ``smdebug`` folder.

    Both distributions install the import package ``smdebug``: installed side by side their
    files are mixed, and uninstalling one removes files of the other. ``core/tfevent/`` and
    ``profiler/python_profiler.py`` exist only in the original (our ``core/`` and ``profiler/``
    keep a few of its import paths); its ``smdebug-<version>.dist-info`` sits next to the folder.
    """
    here = _os.path.dirname(_os.path.abspath(__file__))
    found = [_os.path.join(here, *p) for p in (("core", "tfevent"), ("profiler", "python_profiler.py"))
             if _os.path.exists(_os.path.join(here, *p))]
    if not found:
        return
    parent = _os.path.dirname(here)
    try:
        found += [_os.path.join(parent, n) for n in _os.listdir(parent)
                  if n.startswith("smdebug-") and n.endswith(".dist-info")]
    except OSError:
        pass
    raise ImportError(
        f"the original SageMaker Debugger package 'smdebug' is installed in the same place as smdebug-core "
        f"(found {', '.join(found)}). Both install the import package 'smdebug', so their files are mixed in "
        f"{here}. Uninstall both, then reinstall smdebug-core: "
        "pip uninstall -y smdebug smdebug-core, then install smdebug-core again from where you installed it "
        "(pip install . in its checkout)"
    )


_refuse_mixed_install()

from . import modes  # noqa: E402 - after the mixed-install check
from ._version import __version__  # noqa: E402 - after the mixed-install check
from .collections import Collection, CollectionKeys  # noqa: E402 - after the mixed-install check
from .flight_recorder_config import FlightRecorder  # noqa: E402 - after the mixed-install check
from .hook import Hook, del_hook, get_hook, set_hook  # noqa: E402 - after the mixed-install check
from .modes import ModeKeys  # noqa: E402 - after the mixed-install check
from .reduction_config import ReductionConfig  # noqa: E402 - after the mixed-install check
from .save_config import SaveConfig, SaveConfigMode  # noqa: E402 - after the mixed-install check
from . import sinks  # noqa: E402 - after the mixed-install check (imports no tracker until a sink is made)


def create_trial(path=None, *args, **kwargs):
    """Open a run directory for analysis; see :func:`smdebug.trials.create_trial`."""
    from .analysis.trials import create_trial as _create_trial  # the reader is loaded only when used

    return _create_trial(path, *args, **kwargs)


__all__ = [
    "Collection", "CollectionKeys", "FlightRecorder", "Hook", "ModeKeys", "ReductionConfig", "SaveConfig", "SaveConfigMode",
    "create_trial", "del_hook", "get_hook", "modes", "set_hook", "sinks", "__version__",
]
