"""An upstream's configuration checked against what the upstream really offers (pure: no I/O).

Every name in an upstream's ``allow``, ``deny``, ``idempotent`` and ``scopes`` (tools) and in its ``prompts`` and
``resources`` rules' ``allow`` and ``deny`` must be something its listing has. A name it does not have is almost
always a typo, and a typo in ``deny`` or ``scopes`` widens access silently: ``deny = ["transfr"]`` leaves
``transfer`` callable, ``scopes = { transfr = [...] }`` leaves it callable without the scope. So a mismatch is
reported naming the key, the name and the closest real name, and by default the upstream exposes nothing until
its configuration checks out (:meth:`Verdicts.effective` is ``None``).

``--lenient-config`` exposes it anyway, with a warning, but never wider than the operator meant
(:func:`narrowed`): a ``deny`` or ``scopes`` entry that names nothing applies to the closest real name, and when
none is close, a ``deny`` withholds every tool (prompt, resource) of the upstream and a ``scopes`` entry is
required for every one of its tools. An ``allow`` or ``idempotent`` entry that names nothing only narrows (a tool
not allowed, a call not re-issued), so it is reported and otherwise ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from .config import CatalogRule, UpstreamConfig
from .upstream import CatalogKind
from .uri_template import compile_template, matches

log = logging.getLogger("mcp_lossless.gateway")
CLOSE_ENOUGH = 0.6
"""difflib's ratio above which a real name counts as the one a mistyped name meant (its default cutoff)."""


@dataclass(frozen=True, slots=True)
class Unmatched:
    """One configured name the upstream does not offer: under ``key`` (``deny``, ``scopes``, ``prompts.allow``…)."""

    key: str
    name: str
    closest: str | None

    def __str__(self) -> str:
        hint = f"closest: {self.closest!r}" if self.closest is not None else "nothing offered is close"
        return f"{self.key} names {self.name!r}, which the upstream does not offer ({hint})"


def _closest(name: str, offered: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(name, list(offered), n=1, cutoff=CLOSE_ENOUGH)
    return found[0] if found else None


def unmatched_tools(config: UpstreamConfig, tools: Collection[str]) -> list[Unmatched]:
    """The tool names of ``config`` that the upstream's tool list ``tools`` lacks (``"*"`` in ``scopes`` is not a
    name), in the order an operator reads the table."""
    named = [("allow", sorted(config.allow or ())), ("deny", sorted(config.deny))]
    named += [("idempotent", sorted(config.idempotent)), ("scopes", sorted(set(config.scopes) - {"*"}))]
    return [Unmatched(key, name, _closest(name, tools)) for key, names in named for name in names if name not in tools]


@dataclass(frozen=True, slots=True)
class Offered:
    """What an upstream lists of one catalog kind: prompt names, or resource URIs and resource templates."""

    names: frozenset[str]
    templates: frozenset[str] = frozenset()

    def has(self, name: str) -> bool:
        """Whether ``name`` is listed, or (a resource URI) is one a level-1 template of the listing names: a
        ``deny`` may well name one URI a template would otherwise route."""
        if name in self.names or name in self.templates:
            return True
        return any((c := compile_template(t)) is not None and matches(c, name) for t in self.templates)


def rule_of(config: UpstreamConfig, kind: CatalogKind) -> CatalogRule:
    return config.prompts if kind == "prompts" else config.resources


def names_entries(rule: CatalogRule) -> bool:
    """Whether the rule names prompts or resources (only then is there anything to check it against)."""
    return rule.exposed and (rule.allow is not None or bool(rule.deny))


def unmatched_catalog(config: UpstreamConfig, kind: CatalogKind, offered: Offered) -> list[Unmatched]:
    rule = rule_of(config, kind)
    if not rule.exposed:
        return []
    everything = offered.names | offered.templates
    named = [("allow", sorted(rule.allow or ())), ("deny", sorted(rule.deny))]
    return [
        Unmatched(f"{kind}.{key}", name, _closest(name, everything))
        for key, names in named
        for name in names
        if not offered.has(name)
    ]


def narrowed(config: UpstreamConfig, unmatched: Iterable[Unmatched]) -> UpstreamConfig:
    """``config`` as ``--lenient-config`` applies it: every unmatched ``deny`` and ``scopes`` entry kept in force on
    the closest real name, or on everything of the upstream when no name is close; never wider than ``config``."""
    deny, allow, scopes = set(config.deny), config.allow, {k: tuple(v) for k, v in config.scopes.items()}
    rules: dict[CatalogKind, CatalogRule] = {"prompts": config.prompts, "resources": config.resources}
    for miss in unmatched:
        if miss.key == "deny":
            if miss.closest is not None:
                deny.add(miss.closest)
            else:
                allow = frozenset()
        elif miss.key == "scopes":
            target = miss.closest if miss.closest is not None else "*"
            scopes[target] = tuple(sorted({*scopes.get(target, ()), *config.scopes[miss.name]}))
        elif miss.key in ("prompts.deny", "resources.deny"):
            kind: CatalogKind = "prompts" if miss.key == "prompts.deny" else "resources"
            rule = rules[kind]
            rules[kind] = (
                dataclasses.replace(rule, deny=rule.deny | {miss.closest})
                if miss.closest is not None
                else dataclasses.replace(rule, exposed=False)
            )
    return dataclasses.replace(
        config,
        allow=allow,
        deny=frozenset(deny),
        scopes=scopes,
        prompts=rules["prompts"],
        resources=rules["resources"],
    )


class Verdicts:
    """Each upstream's last check: what its tool listing and its catalog listings left unmatched, and so the
    configuration it is exposed under (or that it is withheld). Logged when a verdict changes, not at every
    re-listing that finds the same."""

    def __init__(self, configs: Mapping[str, UpstreamConfig], *, lenient: bool) -> None:
        self.configs = configs
        self.lenient = lenient
        self._tools: dict[str, tuple[Unmatched, ...]] = {}
        self._catalog: dict[tuple[str, CatalogKind], tuple[Unmatched, ...]] = {}
        self._checked: set[str] = set()
        """Upstreams whose tools have been listed and checked at least once."""

    def tools_listed(self, name: str, tools: Collection[str]) -> None:
        self._checked.add(name)
        self._record(name, lambda: self._tools.__setitem__(name, tuple(unmatched_tools(self.configs[name], tools))))

    def catalog_listed(self, name: str, kind: CatalogKind, offered: Offered) -> None:
        found = tuple(unmatched_catalog(self.configs[name], kind, offered))
        self._record(name, lambda: self._catalog.__setitem__((name, kind), found))

    def unmatched(self, name: str) -> tuple[Unmatched, ...]:
        catalog = (*self._catalog.get((name, "prompts"), ()), *self._catalog.get((name, "resources"), ()))
        return (*self._tools.get(name, ()), *catalog)

    def exposed(self, name: str) -> bool:
        """Listed and checked, and exposed: every name of its configuration found, or ``--lenient-config`` (what
        ``/readyz`` asks of each upstream)."""
        return name in self._checked and self.effective(name) is not None

    def effective(self, name: str) -> UpstreamConfig | None:
        """The configuration ``name`` is exposed under: its own when it checks out, the narrowed one when lenient,
        else ``None``: nothing of it is exposed."""
        config, unmatched = self.configs[name], self.unmatched(name)
        if not unmatched:
            return config
        return narrowed(config, unmatched) if self.lenient else None

    def _record(self, name: str, update: Callable[[], None]) -> None:
        before = self.unmatched(name)
        update()
        after = self.unmatched(name)
        if after == before:
            return
        if not after:
            log.info("upstream %s: its configuration checks out against its listing", name)
        elif self.lenient:
            log.warning(
                "upstream %s is exposed anyway (--lenient-config), each deny and scope kept in force: %s",
                name,
                "; ".join(map(str, after)),
            )
        else:
            log.error(
                "upstream %s is not exposed: %s; fix the configuration (or run with --lenient-config)",
                name,
                "; ".join(map(str, after)),
            )
