"""How a saved reduction is named in tables, series and the ``smdebug`` command, and what a
name that was not saved probably meant (a key's name itself: ``reduction_config.reduction_label``)."""


def tensor_name_hint(name, known) -> str:
    """What the user probably meant by ``name``, which is not among ``known`` (a trial's tensors)."""
    if not isinstance(name, str):
        return f"; tensor names are strings, got {type(name).__name__}"
    if f"scalar/{name}" in known:
        return f"; save_scalar() names are prefixed: use trial.tensor('scalar/{name}')"
    from ...reduction_config import parse_reduction_tag

    reduction = parse_reduction_tag(name)
    if reduction is not None and reduction[2] in known:
        op, is_abs, base = reduction
        return (f"; reductions belong to their tensor: trial.tensor({base!r}).reduction_value(step, {op!r}"
                f"{', abs=True' if is_abs else ''})")
    from ...names import close_matches

    matches = close_matches(name, known)
    if matches:
        return "; did you mean " + " or ".join(map(repr, matches)) + "?"
    total = len(known)
    return f"; it has {total} tensors: trial.tensor_names() lists them" if total else "; it has no tensors yet"

