"""Warnings for collections a user included that would silently save nothing (a hook keeps
one :class:`InclusionCheck`; its step plans consult it)."""
from __future__ import annotations

from typing import Dict, Iterable

from ..collections import CollectionKeys, CollectionManager
from ..names import did_you_mean


class InclusionCheck:
    """Warnings for included collections that would silently save nothing.

    A hook keeps one. Two mistakes are reported, each once per collection, for the
    collections the user asked for (not the framework's defaults):

    * at the end of the first step, a collection that is neither built in nor configured (no
      regex, no tensor names, no layers or framework objects, no ``save_tensor`` into it):
      usually a typo of a built-in name;
    * at the end of the first step that saves it, a collection none of whose tensor names
      the hook had seen. The hook records every name it was offered (``seen``) so that the
      message can show the names to match.
    """

    def __init__(self, builtin: Iterable[str], framework: str):
        self.builtin = tuple(builtin)
        self.framework = framework
        #: Collections the user included, still to be checked for matches.
        self.pending: Dict[str, None] = {}
        self.warned: set = set()
        #: Every tensor name the hook was offered, in order of first sight.
        self.seen: Dict[str, None] = {}
        #: Names refused (reserved for reductions), warned about once each.
        self.refused: set = set()
        #: Whether :meth:`check_configured` ran (it runs at the end of the first step).
        self.configured_checked = False

    def expect(self, name: str) -> None:
        """``name`` was included by the user: check it."""
        if name not in (CollectionKeys.ALL,) and name not in self.warned:
            self.pending[name] = None

    def not_applicable(self, name: str, reason: str, logger) -> None:
        """The adapter knows ``name`` cannot hold tensors in this training: say so once at
        info level instead of warning about a regex that matched nothing."""
        if self.pending.pop(name, False) is None:
            logger.info("smdebug: included collection %r saves nothing: %s", name, reason)

    def check_configured(self, manager: CollectionManager, logger) -> None:
        """Warn about included collections that are neither built in nor configured, or
        whose reduction config saves nothing."""
        self.configured_checked = True
        for name in list(self.pending):
            coll = manager.get(name, create=False)
            config = getattr(coll, "reduction_config", None)
            if config is not None and not (config.has_reductions or config.save_raw_tensor or config.save_shape):
                del self.pending[name]
                self.warned.add(name)
                logger.warning(
                    "smdebug: included collection %r saves nothing: its reduction_config has no reductions or "
                    "norms and save_raw_tensor=False (smdebug 1.0.34 saved nothing either). To save its tensors "
                    "whole: hook.get_collection(%r).reduction_config = smd.ReductionConfig(save_raw_tensor=True)",
                    name, name)
                continue
            if name in self.builtin or coll is None or coll.has_regex_or_names():
                continue
            del self.pending[name]
            self.warned.add(name)
            known = [n for n in manager.collections if n != name and
                     (n in self.builtin or manager.collections[n].has_regex_or_names())]
            logger.warning(
                "smdebug: included collection %r is not a built-in %s collection and has no regex, tensor "
                "names or layers, so it saves nothing%s. Built-in collections: %s. To define it: "
                "hook.get_collection(%r).include('<regex of tensor names>')",
                name, self.framework, did_you_mean(name, known), ", ".join(self.builtin), name)

    def check_matches(self, manager: CollectionManager, saved: Iterable[str], step: int, logger,
                      names_method: str = "hook.seen_tensor_names()") -> None:
        """Warn about collections saved at this step that matched none of the names seen."""
        for name in [n for n in self.pending if n in saved]:
            del self.pending[name]
            coll = manager.get(name, create=False)
            if coll is None or any(coll.matches(t) for t in self.seen):
                continue
            self.warned.add(name)
            seen = list(self.seen)
            # A sample spread over the list: adapters offer one kind of name after another.
            sample = [seen[i * len(seen) // 8] for i in range(8)] if len(seen) > 8 else seen
            shown = ", ".join(map(repr, dict.fromkeys(sample))) + (", ..." if len(seen) > len(sample) else "")
            logger.warning(
                "smdebug: included collection %r matched none of the %d tensor names the hook saw by step %d "
                "(e.g. %s), so it saved nothing; %s lists them all. Its regexes: %s. Add one that matches: "
                "hook.get_collection(%r).include('<regex>')",
                name, len(self.seen), step, shown or "none", names_method,
                list(coll.include_regex) or "none", name)
