"""Progress bars for long loads and reads of a trial (tqdm, when wanted)."""
import sys
from typing import Optional


def progress_wanted(progress: Optional[bool]) -> bool:
    """``progress`` as asked; None: when stderr is a terminal."""
    if progress is None:
        try:
            return sys.stderr is not None and sys.stderr.isatty()
        except (AttributeError, ValueError):
            return False
    return bool(progress)


def progress_bar(wanted: bool, total: int, desc: str):
    """A tqdm bar, or None when not wanted (or tqdm is missing)."""
    if not wanted:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a declared dependency
        return None
    return tqdm(total=total, desc=desc, unit="file", leave=False)
