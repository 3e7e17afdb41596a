"""The gateway's configuration against an upstream's listing (:mod:`mcp_lossless.gateway.vetting`): what is
unmatched, and that the lenient reading never exposes more, or asks less, than the configuration meant."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.gateway import CatalogRule, UpstreamConfig
from mcp_lossless.gateway.vetting import Offered, Unmatched, Verdicts, narrowed, unmatched_catalog, unmatched_tools

TOOLS = frozenset({"transfer", "balance", "history"})


def test_each_key_names_its_unmatched_names_and_the_closest_real_one() -> None:
    config = UpstreamConfig(
        name="bank",
        command=("x",),
        allow=frozenset({"balance", "histroy"}),
        deny=frozenset({"transfr"}),
        idempotent=frozenset({"balanse"}),
        scopes={"*": ("bank",), "tranfser": ("bank:write",), "zzzz": ("z",)},
    )
    assert unmatched_tools(config, TOOLS) == [
        Unmatched("allow", "histroy", "history"),
        Unmatched("deny", "transfr", "transfer"),
        Unmatched("idempotent", "balanse", "balance"),
        Unmatched("scopes", "tranfser", "transfer"),
        Unmatched("scopes", "zzzz", None),
    ]
    assert str(Unmatched("deny", "transfr", "transfer")) == (
        "deny names 'transfr', which the upstream does not offer (closest: 'transfer')"
    )


def test_a_resource_deny_may_name_a_uri_a_template_routes() -> None:
    rule = CatalogRule(deny=frozenset({"notes://topics/secret", "notes://topcs/x"}))
    config = UpstreamConfig(name="n", command=("x",), resources=rule)
    offered = Offered(frozenset({"notes://readme"}), frozenset({"notes://topics/{topic}"}))
    assert [m.name for m in unmatched_catalog(config, "resources", offered)] == ["notes://topcs/x"]


def test_the_strict_verdict_withholds_until_a_listing_checks_out() -> None:
    config = UpstreamConfig(name="bank", command=("x",), deny=frozenset({"audit"}))
    verdicts = Verdicts({"bank": config}, lenient=False)
    assert not verdicts.exposed("bank"), "not listed yet"
    verdicts.tools_listed("bank", TOOLS)
    assert verdicts.effective("bank") is None and not verdicts.exposed("bank")
    verdicts.tools_listed("bank", TOOLS | {"audit"})
    assert verdicts.effective("bank") == config and verdicts.exposed("bank")
    verdicts.tools_listed("bank", TOOLS)
    assert verdicts.effective("bank") is None, "a re-listing that loses the name withholds it again"


names = st.sampled_from(["transfer", "transfr", "balance", "qqqq", "history", "hist", "*"])


@given(
    allow=st.none() | st.frozensets(names.filter(lambda n: n != "*")),
    deny=st.frozensets(names.filter(lambda n: n != "*")),
    scoped=st.dictionaries(names, st.sampled_from([("a",), ("b",), ("a", "b")]), max_size=3),
    listed=st.frozensets(st.sampled_from(sorted(TOOLS)), min_size=1),
)
def test_lenient_is_never_wider_than_meant(
    allow: frozenset[str] | None, deny: frozenset[str], scoped: dict[str, tuple[str, ...]], listed: frozenset[str]
) -> None:
    """Whatever the typos, every tool the narrowed configuration exposes is one the configuration exposes, and
    needs at least the scopes the configuration asks of it; a deny that was meant for a real tool keeps it out."""
    config = UpstreamConfig(name="u", command=("x",), allow=allow, deny=deny, scopes=scoped)
    lenient = narrowed(config, unmatched_tools(config, listed))
    for tool in listed:
        if lenient.exposes(tool):
            assert config.exposes(tool)
            assert set(config.scopes_of(tool)) <= set(lenient.scopes_of(tool))
    for miss in unmatched_tools(config, listed):
        if miss.key == "deny" and miss.closest is not None:
            assert not lenient.exposes(miss.closest)
        if miss.key == "scopes":
            meant_for = [miss.closest] if miss.closest is not None else sorted(listed)
            for tool in meant_for:
                assert set(config.scopes[miss.name]) <= set(lenient.scopes_of(tool))
